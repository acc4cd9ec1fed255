#pragma once
/// FP8 (OCP E4M3) row quantization: the one definition the weights, the activations and the FP8 KV cache follow,
/// on the host here and in the CUDA kernels (kernels/fp8.cu) bit for bit. For one row x[0..n):
///
///     amax  = max(max_c |x[c]|, kFp8MinAmax)      (NaN elements are skipped by the max, as fmaxf does)
///     scale = amax / 448                          (one f32 division)
///     q[c]  = e4m3(x[c] * (448 / amax))           (f32 multiply, then f32_to_f8e4m3: nearest even, saturating)
///     x[c] ~= q[c] * scale
///
/// A row is an output channel of a weight [out, in] (per-output-channel scales), a token of an activation
/// [tokens, features] (per-token scales), or one head of one token of K or V (the FP8 KV pool's per-head scales).
/// The floor kFp8MinAmax keeps the scale positive and finite on an all-zero row (its q are all zero).
#include <cstdint>

#include "core/tensor.h"

namespace dzr {

/// The largest finite E4M3 value.
inline constexpr float kFp8E4M3Max = 448.0f;
/// The smallest amax a row's scale is made from (an all-zero row gets scale kFp8MinAmax / 448).
inline constexpr float kFp8MinAmax = 1e-12f;

/// The scale of a row with this absolute maximum (after the floor) and its reciprocal multiplier 448 / amax.
struct Fp8RowScale {
    float scale = 1.0f;
    float inv = 1.0f;
};
Fp8RowScale fp8_row_scale(float amax);

/// Quantizes one f32 row of n values into q[n] and returns its scale.
float quantize_row_fp8(const float* x, int64_t n, uint8_t* q);

/// Quantizes the rows of a host view x (any float dtype; [rows, cols] seen as rows of its last dim, any strides)
/// into q (host F8_E4M3, contiguous, x's element count) and scales (host F32, contiguous, one per row).
void quantize_rows_fp8_host(const TensorView& x, const TensorView& q, const TensorView& scales);

/// out[r, c] = e4m3 q[r, c] * scales[r], written in out's dtype (host, contiguous; any float dtype).
void dequantize_rows_fp8_host(const TensorView& q, const TensorView& scales, const TensorView& out);

}  // namespace dzr
