#pragma once
/// Paged KV-cache data movement: the scatter of current K/V rows into their pool slots and the gather of
/// a block-table history plus the current rows into one contiguous [history | current] buffer. Both read
/// the block table / slot mapping from device memory, so a captured CUDA graph stays valid when the
/// table's contents change.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace dzr::kernels {

/// Rows of one [L, H, D] operand: element (t, h, d) at data[t * token_stride + h * head_stride + d].
struct KvRows {
    const void* k = nullptr;
    const void* v = nullptr;
    int64_t token_stride = 0;
    int64_t head_stride = 0;
};

/// One layer of the pool: slot s, head h at base[s * token_stride + h * head_stride] (head_dim contiguous).
struct KvPoolLayer {
    void* k = nullptr;
    void* v = nullptr;
    int64_t token_stride = 0;
    int64_t head_stride = 0;
    int32_t block_size = 0;
};

/// pool[slots[i]] = rows[i] for i < n, K and V; slots outside [0, num_slots) (kPadSlot = -1 included)
/// are skipped. Rows and pool share `dtype` (f32, bf16 or f16); heads x head_dim elements per row.
cudaError_t scatter_kv(const KvRows& rows, const KvPoolLayer& pool, const int64_t* slots, int64_t n,
                       int64_t num_slots, int heads, int head_dim, DType dtype, cudaStream_t stream);

/// out_k/out_v (contiguous [hist + cur, heads, head_dim]) = [pool rows of history token t at block
/// table[t / block_size], offset t % block_size | current rows]. `table` is a device int32 array.
cudaError_t gather_kv(const KvPoolLayer& pool, const int32_t* table, int64_t hist, const KvRows& cur,
                      int64_t cur_len, void* out_k, void* out_v, int heads, int head_dim, DType dtype,
                      cudaStream_t stream);

}  // namespace dzr::kernels
