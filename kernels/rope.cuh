#pragma once
/// Rotary embedding on interleaved channel pairs with a per-token f32 (cos, sin) table.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace dzr::kernels {

/// x and out are [L, H, D] with unit last stride and row strides (x_sl, x_sh), (o_sl, o_sh); table is a
/// contiguous f32 [L, P, 2] of (cos, sin), or with `double_table` [L, P, 4] of double-float (cos_hi, cos_lo,
/// sin_hi, sin_lo), rotated in double and rounded to f32 before the output dtype. Pair j < P of every head of
/// token l rotates by table[l, j]; pairs j >= P are copied unchanged. out may alias x.
cudaError_t rope(const void* x, DType tx, int64_t x_sl, int64_t x_sh, void* out, DType to, int64_t o_sl,
                 int64_t o_sh, int64_t L, int64_t H, int64_t D, const float* table, int64_t P, bool double_table,
                 cudaStream_t stream);

}  // namespace dzr::kernels
