// Pointwise activations.
#include "kernels/activation.cuh"
#include "kernels/common.cuh"

namespace dzr::kernels {
namespace {

// v rounded to the storage type To and back (the identity for f32).
template <typename To>
__device__ __forceinline__ float round_as(float v) {
    return to_f32(from_f32<To>(v));
}

// NOTE: each formula is evaluated in the order PyTorch's CUDA kernel evaluates it (float opmath, no
// fast-math intrinsics), so a bf16 result rounds the same float value PyTorch rounds.
template <ActKind kKind, typename To>
__device__ __forceinline__ float act(float v) {
    if constexpr (kKind == ActKind::GeluTanh) {
        return gelu_tanh(v);
    } else if constexpr (kKind == ActKind::GeluErf) {
        return v * 0.5f * (1.f + erff(v * 0.7071067811865476f));
    } else if constexpr (kKind == ActKind::Silu) {
        return v / (1.f + expf(-v));
    } else if constexpr (kKind == ActKind::Sigmoid) {
        return 1.f / (1.f + expf(-v));
    } else if constexpr (kKind == ActKind::GeluTanhStepwise) {
        // umT5's GELU module, one rounding per eager op: 0.5 * x, pow(x, 3), 0.044715 * (.), x + (.),
        // sqrt(2/pi) * (.), tanh, 1 + (.), product.
        // NOTE: PyTorch's CUDA pow(x, 3) is `base * base * base` in the tensor's own type (PowKernel.cu), so
        // on bf16 the square rounds before the third factor: two roundings, not one.
        const float half = round_as<To>(0.5f * v);
        const float cube = round_as<To>(round_as<To>(v * v) * v);
        const float inner = round_as<To>(0.7978845608028654f * round_as<To>(v + round_as<To>(0.044715f * cube)));
        return half * round_as<To>(1.f + round_as<To>(tanhf(inner)));
    } else {
        return v <= 0.f ? 0.f : v;  // NOTE: NaN passes, as torch.relu lets it (`v > 0 ? v : 0` would zero it)
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
            for (int k = 0; k < 8; ++k) t[k] = act<kKind, To>(t[k]);
            Vec8<To>::store(out + v * 8, t);
        }
    } else {
        for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step)
            out[i] = from_f32<To>(act<kKind, To>(to_f32(x[i])));
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
        return launch_elementwise(n, vec, kThreads, [&](auto kVec, unsigned grid) {
            activation_kernel<kKind, Tx, To, decltype(kVec)::value><<<grid, kThreads, 0, stream>>>(px, po, n);
        });
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
        case ActKind::Sigmoid:
            return launch<ActKind::Sigmoid>(x, tx, out, to, n, stream);
        case ActKind::GeluTanhStepwise:
            return launch<ActKind::GeluTanhStepwise>(x, tx, out, to, n, stream);
    }
    return cudaErrorInvalidValue;
}

}  // namespace dzr::kernels
