// The VAE's channel L2 norm (+ SiLU) over channels-last rows, a few threads per row (PyTorch's order, below).
// The row (<= a few hundred channels) is read twice, the second time from L1/L2. Fast numerics read it once, with
// 16-byte loads, into registers (vae_norm_fast_kernel).
#include <algorithm>
#include <type_traits>

#include "kernels/common.cuh"
#include "kernels/vae_norm.cuh"

namespace dzr::kernels {
namespace {

// v rounded to the storage type To and back (the identity for f32).
template <typename To>
__device__ __forceinline__ float round_as(float v) {
    return to_f32(from_f32<To>(v));
}

constexpr int kBlock = 256;

// NOTE: the sum of squares in the order of PyTorch's reduction (Reduce.cuh, NormTwoOps) for the reference's
// x.norm(2, dim=1) over the channels of a [.., C, T, H, W] tensor: the reduced dim is not the fastest, so
// every output gets G threads (its block's y extent when the channels are split over warps, else 1) and
// thread y adds the channels y + G·(i + 4k) into four partial sums s_i (vt0 = 4), the last round (tail)
// filling s_0, s_1, ... in order; then ((s0 + s1) + s2) + s3 and the threads' tree (offsets G/2, ..., 1, as
// block_y_reduce combines them). vae_norm_group() gives G from the shape as setReduceConfig does.
//
// Every later step is a separate IEEE f32 operation in the reference's order (sqrt, max, divide, * scale,
// * weight, then x / (1 + expf(-x)) as PyTorch's SiLU kernel writes it); nvcc's default -prec-div/-prec-sqrt
// keep division and sqrt correctly rounded, and the only add (+ 0) gives the same bits whether or not it
// contracts into an FMA. In eager mode each step's float result is rounded to To, as a bf16 eager op stores
// its result.
template <typename Tx, typename To, bool kEager, bool kSilu, int G>
__global__ void __launch_bounds__(kBlock)
    vae_norm_kernel(const Tx* x, To* out, ParamPtr w, int64_t rows, int64_t cols, float eps, float scale) {
    const int y = int(threadIdx.x) % G;
    const int64_t r = int64_t(blockIdx.x) * (kBlock / G) + threadIdx.x / G;
    const bool live = r < rows;  // every thread of the warp takes part in the shuffles
    const Tx* row = x + (live ? r : 0) * cols;
    const auto sq = [&](int64_t c) {
        const float v = to_f32(row[c]);
        return __fmul_rn(v, v);
    };
    float ss = live ? torch_thread_sum(y, G, cols, sq) : 0.f;
#pragma unroll
    for (int off = G / 2; off > 0; off /= 2) ss = __fadd_rn(ss, __shfl_down_sync(0xffffffffu, ss, off, G));
    if constexpr (G > 1) ss = __shfl_sync(0xffffffffu, ss, 0, G);
    if (!live) return;
    float norm = sqrtf(ss);
    // NOTE: a NaN norm stays NaN, as PyTorch's clamp_min keeps it (fmaxf would return eps and turn the row's
    // finite elements into huge values instead of NaN).
    if constexpr (kEager) norm = isnan(norm) ? norm : round_as<To>(fmaxf(round_as<To>(norm), eps));
    else norm = isnan(norm) ? norm : fmaxf(norm, eps);
    To* orow = out + r * cols;
    for (int64_t c = y; c < cols; c += G) {
        float v = to_f32(row[c]) / norm;
        if constexpr (kEager) {
            v = round_as<To>(v);          // x / max(||x||, eps)
            v = round_as<To>(v * scale);  // * sqrt(C)
            v = v * w[c] + 0.f;           // * gamma + 0 (the bias): -0 becomes +0 as in PyTorch
            if constexpr (kSilu) {
                v = round_as<To>(v);
                v = v / (1.f + expf(-v));
            }
        } else {
            v = __fmul_rn(__fmul_rn(v, scale), w[c]) + 0.f;
            if constexpr (kSilu) v = v / (1.f + expf(-v));
        }
        orow[c] = from_f32<To>(v);
    }
}

// Fast numerics: G lanes per row (G a power of two >= the row's 8-channel vectors / kFastVecs), each holding up to
// kFastVecs vectors of 8 bf16 in registers, so the row is read once; sum of squares in f32 (a lane's vectors in
// order, then the lanes' shuffle tree), norm, * scale * gamma (and SiLU) in f32, one rounding to bf16.
constexpr int kFastVecs = 8;

template <bool kSilu, int G>
__global__ void __launch_bounds__(kBlock)
    vae_norm_fast_kernel(const bf16* x, bf16* out, ParamPtr w, int64_t rows, int64_t cols, float eps, float scale) {
    const int lane = int(threadIdx.x) % G;
    const int64_t r = int64_t(blockIdx.x) * (kBlock / G) + threadIdx.x / G;
    const bool live = r < rows;
    const int64_t vecs = cols / 8;
    const bf16* row = x + (live ? r : 0) * cols;
    float v[kFastVecs][8];
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < kFastVecs; ++k) {
        const int64_t j = lane + int64_t(k) * G;
        if (live && j < vecs) {
            unpack8(*reinterpret_cast<const uint4*>(row + j * 8), v[k]);
#pragma unroll
            for (int i = 0; i < 8; ++i) ss = fmaf(v[k][i], v[k][i], ss);
        }
    }
#pragma unroll
    for (int off = G / 2; off > 0; off /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, off, G);
    if (!live) return;
    float norm = sqrtf(ss);
    norm = isnan(norm) ? norm : fmaxf(norm, eps);  // a NaN row stays NaN, as in the reference kernel
    const float inv = scale / norm;
    bf16* orow = out + r * cols;
#pragma unroll
    for (int k = 0; k < kFastVecs; ++k) {
        const int64_t j = lane + int64_t(k) * G;
        if (j < vecs) {
            float y[8];
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                float t = v[k][i] * inv * w[j * 8 + i];
                if constexpr (kSilu) t = t / (1.f + __expf(-t));
                y[i] = t;
            }
            *reinterpret_cast<uint4*>(orow + j * 8) = pack8(y);
        }
    }
}

int last_pow2(int64_t n) {
    int p = 1;
    while (int64_t(p) * 2 <= n) p *= 2;
    return p;
}

}  // namespace

int vae_norm_group(int64_t rows, int64_t cols) {
    // setReduceConfig for a reduction over a strided dim: outputs vectorized by 4 (2, 1) when their count
    // allows, max threads 512 / vec, block x = min(pow2 outputs, 32), y = min(pow2 channels, max / x); the
    // channels are split over the y threads when each would otherwise add at least min(16 y, 256) of them.
    const int vec = rows % 4 == 0 ? 4 : rows % 2 == 0 ? 2 : 1;
    const int max_threads = 512 / vec;
    const int64_t dim0 = rows / vec;
    const int dim0_pow2 = dim0 < max_threads ? last_pow2(dim0) : max_threads;
    const int dim1_pow2 = cols < max_threads ? last_pow2(cols) : max_threads;
    int bw = std::min(dim0_pow2, kWarp);
    const int bh = std::min(dim1_pow2, max_threads / bw);
    const bool split = cols >= std::min(bh * 16, 256);
    // NOTE: more than a warp of threads per output (fewer than 16 outputs with many channels) would need a
    // shared-memory tree; such shapes do not occur in the VAE, and a warp's tree is used for them instead.
    return split ? std::min(bh, kWarp) : 1;
}

cudaError_t vae_norm(const VaeNormArgs& a, cudaStream_t stream) {
    if (a.rows == 0 || a.cols == 0) return cudaSuccess;
    if (a.weight == nullptr) return cudaErrorInvalidValue;
    const ParamPtr w{a.weight, a.tw == DType::BF16};
    const auto aligned16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
    if (a.fast && a.tx == DType::BF16 && a.to == DType::BF16 && a.cols % 8 == 0 && a.cols <= 32 * 8 * kFastVecs &&
        aligned16(a.x) && aligned16(a.out)) {
        int g = 1;
        while (int64_t(g) * kFastVecs * 8 < a.cols) g *= 2;  // lanes per row
        const auto* px = static_cast<const bf16*>(a.x);
        auto* po = static_cast<bf16*>(a.out);
        auto launch = [&](auto kernel, int group) {
            const int64_t blocks = (a.rows + kBlock / group - 1) / (kBlock / group);
            if (blocks > int64_t(INT32_MAX)) return cudaErrorInvalidValue;
            kernel<<<unsigned(blocks), kBlock, 0, stream>>>(px, po, w, a.rows, a.cols, a.eps, a.scale);
            return cudaGetLastError();
        };
        auto by_group = [&](auto silu) {
            constexpr bool kS = decltype(silu)::value;
            switch (g) {
                case 1: return launch(vae_norm_fast_kernel<kS, 1>, 1);
                case 2: return launch(vae_norm_fast_kernel<kS, 2>, 2);
                case 4: return launch(vae_norm_fast_kernel<kS, 4>, 4);
                case 8: return launch(vae_norm_fast_kernel<kS, 8>, 8);
                case 16: return launch(vae_norm_fast_kernel<kS, 16>, 16);
                case 32: return launch(vae_norm_fast_kernel<kS, 32>, 32);
                default: return cudaErrorInvalidValue;
            }
        };
        return a.silu ? by_group(std::true_type{}) : by_group(std::false_type{});
    }
    const int g = vae_norm_group(a.rows, a.cols);
    return dispatch_float2(a.tx, a.to, [&](auto xi, auto xo) {
        using Tx = decltype(xi);
        using To = decltype(xo);
        const auto* px = static_cast<const Tx*>(a.x);
        auto* po = static_cast<To*>(a.out);
        auto launch = [&](auto kernel, int group) {
            const int64_t blocks = (a.rows + kBlock / group - 1) / (kBlock / group);
            if (blocks > int64_t(INT32_MAX)) return cudaErrorInvalidValue;
            kernel<<<unsigned(blocks), kBlock, 0, stream>>>(px, po, w, a.rows, a.cols, a.eps, a.scale);
            return cudaGetLastError();
        };
        auto by_group = [&](auto eager, auto silu) {
            constexpr bool kE = decltype(eager)::value, kS = decltype(silu)::value;
            switch (g) {
                case 1: return launch(vae_norm_kernel<Tx, To, kE, kS, 1>, 1);
                case 2: return launch(vae_norm_kernel<Tx, To, kE, kS, 2>, 2);
                case 4: return launch(vae_norm_kernel<Tx, To, kE, kS, 4>, 4);
                case 8: return launch(vae_norm_kernel<Tx, To, kE, kS, 8>, 8);
                case 16: return launch(vae_norm_kernel<Tx, To, kE, kS, 16>, 16);
                case 32: return launch(vae_norm_kernel<Tx, To, kE, kS, 32>, 32);
                default: return cudaErrorInvalidValue;
            }
        };
        using T = std::true_type;
        using F = std::false_type;
        if (a.eager) return a.silu ? by_group(T{}, T{}) : by_group(T{}, F{});
        return a.silu ? by_group(F{}, T{}) : by_group(F{}, F{});
    });
}

}  // namespace dzr::kernels
