#pragma once
/// A plain GEMM kernel (one thread per output element, f32 accumulation) for shapes cuBLASLt offers no
/// algorithm for (odd alignments, degenerate sizes). Correct, not fast.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace dzr::kernels {

/// Row-major operands: element (m, k) of op(a) lives at a[m * lda + k] (or a[k * lda + m] with trans_a),
/// element (k, n) of op(b) at b[k * ldb + n] (or b[n * ldb + k] with trans_b); out (m, n) at
/// out[m * ldc + n]. Batch i adds i * stride_{a,b,c}. out = alpha * op(a) op(b) + beta * out
/// (beta == 0 does not read out) + bias[n].
struct GemmFallbackArgs {
    DType ab_dtype = DType::F32;
    DType out_dtype = DType::F32;
    bool trans_a = false, trans_b = true;
    int64_t M = 0, N = 0, K = 0, batch = 1;
    const void* a = nullptr;
    int64_t lda = 0, stride_a = 0;
    const void* b = nullptr;
    int64_t ldb = 0, stride_b = 0;
    void* out = nullptr;
    int64_t ldc = 0, stride_c = 0;
    float alpha = 1.f, beta = 0.f;
    const void* bias = nullptr;
    DType bias_dtype = DType::F32;
    bool batched = false;  ///< a rank-3 Backend::gemm call (the CUDA backend's BatchedGemmImpl applies)
};

cudaError_t gemm_fallback(const GemmFallbackArgs& args, cudaStream_t stream);

}  // namespace dzr::kernels
