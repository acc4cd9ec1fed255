// The memory-efficient SDPA order (see attention_memeff.cuh). One CTA of 4 warps takes 32 query rows of one
// head and walks the keys in blocks of 128. Warp w owns keys [32w, 32w + 32) of a block for S and value
// columns [32w, 32w + 32) of each 128-column chunk for P V, each as 2 x 4 m16n8k16 tiles (the 32 x 32 warp
// tile of PyTorch's kernel). Q stays in shared memory; K goes through in 32-dim chunks, V in 128-column
// chunks; the f32 output accumulator of the 32 rows lives in shared memory (PyTorch keeps it in global
// memory; the values are the same).
//
// MMA fragment layouts (PTX ISA, m16n8k16 as loaded; each runs as two m16n8k8, g = lane / 4, t = lane % 4):
//   A (16x16, row): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..2t+9), a3 = (g+8, 2t+8..)
//   B (16x8, col):  b0 = (k = 2t..2t+1, n = g), b1 = (k = 2t+8..2t+9, n = g)
//   C (16x8):       c0, c1 = (g, 2t..2t+1), c2, c3 = (g+8, 2t..2t+1)
//
// The arithmetic where PyTorch's compiled code contracts or rounds (each checked against its kernel on the H200,
// docs/PARITY.md): exp2(round(s * log2e) - m) (not an FMA), the middle blocks' o = fma(r, o, o_block), the last
// block's o = fma(alpha, o_block, round(round(alpha * r) * o)) with alpha = 1 / sum an IEEE division.
#include <cfloat>
#include <type_traits>

#include "kernels/attention_memeff.cuh"
#include "kernels/common.cuh"

namespace dzr::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarp;
constexpr int kRows = 32;     // query rows per CTA
constexpr int kKeys = 128;    // keys per block
constexpr int kDimStep = 32;  // head-dim chunk of K (PyTorch's threadblock K)
constexpr int kCols = 128;    // value columns per P V pass
constexpr int kMaxDim = 512;
constexpr int kPad = 8;  // row padding of the shared tiles (elements)
constexpr float kLog2e = 1.4426950408889634074f;

template <typename T>
struct Mma {
    __device__ __forceinline__ static void k8(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t b) {
        if constexpr (std::is_same_v<T, bf16>)
            asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
                         : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                         : "r"(a0), "r"(a1), "r"(b));
        else
            asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
                         : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                         : "r"(a0), "r"(a1), "r"(b));
    }
    __device__ __forceinline__ static void run(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
        k8(c, a[0], a[1], b0);
        k8(c, a[2], a[3], b1);
    }
};

__device__ __forceinline__ uint32_t ld32(const void* p) { return *reinterpret_cast<const uint32_t*>(p); }

/// Two 16-bit elements (lo at the lower address of a register's pair) from separate rows.
template <typename T>
__device__ __forceinline__ uint32_t pack2(const T& lo, const T& hi) {
    const uint16_t l = *reinterpret_cast<const uint16_t*>(&lo), h = *reinterpret_cast<const uint16_t*>(&hi);
    return uint32_t(l) | (uint32_t(h) << 16);
}

/// PyTorch's atomicMaxFloat: an integer max for non-negative values, an unsigned min for negative ones.
__device__ __forceinline__ void atomic_max_float(float* addr, float value) {
    if (value >= 0)
        atomicMax(reinterpret_cast<int*>(addr), __float_as_int(value));
    else
        atomicMin(reinterpret_cast<unsigned int*>(addr), __float_as_uint(value));
}

/// Copies rows [0, nrows) x columns [c0, c0 + ncols) of a global matrix (row stride `ld` elements) into a
/// shared tile with row stride `sld`; elements outside (valid_rows, valid_cols) read as zero. ncols % 8 == 0.
template <typename T>
__device__ __forceinline__ void load_rows(T* tile, int sld, const T* src, int64_t ld, int nrows, int ncols, int c0,
                                          int64_t valid_rows, int valid_cols) {
    const int chunks_per_row = ncols / 8, chunks = nrows * chunks_per_row;
    for (int c = int(threadIdx.x); c < chunks; c += kThreads) {
        const int r = c / chunks_per_row, col = (c % chunks_per_row) * 8;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (r < valid_rows && c0 + col < valid_cols) v = *reinterpret_cast<const uint4*>(src + r * ld + c0 + col);
        *reinterpret_cast<uint4*>(tile + r * sld + col) = v;
    }
}

/// S = Q K^T of one key block: Q from its shared tile, K through `ks` in kDimStep-dim chunks; warp w's keys
/// [32w, 32w + 32) as 2 x 4 m16n8k16 tiles.
template <typename T>
__device__ __forceinline__ void qk_block(float (&s)[2][4][4], const T* qs, int q_ld, T* ks, int k_ld, const T* kblock,
                                         int64_t k_tok, int dp, int nkeys, int d, int warp, int g, int t) {
    for (int dc = 0; dc < dp; dc += kDimStep) {
        __syncthreads();  // the previous chunk (or block's P V) is done with the shared tiles
        load_rows(ks, k_ld, kblock, k_tok, kKeys, kDimStep, dc, nkeys, d);
        __syncthreads();
#pragma unroll
        for (int k16 = 0; k16 < kDimStep; k16 += 16) {
            uint32_t af[2][4];
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
                const T* r0 = qs + (mt * 16 + g) * q_ld + dc + k16 + 2 * t;
                const T* r1 = r0 + 8 * q_ld;
                af[mt][0] = ld32(r0), af[mt][1] = ld32(r1), af[mt][2] = ld32(r0 + 8), af[mt][3] = ld32(r1 + 8);
            }
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
                const T* kr = ks + (warp * 32 + nt * 8 + g) * k_ld + k16 + 2 * t;
                const uint32_t b0 = ld32(kr), b1 = ld32(kr + 8);
#pragma unroll
                for (int mt = 0; mt < 2; ++mt) Mma<T>::run(s[mt][nt], af[mt], b0, b1);
            }
        }
    }
}

/// O = P V for value columns [c0, c0 + kCols) of one key block (V in `vs`), combined with the f32 accumulator:
/// kept in `oacc` for a middle block, scaled by 1 / sum and written to `og` for the last.
template <typename T>
__device__ __forceinline__ void pv_chunk(const T* ps, int p_ld, const T* vs, int v_ld, float* oacc, int dvp,
                                         const float* s_prime, const float* out_rescale, T* og,
                                         const MemEffAttentionArgs& a, int c0, int ksteps, bool first, bool last,
                                         int64_t rows_valid, int warp, int g, int t) {
    float o[2][4][4] = {};
    for (int ks16 = 0; ks16 < ksteps; ++ks16) {
        const int kk = ks16 * 16;
        uint32_t af[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
            const T* r0 = ps + (mt * 16 + g) * p_ld + kk + 2 * t;
            const T* r1 = r0 + 8 * p_ld;
            af[mt][0] = ld32(r0), af[mt][1] = ld32(r1), af[mt][2] = ld32(r0 + 8), af[mt][3] = ld32(r1 + 8);
        }
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
            const T* vc = vs + (kk + 2 * t) * v_ld + warp * 32 + nt * 8 + g;
            const uint32_t b0 = pack2(vc[0], vc[v_ld]), b1 = pack2(vc[8 * v_ld], vc[9 * v_ld]);
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) Mma<T>::run(o[mt][nt], af[mt], b0, b1);
        }
    }
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int row = mt * 16 + h * 8 + g;
            const float sum = s_prime[row] == 0.f ? 1.f : s_prime[row];
            const float alpha = __fdiv_rn(1.f, sum);
            const float r = out_rescale[row];
#pragma unroll
            for (int nt = 0; nt < 4; ++nt)
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    const int col = c0 + warp * 32 + nt * 8 + 2 * t + c;
                    if (col >= a.dv) continue;
                    const float acc = o[mt][nt][2 * h + c];
                    float& prev = oacc[row * dvp + col];
                    float res;
                    if (first) {
                        res = last ? __fmul_rn(alpha, acc) : acc;
                    } else if (!last) {
                        res = __fmaf_rn(r, prev, acc);
                    } else {
                        const float beta = __fmul_rn(alpha, r);
                        res = __fmaf_rn(alpha, acc, __fmul_rn(beta, prev));
                    }
                    if (last) {
                        if (row < rows_valid) og[row * a.o_tok + col] = from_f32<T>(res);
                    } else {
                        prev = res;
                    }
                }
        }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) mem_eff_kernel(MemEffAttentionArgs a) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const int dp = (a.d + kDimStep - 1) / kDimStep * kDimStep;
    const int dvp = (a.dv + kCols - 1) / kCols * kCols;
    const int q_ld = dp + kPad, k_ld = kDimStep + kPad, p_ld = kKeys + kPad, v_ld = kCols + kPad;
    T* qs = reinterpret_cast<T*>(smem_raw);
    T* ks = qs + kRows * q_ld;
    T* ps = ks + kKeys * k_ld;
    T* vs = ps + kRows * p_ld;
    float* oacc = reinterpret_cast<float*>(vs + kKeys * v_ld);  // [kRows][dvp]
    float* mi = oacc + kRows * dvp;
    float* m_prime = mi + kRows;
    float* s_prime = m_prime + kRows;
    float* out_rescale = s_prime + kRows;
    float* addition = out_rescale + kRows;  // [kWarps][kRows]

    const int tid = int(threadIdx.x), lane = tid % kWarp, warp = tid / kWarp, g = lane / 4, t = lane % 4;
    const int head = int(blockIdx.y);
    const int64_t q0 = int64_t(blockIdx.x) * kRows;
    const int64_t rows_valid = a.lq - q0 < kRows ? a.lq - q0 : kRows;
    const T* qg = static_cast<const T*>(a.q) + q0 * a.q_tok + head * a.q_head;
    const T* kg = static_cast<const T*>(a.k) + head * a.k_head;
    const T* vg = static_cast<const T*>(a.v) + head * a.v_head;
    T* og = static_cast<T*>(a.out) + q0 * a.o_tok + head * a.o_head;

    if (tid < kRows) {
        s_prime[tid] = 0.f;
        out_rescale[tid] = 1.f;
        m_prime[tid] = -INFINITY;
        mi[tid] = -INFINITY;
    }
    load_rows(qs, q_ld, qg, a.q_tok, kRows, dp, 0, rows_valid, a.d);

    for (int64_t key0 = 0; key0 < a.lk; key0 += kKeys) {
        const int nkeys = a.lk - key0 < kKeys ? int(a.lk - key0) : kKeys;
        const bool first = key0 == 0, last = key0 + kKeys >= a.lk;

        // S = Q K^T: 32 x 128, warp w holds keys [32w, 32w + 32)
        float s[2][4][4] = {};
        qk_block(s, qs, q_ld, ks, k_ld, kg + key0 * a.k_tok, a.k_tok, dp, nkeys, a.d, warp, g, t);

        // scale, then log2(e) (PyTorch's kernels with bias support scale first), and the row maxima
        float sl[2][4][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float mx = -INFINITY;
#pragma unroll
                for (int nt = 0; nt < 4; ++nt)
#pragma unroll
                    for (int c = 0; c < 2; ++c) {
                        float& v = s[mt][nt][2 * h + c];
                        v = __fmul_rn(v, a.scale);
                        sl[mt][nt][2 * h + c] = __fmul_rn(v, kLog2e);
                        if (warp * 32 + nt * 8 + 2 * t + c < nkeys) mx = fmaxf(mx, sl[mt][nt][2 * h + c]);
                    }
                atomic_max_float(&mi[mt * 16 + h * 8 + g], mx);
            }
        __syncthreads();
        bool restore = false;
        if (lane < kRows / kWarps) {
            const int id = warp * (kRows / kWarps) + lane;
            const float mp = m_prime[id], m = mi[id];
            if (mp < m) {
                const float e = exp2f(mp - m);
                out_rescale[id] = e;
                s_prime[id] *= e;
            } else {
                if (m == -INFINITY) {
                    restore = true;
                    mi[id] = 0.f;
                }
                out_rescale[id] = 1.f;
            }
        }
        __syncthreads();

        // P = exp2(S - m); the row sums in the MMA layout's order; P to shared memory in T
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = mt * 16 + h * 8 + g;
                const float m = mi[row];
                float total = 0.f;
#pragma unroll
                for (int nt = 0; nt < 4; ++nt)
#pragma unroll
                    for (int c = 0; c < 2; ++c) {
                        const int col = warp * 32 + nt * 8 + 2 * t + c;
                        const float arg = __fsub_rn(sl[mt][nt][2 * h + c], m);
                        const float p = col < nkeys ? exp2f(arg) : 0.f;
                        total = __fadd_rn(total, p);
                        ps[row * p_ld + col] = from_f32<T>(p);
                    }
                total = __fadd_rn(total, __shfl_xor_sync(0xffffffffu, total, 1));
                total = __fadd_rn(total, __shfl_xor_sync(0xffffffffu, total, 2));
                if (t == 0) addition[warp * kRows + row] = total;
            }
        __syncthreads();
        if (lane < kRows / kWarps) {
            const int id = warp * (kRows / kWarps) + lane;
            float total = s_prime[id];
            if (restore)
                mi[id] = -INFINITY;
            else
                m_prime[id] = mi[id];
#pragma unroll
            for (int w = 0; w < kWarps; ++w) total = __fadd_rn(total, addition[w * kRows + id]);
            s_prime[id] = total;
        }

        // O = P V per 128-column chunk, combined with the f32 accumulator
        const int ksteps = (nkeys + kDimStep - 1) / kDimStep * (kDimStep / 16);
        for (int c0 = 0; c0 < dvp; c0 += kCols) {
            __syncthreads();  // s_prime is final; the previous chunk is done with vs
            load_rows(vs, v_ld, vg + key0 * a.v_tok, a.v_tok, kKeys, kCols, c0, nkeys, a.dv);
            __syncthreads();
            pv_chunk(ps, p_ld, vs, v_ld, oacc, dvp, s_prime, out_rescale, og, a, c0, ksteps, first, last,
                     rows_valid, warp, g, t);
        }
    }
}

size_t smem_bytes(const MemEffAttentionArgs& a) {
    const size_t dp = size_t(a.d + kDimStep - 1) / kDimStep * kDimStep;
    const size_t dvp = size_t(a.dv + kCols - 1) / kCols * kCols;
    const size_t es = dtype_size(a.dtype);
    return (kRows * (dp + kPad) + kKeys * (kDimStep + kPad) + kRows * (kKeys + kPad) + kKeys * (kCols + kPad)) * es +
           (kRows * dvp + 4 * kRows + kWarps * kRows) * sizeof(float);
}

template <typename T>
cudaError_t launch(const MemEffAttentionArgs& a, cudaStream_t stream) {
    const size_t smem = smem_bytes(a);
    auto kernel = mem_eff_kernel<T>;
    const cudaError_t st = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (st != cudaSuccess) return st;
    const dim3 grid(unsigned((a.lq + kRows - 1) / kRows), unsigned(a.heads));
    kernel<<<grid, kThreads, smem, stream>>>(a);
    return cudaGetLastError();
}

}  // namespace

bool mem_eff_attention_supported(const MemEffAttentionArgs& a) {
    if (a.dtype != DType::BF16 && a.dtype != DType::F16) return false;
    if (a.d <= 0 || a.dv <= 0 || a.d % 8 != 0 || a.dv % 8 != 0 || a.d > kMaxDim || a.dv > kMaxDim) return false;
    if (a.d <= 128 && a.dv <= 128) return false;  // PyTorch runs its 64-query tiles there
    if (a.heads <= 0 || a.heads > 65535 || a.lq <= 0 || a.lk <= 0 || a.lk > int64_t(0x7fffffff)) return false;
    if ((a.lq + kRows - 1) / kRows > int64_t(0x7fffffff)) return false;
    const size_t es = dtype_size(a.dtype);
    return aligned16(a.q) && aligned16(a.k) && aligned16(a.v) && aligned16(a.out) && aligned16_stride(a.q_tok, es) &&
           aligned16_stride(a.q_head, es) && aligned16_stride(a.k_tok, es) && aligned16_stride(a.k_head, es) &&
           aligned16_stride(a.v_tok, es) && aligned16_stride(a.v_head, es) && aligned16_stride(a.o_tok, es) &&
           aligned16_stride(a.o_head, es);
}

cudaError_t mem_eff_attention(const MemEffAttentionArgs& a, cudaStream_t stream) {
    if (!mem_eff_attention_supported(a)) return cudaErrorNotSupported;
    return a.dtype == DType::BF16 ? launch<bf16>(a, stream) : launch<__half>(a, stream);
}

}  // namespace dzr::kernels
