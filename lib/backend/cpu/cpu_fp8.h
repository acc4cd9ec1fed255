#pragma once
/// The CPU backend's FP8 (E4M3) ops (not a public API): the per-row quantization of core/fp8.h, its inverse, and
/// the FP8 GEMM on decoded values. The CPU reference of what kernels/fp8.cu and cuBLASLt compute on a GPU.
#include "core/tensor.h"

namespace dzr::cpu {

/// Backend::quantize_fp8 on host views (x f32).
void quantize_fp8(const TensorView& x, const TensorView& q, const TensorView& scales);
/// Backend::dequantize_fp8 on host views (out f32).
void dequantize_fp8(const TensorView& q, const TensorView& scales, const TensorView& out);
/// Backend::gemm_fp8 on host views (bias and out f32): the E4M3 codes decoded exactly to f32, one OpenBLAS sgemm
/// (f32 sums), then out[m, n] = (sum · x_scales[m]) · w_scales[n] + bias[n]. Scaling the sum equals dequantizing
/// both operands first (each scale is constant along k), and is the order the GPU's per-row/column scaled GEMM uses.
void gemm_fp8(const TensorView& xq, const TensorView& x_scales, const TensorView& wq, const TensorView& w_scales,
              const TensorView& bias, const TensorView& out);

}  // namespace dzr::cpu
