// The DiT block's fused memory-bound chains (`fast` numerics). bf16 rows of up to kWarpMaxCols columns (the DiT's
// 5120) take the streamed kernels of kernels/dit_rows.cu (RowImpl::Stream) where their shared memory fits, else (and
// with RowImpl::Warp, and for the fused residual + norm) the warp kernels: one warp per row, the row held in registers
// as packed bf16, shuffle reductions only (no shared memory, no barrier), kWarpRows rows per block. Other rows take
// the block kernels (one block of 256 threads per row, the row in f32 registers) or, for any shape, the plain kernels
// over global memory. The gated residual is a grid-stride loop over 8-element chunks.
#include "kernels/common.cuh"
#include "kernels/dit_fused.cuh"
#include "kernels/dit_rows.cuh"
#include "kernels/fp8_convert.cuh"
#include "kernels/warp_rows.cuh"

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
                                                                    int64_t split, int64_t period) {
    __shared__ float shared[kWarp];
    const int64_t r = blockIdx.x;
    const int64_t moff = (r % period < split ? 0 : 1) * mod_stride;
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
                                          GroupPtr scale, GroupPtr shift, int64_t split, int64_t period) {
    __shared__ float shared[kWarp];
    const int64_t r = blockIdx.x;
    const int g = r % period < split ? 0 : 1;
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
__global__ void gated_residual_any_kernel(T* x, const T* y, int64_t rows, int64_t cols, GroupPtr gate,
                                          int64_t split, int64_t period) {
    const int64_t total = rows * cols, step = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
        const int64_t r = i / cols, c = i % cols;
        const int g = r % period < split ? 0 : 1;
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
                                                                   int64_t split, int64_t period) {
    __shared__ float shared[kWarp];
    const int64_t r = blockIdx.x, rr = r % period;
    const Tx* xr = x + r * cols;
    To* orow = out + r * cols;
    const int64_t chunks = cols / 8;
    float v[kMaxChunks][8];
    const float sq = load_row(xr, chunks, v, [](float a) { return a * a; });
    const float rstd = rsqrtf(block_sum(sq, shared) / float(cols) + eps);
    const float* table = rr < split ? ta : tb;
    const int64_t trow = rr < split ? rr : rr - split;
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
                                         const float* ta, const float* tb, int64_t pairs, int entry, int64_t split,
                                         int64_t period) {
    __shared__ float shared[kWarp];
    const int64_t r = blockIdx.x, rr = r % period;
    const Tx* xr = x + r * cols;
    To* orow = out + r * cols;
    float sq = 0.f;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        const float a = to_f32(xr[c]);
        sq += a * a;
    }
    const float rstd = rsqrtf(block_sum(sq, shared) / float(cols) + eps);
    const float* table = rr < split ? ta : tb;
    const int64_t trow = rr < split ? rr : rr - split;
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


// ---- warp kernels: one warp per bf16 row ------------------------------------------------------------------------
//
// Chunk k of lane l is the row's 8-element chunk 32k + l, so each load instruction of a warp reads 512 contiguous
// bytes; a lane keeps its chunks as packed bf16 (4 registers each), so a 5120-wide row costs 80 registers a lane and
// an SM holds ~20 rows in flight: a [1785, 5120] tensor is one wave on 132 SMs, its loads all issued up front.

constexpr int kWarpRows = 4;  // rows (warps) per block of the warp kernels

/// The operands of the warp LayerNorm; with kResidual, x += y [* gate[g]] first (written back, rounded to bf16, and
/// the norm reads the rounded sum, as the unfused gated_residual then ada_layer_norm do).
struct AdaWarpArgs {
    bf16* x;  // read-only without kResidual
    const bf16* y;
    bf16* out;
    int64_t rows;
    int cols;
    float eps;
    Vec8Ptr weight, bias, scale, shift, gate;
    int64_t mod_stride;   // scale and shift: elements between the groups' rows
    int64_t gate_stride;  // gate: the same
    int64_t split;
    int64_t period;  // the groups repeat every `period` rows (batched branches)
    uint8_t* q;      // kFp8: the rows' E4M3 codes [rows, cols] (instead of `out`)
    float* q_scales; // kFp8: their scales [rows]
};

// kFp8: the output rows, rounded to bf16 as `out` would hold them, quantized per row (quantize_fp8's codes and scale
// of that bf16 row) instead of written.
template <int N, bool kResidual, bool kFp8 = false>
__global__ void __launch_bounds__(kWarpRows* kWarp) ada_layer_norm_warp_kernel(const AdaWarpArgs a) {
    const int lane = threadIdx.x % kWarp;
    const int64_t r = int64_t(blockIdx.x) * kWarpRows + threadIdx.x / kWarp;
    if (r >= a.rows) return;  // NOTE: whole warps leave; the kernel has no block barrier
    const int chunks = a.cols / 8;
    const int g = r % a.period < a.split ? 0 : 1;
    uint4* xr = reinterpret_cast<uint4*>(a.x + r * a.cols);
    uint4 raw[N];
#pragma unroll
    for (int k = 0; k < N; ++k)
        if (k * kWarp + lane < chunks) raw[k] = xr[k * kWarp + lane];
    if constexpr (kResidual) {
        const uint4* yr = reinterpret_cast<const uint4*>(a.y + r * a.cols);
#pragma unroll
        for (int k = 0; k < N; ++k) {
            const int ch = k * kWarp + lane;
            if (ch < chunks) {
                float v[8], d[8];
                unpack8(raw[k], v);
                unpack8(yr[ch], d);
                if (a.gate.defined()) {
                    float gt[8];
                    a.gate.load(g * a.gate_stride + int64_t(ch) * 8, gt);
#pragma unroll
                    for (int i = 0; i < 8; ++i) v[i] = fmaf(d[i], gt[i], v[i]);
                } else {
#pragma unroll
                    for (int i = 0; i < 8; ++i) v[i] += d[i];
                }
                raw[k] = pack8(v);
                xr[ch] = raw[k];
            }
        }
    }
    const float mean = warp_row_sum(raw, chunks, lane, [](float v) { return v; }) / float(a.cols);
    const float var = warp_row_sum(raw, chunks, lane, [mean](float v) {
                          const float d = v - mean;
                          return d * d;
                      }) / float(a.cols);
    const float rstd = rsqrtf(var + a.eps);
    const int64_t moff = g * a.mod_stride;
    uint4* orow = reinterpret_cast<uint4*>(a.out + r * a.cols);
    float amax = 0.f;
#pragma unroll
    for (int k = 0; k < N; ++k) {
        const int ch = k * kWarp + lane;
        if (ch < chunks) {
            const int64_t c0 = int64_t(ch) * 8;
            float o[8], p[8];
            unpack8(raw[k], o);
#pragma unroll
            for (int i = 0; i < 8; ++i) o[i] = (o[i] - mean) * rstd;
            if (a.weight.defined()) {
                a.weight.load(c0, p);
#pragma unroll
                for (int i = 0; i < 8; ++i) o[i] *= p[i];
            }
            if (a.bias.defined()) {
                a.bias.load(c0, p);
#pragma unroll
                for (int i = 0; i < 8; ++i) o[i] += p[i];
            }
            if (a.scale.defined()) {
                a.scale.load(moff + c0, p);
#pragma unroll
                for (int i = 0; i < 8; ++i) o[i] *= 1.f + p[i];
            }
            if (a.shift.defined()) {
                a.shift.load(moff + c0, p);
#pragma unroll
                for (int i = 0; i < 8; ++i) o[i] += p[i];
            }
            if constexpr (kFp8) {
                fp8::round_for_codes(raw[k], o, amax);  // the bf16 row, kept for the codes
            } else {
                orow[ch] = pack8(o);
            }
        }
    }
    if constexpr (kFp8) {
        const float2 sc = fp8::row_scale(warp_max(amax));
        fp8::write_codes(raw, chunks, lane, kWarp, sc.y, reinterpret_cast<uint2*>(a.q + r * a.cols));
        if (lane == 0) a.q_scales[r] = sc.x;
    }
}

struct RopeWarpArgs : rows::RopeArgs {
    bool lane_table = false;  // 256 % head_dim == 0: a lane's chunks all sit at one offset in their heads
};

template <int N, int kEntry>
__global__ void __launch_bounds__(kWarpRows* kWarp) rms_norm_rope_warp_kernel(const RopeWarpArgs a) {
    const int lane = threadIdx.x % kWarp;
    const int64_t r = int64_t(blockIdx.x) * kWarpRows + threadIdx.x / kWarp;
    if (r >= a.rows) return;
    const int chunks = a.cols / 8;
    const uint4* xr = reinterpret_cast<const uint4*>(a.x + r * a.cols);
    uint4 raw[N];
#pragma unroll
    for (int k = 0; k < N; ++k)
        if (k * kWarp + lane < chunks) raw[k] = xr[k * kWarp + lane];
    const float rstd = rsqrtf(warp_row_sum(raw, chunks, lane, [](float v) { return v * v; }) / float(a.cols) + a.eps);
    float cs[4], sn[4];
    bool rotate = a.lane_table && rope_fetch<kEntry>(a, r, lane * 8, cs, sn);
    uint4* orow = reinterpret_cast<uint4*>(a.out + r * a.cols);
#pragma unroll
    for (int k = 0; k < N; ++k) {
        const int ch = k * kWarp + lane;
        if (ch < chunks) {
            float o[8];
            unpack8(raw[k], o);
#pragma unroll
            for (int i = 0; i < 8; ++i) o[i] *= rstd;
            if (a.weight.defined()) {
                float p[8];
                a.weight.load(int64_t(ch) * 8, p);
#pragma unroll
                for (int i = 0; i < 8; ++i) o[i] *= p[i];
            }
            if (!a.lane_table) rotate = rope_fetch<kEntry>(a, r, ch * 8, cs, sn);
            if (rotate) rotate_pairs(o, cs, sn);
            orow[ch] = pack8(o);
        }
    }
}

unsigned warp_grid(int64_t rows) { return unsigned((rows + kWarpRows - 1) / kWarpRows); }

/// The gated residual over 8-element chunks with 32-bit indexing (rows · cols / 8 < 2^31, host check), the gate read
/// 8 at a time.
template <typename T>
__global__ void gated_residual_vec_kernel(T* x, const T* y, uint32_t total, uint32_t chunks_per_row, Vec8Ptr gate,
                                          int64_t gate_stride, int64_t split, int64_t period) {
    const uint32_t step = gridDim.x * blockDim.x;
    for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += step) {
        const uint32_t r = i / chunks_per_row;
        const int64_t off = int64_t(i) * 8, c0 = int64_t(i - r * chunks_per_row) * 8;
        float a[8], d[8];
        Vec8<T>::load(x + off, a);
        Vec8<T>::load(y + off, d);
        if (gate.defined()) {
            float gt[8];
            gate.load((int64_t(r) % period < split ? 0 : gate_stride) + c0, gt);
#pragma unroll
            for (int k = 0; k < 8; ++k) a[k] = fmaf(d[k], gt[k], a[k]);
        } else {
#pragma unroll
            for (int k = 0; k < 8; ++k) a[k] += d[k];
        }
        Vec8<T>::store(x + off, a);
    }
}

ParamPtr param(const void* p, DType t) { return ParamPtr{p, t == DType::BF16}; }

bool ok16(const void* p) { return !p || aligned16(p); }

/// The per-group vector's rows keep 16-byte alignment (or it is absent).
bool group_ok16(const GroupVec& v) { return !v.data || (aligned16(v.data) && aligned16_stride(v.row_stride, dtype_size(v.dtype))); }

/// The block and plain kernels of ada_layer_norm (f32 rows, rows past kWarpMaxCols, unaligned operands).
cudaError_t ada_layer_norm_rows(const void* x, DType tx, void* out, DType to, int64_t rows, int64_t cols, float eps,
                                const void* weight, const void* bias, DType tparam, GroupVec scale, GroupVec shift,
                                int64_t split, int64_t period, cudaStream_t stream) {
    // NOTE: the block kernel reads scale and shift through one pointer type and one row stride
    const bool mods_agree =
        !scale.data || !shift.data || (scale.dtype == shift.dtype && scale.row_stride == shift.row_stride);
    const DType tm = scale.data ? scale.dtype : shift.dtype;
    const int64_t mstride = scale.data ? scale.row_stride : shift.row_stride;
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
                param(bias, tparam), group_ptr(scale), group_ptr(shift), split, period);
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
                mstride, split, period);
            return cudaGetLastError();
        });
    });
}

/// The warp kernel takes bf16 rows of x (and y) and out of at most kWarpMaxCols columns with 16-byte aligned
/// operands.
bool warp_norm_ok(const void* x, DType tx, const void* out, DType to, int64_t cols, const void* weight,
                  const void* bias, const GroupVec& scale, const GroupVec& shift) {
    return tx == DType::BF16 && to == DType::BF16 && cols % 8 == 0 && cols > 0 && cols <= kWarpMaxCols &&
           aligned16(x) && aligned16(out) && ok16(weight) && ok16(bias) && group_ok16(scale) && group_ok16(shift);
}

template <bool kResidual, bool kFp8 = false>
cudaError_t launch_ada_warp(const AdaWarpArgs& a, cudaStream_t stream) {
    return dispatch_warp_chunks(a.cols, [&](auto n) {
        ada_layer_norm_warp_kernel<decltype(n)::value, kResidual, kFp8>
            <<<warp_grid(a.rows), kWarpRows * kWarp, 0, stream>>>(a);
        return cudaGetLastError();
    });
}

/// The norm operands the warp kernels' AdaWarpArgs and the streamed kernels' rows::NormArgs share.
template <typename Args>
void fill_norm_args(Args& a, int64_t rows, int64_t cols, float eps, const void* weight, const void* bias, DType tparam,
                    GroupVec scale, GroupVec shift, int64_t split, int64_t period) {
    a.rows = rows;
    a.cols = int(cols);
    a.eps = eps;
    a.weight = vec8(weight, tparam);
    a.bias = vec8(bias, tparam);
    a.scale = vec8(scale.data, scale.dtype);
    a.shift = vec8(shift.data, shift.dtype);
    // NOTE: the kernels read scale and shift with one row stride; absent vectors take the other's
    a.mod_stride = scale.data ? scale.row_stride : shift.row_stride;
    a.split = split;
    a.period = period;
}

AdaWarpArgs ada_warp_args(const void* x, void* out, int64_t rows, int64_t cols, float eps, const void* weight,
                          const void* bias, DType tparam, GroupVec scale, GroupVec shift, int64_t split,
                          int64_t period) {
    AdaWarpArgs a{};
    a.x = static_cast<bf16*>(const_cast<void*>(x));
    a.out = static_cast<bf16*>(out);
    fill_norm_args(a, rows, cols, eps, weight, bias, tparam, scale, shift, split, period);
    return a;
}

rows::NormArgs stream_norm_args(const void* x, int64_t rows, int64_t cols, float eps, const void* weight,
                                const void* bias, DType tparam, GroupVec scale, GroupVec shift, int64_t split,
                                int64_t period) {
    rows::NormArgs a;
    a.x = static_cast<const bf16*>(x);
    fill_norm_args(a, rows, cols, eps, weight, bias, tparam, scale, shift, split, period);
    return a;
}

}  // namespace

cudaError_t ada_layer_norm(const void* x, DType tx, void* out, DType to, int64_t rows, int64_t cols, float eps,
                           const void* weight, const void* bias, DType tparam, GroupVec scale, GroupVec shift,
                           int64_t split, int64_t period, cudaStream_t stream, RowImpl impl) {
    if (rows == 0) return cudaSuccess;
    if (period <= 0) return cudaErrorInvalidValue;
    const bool strides_agree = !scale.data || !shift.data || scale.row_stride == shift.row_stride;
    if (!warp_norm_ok(x, tx, out, to, cols, weight, bias, scale, shift) || !strides_agree)
        return ada_layer_norm_rows(x, tx, out, to, rows, cols, eps, weight, bias, tparam, scale, shift, split, period,
                                   stream);
    if (streamed(impl)) {
        rows::NormArgs a = stream_norm_args(x, rows, cols, eps, weight, bias, tparam, scale, shift, split, period);
        a.out = static_cast<bf16*>(out);
        a.narrow = impl == RowImpl::Stream8;
        const cudaError_t e = rows::ada_layer_norm(a, stream);
        if (e != cudaErrorNotSupported) return e;
    }
    return launch_ada_warp<false>(
        ada_warp_args(x, out, rows, cols, eps, weight, bias, tparam, scale, shift, split, period), stream);
}

cudaError_t ada_layer_norm_fp8(const void* x, DType tx, uint8_t* q, float* q_scales, int64_t rows, int64_t cols,
                               float eps, const void* weight, const void* bias, DType tparam, GroupVec scale,
                               GroupVec shift, int64_t split, int64_t period, cudaStream_t stream, RowImpl impl) {
    if (rows == 0) return cudaSuccess;
    if (period <= 0) return cudaErrorInvalidValue;
    const bool strides_agree = !scale.data || !shift.data || scale.row_stride == shift.row_stride;
    // NOTE: `out` of the warp check stands for q (8-byte codes per chunk: 8-byte alignment suffices)
    if (!warp_norm_ok(x, tx, x, DType::BF16, cols, weight, bias, scale, shift) || !strides_agree ||
        (reinterpret_cast<uintptr_t>(q) & 7u) != 0)
        return cudaErrorNotSupported;
    // NOTE: ada_layer_norm with the same impl takes the same kernel for these shapes, so the codes are those of its rows
    if (streamed(impl)) {
        rows::NormArgs s = stream_norm_args(x, rows, cols, eps, weight, bias, tparam, scale, shift, split, period);
        s.narrow = impl == RowImpl::Stream8;
        s.q = q;
        s.q_scales = q_scales;
        const cudaError_t e = rows::ada_layer_norm(s, stream);
        if (e != cudaErrorNotSupported) return e;
    }
    AdaWarpArgs a = ada_warp_args(x, nullptr, rows, cols, eps, weight, bias, tparam, scale, shift, split, period);
    a.q = q;
    a.q_scales = q_scales;
    return launch_ada_warp<false, true>(a, stream);
}

cudaError_t gated_residual(void* x, const void* y, DType t, int64_t rows, int64_t cols, GroupVec gate, int64_t split,
                           int64_t period, cudaStream_t stream) {
    if (rows == 0) return cudaSuccess;
    if (period <= 0) return cudaErrorInvalidValue;
    const int threads = 256;
    const bool vec = cols % 8 == 0 && rows * cols / 8 < (int64_t(1) << 31) && aligned16(x) && aligned16(y) &&
                     group_ok16(gate);
    return dispatch_float(t, [&](auto e) {
        using T = decltype(e);
        if (vec) {
            const int64_t total = rows * cols / 8;
            // NOTE: a few chunks a thread keep enough loads in flight; more blocks only add scheduling
            gated_residual_vec_kernel<T><<<grid_for(total, threads, 132 * 16), threads, 0, stream>>>(
                static_cast<T*>(x), static_cast<const T*>(y), uint32_t(total), uint32_t(cols / 8),
                vec8(gate.data, gate.dtype), gate.row_stride, split, period);
        } else {
            gated_residual_any_kernel<T><<<grid_for(rows * cols, threads, 4096), threads, 0, stream>>>(
                static_cast<T*>(x), static_cast<const T*>(y), rows, cols, group_ptr(gate), split, period);
        }
        return cudaGetLastError();
    });
}

cudaError_t gated_residual_norm(const GatedResidualNormArgs& a, cudaStream_t stream) {
    if (a.rows == 0) return cudaSuccess;
    if (a.period <= 0) return cudaErrorInvalidValue;
    const bool strides_agree = !a.scale.data || !a.shift.data || a.scale.row_stride == a.shift.row_stride;
    if (a.t != DType::BF16 || !aligned16(a.y) || !group_ok16(a.gate) || !strides_agree ||
        !warp_norm_ok(a.x, a.t, a.out, a.to, a.cols, a.weight, a.bias, a.scale, a.shift)) {
        // the unfused pair: the same values (the norm reads the rounded residual either way)
        const cudaError_t e = gated_residual(a.x, a.y, a.t, a.rows, a.cols, a.gate, a.split, a.period, stream);
        if (e != cudaSuccess) return e;
        return ada_layer_norm(a.x, a.t, a.out, a.to, a.rows, a.cols, a.eps, a.weight, a.bias, a.tparam, a.scale,
                              a.shift, a.split, a.period, stream);
    }
    AdaWarpArgs w = ada_warp_args(a.x, a.out, a.rows, a.cols, a.eps, a.weight, a.bias, a.tparam, a.scale, a.shift,
                                  a.split, a.period);
    w.y = static_cast<const bf16*>(a.y);
    w.gate = vec8(a.gate.data, a.gate.dtype);
    w.gate_stride = a.gate.row_stride;
    return launch_ada_warp<true>(w, stream);
}

cudaError_t rms_norm_rope(const void* x, DType tx, void* out, DType to, int64_t rows, int64_t heads, int64_t head_dim,
                          float eps, const void* weight, DType tw, const float* table_a, const float* table_b,
                          int64_t pairs, int entry, int64_t split, int64_t period, cudaStream_t stream,
                          RowImpl impl) {
    if (rows == 0) return cudaSuccess;
    if (period <= 0) return cudaErrorInvalidValue;
    const int64_t cols = heads * head_dim;
    const bool tables_ok = head_dim % 8 == 0 && pairs % 4 == 0 && ok16(table_a) && ok16(table_b);
    if (tables_ok && tx == DType::BF16 && to == DType::BF16 && cols <= kWarpMaxCols && aligned16(x) &&
        aligned16(out) && ok16(weight)) {
        RopeWarpArgs a;
        a.x = static_cast<const bf16*>(x);
        a.out = static_cast<bf16*>(out);
        a.rows = rows;
        a.cols = int(cols);
        a.head_dim = int(head_dim);
        a.eps = eps;
        a.weight = vec8(weight, tw);
        a.table_a = table_a;
        a.table_b = table_b;
        a.pairs = int(pairs);
        a.entry = entry;
        a.split = split;
        a.period = period;
        if (streamed(impl)) {
            a.narrow = impl == RowImpl::Stream8;
            const cudaError_t e = rows::rms_norm_rope(a, stream);
            if (e != cudaErrorNotSupported) return e;
        }
        a.lane_table = (kWarp * 8) % head_dim == 0;
        return dispatch_warp_chunks(cols, [&](auto n) {
            constexpr int N = decltype(n)::value;
            if (entry == 4)
                rms_norm_rope_warp_kernel<N, 4><<<warp_grid(rows), kWarpRows * kWarp, 0, stream>>>(a);
            else
                rms_norm_rope_warp_kernel<N, 2><<<warp_grid(rows), kWarpRows * kWarp, 0, stream>>>(a);
            return cudaGetLastError();
        });
    }
    const bool vec = tables_ok && cols <= int64_t(8) * kMaxChunks * kRowThreads && aligned16(x) && aligned16(out) &&
                     ok16(weight);
    if (!vec) {
        const int threads = row_block_threads(cols);
        return dispatch_float2(tx, to, [&](auto a, auto o) {
            using Tx = decltype(a);
            using To = decltype(o);
            rms_norm_rope_any_kernel<Tx, To><<<unsigned(rows), threads, 0, stream>>>(
                static_cast<const Tx*>(x), static_cast<To*>(out), cols, head_dim, eps, param(weight, tw), table_a,
                table_b, pairs, entry, split, period);
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
                    pairs, split, period);
            else
                rms_norm_rope_kernel<Tx, To, Tw, 2><<<unsigned(rows), kRowThreads, 0, stream>>>(
                    static_cast<const Tx*>(x), static_cast<To*>(out), cols, head_dim, eps, weight, table_a, table_b,
                    pairs, split, period);
            return cudaGetLastError();
        });
    });
}

}  // namespace dzr::kernels
