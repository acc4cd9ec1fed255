// Row reductions (sum, mean, max) with f32 accumulation, one block per row.
#include "kernels/common.cuh"
#include "kernels/reduce.cuh"

namespace dzr::kernels {
namespace {

template <typename Tx, typename To>
__global__ void reduce_kernel(ReduceKind kind, const Tx* x, To* out, int64_t rows, int64_t cols) {
    __shared__ float shared[kWarp];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const Tx* row = x + r * cols;
        float acc = kind == ReduceKind::Max ? -INFINITY : 0.f;
        for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
            const float v = to_f32(row[c]);
            acc = kind == ReduceKind::Max ? fmaxf(acc, v) : acc + v;
        }
        acc = kind == ReduceKind::Max ? block_max(acc, shared) : block_sum(acc, shared);
        if (kind == ReduceKind::Mean) acc /= float(cols);
        if (threadIdx.x == 0) out[r] = from_f32<To>(acc);
    }
}

template <typename Tx>
__global__ void count_nonfinite_kernel(const Tx* x, int64_t n, int32_t* count) {
    int32_t local = 0;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
        local += isfinite(to_f32(x[i])) ? 0 : 1;
#pragma unroll
    for (int off = kWarp / 2; off > 0; off /= 2) local += __shfl_down_sync(0xffffffffu, local, off);
    if (threadIdx.x % kWarp == 0 && local != 0) atomicAdd(count, local);
}

}  // namespace

cudaError_t count_nonfinite(const void* x, DType tx, int64_t n, int32_t* count, cudaStream_t stream) {
    cudaError_t err = cudaMemsetAsync(count, 0, sizeof(int32_t), stream);
    if (err != cudaSuccess || n == 0) return err;
    constexpr int kThreads = 256;
    const int64_t blocks = (n + kThreads - 1) / kThreads;
    const unsigned grid = unsigned(blocks < 1024 ? blocks : 1024);
    return dispatch_float(tx, [&](auto xi) {
        using Tx = decltype(xi);
        count_nonfinite_kernel<Tx><<<grid, kThreads, 0, stream>>>(static_cast<const Tx*>(x), n, count);
        return cudaGetLastError();
    });
}

cudaError_t reduce_rows(ReduceKind kind, const void* x, DType tx, void* out, DType to, int64_t rows, int64_t cols,
                        cudaStream_t stream) {
    if (rows == 0) return cudaSuccess;
    const int threads = row_block_threads(cols, 4);
    const unsigned grid = row_grid(rows);
    return dispatch_float2(tx, to, [&](auto xi, auto xo) {
        using Tx = decltype(xi);
        using To = decltype(xo);
        reduce_kernel<Tx, To><<<grid, threads, 0, stream>>>(kind, static_cast<const Tx*>(x), static_cast<To*>(out),
                                                             rows, cols);
        return cudaGetLastError();
    });
}

}  // namespace dzr::kernels
