#pragma once
/// Internal kernels of the CPU backend (not a public API): the f32 3-D convolution and the strided
/// same-dtype copy. Shapes and parameters are validated by CpuBackend before these run.
#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace dzr::cpu {

/// Which conv3d implementation runs (Auto picks by shape and CPU; the others are for tests).
enum class ConvKernel : uint8_t {
    Auto,
    DirectBaseline,  ///< direct convolution, baseline ISA (SSE2 on x86-64)
    DirectSimd,      ///< direct convolution, AVX2 + FMA (falls back to baseline without them)
    Gemm,            ///< im2col + OpenBLAS sgemm
};

/// True when DirectSimd runs AVX2 + FMA code on this CPU.
bool conv_simd_available();

/// out [Co, To, Ho, Wo] = conv3d(x [Ci, T, H, W], w [Co, Ci, kt, kh, kw]) (+ bias [Co] when not null),
/// zero padding as in Conv3dParams. Contiguous f32 operands. Each output element sums its taps in one
/// fixed order whatever the clip length and the output's spatial position, so results do not depend on
/// how a clip is split into calls. `scratch` is a reusable host buffer (grown as needed).
void conv3d_f32(const Conv3dParams& p, const TensorView& x, const TensorView& w, const float* bias,
                const TensorView& out, std::vector<float>& scratch, ConvKernel kernel = ConvKernel::Auto);

/// Copies a host view of any layout (strided, permuted, stride-0 broadcast dims) into a contiguous host
/// view of the same dtype and element count. Returns false (and copies nothing) when the dtypes differ.
bool copy_same_dtype(const TensorView& src, const TensorView& dst);

}  // namespace dzr::cpu
