#pragma once
/// Row normalizations over the last dim of a contiguous [rows, cols] tensor: statistics in f32 through
/// warp/block reductions, one block per row. Parameters (weight, bias) are f32 or bf16 or absent
/// (nullptr).
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace dzr::kernels {

/// out = (x - mean) / sqrt(var + eps) [* weight] [+ bias]; two-pass mean and variance.
cudaError_t layer_norm(const void* x, DType tx, void* out, DType to, int64_t rows, int64_t cols, float eps,
                       const void* weight, DType tw, const void* bias, DType tb, cudaStream_t stream);

/// out = x / sqrt(mean(x^2) + eps) [* weight].
cudaError_t rms_norm(const void* x, DType tx, void* out, DType to, int64_t rows, int64_t cols, float eps,
                     const void* weight, DType tw, cudaStream_t stream);

}  // namespace dzr::kernels
