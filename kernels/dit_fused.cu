// The DiT block's fused memory-bound chains (`fast` numerics): one block per row for the norms (the row held in
// registers, 8 elements per 16-byte access), a grid-stride loop for the gated residual.
#include "kernels/common.cuh"
#include "kernels/dit_fused.cuh"

namespace dzr::kernels {
namespace {

constexpr int kRowThreads = 256;  // threads per row of the register-resident row kernels
constexpr int kMaxChunks = 4;     // 8-element chunks per thread held in registers: cols <= 8 * 4 * 256 = 8192

struct GroupPtr {
    const void* data;
    bool is_bf16;
    int64_t row_stride;
    __device__ __forceinline__ float at(int g, int64_t c) const {
        const int64_t i = g * row_stride + c;
        return is_bf16 ? __bfloat162float(static_cast<const bf16*>(data)[i]) : static_cast<const float*>(data)[i];
    }
    __device__ __forceinline__ bool defined() const { return data != nullptr; }
};

GroupPtr group_ptr(const GroupVec& v) { return {v.data, v.dtype == DType::BF16, v.row_stride}; }

template <typename T>
__device__ __forceinline__ void load8(const void* base, int64_t off, float (&v)[8]) {
    Vec8<T>::load(static_cast<const T*>(base) + off, v);
}

/// This thread's chunks of a row (chunk k at threadIdx.x + k · kRowThreads) into registers; returns the sum of f
/// over the values it loaded.
template <typename Tx, typename F>
__device__ __forceinline__ float load_row(const Tx* xr, int64_t chunks, float (&v)[kMaxChunks][8], F f) {
    float acc = 0.f;
#pragma unroll
    for (int k = 0; k < kMaxChunks; ++k) {
        const int64_t ch = threadIdx.x + int64_t(k) * kRowThreads;
        if (ch < chunks) {
            Vec8<Tx>::load(xr + ch * 8, v[k]);
#pragma unroll
            for (int i = 0; i < 8; ++i) acc += f(v[k][i]);
        }
    }
    return acc;
}

// One row per block of kRowThreads threads, the row in registers (kMaxChunks chunks of 8 per thread); the
// per-group vectors (Tm) and the norm parameters (Tp) read 8 at a time.
template <typename Tx, typename To, typename Tm, typename Tp>
__global__ void __launch_bounds__(kRowThreads) ada_layer_norm_kernel(const Tx* x, To* out, int64_t cols, float eps,
                                                                    const void* w, const void* b, const void* scale,
                                                                    const void* shift, int64_t mod_stride,
                                                                    int64_t split) {
    __shared__ float shared[kWarp];
    const int64_t r = blockIdx.x;
    const int64_t moff = (r < split ? 0 : 1) * mod_stride;
    const Tx* xr = x + r * cols;
    To* orow = out + r * cols;
    const int64_t chunks = cols / 8;
    float v[kMaxChunks][8];
    const float sum = load_row(xr, chunks, v, [](float a) { return a; });
    const float mean = block_sum(sum, shared) / float(cols);
    float sq = 0.f;
#pragma unroll
    for (int k = 0; k < kMaxChunks; ++k) {
        const int64_t ch = threadIdx.x + int64_t(k) * kRowThreads;
        if (ch < chunks) {
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const float d = v[k][i] - mean;
                sq += d * d;
            }
        }
    }
    const float rstd = rsqrtf(block_sum(sq, shared) / float(cols) + eps);
#pragma unroll
    for (int k = 0; k < kMaxChunks; ++k) {
        const int64_t ch = threadIdx.x + int64_t(k) * kRowThreads;
        if (ch < chunks) {
            const int64_t c0 = ch * 8;
            float o[8], p[8];
#pragma unroll
            for (int i = 0; i < 8; ++i) o[i] = (v[k][i] - mean) * rstd;
            if (w) {
                load8<Tp>(w, c0, p);
#pragma unroll
                for (int i = 0; i < 8; ++i) o[i] *= p[i];
            }
            if (b) {
                load8<Tp>(b, c0, p);
#pragma unroll
                for (int i = 0; i < 8; ++i) o[i] += p[i];
            }
            if (scale) {
                load8<Tm>(scale, moff + c0, p);
#pragma unroll
                for (int i = 0; i < 8; ++i) o[i] *= 1.f + p[i];
            }
            if (shift) {
                load8<Tm>(shift, moff + c0, p);
#pragma unroll
                for (int i = 0; i < 8; ++i) o[i] += p[i];
            }
            Vec8<To>::store(orow + c0, o);
        }
    }
}

// Any shape: three passes over the row in global memory.
template <typename Tx, typename To>
__global__ void ada_layer_norm_any_kernel(const Tx* x, To* out, int64_t cols, float eps, ParamPtr w, ParamPtr b,
                                          GroupPtr scale, GroupPtr shift, int64_t split) {
    __shared__ float shared[kWarp];
    const int64_t r = blockIdx.x;
    const int g = r < split ? 0 : 1;
    const Tx* xr = x + r * cols;
    To* orow = out + r * cols;
    float sum = 0.f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) sum += to_f32(xr[c]);
    const float mean = block_sum(sum, shared) / float(cols);
    float sq = 0.f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        const float d = to_f32(xr[c]) - mean;
        sq += d * d;
    }
    const float rstd = rsqrtf(block_sum(sq, shared) / float(cols) + eps);
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        float y = (to_f32(xr[c]) - mean) * rstd;
        if (w.defined()) y = y * w[c];
        if (b.defined()) y = y + b[c];
        if (scale.defined()) y = y * (1.f + scale.at(g, c));
        if (shift.defined()) y = y + shift.at(g, c);
        orow[c] = from_f32<To>(y);
    }
}

template <typename T>
__global__ void gated_residual_kernel(T* x, const T* y, int64_t rows, int64_t cols, GroupPtr gate, int64_t split) {
    const int64_t chunks_per_row = cols / 8, total = rows * chunks_per_row;
    const int64_t step = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
        const int64_t r = i / chunks_per_row, c0 = (i % chunks_per_row) * 8;
        const int g = r < split ? 0 : 1;
        float a[8], d[8];
        Vec8<T>::load(x + r * cols + c0, a);
        Vec8<T>::load(y + r * cols + c0, d);
#pragma unroll
        for (int k = 0; k < 8; ++k) a[k] = gate.defined() ? fmaf(d[k], gate.at(g, c0 + k), a[k]) : a[k] + d[k];
        Vec8<T>::store(x + r * cols + c0, a);
    }
}

template <typename T>
__global__ void gated_residual_any_kernel(T* x, const T* y, int64_t rows, int64_t cols, GroupPtr gate,
                                          int64_t split) {
    const int64_t total = rows * cols, step = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
        const int64_t r = i / cols, c = i % cols;
        const int g = r < split ? 0 : 1;
        const float a = to_f32(x[i]), d = to_f32(y[i]);
        x[i] = from_f32<T>(gate.defined() ? fmaf(d, gate.at(g, c), a) : a + d);
    }
}

__device__ __forceinline__ void rope_entry(const float* e, int entry, float& c, float& s) {
    if (entry == 4) {
        c = e[0] + e[1];
        s = e[2] + e[3];
    } else {
        c = e[0];
        s = e[1];
    }
}

// head_dim % 8 == 0: a chunk of 8 holds 4 whole pairs of one head. Tw: the weight's type.
template <typename Tx, typename To, typename Tw, int kEntry>
__global__ void __launch_bounds__(kRowThreads) rms_norm_rope_kernel(const Tx* x, To* out, int64_t cols,
                                                                   int64_t head_dim, float eps, const void* w,
                                                                   const float* ta, const float* tb, int64_t pairs,
                                                                   int64_t split) {
    __shared__ float shared[kWarp];
    const int64_t r = blockIdx.x;
    const Tx* xr = x + r * cols;
    To* orow = out + r * cols;
    const int64_t chunks = cols / 8;
    float v[kMaxChunks][8];
    const float sq = load_row(xr, chunks, v, [](float a) { return a * a; });
    const float rstd = rsqrtf(block_sum(sq, shared) / float(cols) + eps);
    const float* table = r < split ? ta : tb;
    const int64_t trow = r < split ? r : r - split;
#pragma unroll
    for (int k = 0; k < kMaxChunks; ++k) {
        const int64_t ch = threadIdx.x + int64_t(k) * kRowThreads;
        if (ch < chunks) {
            float o[8];
#pragma unroll
            for (int i = 0; i < 8; ++i) o[i] = v[k][i] * rstd;
            if (w) {
                float p[8];
                load8<Tw>(w, ch * 8, p);
#pragma unroll
                for (int i = 0; i < 8; ++i) o[i] *= p[i];
            }
            if (table) {
                const int64_t j0 = (ch * 8 % head_dim) / 2;
                if (j0 < pairs) {  // NOTE: pairs % 4 == 0 (host check): a chunk is wholly rotated or not
                    const float* e = table + (trow * pairs + j0) * kEntry;
#pragma unroll
                    for (int q = 0; q < 4; ++q) {
                        float c, sn;
                        if constexpr (kEntry == 4) {
                            const float4 t = reinterpret_cast<const float4*>(e)[q];
                            c = t.x + t.y;
                            sn = t.z + t.w;
                        } else {
                            const float2 t = reinterpret_cast<const float2*>(e)[q];
                            c = t.x;
                            sn = t.y;
                        }
                        const float x0 = o[2 * q], x1 = o[2 * q + 1];
                        o[2 * q] = x0 * c - x1 * sn;
                        o[2 * q + 1] = x0 * sn + x1 * c;
                    }
                }
            }
            Vec8<To>::store(orow + ch * 8, o);
        }
    }
}

// Any shape: one thread per pair, two passes.
template <typename Tx, typename To>
__global__ void rms_norm_rope_any_kernel(const Tx* x, To* out, int64_t cols, int64_t head_dim, float eps, ParamPtr w,
                                         const float* ta, const float* tb, int64_t pairs, int entry, int64_t split) {
    __shared__ float shared[kWarp];
    const int64_t r = blockIdx.x;
    const Tx* xr = x + r * cols;
    To* orow = out + r * cols;
    float sq = 0.f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        const float a = to_f32(xr[c]);
        sq += a * a;
    }
    const float rstd = rsqrtf(block_sum(sq, shared) / float(cols) + eps);
    const float* table = r < split ? ta : tb;
    const int64_t trow = r < split ? r : r - split;
    for (int64_t p = threadIdx.x; p < cols / 2; p += blockDim.x) {
        const int64_t c = 2 * p, j = (c % head_dim) / 2;
        float x0 = to_f32(xr[c]) * rstd, x1 = to_f32(xr[c + 1]) * rstd;
        if (w.defined()) {
            x0 *= w[c];
            x1 *= w[c + 1];
        }
        if (table && j < pairs) {
            float cs, sn;
            rope_entry(table + (trow * pairs + j) * entry, entry, cs, sn);
            const float y0 = x0 * cs - x1 * sn, y1 = x0 * sn + x1 * cs;
            x0 = y0;
            x1 = y1;
        }
        orow[c] = from_f32<To>(x0);
        orow[c + 1] = from_f32<To>(x1);
    }
}

ParamPtr param(const void* p, DType t) { return ParamPtr{p, t == DType::BF16}; }

}  // namespace

cudaError_t ada_layer_norm(const void* x, DType tx, void* out, DType to, int64_t rows, int64_t cols, float eps,
                           const void* weight, const void* bias, DType tparam, GroupVec scale, GroupVec shift,
                           int64_t split, cudaStream_t stream) {
    if (rows == 0) return cudaSuccess;
    // NOTE: the vector kernel reads scale and shift through one pointer type and one row stride
    const bool mods_agree = !scale.data || !shift.data || (scale.dtype == shift.dtype && scale.row_stride == shift.row_stride);
    const DType tm = scale.data ? scale.dtype : shift.dtype;
    const int64_t mstride = scale.data ? scale.row_stride : shift.row_stride;
    const auto ok16 = [](const void* p) { return !p || aligned16(p); };
    const bool vec = cols % 8 == 0 && cols <= int64_t(8) * kMaxChunks * kRowThreads && aligned16(x) &&
                     aligned16(out) && ok16(weight) && ok16(bias) && ok16(scale.data) && ok16(shift.data) &&
                     aligned16_stride(mstride, dtype_size(tm)) && mods_agree;
    if (!vec) {
        const int threads = row_block_threads(cols);
        return dispatch_float2(tx, to, [&](auto a, auto o) {
            using Tx = decltype(a);
            using To = decltype(o);
            ada_layer_norm_any_kernel<Tx, To><<<unsigned(rows), threads, 0, stream>>>(
                static_cast<const Tx*>(x), static_cast<To*>(out), cols, eps, param(weight, tparam),
                param(bias, tparam), group_ptr(scale), group_ptr(shift), split);
            return cudaGetLastError();
        });
    }
    return dispatch_float2(tx, to, [&](auto a, auto o) {
        return dispatch_float2(tm, tparam, [&](auto m, auto p) {
            using Tx = decltype(a);
            using To = decltype(o);
            using Tm = decltype(m);
            using Tp = decltype(p);
            ada_layer_norm_kernel<Tx, To, Tm, Tp><<<unsigned(rows), kRowThreads, 0, stream>>>(
                static_cast<const Tx*>(x), static_cast<To*>(out), cols, eps, weight, bias, scale.data, shift.data,
                mstride, split);
            return cudaGetLastError();
        });
    });
}

cudaError_t gated_residual(void* x, const void* y, DType t, int64_t rows, int64_t cols, GroupVec gate, int64_t split,
                           cudaStream_t stream) {
    if (rows == 0) return cudaSuccess;
    const bool vec = cols % 8 == 0 && aligned16(x) && aligned16(y);
    return dispatch_float(t, [&](auto e) {
        using T = decltype(e);
        const int threads = 256;
        if (vec)
            gated_residual_kernel<T><<<grid_for(rows * cols / 8, threads, 4096), threads, 0, stream>>>(
                static_cast<T*>(x), static_cast<const T*>(y), rows, cols, group_ptr(gate), split);
        else
            gated_residual_any_kernel<T><<<grid_for(rows * cols, threads, 4096), threads, 0, stream>>>(
                static_cast<T*>(x), static_cast<const T*>(y), rows, cols, group_ptr(gate), split);
        return cudaGetLastError();
    });
}

cudaError_t rms_norm_rope(const void* x, DType tx, void* out, DType to, int64_t rows, int64_t heads, int64_t head_dim,
                          float eps, const void* weight, DType tw, const float* table_a, const float* table_b,
                          int64_t pairs, int entry, int64_t split, cudaStream_t stream) {
    if (rows == 0) return cudaSuccess;
    const int64_t cols = heads * head_dim;
    const bool vec = head_dim % 8 == 0 && pairs % 4 == 0 && cols <= int64_t(8) * kMaxChunks * kRowThreads &&
                     aligned16(x) && aligned16(out) && (!weight || aligned16(weight)) &&
                     (!table_a || aligned16(table_a)) && (!table_b || aligned16(table_b));
    if (!vec) {
        const int threads = row_block_threads(cols);
        return dispatch_float2(tx, to, [&](auto a, auto o) {
            using Tx = decltype(a);
            using To = decltype(o);
            rms_norm_rope_any_kernel<Tx, To><<<unsigned(rows), threads, 0, stream>>>(
                static_cast<const Tx*>(x), static_cast<To*>(out), cols, head_dim, eps, param(weight, tw), table_a,
                table_b, pairs, entry, split);
            return cudaGetLastError();
        });
    }
    return dispatch_float2(tx, to, [&](auto a, auto o) {
        return dispatch_float(weight ? tw : DType::F32, [&](auto wt) {
            using Tx = decltype(a);
            using To = decltype(o);
            using Tw = decltype(wt);
            if (entry == 4)
                rms_norm_rope_kernel<Tx, To, Tw, 4><<<unsigned(rows), kRowThreads, 0, stream>>>(
                    static_cast<const Tx*>(x), static_cast<To*>(out), cols, head_dim, eps, weight, table_a, table_b,
                    pairs, split);
            else
                rms_norm_rope_kernel<Tx, To, Tw, 2><<<unsigned(rows), kRowThreads, 0, stream>>>(
                    static_cast<const Tx*>(x), static_cast<To*>(out), cols, head_dim, eps, weight, table_a, table_b,
                    pairs, split);
            return cudaGetLastError();
        });
    });
}

}  // namespace dzr::kernels
