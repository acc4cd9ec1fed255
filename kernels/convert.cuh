#pragma once
/// Strided copies with dtype conversion (up to 6 dims, source strides may be 0 = broadcast) and fills.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace dzr::kernels {

inline constexpr int kMaxCopyDims = 6;

/// Source layout in elements, outermost first.
struct StridedLayout {
    int rank = 0;
    int64_t shape[kMaxCopyDims] = {};
    int64_t stride[kMaxCopyDims] = {};
};

/// True when convert_copy supports src -> dst: the same dtype (any size), or both among f32, bf16, f16.
bool convert_supported(DType src, DType dst);

/// dst (contiguous, src.numel() elements) = convert(src viewed through `layout`).
cudaError_t convert_copy(const void* src, DType ts, const StridedLayout& layout, void* dst, DType td,
                         cudaStream_t stream);

/// True when fill supports the dtype (f32, bf16, f16, i32).
bool fill_supported(DType t);

/// dst[i] = value for i < n (contiguous).
cudaError_t fill(void* dst, DType t, int64_t n, float value, cudaStream_t stream);

}  // namespace dzr::kernels
