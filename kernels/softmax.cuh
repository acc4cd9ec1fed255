#pragma once
/// Row softmax over the last dim of a contiguous [rows, cols] tensor, f32 statistics.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace dzr::kernels {

/// out[r, :] = softmax(scale * x[r, :]). x and out may alias when they share a dtype.
cudaError_t softmax(const void* x, DType tx, void* out, DType to, int64_t rows, int64_t cols, float scale,
                    cudaStream_t stream);

}  // namespace dzr::kernels
