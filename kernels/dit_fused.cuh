#pragma once
/// Fused memory-bound chains of the DiT block for `fast` numerics: each computes in f32 and rounds once to the
/// output dtype. Rows are split into at most two groups: rows [0, split) read row 0 of the per-group vectors,
/// rows [split, rows) row 1 (the video tokens and the register tokens of a denoising forward). With a `period`
/// below `rows` the grouping repeats every `period` rows (row r is grouped, and takes its rope table row, as row
/// r % period): the two CFG branches' rows stacked in one batch. period = INT64_MAX: no repetition.
/// Per-group vectors (scale, shift, gate) are f32 or bf16 with a row stride in elements; norm parameters are f32 or
/// bf16; activations f32 or bf16, contiguous rows.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "core/dtype.h"

namespace dzr::kernels {

/// The kernels bf16 rows take: the streamed kernels (kernels/dit_rows.cu: persistent blocks, the next row copied into
/// shared memory while the current one is normalized, the parameters staged once per block) or the one-warp-per-row
/// kernels they replace (kept for `dzr bench fused`'s comparison: CudaBackendOptions::row_kernels, DZR_ROW_KERNELS).
/// Shapes the streamed kernels do not take run the warp kernels either way. Stream8: the streamed kernels as they
/// first shipped (8 warps a block, the vectors staged as f32; the same bits), for `dzr bench`'s comparison.
enum class RowImpl { Stream, Warp, Stream8 };

/// The streamed kernels of `impl` (Warp: none).
inline bool streamed(RowImpl impl) { return impl != RowImpl::Warp; }

/// A per-group vector set: element (g, c) at data[g * row_stride + c]; data == nullptr: absent.
struct GroupVec {
    const void* data = nullptr;
    DType dtype = DType::F32;
    int64_t row_stride = 0;
};

/// out = (LN(x) [* weight + bias]) [* (1 + scale[g])] [+ shift[g]] over rows of `cols`.
cudaError_t ada_layer_norm(const void* x, DType tx, void* out, DType to, int64_t rows, int64_t cols, float eps,
                           const void* weight, const void* bias, DType tparam, GroupVec scale, GroupVec shift,
                           int64_t split, int64_t period, cudaStream_t stream, RowImpl impl = RowImpl::Stream);

/// ada_layer_norm's rows rounded to bf16 and quantized per row as kernels::quantize_fp8_rows would quantize them
/// (q [rows, cols] E4M3 codes, 8-byte aligned; q_scales [rows]), without writing the bf16 rows: bf16 x of at most
/// 6144 columns with 16-byte aligned operands, cudaErrorNotSupported otherwise (nothing launched). Its codes are those
/// of ada_layer_norm's bf16 rows of the same `impl` (one reduction order).
cudaError_t ada_layer_norm_fp8(const void* x, DType tx, uint8_t* q, float* q_scales, int64_t rows, int64_t cols,
                               float eps, const void* weight, const void* bias, DType tparam, GroupVec scale,
                               GroupVec shift, int64_t split, int64_t period, cudaStream_t stream,
                               RowImpl impl = RowImpl::Stream);

/// x += y [* gate[g]] over rows of `cols` (x and y of one dtype).
cudaError_t gated_residual(void* x, const void* y, DType t, int64_t rows, int64_t cols, GroupVec gate, int64_t split,
                           int64_t period, cudaStream_t stream);

/// The operands of gated_residual_norm.
struct GatedResidualNormArgs {
    void* x = nullptr;  // [rows, cols], updated in place
    const void* y = nullptr;
    DType t = DType::BF16;  // x and y
    GroupVec gate;          // absent: x += y
    void* out = nullptr;    // [rows, cols]
    DType to = DType::BF16;
    int64_t rows = 0, cols = 0;
    float eps = 1e-6f;
    const void* weight = nullptr;  // absent: no affine weight
    const void* bias = nullptr;
    DType tparam = DType::F32;
    GroupVec scale, shift;
    int64_t split = INT64_MAX;
    int64_t period = INT64_MAX;
};

/// x += y [* gate[g]] (rounded to x's dtype), then out = ada_layer_norm(x): one pass over x where the shapes allow
/// (bf16 rows the warp kernel takes), else the two kernels in turn (the same values).
cudaError_t gated_residual_norm(const GatedResidualNormArgs& a, cudaStream_t stream);

/// out[r] = rope(rms_norm(x[r]) * weight): the RMS over the whole row (heads · head_dim), then the rotation of each
/// head's interleaved pairs j < pairs by (cos, sin) of table row r (table_a for r < split, table_b row r - split
/// after); a table of `entry` 2 holds (cos, sin), of 4 (cos_hi, cos_lo, sin_hi, sin_lo). No tables: no rotation.
cudaError_t rms_norm_rope(const void* x, DType tx, void* out, DType to, int64_t rows, int64_t heads, int64_t head_dim,
                          float eps, const void* weight, DType tw, const float* table_a, const float* table_b,
                          int64_t pairs, int entry, int64_t split, int64_t period, cudaStream_t stream,
                          RowImpl impl = RowImpl::Stream);

}  // namespace dzr::kernels
