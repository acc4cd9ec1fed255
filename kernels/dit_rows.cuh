#pragma once
/// The streamed row kernels of `fast` numerics (kernels/dit_rows.cu), behind kernels::ada_layer_norm[_fp8] and
/// kernels::rms_norm_rope (kernels/dit_fused.cu) for bf16 rows: persistent blocks, one warp per row at a time, the next
/// row copied into shared memory (cp.async) while the current one is normalized, the norm parameters and per-group
/// vectors staged once per block in shared memory as f32. Internal to kernels/: included by kernels/*.cu only.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "kernels/common.cuh"
#include "kernels/warp_rows.cuh"

namespace dzr::kernels::rows {

/// The operands of the streamed LayerNorm (bf16 x [rows, cols], cols % 8 == 0, 16-byte aligned vectors; scale and
/// shift rows `mod_stride` elements apart). With q set: the bf16 rows' E4M3 codes and row scales instead of out.
struct NormArgs {
    const bf16* x = nullptr;
    bf16* out = nullptr;
    uint8_t* q = nullptr;
    float* q_scales = nullptr;
    int64_t rows = 0;
    int cols = 0;
    float eps = 1e-6f;
    Vec8Ptr weight, bias, scale, shift;
    int64_t mod_stride = 0;
    int64_t split = INT64_MAX;
    int64_t period = INT64_MAX;
    bool narrow = false;  // 8 warps a block and f32 staging (RowImpl::Stream8); the same bits
};

/// The operands of the streamed RMSNorm + RoPE (as kernels::rms_norm_rope; head_dim % 8 == 0, pairs % 4 == 0).
struct RopeArgs {
    const bf16* x = nullptr;
    bf16* out = nullptr;
    int64_t rows = 0;
    int cols = 0;
    int head_dim = 0;
    float eps = 1e-6f;
    Vec8Ptr weight;
    const float* table_a = nullptr;
    const float* table_b = nullptr;
    int pairs = 0;
    int entry = 2;
    int64_t split = INT64_MAX;
    int64_t period = INT64_MAX;
    bool narrow = false;  // as NormArgs::narrow
};

/// cudaErrorNotSupported (nothing launched) when the shape (at most kWarpMaxCols columns) or the shared memory does
/// not fit.
cudaError_t ada_layer_norm(const NormArgs& a, cudaStream_t stream);
cudaError_t rms_norm_rope(const RopeArgs& a, cudaStream_t stream);

}  // namespace dzr::kernels::rows
