#pragma once
/// Row reductions over the last dim of a contiguous [rows, cols] tensor into out[rows] (f32 math).
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace dzr::kernels {

enum class ReduceKind : uint8_t { Sum, Mean, Max };

cudaError_t reduce_rows(ReduceKind kind, const void* x, DType tx, void* out, DType to, int64_t rows, int64_t cols,
                        cudaStream_t stream);

/// count[0] (int32, device) = the number of NaN and ±Inf among the n elements of x (any float dtype).
cudaError_t count_nonfinite(const void* x, DType tx, int64_t n, int32_t* count, cudaStream_t stream);

}  // namespace dzr::kernels
