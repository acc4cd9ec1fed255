// Pointwise activations.
#include "kernels/activation.cuh"
#include "kernels/common.cuh"

namespace dzr::kernels {
namespace {

template <ActKind kKind>
__device__ __forceinline__ float act(float v) {
    if constexpr (kKind == ActKind::GeluTanh) {
        // 0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3)))
        return 0.5f * v * (1.f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
    } else if constexpr (kKind == ActKind::GeluErf) {
        return 0.5f * v * (1.f + erff(v * 0.7071067811865476f));
    } else if constexpr (kKind == ActKind::Silu) {
        return v / (1.f + expf(-v));
    } else {
        return v > 0.f ? v : 0.f;
    }
}

template <ActKind kKind, typename Tx, typename To, bool kVec>
__global__ void activation_kernel(const Tx* x, To* out, int64_t n) {
    const int64_t step = int64_t(gridDim.x) * blockDim.x;
    if constexpr (kVec) {
        for (int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < n / 8; v += step) {
            float t[8];
            Vec8<Tx>::load(x + v * 8, t);
#pragma unroll
            for (int k = 0; k < 8; ++k) t[k] = act<kKind>(t[k]);
            Vec8<To>::store(out + v * 8, t);
        }
    } else {
        for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step)
            out[i] = from_f32<To>(act<kKind>(to_f32(x[i])));
    }
}

template <ActKind kKind>
cudaError_t launch(const void* x, DType tx, void* out, DType to, int64_t n, cudaStream_t stream) {
    constexpr int kThreads = 256;
    const bool vec = n % 8 == 0 && aligned16(x) && aligned16(out);
    return dispatch_float2(tx, to, [&](auto xi, auto xo) {
        using Tx = decltype(xi);
        using To = decltype(xo);
        const auto* px = static_cast<const Tx*>(x);
        auto* po = static_cast<To*>(out);
        if (vec)
            activation_kernel<kKind, Tx, To, true><<<grid_for(n / 8, kThreads), kThreads, 0, stream>>>(px, po, n);
        else
            activation_kernel<kKind, Tx, To, false><<<grid_for(n, kThreads), kThreads, 0, stream>>>(px, po, n);
        return cudaGetLastError();
    });
}

}  // namespace

cudaError_t activation(ActKind kind, const void* x, DType tx, void* out, DType to, int64_t n, cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    switch (kind) {
        case ActKind::GeluTanh:
            return launch<ActKind::GeluTanh>(x, tx, out, to, n, stream);
        case ActKind::GeluErf:
            return launch<ActKind::GeluErf>(x, tx, out, to, n, stream);
        case ActKind::Silu:
            return launch<ActKind::Silu>(x, tx, out, to, n, stream);
        case ActKind::Relu:
            return launch<ActKind::Relu>(x, tx, out, to, n, stream);
    }
    return cudaErrorInvalidValue;
}

}  // namespace dzr::kernels
