// A plain GEMM: one thread per output element, f32 accumulation, for shapes cuBLASLt rejects.
#include "kernels/common.cuh"
#include "kernels/gemm_fallback.cuh"

namespace dzr::kernels {
namespace {

template <typename T, typename To>
__global__ void gemm_fallback_kernel(GemmFallbackArgs g) {
    const int64_t total = g.batch * g.M * g.N, step = int64_t(gridDim.x) * blockDim.x;
    const ParamPtr bias{g.bias, g.bias_dtype == DType::BF16};
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
        const int64_t n = i % g.N, m = (i / g.N) % g.M, bi = i / (g.N * g.M);
        const T* a = static_cast<const T*>(g.a) + bi * g.stride_a;
        const T* b = static_cast<const T*>(g.b) + bi * g.stride_b;
        To* c = static_cast<To*>(g.out) + bi * g.stride_c + m * g.ldc + n;
        float acc = 0.f;
        for (int64_t k = 0; k < g.K; ++k) {
            const float av = to_f32(g.trans_a ? a[k * g.lda + m] : a[m * g.lda + k]);
            const float bv = to_f32(g.trans_b ? b[n * g.ldb + k] : b[k * g.ldb + n]);
            acc = fmaf(av, bv, acc);
        }
        float v = g.alpha * acc;
        if (g.beta != 0.f) v += g.beta * to_f32(*c);
        if (bias.defined()) v += bias[n];
        *c = from_f32<To>(v);
    }
}

}  // namespace

cudaError_t gemm_fallback(const GemmFallbackArgs& args, cudaStream_t stream) {
    const int64_t total = args.batch * args.M * args.N;
    if (total == 0) return cudaSuccess;
    constexpr int kThreads = 256;
    return dispatch_float2(args.ab_dtype, args.out_dtype, [&](auto xi, auto xo) {
        gemm_fallback_kernel<decltype(xi), decltype(xo)><<<grid_for(total, kThreads), kThreads, 0, stream>>>(args);
        return cudaGetLastError();
    });
}

}  // namespace dzr::kernels
