// Row softmax: one block per row; pass 1 the max, pass 2 the sum of exponentials, pass 3 the output.
#include "kernels/common.cuh"
#include "kernels/softmax.cuh"

namespace dzr::kernels {
namespace {

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
    int threads = kWarp;
    while (threads < 512 && threads * 4 < cols) threads *= 2;
    const unsigned grid = unsigned(rows < (int64_t(1) << 20) ? rows : (int64_t(1) << 20));
    return dispatch_float2(tx, to, [&](auto xi, auto xo) {
        using Tx = decltype(xi);
        using To = decltype(xo);
        softmax_kernel<Tx, To><<<grid, threads, 0, stream>>>(static_cast<const Tx*>(x), static_cast<To*>(out), rows,
                                                              cols, scale);
        return cudaGetLastError();
    });
}

}  // namespace dzr::kernels
