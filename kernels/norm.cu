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

unsigned row_grid(int64_t rows) { return unsigned(rows < (int64_t(1) << 20) ? rows : (int64_t(1) << 20)); }

}  // namespace

cudaError_t layer_norm(const void* x, DType tx, void* out, DType to, int64_t rows, int64_t cols, float eps,
                       const void* weight, DType tw, const void* bias, DType tb, cudaStream_t stream) {
    if (rows == 0 || cols == 0) return cudaSuccess;
    const bool vec = cols % 8 == 0 && aligned16(x) && aligned16(out);
    const int threads = row_block_threads(cols);
    const ParamPtr w{weight, tw == DType::BF16}, b{bias, tb == DType::BF16};
    return dispatch_float2(tx, to, [&](auto xi, auto xo) {
        using Tx = decltype(xi);
        using To = decltype(xo);
        const auto* px = static_cast<const Tx*>(x);
        auto* po = static_cast<To*>(out);
        if (vec)
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
        if (vec)
            rms_norm_kernel<Tx, To, true><<<row_grid(rows), threads, 0, stream>>>(px, po, rows, cols, eps, w);
        else
            rms_norm_kernel<Tx, To, false><<<row_grid(rows), threads, 0, stream>>>(px, po, rows, cols, eps, w);
        return cudaGetLastError();
    });
}

}  // namespace dzr::kernels
