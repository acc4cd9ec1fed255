// LayerNorm and RMSNorm: one block per row, f32 statistics through block reductions. The row is read
// once per pass; for the widths used here (<= 13824 channels) it stays in L1/L2 between passes.
#include "kernels/common.cuh"
#include "kernels/norm.cuh"

namespace dzr::kernels {
namespace {

// Calls f(c, v) for every element of the row (v as f32), 8 at a time through 16-byte loads with kVec.
template <typename T, bool kVec, typename F>
__device__ __forceinline__ void for_row(const T* row, int64_t cols, F&& f) {
    if constexpr (kVec) {
        for (int64_t c = int64_t(threadIdx.x) * 8; c < cols; c += int64_t(blockDim.x) * 8) {
            float v[8];
            Vec8<T>::load(row + c, v);
#pragma unroll
            for (int k = 0; k < 8; ++k) f(c + k, v[k]);
        }
    } else {
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) f(c, to_f32(row[c]));
    }
}

// Writes g(c, x[c]) for every element of the row.
template <typename Tx, typename To, bool kVec, typename G>
__device__ __forceinline__ void map_row(const Tx* row, To* orow, int64_t cols, G&& g) {
    if constexpr (kVec) {
        for (int64_t c = int64_t(threadIdx.x) * 8; c < cols; c += int64_t(blockDim.x) * 8) {
            float v[8];
            Vec8<Tx>::load(row + c, v);
#pragma unroll
            for (int k = 0; k < 8; ++k) v[k] = g(c + k, v[k]);
            Vec8<To>::store(orow + c, v);
        }
    } else {
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) orow[c] = from_f32<To>(g(c, to_f32(row[c])));
    }
}

template <typename Tx, typename To, bool kVec>
__global__ void layer_norm_kernel(const Tx* x, To* out, int64_t rows, int64_t cols, float eps, ParamPtr w,
                                  ParamPtr b) {
    __shared__ float shared[kWarp];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const Tx* row = x + r * cols;
        float s = 0.f;
        for_row<Tx, kVec>(row, cols, [&](int64_t, float v) { s += v; });
        const float mean = block_sum(s, shared) / float(cols);
        float q = 0.f;
        for_row<Tx, kVec>(row, cols, [&](int64_t, float v) { q += (v - mean) * (v - mean); });
        const float inv = rsqrtf(block_sum(q, shared) / float(cols) + eps);
        map_row<Tx, To, kVec>(row, out + r * cols, cols, [&](int64_t c, float v) {
            float y = (v - mean) * inv;
            if (w.defined()) y *= w[c];
            if (b.defined()) y += b[c];
            return y;
        });
    }
}

// ---- LayerNorm in PyTorch's arithmetic order ------------------------------------------------------
// PyTorch's CUDA LayerNorm (its vectorized kernel: rows with a width divisible by 4, which every LayerNorm
// here has) computes the statistics with a Welford recurrence in a fixed order: a block of 4 warps, thread
// t folding in elements 4t..4t+3, 4(t+128).., one at a time; then the lanes of each warp merged by a
// shuffle-down tree, then the 4 warps pairwise (2+3 into 0+1, then 1 into 0). In bf16 the result rounds
// differently from a two-pass mean/variance in some elements, so dzr's CUDA LayerNorm follows the same
// order and the same floating-point expressions (below, written so nvcc contracts them as in PyTorch's
// build: no fast math, default FMA contraction).
constexpr int kLnWarps = 4, kLnVec = 4;

struct Welford {
    float mean = 0.f, m2 = 0.f, count = 0.f;
};

__device__ __forceinline__ Welford welford_push(Welford w, float v) {
    const float delta = v - w.mean;
    const float count = w.count + 1.f;
    const float mean = w.mean + delta * (1.f / count);
    return {mean, w.m2 + delta * (v - mean), count};
}

// `own` absorbs `other` (the operand order matters for rounding).
__device__ __forceinline__ Welford welford_merge(Welford own, Welford other) {
    const float delta = own.mean - other.mean;
    const float count = other.count + own.count;
    if (!(count > 0.f)) return {0.f, 0.f, count};
    const float inv = 1.f / count;
    const float w_other = other.count * inv;
    const float w_own = own.count * inv;
    const float mean = w_other * other.mean + w_own * own.mean;
    const float m2 = other.m2 + own.m2 + delta * delta * other.count * w_own;
    return {mean, m2, count};
}

template <typename Tx, typename To>
__global__ void __launch_bounds__(kWarp * kLnWarps)
    layer_norm_welford_kernel(const Tx* x, To* out, int64_t rows, int cols, float eps, ParamPtr w, ParamPtr b) {
    __shared__ float part[3 * kLnWarps];
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
    const int groups = cols / kLnVec;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const Tx* row = x + r * int64_t(cols);
        Welford s;
        for (int g = int(threadIdx.x); g < groups; g += kWarp * kLnWarps)
#pragma unroll
            for (int k = 0; k < kLnVec; ++k) s = welford_push(s, to_f32(row[g * kLnVec + k]));
        for (int o = kWarp / 2; o > 0; o >>= 1) {
            Welford t;
            t.mean = __shfl_down_sync(0xffffffffu, s.mean, o);
            t.m2 = __shfl_down_sync(0xffffffffu, s.m2, o);
            t.count = __shfl_down_sync(0xffffffffu, s.count, o);
            s = welford_merge(s, t);
        }
        for (int half = kLnWarps / 2; half > 0; half /= 2) {
            if (lane == 0 && warp >= half && warp < 2 * half) {
                const int slot = warp - half;
                part[2 * slot] = s.mean;
                part[2 * slot + 1] = s.m2;
                part[2 * kLnWarps + slot] = s.count;
            }
            __syncthreads();
            if (lane == 0 && warp < half) s = welford_merge(s, Welford{part[2 * warp], part[2 * warp + 1],
                                                                       part[2 * kLnWarps + warp]});
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            part[0] = s.mean;
            part[1] = s.m2 / float(cols);
        }
        __syncthreads();
        const float mean = part[0], var = part[1];
        __syncthreads();  // NOTE: `part` is rewritten by the next row
        const float rstd = rsqrtf(var + eps);
        To* orow = out + r * int64_t(cols);
        for (int c = int(threadIdx.x); c < cols; c += blockDim.x) {
            const float v = to_f32(row[c]);
            float y;
            // NOTE: the fused multiply-adds are explicit: they are what nvcc's default contraction makes of
            // PyTorch's `gamma * (rstd * (x - mean)) + beta` (bit-identical on the H200, kernel_probe.py).
            if (w.defined() && b.defined()) y = __fmaf_rn(w[c], rstd * (v - mean), b[c]);
            else if (w.defined()) y = w[c] * (rstd * (v - mean));
            else if (b.defined()) y = __fmaf_rn(rstd, v - mean, b[c]);
            else y = rstd * (v - mean);
            orow[c] = from_f32<To>(y);
        }
    }
}

template <typename Tx, typename To, bool kVec>
__global__ void rms_norm_kernel(const Tx* x, To* out, int64_t rows, int64_t cols, float eps, ParamPtr w) {
    __shared__ float shared[kWarp];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const Tx* row = x + r * cols;
        float s = 0.f;
        for_row<Tx, kVec>(row, cols, [&](int64_t, float v) { s += v * v; });
        const float inv = rsqrtf(block_sum(s, shared) / float(cols) + eps);
        // NOTE: x * rsqrt(...) is rounded to the output type before the weight multiply, as Wan's and
        // umT5's RMSNorm modules do (`norm(x.float()).type_as(x) * weight`): one bf16 rounding more
        // than a fused formula, and the same value PyTorch rounds.
        map_row<Tx, To, kVec>(row, out + r * cols, cols, [&](int64_t c, float v) {
            const float y = to_f32(from_f32<To>(v * inv));
            return w.defined() ? y * w[c] : y;
        });
    }
}

// ---- RMSNorm in PyTorch's order -----------------------------------------------------------------------
//
// The reference computes `x.float().pow(2).mean(-1, keepdim=True)` with PyTorch's generic CUDA reduction
// (Reduce.cuh, MeanOps), then `+ eps`, `rsqrt`, `x * r`, the cast and the weight product as separate kernels.
// For a contiguous [rows, cols] input with rows >= 16 and cols of at most 8160, that reduction gives each row
// one warp and no cross-warp or cross-block step (block 32 x 16, input split over the 32 lanes); what a lane
// adds, and in which order, is:
//   cols >= 128 ("vectorize along input", 4-wide): four partial sums, the i-th over the elements 4v + i for
//     v = lane, lane + 32, ... (4v + 3 < cols; cols % 4 == 0 here, so no head or tail), combined
//     ((s0 + s1) + s2) + s3;
//   cols < 128 (vt0 = 4 unrolled): four partial sums, the i-th over lane + 32 i + 128 k, the last partial
//     rounds (tail) filling s0, s1, ... in order; combined the same way;
// then the lanes by shuffle-down with offsets 16, 8, 4, 2, 1, and the mean as sum * (rows / (rows * cols))
// in float (MeanOps::project). Every step is one rounded f32 operation (no contraction across them).
constexpr int kRmsTorchBlock = 128;  // 4 rows per block

bool rms_torch_order(int64_t rows, int64_t cols) {
    if (rows < 16 || cols > 8160) return false;  // block height 16, fewer than 256 values per lane
    if (cols >= 128) return cols % 4 == 0;       // the vectorized path without a misaligned head
    return cols >= 32;                           // a full warp of lanes
}

template <typename Tx, typename To>
__global__ void __launch_bounds__(kRmsTorchBlock)
    rms_norm_torch_kernel(const Tx* x, To* out, int64_t rows, int cols, float factor, float eps, ParamPtr w) {
    const int lane = int(threadIdx.x) % kWarp;
    const int64_t r = int64_t(blockIdx.x) * (kRmsTorchBlock / kWarp) + threadIdx.x / kWarp;
    const bool live = r < rows;  // every lane takes part in the shuffles
    const Tx* row = x + (live ? r : 0) * int64_t(cols);
    const auto sq = [&](int c) {
        const float v = to_f32(row[c]);
        return __fmul_rn(v, v);
    };
    float sum = 0.f;
    if (live && cols >= 128) {
        float s[4] = {0.f, 0.f, 0.f, 0.f};
        for (int v = lane; 4 * v + 3 < cols; v += kWarp) {
#pragma unroll
            for (int i = 0; i < 4; ++i) s[i] = __fadd_rn(s[i], sq(4 * v + i));
        }
        sum = __fadd_rn(__fadd_rn(__fadd_rn(s[0], s[1]), s[2]), s[3]);
    } else if (live) {
        sum = torch_thread_sum(lane, kWarp, cols, [&](int64_t c) { return sq(int(c)); });
    }
#pragma unroll
    for (int off = kWarp / 2; off > 0; off /= 2) sum = __fadd_rn(sum, __shfl_down_sync(0xffffffffu, sum, off));
    sum = __shfl_sync(0xffffffffu, sum, 0);
    if (!live) return;
    const float inv = rsqrtf(__fadd_rn(__fmul_rn(sum, factor), eps));
    To* orow = out + r * int64_t(cols);
    for (int c = lane; c < cols; c += kWarp) {
        const float y = to_f32(from_f32<To>(__fmul_rn(to_f32(row[c]), inv)));  // `.type_as(x)`
        orow[c] = from_f32<To>(w.defined() ? __fmul_rn(y, w[c]) : y);
    }
}

}  // namespace

cudaError_t layer_norm(const void* x, DType tx, void* out, DType to, int64_t rows, int64_t cols, float eps,
                       const void* weight, DType tw, const void* bias, DType tb, cudaStream_t stream) {
    if (rows == 0 || cols == 0) return cudaSuccess;
    const bool vec = cols % 8 == 0 && aligned16(x) && aligned16(out);
    const int threads = row_block_threads(cols);
    const ParamPtr w{weight, tw == DType::BF16}, b{bias, tb == DType::BF16};
    // PyTorch's order whenever its vectorized kernel would run (width divisible by 4, below 2^24)
    const bool torch_order = cols % kLnVec == 0 && cols < (int64_t(1) << 24);
    return dispatch_float2(tx, to, [&](auto xi, auto xo) {
        using Tx = decltype(xi);
        using To = decltype(xo);
        const auto* px = static_cast<const Tx*>(x);
        auto* po = static_cast<To*>(out);
        if (torch_order)
            layer_norm_welford_kernel<Tx, To>
                <<<row_grid(rows), kWarp * kLnWarps, 0, stream>>>(px, po, rows, int(cols), eps, w, b);
        else if (vec)
            layer_norm_kernel<Tx, To, true><<<row_grid(rows), threads, 0, stream>>>(px, po, rows, cols, eps, w, b);
        else
            layer_norm_kernel<Tx, To, false><<<row_grid(rows), threads, 0, stream>>>(px, po, rows, cols, eps, w, b);
        return cudaGetLastError();
    });
}

cudaError_t rms_norm(const void* x, DType tx, void* out, DType to, int64_t rows, int64_t cols, float eps,
                     const void* weight, DType tw, cudaStream_t stream) {
    if (rows == 0 || cols == 0) return cudaSuccess;
    const bool vec = cols % 8 == 0 && aligned16(x) && aligned16(out);
    const int threads = row_block_threads(cols);
    const ParamPtr w{weight, tw == DType::BF16};
    return dispatch_float2(tx, to, [&](auto xi, auto xo) {
        using Tx = decltype(xi);
        using To = decltype(xo);
        const auto* px = static_cast<const Tx*>(x);
        auto* po = static_cast<To*>(out);
        if (rms_torch_order(rows, cols)) {
            // MeanOps' factor: float(outputs) / numel, in float as PyTorch computes it
            const float factor = float(rows) / float(rows * cols);
            const int64_t blocks = (rows + kRmsTorchBlock / kWarp - 1) / (kRmsTorchBlock / kWarp);
            if (blocks > int64_t(INT32_MAX)) return cudaErrorInvalidValue;
            rms_norm_torch_kernel<Tx, To>
                <<<unsigned(blocks), kRmsTorchBlock, 0, stream>>>(px, po, rows, int(cols), factor, eps, w);
        } else if (vec)
            rms_norm_kernel<Tx, To, true><<<row_grid(rows), threads, 0, stream>>>(px, po, rows, cols, eps, w);
        else
            rms_norm_kernel<Tx, To, false><<<row_grid(rows), threads, 0, stream>>>(px, po, rows, cols, eps, w);
        return cudaGetLastError();
    });
}

}  // namespace dzr::kernels
