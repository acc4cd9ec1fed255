// FP8 (E4M3) quantization, dequantization, the plain FP8 GEMM and the FP8 KV pool's scatter and gather.
// Every conversion and scale follows core/fp8.h bit for bit: amax by fmaxf (NaN skipped), scale = max(amax,
// 1e-12) / 448 and the multiplier 448 / max(amax, 1e-12) by IEEE divisions, codes by cvt.rn.satfinite.
#include <algorithm>
#include <atomic>

#include "kernels/common.cuh"
#include "kernels/fp8.cuh"
#include "kernels/fp8_convert.cuh"

namespace dzr::kernels {
namespace {

using fp8::from_e4m3;
using fp8::row_scale;
using fp8::to_e4m3;

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

// bf16 rows of at most kQuantChunks · kQuantThreads chunks of 8, 16-byte aligned: each thread keeps its chunks as packed
// bf16 (16-byte loads), the block's absolute maximum, then 8 codes per 8-byte store. The same values, maximum and
// codes as quantize_rows_kernel (the maximum does not depend on the order).
constexpr int kQuantThreads = 256;
constexpr int kQuantChunks = 8;  // cols <= 8 · 8 · 256 = 16384 (the FFN's 13824 included)

// kGelu: the codes of gelu_tanh(x) rounded to bf16 (the activation kernel's values), not of x.
template <bool kGelu>
__global__ void __launch_bounds__(kQuantThreads) quantize_rows_vec_kernel(const bf16* x, int chunks, int64_t ld,
                                                                          uint8_t* q, float* scales) {
    __shared__ float shared[kWarp];
    const int64_t r = blockIdx.x;
    const uint4* row = reinterpret_cast<const uint4*>(x + r * ld);
    uint4 raw[kQuantChunks];
    float amax = 0.f;
#pragma unroll
    for (int k = 0; k < kQuantChunks; ++k) {
        const int ch = threadIdx.x + k * kQuantThreads;
        if (ch < chunks) {
            raw[k] = row[ch];
            float v[8];
            unpack8(raw[k], v);
            if constexpr (kGelu) {
#pragma unroll
                for (int i = 0; i < 8; ++i) v[i] = gelu_tanh(v[i]);
                raw[k] = pack8(v);  // rounded to bf16 as the activation kernel stores it
                unpack8(raw[k], v);
            }
#pragma unroll
            for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[i]));
        }
    }
    amax = block_max(amax, shared);
    const float2 s = row_scale(amax);
    fp8::write_codes(raw, chunks, int(threadIdx.x), kQuantThreads, s.y,
                     reinterpret_cast<uint2*>(q + r * int64_t(chunks) * 8));
    if (threadIdx.x == 0) scales[r] = s.x;
}

// ---- the GELU quantization by table ------------------------------------------------------------------------------
//
// The tanh GELU costs ~30 instructions an element (tanhf and its branch), so evaluating it made the fused quantization
// of [3570, 13824] compute-bound (91 us, 1.6 TB/s). Its input is bf16 and its output is rounded to bf16: a table of
// all 65536 inputs, built once by the same gelu_tanh and pack8, gives the same bits for a shared-memory lookup. Each
// persistent block stages the 128 KiB table, then quantizes rows with the next kGeluAhead rows' loads in flight.

/// gelu_tanh(x) rounded to bf16 for x = the bf16 of each 16-bit pattern (its bits).
__device__ __align__(16) uint16_t g_gelu_table[65536];

__global__ void gelu_table_kernel() {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;  // entries 8i .. 8i + 7
    if (i >= 65536 / 8) return;
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = gelu_tanh(__uint_as_float(uint32_t(8 * i + j) << 16));
    reinterpret_cast<uint4*>(g_gelu_table)[i] = pack8(v);  // rounded as quantize_rows_vec_kernel<true> rounds
}

constexpr int kGeluThreads = 1024;
constexpr int kGeluChunks = 2;  // cols <= 2 · 1024 · 8 = 16384
constexpr int kGeluAhead = 2;   // rows whose loads are in flight while one is quantized

/// The table's GELU of 8 packed bf16 values.
__device__ __forceinline__ uint4 gelu8(const uint4& raw, const uint16_t* table) {
    const uint32_t in[4] = {raw.x, raw.y, raw.z, raw.w};
    uint32_t o[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) o[i] = uint32_t(table[in[i] & 0xffffu]) | (uint32_t(table[in[i] >> 16]) << 16);
    return make_uint4(o[0], o[1], o[2], o[3]);
}

__global__ void __launch_bounds__(kGeluThreads) gelu_quantize_stream_kernel(const bf16* x, int64_t rows, int chunks,
                                                                            uint8_t* q, float* scales) {
    extern __shared__ uint4 table4[];  // the 65536-entry table
    __shared__ float shared[kWarp];
    const uint16_t* table = reinterpret_cast<const uint16_t*>(table4);
    const int64_t step = gridDim.x;
    const auto load = [&](int64_t row, uint4 (&dst)[kGeluChunks]) {
        if (row >= rows) return;
        const uint4* src = reinterpret_cast<const uint4*>(x + row * int64_t(chunks) * 8);
#pragma unroll
        for (int c = 0; c < kGeluChunks; ++c) {
            const int ch = threadIdx.x + c * kGeluThreads;
            if (ch < chunks) dst[c] = __ldcs(src + ch);  // streamed once: evict first
        }
    };
    int64_t r = blockIdx.x;
    uint4 ahead[kGeluAhead][kGeluChunks];
#pragma unroll
    for (int a = 0; a < kGeluAhead; ++a) load(r + a * step, ahead[a]);
    const uint4* g = reinterpret_cast<const uint4*>(g_gelu_table);
    for (int i = threadIdx.x; i < 65536 / 8; i += kGeluThreads) table4[i] = g[i];
    __syncthreads();
    for (; r < rows; r += step) {
        uint4 raw[kGeluChunks];
#pragma unroll
        for (int c = 0; c < kGeluChunks; ++c) raw[c] = ahead[0][c];
#pragma unroll
        for (int a = 0; a + 1 < kGeluAhead; ++a)
#pragma unroll
            for (int c = 0; c < kGeluChunks; ++c) ahead[a][c] = ahead[a + 1][c];
        load(r + kGeluAhead * step, ahead[kGeluAhead - 1]);
        float amax = 0.f;
#pragma unroll
        for (int c = 0; c < kGeluChunks; ++c) {
            if (threadIdx.x + c * kGeluThreads < chunks) {
                raw[c] = gelu8(raw[c], table);
                float v[8];
                unpack8(raw[c], v);
#pragma unroll
                for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[i]));
            }
        }
        amax = block_max(amax, shared);
        const float2 s = row_scale(amax);
        fp8::write_codes(raw, chunks, int(threadIdx.x), kGeluThreads, s.y,
                         reinterpret_cast<uint2*>(q + r * int64_t(chunks) * 8));
        if (threadIdx.x == 0) scales[r] = s.x;
    }
}

constexpr size_t kGeluTableBytes = 65536 * sizeof(uint16_t);

/// Devices whose table is filled (bit d: device d < 64).
std::atomic<uint64_t> g_gelu_table_ready{0};

bool gelu_table_ready() {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev >= 64) return false;
    return (g_gelu_table_ready.load(std::memory_order_acquire) >> dev) & 1u;
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

// gather_fp8_kernel 8 elements at a time (head_dim % 8 == 0, 16-byte aligned current rows and outputs, 8-byte aligned
// pool rows): the same values.
template <typename T>
__global__ void gather_fp8_vec_kernel(Fp8KvPoolLayer pool, const int32_t* table, int64_t hist, KvRows cur,
                                      int64_t cur_len, T* out_k, T* out_v, int heads, int head_dim) {
    const int64_t per_row = int64_t(heads) * head_dim / 8, total = (hist + cur_len) * per_row;
    const int chunks_per_head = head_dim / 8;
    const int64_t step = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
        const int64_t t = i / per_row;
        const int rem = int(i - t * per_row), h = rem / chunks_per_head, d = (rem - h * chunks_per_head) * 8;
        if (t < hist) {
            const int64_t slot = int64_t(table[t / pool.block_size]) * pool.block_size + t % pool.block_size;
            const int64_t row = slot * pool.token_stride + h * pool.head_stride;
            for (int kv = 0; kv < 2; ++kv) {
                const uint8_t* codes = (kv == 0 ? pool.k : pool.v) + row + d;
                const float sc = (kv == 0 ? pool.k_scale : pool.v_scale)[row / head_dim];
                const uint2 c = *reinterpret_cast<const uint2*>(codes);
                float v[8];
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    v[j] = __fmul_rn(from_e4m3(uint8_t(c.x >> (8 * j))), sc);
                    v[j + 4] = __fmul_rn(from_e4m3(uint8_t(c.y >> (8 * j))), sc);
                }
                Vec8<T>::store((kv == 0 ? out_k : out_v) + i * 8, v);
            }
        } else {
            const int64_t src = (t - hist) * cur.token_stride + h * cur.head_stride + d;
            float v[8];
            Vec8<T>::load(static_cast<const T*>(cur.k) + src, v);
            Vec8<T>::store(out_k + i * 8, v);
            Vec8<T>::load(static_cast<const T*>(cur.v) + src, v);
            Vec8<T>::store(out_v + i * 8, v);
        }
    }
}

constexpr int kThreads = 256;

}  // namespace

cudaError_t quantize_fp8_rows(const void* x, DType x_dtype, int64_t rows, int64_t cols, int64_t ld, uint8_t* q,
                              float* scales, cudaStream_t stream) {
    if (rows <= 0) return cudaSuccess;
    if (rows > int64_t(INT32_MAX)) return cudaErrorInvalidValue;
    if (x_dtype == DType::BF16 && cols % 8 == 0 && cols > 0 && cols <= int64_t(8) * kQuantChunks * kQuantThreads &&
        ld % 8 == 0 && aligned16(x) && (reinterpret_cast<uintptr_t>(q) & 7u) == 0) {
        quantize_rows_vec_kernel<false><<<unsigned(rows), kQuantThreads, 0, stream>>>(static_cast<const bf16*>(x),
                                                                                      int(cols / 8), ld, q, scales);
        return cudaGetLastError();
    }
    const int threads = row_block_threads(cols);
    return dispatch_float(x_dtype, [&](auto t) {
        using T = decltype(t);
        quantize_rows_kernel<T><<<unsigned(rows), threads, 0, stream>>>(static_cast<const T*>(x), cols, ld, q, scales);
        return cudaGetLastError();
    });
}

cudaError_t gelu_quantize_fp8_rows(const void* x, DType x_dtype, int64_t rows, int64_t cols, uint8_t* q, float* scales,
                                   cudaStream_t stream, RowImpl impl) {
    if (rows <= 0) return cudaSuccess;
    if (x_dtype != DType::BF16 || cols % 8 != 0 || cols <= 0 || cols > int64_t(8) * kQuantChunks * kQuantThreads ||
        rows > int64_t(INT32_MAX) || !aligned16(x) || (reinterpret_cast<uintptr_t>(q) & 7u) != 0)
        return cudaErrorNotSupported;
    static_assert(int64_t(8) * kGeluChunks * kGeluThreads >= int64_t(8) * kQuantChunks * kQuantThreads);
    if (streamed(impl) && gelu_table_ready()) {
        int dev = 0, sms = 0;
        cudaError_t e = cudaGetDevice(&dev);
        if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        if (e == cudaSuccess)
            e = cudaFuncSetAttribute(gelu_quantize_stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     int(kGeluTableBytes));
        if (e != cudaSuccess) return e;
        // NOTE: one block per SM (the table fills most of its shared memory); each loops over rows
        const unsigned blocks = unsigned(std::min<int64_t>(rows, sms));
        gelu_quantize_stream_kernel<<<blocks, kGeluThreads, kGeluTableBytes, stream>>>(
            static_cast<const bf16*>(x), rows, int(cols / 8), q, scales);
        return cudaGetLastError();
    }
    quantize_rows_vec_kernel<true><<<unsigned(rows), kQuantThreads, 0, stream>>>(static_cast<const bf16*>(x),
                                                                                 int(cols / 8), cols, q, scales);
    return cudaGetLastError();
}

cudaError_t prepare_gelu_table(cudaStream_t stream) {
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return e;
    gelu_table_kernel<<<65536 / 8 / 256, 256, 0, stream>>>();
    e = cudaGetLastError();
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
    if (e == cudaSuccess && dev < 64) g_gelu_table_ready.fetch_or(uint64_t(1) << dev, std::memory_order_release);
    return e;
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
    const auto a8 = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 7u) == 0; };
    // NOTE: every pool row starts a multiple of head_dim bytes from the layer's base (its scale index is row / head_dim)
    const bool vec = head_dim % 8 == 0 && pool.token_stride % 8 == 0 && pool.head_stride % 8 == 0 && a8(pool.k) &&
                     a8(pool.v) && (cur_len == 0 || (cur.token_stride % 8 == 0 && cur.head_stride % 8 == 0 &&
                                                     aligned16(cur.k) && aligned16(cur.v))) &&
                     aligned16(out_k) && aligned16(out_v);
    if (vec)
        return dispatch_float(dtype, [&](auto t) {
            using T = decltype(t);
            gather_fp8_vec_kernel<T><<<grid_for(rows * heads * head_dim / 8, kThreads), kThreads, 0, stream>>>(
                pool, table, hist, cur, cur_len, static_cast<T*>(out_k), static_cast<T*>(out_v), heads, head_dim);
            return cudaGetLastError();
        });
    return dispatch_float(dtype, [&](auto t) {
        using T = decltype(t);
        gather_fp8_kernel<T><<<grid_for(rows * heads * head_dim, kThreads), kThreads, 0, stream>>>(
            pool, table, hist, cur, cur_len, static_cast<T*>(out_k), static_cast<T*>(out_v), heads, head_dim);
        return cudaGetLastError();
    });
}

}  // namespace dzr::kernels
