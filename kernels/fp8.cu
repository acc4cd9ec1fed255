// FP8 (E4M3) quantization, dequantization, the plain FP8 GEMM and the FP8 KV pool's scatter and gather.
// Every conversion and scale follows core/fp8.h bit for bit: amax by fmaxf (NaN skipped), scale = max(amax,
// 1e-12) / 448 and the multiplier 448 / max(amax, 1e-12) by IEEE divisions, codes by cvt.rn.satfinite.
#include <cuda_fp8.h>

#include "kernels/common.cuh"
#include "kernels/fp8.cuh"

namespace dzr::kernels {
namespace {

// NOTE: the host's kFp8E4M3Max and kFp8MinAmax (core/fp8.h)
constexpr float kMax = 448.0f;
constexpr float kMinAmax = 1e-12f;

__device__ __forceinline__ uint8_t to_e4m3(float v) {
    return uint8_t(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
}

__device__ __forceinline__ float from_e4m3(uint8_t q) {
    const __half_raw h = __nv_cvt_fp8_to_halfraw(__nv_fp8_storage_t(q), __NV_E4M3);
    return __half2float(__half(h));
}

/// (scale, multiplier) of a row with this absolute maximum (fp8_row_scale).
__device__ __forceinline__ float2 row_scale(float amax) {
    const float a = fmaxf(amax, kMinAmax);
    return make_float2(__fdiv_rn(a, kMax), __fdiv_rn(kMax, a));
}

template <typename T>
__global__ void quantize_rows_kernel(const T* x, int64_t cols, int64_t ld, uint8_t* q, float* scales) {
    __shared__ float shared[kWarp];
    const int64_t r = blockIdx.x;
    const T* row = x + r * ld;
    float amax = 0.f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) amax = fmaxf(amax, fabsf(to_f32(row[c])));
    amax = block_max(amax, shared);
    const float2 s = row_scale(amax);
    uint8_t* out = q + r * cols;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) out[c] = to_e4m3(__fmul_rn(to_f32(row[c]), s.y));
    if (threadIdx.x == 0) scales[r] = s.x;
}

template <typename T>
__global__ void dequantize_rows_kernel(const uint8_t* q, const float* scales, int64_t rows, int64_t cols, T* out) {
    const int64_t total = rows * cols, step = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step)
        out[i] = from_f32<T>(__fmul_rn(from_e4m3(q[i]), scales[i / cols]));
}

template <typename To>
__global__ void gemm_fp8_kernel(Fp8GemmArgs g) {
    const int64_t total = g.M * g.N, step = int64_t(gridDim.x) * blockDim.x;
    const ParamPtr bias{g.bias, g.bias_dtype == DType::BF16};
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
        const int64_t n = i % g.N, m = i / g.N;
        const uint8_t* a = g.xq + m * g.K;
        const uint8_t* b = g.wq + n * g.K;
        float acc = 0.f;
        for (int64_t k = 0; k < g.K; ++k) acc = fmaf(from_e4m3(a[k]), from_e4m3(b[k]), acc);  // exact products
        float v = __fmul_rn(__fmul_rn(acc, g.x_scales[m]), g.w_scales[n]);
        if (bias.defined()) v = __fadd_rn(v, bias[n]);
        static_cast<To*>(g.out)[m * g.ldc + n] = from_f32<To>(v);
    }
}

/// One warp per (row, head): the head's absolute maximum by shuffles, then its codes and scale.
template <typename T>
__global__ void scatter_fp8_kernel(KvRows rows, Fp8KvPoolLayer pool, const int64_t* slots, int64_t n,
                                   int64_t num_slots, int heads, int head_dim) {
    const int64_t warps = int64_t(gridDim.x) * (blockDim.x / kWarp);
    const int lane = threadIdx.x % kWarp;
    for (int64_t w = int64_t(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp; w < n * heads; w += warps) {
        const int64_t r = w / heads, h = w % heads;
        const int64_t slot = slots[r];
        if (slot < 0 || slot >= num_slots) continue;  // the whole warp skips together
        const int64_t src = r * rows.token_stride + h * rows.head_stride;
        const int64_t dst = slot * pool.token_stride + h * pool.head_stride;
        for (int kv = 0; kv < 2; ++kv) {
            const T* x = static_cast<const T*>(kv == 0 ? rows.k : rows.v) + src;
            float amax = 0.f;
            for (int c = lane; c < head_dim; c += kWarp) amax = fmaxf(amax, fabsf(to_f32(x[c])));
            amax = warp_max(amax);
            const float2 s = row_scale(amax);
            uint8_t* q = (kv == 0 ? pool.k : pool.v) + dst;
            for (int c = lane; c < head_dim; c += kWarp) q[c] = to_e4m3(__fmul_rn(to_f32(x[c]), s.y));
            if (lane == 0) (kv == 0 ? pool.k_scale : pool.v_scale)[dst / head_dim] = s.x;
        }
    }
}

template <typename T>
__global__ void gather_fp8_kernel(Fp8KvPoolLayer pool, const int32_t* table, int64_t hist, KvRows cur,
                                  int64_t cur_len, T* out_k, T* out_v, int heads, int head_dim) {
    const int64_t per_row = int64_t(heads) * head_dim, total = (hist + cur_len) * per_row;
    const int64_t step = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
        const int64_t t = i / per_row, rem = i % per_row, h = rem / head_dim, d = rem % head_dim;
        if (t < hist) {
            const int64_t slot = int64_t(table[t / pool.block_size]) * pool.block_size + t % pool.block_size;
            const int64_t row = slot * pool.token_stride + h * pool.head_stride;
            out_k[i] = from_f32<T>(__fmul_rn(from_e4m3(pool.k[row + d]), pool.k_scale[row / head_dim]));
            out_v[i] = from_f32<T>(__fmul_rn(from_e4m3(pool.v[row + d]), pool.v_scale[row / head_dim]));
        } else {
            const int64_t src = (t - hist) * cur.token_stride + h * cur.head_stride + d;
            out_k[i] = static_cast<const T*>(cur.k)[src];
            out_v[i] = static_cast<const T*>(cur.v)[src];
        }
    }
}

constexpr int kThreads = 256;

}  // namespace

cudaError_t quantize_fp8_rows(const void* x, DType x_dtype, int64_t rows, int64_t cols, int64_t ld, uint8_t* q,
                              float* scales, cudaStream_t stream) {
    if (rows <= 0) return cudaSuccess;
    if (rows > int64_t(INT32_MAX)) return cudaErrorInvalidValue;
    const int threads = row_block_threads(cols);
    return dispatch_float(x_dtype, [&](auto t) {
        using T = decltype(t);
        quantize_rows_kernel<T><<<unsigned(rows), threads, 0, stream>>>(static_cast<const T*>(x), cols, ld, q, scales);
        return cudaGetLastError();
    });
}

cudaError_t dequantize_fp8_rows(const uint8_t* q, const float* scales, int64_t rows, int64_t cols, void* out,
                                DType out_dtype, cudaStream_t stream) {
    if (rows <= 0 || cols <= 0) return cudaSuccess;
    return dispatch_float(out_dtype, [&](auto t) {
        using T = decltype(t);
        dequantize_rows_kernel<T><<<grid_for(rows * cols, kThreads), kThreads, 0, stream>>>(q, scales, rows, cols,
                                                                                           static_cast<T*>(out));
        return cudaGetLastError();
    });
}

cudaError_t gemm_fp8_fallback(const Fp8GemmArgs& args, cudaStream_t stream) {
    if (args.M <= 0 || args.N <= 0) return cudaSuccess;
    if (args.bias && args.bias_dtype != DType::F32 && args.bias_dtype != DType::BF16) return cudaErrorNotSupported;
    return dispatch_float(args.out_dtype, [&](auto t) {
        gemm_fp8_kernel<decltype(t)><<<grid_for(args.M * args.N, kThreads), kThreads, 0, stream>>>(args);
        return cudaGetLastError();
    });
}

cudaError_t scatter_kv_fp8(const KvRows& rows, DType rows_dtype, const Fp8KvPoolLayer& pool, const int64_t* slots,
                           int64_t n, int64_t num_slots, int heads, int head_dim, cudaStream_t stream) {
    if (n <= 0 || heads <= 0 || head_dim <= 0) return cudaSuccess;
    const int64_t warps_per_block = kThreads / kWarp;
    return dispatch_float(rows_dtype, [&](auto t) {
        scatter_fp8_kernel<decltype(t)><<<grid_for(n * heads, int(warps_per_block)), kThreads, 0, stream>>>(
            rows, pool, slots, n, num_slots, heads, head_dim);
        return cudaGetLastError();
    });
}

cudaError_t gather_kv_fp8(const Fp8KvPoolLayer& pool, const int32_t* table, int64_t hist, const KvRows& cur,
                          int64_t cur_len, void* out_k, void* out_v, int heads, int head_dim, DType dtype,
                          cudaStream_t stream) {
    const int64_t rows = hist + cur_len;
    if (rows <= 0 || heads <= 0 || head_dim <= 0) return cudaSuccess;
    return dispatch_float(dtype, [&](auto t) {
        using T = decltype(t);
        gather_fp8_kernel<T><<<grid_for(rows * heads * head_dim, kThreads), kThreads, 0, stream>>>(
            pool, table, hist, cur, cur_len, static_cast<T*>(out_k), static_cast<T*>(out_v), heads, head_dim);
        return cudaGetLastError();
    });
}

}  // namespace dzr::kernels
