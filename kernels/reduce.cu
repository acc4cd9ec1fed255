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

}  // namespace

cudaError_t reduce_rows(ReduceKind kind, const void* x, DType tx, void* out, DType to, int64_t rows, int64_t cols,
                        cudaStream_t stream) {
    if (rows == 0) return cudaSuccess;
    int threads = kWarp;
    while (threads < 512 && threads * 4 < cols) threads *= 2;
    const unsigned grid = unsigned(rows < (int64_t(1) << 20) ? rows : (int64_t(1) << 20));
    return dispatch_float2(tx, to, [&](auto xi, auto xo) {
        using Tx = decltype(xi);
        using To = decltype(xo);
        reduce_kernel<Tx, To><<<grid, threads, 0, stream>>>(kind, static_cast<const Tx*>(x), static_cast<To*>(out),
                                                             rows, cols);
        return cudaGetLastError();
    });
}

}  // namespace dzr::kernels
