// Row softmax. Rows of at most 1024 elements: one group of lanes per row, in PyTorch's summation order
// (below). Longer rows: one block per row; pass 1 the max, pass 2 the sum of exponentials, pass 3 the output.
#include "kernels/common.cuh"
#include "kernels/softmax.cuh"

namespace dzr::kernels {
namespace {

constexpr int kLanesMaxCols = 1024;  // rows up to this length take the lane-group kernel
constexpr int kLaneBlock = 128;      // threads per block of the lane-group kernel

// NOTE: the summation order of PyTorch's CUDA softmax for rows of at most 1024 elements (its "persistent"
// warp softmax), so the f32 sums, and with them every rounded output, are the same: with P the row length
// rounded up to a power of two, W = min(P, 32) lanes share a row; lane l holds the elements l, l + W,
// l + 2W, ... (P / W of them, -inf past the row's end), adds their exponentials in that order starting from
// 0, and the lanes then combine by a butterfly (xor offsets W/2, ..., 1). The max is exact in any order.
template <typename Tx, typename To, int kLog2>
__global__ void softmax_lanes_kernel(const Tx* x, To* out, int64_t rows, int cols, float scale) {
    constexpr int kPow2 = 1 << kLog2;
    constexpr int kW = kPow2 < kWarp ? kPow2 : kWarp;
    constexpr int kIters = kPow2 / kW;
    const int lane = int(threadIdx.x) % kW;
    const int64_t row = int64_t(blockIdx.x) * (kLaneBlock / kW) + threadIdx.x / kW;
    // NOTE: rows past the end still take part in the shuffles below (their lanes hold -inf), so every lane
    // of a warp reaches them; only loads and stores are guarded.
    const bool live = row < rows;
    const Tx* src = x + (live ? row : 0) * cols;
    float v[kIters];
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
        const int c = lane + it * kW;
        v[it] = live && c < cols ? scale * to_f32(src[c]) : -INFINITY;
    }
    float mx = v[0];
#pragma unroll
    for (int it = 1; it < kIters; ++it) mx = mx > v[it] ? mx : v[it];
#pragma unroll
    for (int off = kW / 2; off > 0; off /= 2) {
        const float o = __shfl_xor_sync(0xffffffffu, mx, off, kW);
        mx = mx > o ? mx : o;
    }
    float sum = 0.f;
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
        v[it] = expf(v[it] - mx);
        sum += v[it];
    }
#pragma unroll
    for (int off = kW / 2; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off, kW);
    if (!live) return;
    To* dst = out + row * cols;
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
        const int c = lane + it * kW;
        if (c < cols) dst[c] = from_f32<To>(v[it] / sum);
    }
}

template <typename Tx, typename To, int kLog2>
cudaError_t launch_lanes(const Tx* x, To* out, int64_t rows, int cols, float scale, cudaStream_t stream) {
    constexpr int kW = (1 << kLog2) < kWarp ? (1 << kLog2) : kWarp;
    constexpr int64_t kRowsPerBlock = kLaneBlock / kW;
    const int64_t blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
    if (blocks > int64_t(INT32_MAX)) return cudaErrorInvalidValue;
    softmax_lanes_kernel<Tx, To, kLog2><<<unsigned(blocks), kLaneBlock, 0, stream>>>(x, out, rows, cols, scale);
    return cudaGetLastError();
}

template <typename Tx, typename To>
cudaError_t softmax_lanes(const Tx* x, To* out, int64_t rows, int cols, float scale, cudaStream_t stream) {
    int log2 = 0;
    while ((1 << log2) < cols) ++log2;
    switch (log2) {
        case 0: return launch_lanes<Tx, To, 0>(x, out, rows, cols, scale, stream);
        case 1: return launch_lanes<Tx, To, 1>(x, out, rows, cols, scale, stream);
        case 2: return launch_lanes<Tx, To, 2>(x, out, rows, cols, scale, stream);
        case 3: return launch_lanes<Tx, To, 3>(x, out, rows, cols, scale, stream);
        case 4: return launch_lanes<Tx, To, 4>(x, out, rows, cols, scale, stream);
        case 5: return launch_lanes<Tx, To, 5>(x, out, rows, cols, scale, stream);
        case 6: return launch_lanes<Tx, To, 6>(x, out, rows, cols, scale, stream);
        case 7: return launch_lanes<Tx, To, 7>(x, out, rows, cols, scale, stream);
        case 8: return launch_lanes<Tx, To, 8>(x, out, rows, cols, scale, stream);
        case 9: return launch_lanes<Tx, To, 9>(x, out, rows, cols, scale, stream);
        case 10: return launch_lanes<Tx, To, 10>(x, out, rows, cols, scale, stream);
        default: return cudaErrorInvalidValue;
    }
}

template <typename Tx, typename To>
__global__ void softmax_kernel(const Tx* x, To* out, int64_t rows, int64_t cols, float scale) {
    __shared__ float shared[kWarp];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const Tx* row = x + r * cols;
        To* orow = out + r * cols;
        float mx = -INFINITY;
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) mx = fmaxf(mx, scale * to_f32(row[c]));
        mx = block_max(mx, shared);
        float s = 0.f;
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += expf(scale * to_f32(row[c]) - mx);
        const float sum = block_sum(s, shared);
        // NOTE: when out aliases x, each element is read here by the thread that writes it, and the
        // reductions above finished reading the row before (block_sum ends past a barrier). A division
        // (not a multiply by 1/sum) is what PyTorch's softmax does, so a bf16 output rounds the same value.
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
            orow[c] = from_f32<To>(expf(scale * to_f32(row[c]) - mx) / sum);
    }
}

}  // namespace

cudaError_t softmax(const void* x, DType tx, void* out, DType to, int64_t rows, int64_t cols, float scale,
                    cudaStream_t stream) {
    if (rows == 0 || cols == 0) return cudaSuccess;
    if (cols <= kLanesMaxCols)
        return dispatch_float2(tx, to, [&](auto xi, auto xo) {
            using Tx = decltype(xi);
            using To = decltype(xo);
            return softmax_lanes(static_cast<const Tx*>(x), static_cast<To*>(out), rows, int(cols), scale, stream);
        });
    const int threads = row_block_threads(cols, 4);
    const unsigned grid = row_grid(rows);
    return dispatch_float2(tx, to, [&](auto xi, auto xo) {
        using Tx = decltype(xi);
        using To = decltype(xo);
        softmax_kernel<Tx, To><<<grid, threads, 0, stream>>>(static_cast<const Tx*>(x), static_cast<To*>(out), rows,
                                                              cols, scale);
        return cudaGetLastError();
    });
}

}  // namespace dzr::kernels
