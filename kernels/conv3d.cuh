#pragma once
/// Helpers for 3-D convolution: explicit zero padding (cuDNN pads symmetrically only) and a direct
/// convolution kernel used when cuDNN offers no algorithm.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace dzr::kernels {

/// xp [C, T + pb0 + pa0, H + pb1 + pa1, W + pb2 + pa2] = x [C, T, H, W] placed at offset pad_before,
/// zeros elsewhere. Both contiguous, same dtype (f32 or bf16).
cudaError_t pad3d(const void* x, void* xp, DType t, int64_t C, const int64_t in[3], const int pad_before[3],
                  const int pad_after[3], cudaStream_t stream);

/// out [Co, To, Ho, Wo] = conv(x [Ci, T, H, W], w [Co, Ci, kt, kh, kw]) + bias, zero padding given by
/// pad_before (the output extents decide how much trailing padding is read). x, w, out share a dtype.
struct Conv3dDirectArgs {
    DType dtype = DType::F32;
    const void* x = nullptr;
    const void* w = nullptr;
    const void* bias = nullptr;
    DType bias_dtype = DType::F32;
    void* out = nullptr;
    int64_t Ci = 0, Co = 0;
    int64_t in[3] = {};
    int64_t k[3] = {};
    int64_t o[3] = {};
    int stride[3] = {1, 1, 1};
    int pad_before[3] = {};
};

cudaError_t conv3d_direct(const Conv3dDirectArgs& args, cudaStream_t stream);

/// Fast numerics' channels-last convolution operands (backend/cuda/cuda_conv_fast.cpp):
/// xp [T + pb0 + pa0, H + pb1 + pa1, W + pb2 + pa2, C] (channels-last) = x [C, T, H, W] (channels-first) placed
/// at offset pad_before, zeros elsewhere. Both contiguous, same dtype (f32 or bf16). A tiled transpose.
cudaError_t to_channels_last_padded(const void* x, void* xp, DType t, int64_t C, const int64_t in[3],
                                    const int pad_before[3], const int pad_after[3], cudaStream_t stream);

/// xp [T + pb0 + pa0, H + pb1 + pa1, W + pb2 + pa2, C] = x [T, H, W, C] placed at offset pad_before, zeros
/// elsewhere (both channels-last and contiguous, same dtype).
cudaError_t pad_channels_last(const void* x, void* xp, DType t, int64_t C, const int64_t in[3], const int pad_before[3],
                              const int pad_after[3], cudaStream_t stream);

/// y [S, C] += bias[c], added in f32 and rounded once to y's dtype (as channel_bias does); y contiguous, bias f32
/// or bf16 [C].
cudaError_t add_bias_rows(void* y, DType t, int64_t C, int64_t S, const void* bias, DType bias_dtype,
                          cudaStream_t stream);

/// out [C, S] = y [S, C] (+ bias[c], added in f32 and rounded once to out's dtype, as channel_bias does); y and
/// out contiguous, same dtype; bias f32 or bf16 [C], or null. A tiled transpose.
cudaError_t channels_first_with_bias(const void* y, void* out, DType t, int64_t C, int64_t S, const void* bias,
                                     DType bias_dtype, cudaStream_t stream);

}  // namespace dzr::kernels
