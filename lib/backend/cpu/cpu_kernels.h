#pragma once
/// Internal kernels of the CPU backend (not a public API): the f32 3-D convolution and the strided
/// same-dtype copy. Shapes and parameters are validated by CpuBackend before these run.
#include <vector>

#include "backend/backend.h"

namespace dzr::cpu {

/// out [Co, To, Ho, Wo] = conv3d(x [Ci, T, H, W], w [Co, Ci, kt, kh, kw]) (+ bias [Co] when not null),
/// zero padding as in Conv3dParams. Contiguous f32 operands. Each output element sums its taps in one
/// fixed order (bias, then ci, kt, kh, kw) whatever the clip length, so results do not depend on how
/// a clip is split into calls. `scratch` is a reusable host buffer (grown as needed).
void conv3d_f32(const Conv3dParams& p, const TensorView& x, const TensorView& w, const float* bias,
                const TensorView& out, std::vector<float>& scratch);

/// Copies a host view of any layout (strided, permuted, stride-0 broadcast dims) into a contiguous host
/// view of the same dtype and element count. Returns false (and copies nothing) when the dtypes differ.
bool copy_same_dtype(const TensorView& src, const TensorView& dst);

}  // namespace dzr::cpu
