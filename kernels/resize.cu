// Bicubic resize in PyTorch's arithmetic (see resize.cuh).
#include "kernels/common.cuh"
#include "kernels/resize.cuh"

namespace dzr::kernels {
namespace {

// NOTE: the expressions below keep the form of PyTorch's (UpSample.cuh): Keys' kernel in its two pieces,
// the taps of t and of 1 - t (the latter's outer tap at (1 - t) + 1, not 2 - t), the source index
// scale * (dst + 0.5) - 0.5 and the four-term sums left to right. nvcc contracts a product followed by an
// add into an FMA by default; written the same way, the same pairs fuse, and the f32 results agree bit for bit.
__device__ __forceinline__ float keys_near(float x, float A) { return ((A + 2) * x - (A + 3)) * x * x + 1; }

__device__ __forceinline__ float keys_far(float x, float A) { return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A; }

__device__ __forceinline__ float cubic_1d(float x0, float x1, float x2, float x3, float t) {
    const float A = -0.75f;
    float w[4];
    w[0] = keys_far(t + 1.0, A);
    w[1] = keys_near(t, A);
    const float u = 1.0 - t;
    w[2] = keys_near(u, A);
    w[3] = keys_far(u + 1.0, A);
    return x0 * w[0] + x1 * w[1] + x2 * w[2] + x3 * w[3];
}

__global__ void resize_bicubic_kernel(const float* src, float* dst, int64_t channels, int in_h, int in_w, int out_h,
                                      int out_w, float scale_h, float scale_w) {
    const int64_t n = int64_t(out_h) * out_w;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const int oy = int(i / out_w), ox = int(i % out_w);
        const float sx = scale_w * (ox + 0.5f) - 0.5f;
        const int ix = int(floorf(sx));
        const float tx = sx - ix;
        const float sy = scale_h * (oy + 0.5f) - 0.5f;
        const int iy = int(floorf(sy));
        const float ty = sy - iy;
        const auto at = [&](const float* img, int y, int x) {
            y = max(min(y, in_h - 1), 0);
            x = max(min(x, in_w - 1), 0);
            return img[int64_t(y) * in_w + x];
        };
        for (int64_t c = 0; c < channels; ++c) {
            const float* img = src + c * int64_t(in_h) * in_w;
            float rows[4];
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const int y = iy - 1 + k;
                rows[k] = cubic_1d(at(img, y, ix - 1), at(img, y, ix), at(img, y, ix + 1), at(img, y, ix + 2), tx);
            }
            dst[c * n + i] = cubic_1d(rows[0], rows[1], rows[2], rows[3], ty);
        }
    }
}

}  // namespace

cudaError_t resize_bicubic(const float* src, float* dst, int64_t channels, int in_h, int in_w, int out_h, int out_w,
                           cudaStream_t stream) {
    if (channels == 0 || out_h == 0 || out_w == 0) return cudaSuccess;
    // area_pixel_compute_scale: float(in) / out, computed on the host in float
    const float scale_h = float(in_h) / float(out_h), scale_w = float(in_w) / float(out_w);
    const int threads = 256;
    resize_bicubic_kernel<<<grid_for(int64_t(out_h) * out_w, threads), threads, 0, stream>>>(
        src, dst, channels, in_h, in_w, out_h, out_w, scale_h, scale_w);
    return cudaGetLastError();
}

}  // namespace dzr::kernels
