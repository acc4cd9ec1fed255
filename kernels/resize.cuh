#pragma once
/// Bicubic resize of f32 images as PyTorch's upsample_bicubic2d CUDA kernel computes it (align_corners=False,
/// no antialias): the same f32 expressions in the same form, so that nvcc forms the same fused multiply-adds.
#include <cuda_runtime.h>

#include <cstdint>

namespace dzr::kernels {

/// src f32 [channels, in_h, in_w] -> dst f32 [channels, out_h, out_w], both contiguous.
cudaError_t resize_bicubic(const float* src, float* dst, int64_t channels, int in_h, int in_w, int out_h, int out_w,
                           cudaStream_t stream);

}  // namespace dzr::kernels
