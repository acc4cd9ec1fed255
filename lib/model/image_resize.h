#pragma once
/// Bicubic image resize with the semantics of torch.nn.functional.interpolate(mode='bicubic',
/// align_corners=False, antialias=False): cubic convolution with A = -0.75, half-pixel source
/// coordinates (src = (dst + 0.5) * in / out - 0.5), and border taps clamped to the edge pixel.
///
/// The filter is separable and its taps depend only on the sizes, so a resize is two GEMMs with
/// interpolation matrices built once: out[c] = Wy · src[c] · Wxᵀ, Wy [out_h, in_h], Wx [out_w, in_w].
/// Clamped border taps are folded into the edge columns of the matrices.
#include <cstddef>
#include <vector>

#include "backend/backend.h"
#include "core/tensor.h"

namespace dzr {

/// The cubic-convolution coefficient A used by PyTorch (and OpenCV) for bicubic interpolation.
inline constexpr float kBicubicA = -0.75f;

/// The 1-D interpolation matrix [out_size, in_size] (row-major) of a bicubic resize from in_size
/// to out_size samples, computed in f32 the way PyTorch's CUDA kernel computes its taps.
std::vector<float> bicubic_weight_matrix(int in_size, int out_size);

/// A bicubic resize between fixed sizes on a backend. The f32 interpolation matrices are uploaded once
/// at construction; apply() makes two f32 GEMMs (along x, then y) on workspace buffers (converting a non-f32
/// image to f32 and back, as PyTorch accumulates bicubic taps in f32 for bf16 images).
class BicubicResize {
  public:
    BicubicResize() = default;
    BicubicResize(Backend& be, int in_height, int in_width, int out_height, int out_width);

    /// src: [C, in_h, in_w] contiguous, dst: [C, out_h, out_w] contiguous, any float dtype the
    /// backend takes (any C: channels are independent).
    void apply(Backend& be, const TensorView& src, const TensorView& dst) const;

    /// Workspace bytes apply() takes on `be` for `channels` channels with its input and output in `dtype`:
    /// apply() measured on a MeasuringBackend over `be` (measure_workspace).
    size_t workspace_bytes(Backend& be, int channels, DType dtype) const;

    int in_height() const { return in_h_; }
    int in_width() const { return in_w_; }
    int out_height() const { return out_h_; }
    int out_width() const { return out_w_; }

  private:
    int in_h_ = 0, in_w_ = 0, out_h_ = 0, out_w_ = 0;
    Tensor wy_;  // f32 [out_h, in_h]
    Tensor wx_;  // f32 [out_w, in_w]
};

}  // namespace dzr
