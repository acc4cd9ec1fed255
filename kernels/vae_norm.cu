// The VAE's channel L2 norm (+ SiLU): one warp per channels-last row. The row (<= a few hundred
// channels) is read twice, the second time from L1/L2.
#include "kernels/common.cuh"
#include "kernels/vae_norm.cuh"

namespace dzr::kernels {
namespace {

// v rounded to the storage type To and back (the identity for f32).
template <typename To>
__device__ __forceinline__ float round_as(float v) {
    return to_f32(from_f32<To>(v));
}

constexpr int kRowsPerBlock = 8;

// NOTE: every step is a separate IEEE f32 operation in the reference's order (sqrt, max, divide,
// * scale, * weight, then x / (1 + expf(-x)) as PyTorch's SiLU kernel writes it); nvcc's default
// -prec-div/-prec-sqrt keep division and sqrt correctly rounded, and the only add (+ 0) gives the same
// bits whether or not it contracts into an FMA. In eager mode each step's float result is rounded to To, as a bf16 eager op
// stores its result.
template <typename Tx, typename To, bool kEager, bool kSilu>
__global__ void vae_norm_kernel(const Tx* x, To* out, ParamPtr w, int64_t rows, int64_t cols, float eps,
                                float scale) {
    const int lane = threadIdx.x % kWarp;
    const int64_t step = int64_t(gridDim.x) * kRowsPerBlock;
    for (int64_t r = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp; r < rows; r += step) {
        const Tx* row = x + r * cols;
        float ss = 0.f;
        for (int64_t c = lane; c < cols; c += kWarp) {
            const float v = to_f32(row[c]);
            ss += v * v;
        }
        ss = warp_sum(ss);
        float norm = sqrtf(ss);
        if constexpr (kEager) norm = round_as<To>(fmaxf(round_as<To>(norm), eps));
        else norm = fmaxf(norm, eps);
        To* orow = out + r * cols;
        for (int64_t c = lane; c < cols; c += kWarp) {
            float y = to_f32(row[c]) / norm;
            if constexpr (kEager) {
                y = round_as<To>(y);          // x / max(||x||, eps)
                y = round_as<To>(y * scale);  // * sqrt(C)
                y = y * w[c] + 0.f;           // * gamma + 0 (the bias): -0 becomes +0 as in PyTorch
                if constexpr (kSilu) {
                    y = round_as<To>(y);
                    y = y / (1.f + expf(-y));
                }
            } else {
                y = y * scale * w[c] + 0.f;
                if constexpr (kSilu) y = y / (1.f + expf(-y));
            }
            orow[c] = from_f32<To>(y);
        }
    }
}

}  // namespace

cudaError_t vae_norm(const VaeNormArgs& a, cudaStream_t stream) {
    if (a.rows == 0 || a.cols == 0) return cudaSuccess;
    if (a.weight == nullptr) return cudaErrorInvalidValue;
    const ParamPtr w{a.weight, a.tw == DType::BF16};
    const int64_t blocks = (a.rows + kRowsPerBlock - 1) / kRowsPerBlock;
    const unsigned grid = unsigned(blocks < (int64_t(1) << 20) ? blocks : (int64_t(1) << 20));
    return dispatch_float2(a.tx, a.to, [&](auto xi, auto xo) {
        using Tx = decltype(xi);
        using To = decltype(xo);
        const auto* px = static_cast<const Tx*>(a.x);
        auto* po = static_cast<To*>(a.out);
        auto launch = [&](auto kernel) {
            kernel<<<grid, kRowsPerBlock * kWarp, 0, stream>>>(px, po, w, a.rows, a.cols, a.eps, a.scale);
            return cudaGetLastError();
        };
        if (a.eager)
            return a.silu ? launch(vae_norm_kernel<Tx, To, true, true>) : launch(vae_norm_kernel<Tx, To, true, false>);
        return a.silu ? launch(vae_norm_kernel<Tx, To, false, true>) : launch(vae_norm_kernel<Tx, To, false, false>);
    });
}

}  // namespace dzr::kernels
