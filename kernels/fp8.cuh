#pragma once
/// FP8 (E4M3) kernels: the per-row quantization of core/fp8.h (activations per token, KV rows per token and head),
/// its inverse, a plain FP8 GEMM for what cuBLASLt does not take, and the FP8 KV pool's scatter and dequantizing
/// gather. Conversions go through cuda_fp8.h (round to nearest even, saturating), the same bits as the host's
/// f32_to_f8e4m3 / f8e4m3_to_f32 (core/half.h); the row scale is the host's fp8_row_scale with IEEE divisions.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"
#include "kernels/dit_fused.cuh"
#include "kernels/kv_scatter.cuh"

namespace dzr::kernels {

/// q[r, c] and scales[r] of x's rows (f32 or bf16; row r at x + r * ld elements, unit column stride); q is
/// contiguous [rows, cols]. One block per row: the absolute maximum, then the codes.
cudaError_t quantize_fp8_rows(const void* x, DType x_dtype, int64_t rows, int64_t cols, int64_t ld, uint8_t* q,
                              float* scales, cudaStream_t stream);

/// quantize_fp8_rows of gelu_tanh(x) rounded to bf16 (the values the activation kernel writes), x contiguous bf16
/// [rows, cols] with cols % 8 == 0 and at most 16384, 16-byte aligned, q 8-byte aligned; cudaErrorNotSupported
/// otherwise (nothing launched). RowImpl::Stream on a device whose GELU table is prepared: the GELU of each element
/// looked up in that table (the same bits), persistent blocks with the next rows' loads in flight; else one block
/// per row evaluating the GELU.
cudaError_t gelu_quantize_fp8_rows(const void* x, DType x_dtype, int64_t rows, int64_t cols, uint8_t* q, float* scales,
                                   cudaStream_t stream, RowImpl impl = RowImpl::Stream);

/// Fills the current device's table of gelu_tanh over every bf16 value (rounded to bf16 as the activation kernel
/// rounds it) on `stream` and waits for it: once per device at load, before gelu_quantize_fp8_rows may use it.
cudaError_t prepare_gelu_table(cudaStream_t stream);

/// out[r, c] = e4m3 q[r, c] * scales[r] (an f32 product) in out_dtype (f32 or bf16); q and out contiguous.
cudaError_t dequantize_fp8_rows(const uint8_t* q, const float* scales, int64_t rows, int64_t cols, void* out,
                                DType out_dtype, cudaStream_t stream);

/// out[m, n] = (Σ_k xq[m, k] wq[n, k]) * x_scales[m] * w_scales[n] (+ bias[n]): xq [M, K], wq [N, K] contiguous,
/// out row m at out + m * ldc (f32 or bf16), bias f32 or bf16 (or null). One thread per output, f32 sums.
struct Fp8GemmArgs {
    const uint8_t* xq = nullptr;
    const float* x_scales = nullptr;
    const uint8_t* wq = nullptr;
    const float* w_scales = nullptr;
    const void* bias = nullptr;
    DType bias_dtype = DType::BF16;
    void* out = nullptr;
    DType out_dtype = DType::BF16;
    int64_t M = 0, N = 0, K = 0, ldc = 0;
};
cudaError_t gemm_fp8_fallback(const Fp8GemmArgs& args, cudaStream_t stream);

/// One layer of an FP8 pool: the codes of slot s, head h at k[s * token_stride + h * head_stride] (head_dim
/// contiguous bytes) and its scale at k_scale[(s * token_stride + h * head_stride) / head_dim].
struct Fp8KvPoolLayer {
    uint8_t* k = nullptr;
    uint8_t* v = nullptr;
    float* k_scale = nullptr;
    float* v_scale = nullptr;
    int64_t token_stride = 0;
    int64_t head_stride = 0;
    int32_t block_size = 0;
};

/// For i < n with slots[i] in [0, num_slots): each head of rows[i] (f32 or bf16, `rows_dtype`) quantized into pool
/// slot slots[i] with its scale (one warp per row and head). Other slots (kPadSlot) are skipped.
cudaError_t scatter_kv_fp8(const KvRows& rows, DType rows_dtype, const Fp8KvPoolLayer& pool, const int64_t* slots,
                           int64_t n, int64_t num_slots, int heads, int head_dim, cudaStream_t stream);

/// out_k/out_v (contiguous [hist + cur_len, heads, head_dim] in `dtype`) = [the history token t's pool row at
/// block table[t / block_size], offset t % block_size, dequantized (code * scale, rounded to dtype) | the current
/// rows in `dtype`, copied]. `table` is a device int32 array.
cudaError_t gather_kv_fp8(const Fp8KvPoolLayer& pool, const int32_t* table, int64_t hist, const KvRows& cur,
                          int64_t cur_len, void* out_k, void* out_v, int heads, int head_dim, DType dtype,
                          cudaStream_t stream);

}  // namespace dzr::kernels
