#pragma once
/// Pointwise activations (f32 math; f32 or bf16 in and out).
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace dzr::kernels {

enum class ActKind : uint8_t { GeluTanh, GeluErf, Silu, Relu, Sigmoid, GeluTanhStepwise };

/// out[i] = act(x[i]) for contiguous tensors of n elements; out may alias x.
cudaError_t activation(ActKind kind, const void* x, DType tx, void* out, DType to, int64_t n, cudaStream_t stream);

}  // namespace dzr::kernels
