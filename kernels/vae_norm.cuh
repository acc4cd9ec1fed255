#pragma once
/// The Wan VAE's RMS_norm (F.normalize over channels * scale * gamma), optionally fused with the SiLU
/// after it, over the last dim of contiguous [rows, cols] channels-last rows, in PyTorch's summation order; the
/// sum of squares is accumulated in f32. Backend::l2_norm documents the two rounding modes.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace dzr::kernels {

struct VaeNormArgs {
    const void* x = nullptr;
    DType tx = DType::BF16;
    void* out = nullptr;  // may alias x
    DType to = DType::BF16;
    const void* weight = nullptr;  // [cols], f32 or bf16
    DType tw = DType::BF16;
    int64_t rows = 0, cols = 0;
    float eps = 1e-12f;
    float scale = 1.0f;
    bool silu = false;
    /// Round to the output type after every step (PyTorch eager bf16) instead of once at the end.
    bool eager = false;
    /// Fast numerics: the f32 chain rounded once at the end whatever `eager` says, each row read once with 16-byte
    /// loads (its own summation order). Taken for bf16 rows of a multiple of 8 channels (at most 2048) on 16-byte
    /// aligned buffers; other calls run the reference kernel.
    bool fast = false;
};

cudaError_t vae_norm(const VaeNormArgs& a, cudaStream_t stream);

}  // namespace dzr::kernels
