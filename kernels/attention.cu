// FlashAttention-2 style forward for sm_80+: one CTA of 4 warps takes 64 query rows of one head (16 per
// warp) and walks the keys in tiles of 64. Per tile: S = Q K^T with mma.sync m16n8k16 (bf16/f16 in, f32
// accumulate), online softmax in registers (exp2 with the scale folded in), P rounded to bf16/f16 and
// O += P V. Q, K and V tiles go through shared memory with cp.async (16-byte chunks, XOR-swizzled so
// ldmatrix reads are free of bank conflicts); V of tile j loads while S of tile j computes, and K of
// tile j+1 while P V of tile j computes.
//
// MMA fragment layouts (PTX ISA, m16n8k16, g = lane / 4, c = 2 * (lane % 4)):
//   A (16x16, row): a0 = (g, c..c+1), a1 = (g+8, c..c+1), a2 = (g, c+8..c+9), a3 = (g+8, c+8..c+9)
//   B (16x8, col):  b0 = (k = c..c+1, n = g), b1 = (k = c+8..c+9, n = g)
//   C (16x8):       c0,c1 = (g, c..c+1), c2,c3 = (g+8, c..c+1)
// So the C fragments of two adjacent 8-key tiles are exactly the A fragment of one 16-key step of P V.
#include "kernels/attention.cuh"
#include "kernels/common.cuh"

namespace dzr::kernels {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * kWarp;
constexpr int kBr = 16 * kWarps;  // query rows per CTA
constexpr int kBc = 64;           // keys per tile

template <typename T>
struct MmaType;
template <>
struct MmaType<bf16> {
    __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
        const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<const uint32_t*>(&h);
    }
    __device__ __forceinline__ static void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};
template <>
struct MmaType<__half> {
    __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
        const __half2 h = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<const uint32_t*>(&h);
    }
    __device__ __forceinline__ static void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    const int bytes = valid ? 16 : 0;  // 0: the 16 bytes are zero-filled, nothing is read
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::);
}
__device__ __forceinline__ void cp_async_wait_all() {
    asm volatile("cp.async.wait_group 0;\n" ::);
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/// Element offset of (row, 8-column block cb) in a [rows][D] tile: 16-byte chunks XOR-swizzled by row % 8.
template <int D>
__device__ __forceinline__ int swz(int row, int cb) {
    return row * D + ((cb ^ (row & 7)) << 3);
}

/// Loads kRows rows of D elements into a swizzled tile; row_ptr(r) gives the global row (nullptr: zeros,
/// with `valid` standing in as the never-read source address).
template <typename T, int D, int kRows, typename RowPtr>
__device__ __forceinline__ void load_tile(T* tile, const T* valid, RowPtr&& row_ptr) {
    constexpr int kChunksPerRow = D / 8, kChunks = kRows * kChunksPerRow;
    static_assert(kChunks % kThreads == 0, "tile chunks must divide among the threads");
#pragma unroll
    for (int i = 0; i < kChunks / kThreads; ++i) {
        const int c = i * kThreads + int(threadIdx.x), row = c / kChunksPerRow, cb = c % kChunksPerRow;
        const T* src = row_ptr(row);
        cp_async16(tile + swz<D>(row, cb), src ? src + cb * 8 : valid, src != nullptr);
    }
}

/// S = Q K^T for a warp's 16 query rows (their fragments `qf`) and a tile's kBc keys (the swizzled K tile `ks`).
template <typename T, int D>
__device__ __forceinline__ void qk_tile(float (&s)[kBc / 8][4], const uint32_t (&qf)[D / 16][4], const T* ks,
                                        int lane) {
#pragma unroll
    for (int i = 0; i < kBc / 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
        for (int np = 0; np < kBc / 16; ++np) {
            uint32_t b[4];
            const int row = np * 16 + (lane % 8) + (lane / 16) * 8, cb = 2 * kk + ((lane / 8) & 1);
            ldmatrix_x4(b, ks + swz<D>(row, cb));
            MmaType<T>::mma(s[2 * np], qf[kk], b[0], b[1]);
            MmaType<T>::mma(s[2 * np + 1], qf[kk], b[2], b[3]);
        }
    }
}

template <typename T, int D>
__global__ void __launch_bounds__(kThreads) flash_kernel(FlashAttentionArgs a) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    T* qs = reinterpret_cast<T*>(smem_raw);
    T* ks = qs + kBr * D;
    T* vs = ks + kBc * D;

    const int lane = int(threadIdx.x) % kWarp, warp = int(threadIdx.x) / kWarp;
    const int head = int(blockIdx.y);
    const int64_t q0 = int64_t(blockIdx.x) * kBr;
    const int64_t lk = a.hist_len + a.cur_len;
    const int n_tiles = int((lk + kBc - 1) / kBc);

    const T* q = static_cast<const T*>(a.q) + head * a.q_head;
    const T* hk = static_cast<const T*>(a.hist_k) + head * a.hist_head;
    const T* hv = static_cast<const T*>(a.hist_v) + head * a.hist_head;
    const T* ck = static_cast<const T*>(a.k) + head * a.k_head;
    const T* cv = static_cast<const T*>(a.v) + head * a.v_head;
    // Global row of key j (K or V), nullptr past the end.
    const auto key_row = [&](const T* hist_base, const T* cur_base, int64_t cur_tok, int64_t j) -> const T* {
        if (j >= lk) return nullptr;
        if (j < a.hist_len) {
            const int64_t slot = int64_t(a.table[j / a.block_size]) * a.block_size + j % a.block_size;
            return hist_base + slot * a.hist_tok;
        }
        return cur_base + (j - a.hist_len) * cur_tok;
    };

    load_tile<T, D, kBr>(qs, q,
                         [&](int r) -> const T* { return q0 + r < a.lq ? q + (q0 + r) * a.q_tok : nullptr; });
    load_tile<T, D, kBc>(ks, q, [&](int r) { return key_row(hk, ck, a.k_tok, r); });
    cp_async_commit();

    const float scale_log2 = a.scale * 1.4426950408889634f;
    const int g = lane / 4, c2 = 2 * (lane % 4);
    uint32_t qf[D / 16][4];
    float o[D / 8][4];
#pragma unroll
    for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};

    for (int t = 0; t < n_tiles; ++t) {
        const int64_t k0 = int64_t(t) * kBc;
        cp_async_wait_all();
        __syncthreads();
        if (t == 0) {
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                const int row = warp * 16 + (lane % 8) + ((lane / 8) & 1) * 8, cb = 2 * kk + lane / 16;
                ldmatrix_x4(qf[kk], qs + swz<D>(row, cb));
            }
        }
        load_tile<T, D, kBc>(vs, q, [&](int r) { return key_row(hv, cv, a.v_tok, k0 + r); });
        cp_async_commit();

        // S = Q K^T for this warp's 16 rows and the tile's 64 keys
        float s[kBc / 8][4];
        qk_tile<T, D>(s, qf, ks, lane);

        // online softmax on rows g (s[.][0..1]) and g + 8 (s[.][2..3]), in the log2 domain
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < kBc / 8; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int64_t key = k0 + nt * 8 + c2 + (e & 1);
                const float x = key < lk ? s[nt][e] * scale_log2 : -INFINITY;
                s[nt][e] = x;
                mx[e / 2] = fmaxf(mx[e / 2], x);
            }
        }
        float alpha[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            const float m_new = fmaxf(m_run[r], mx[r]);  // finite: every tile holds at least one key
            alpha[r] = fast_exp2(m_run[r] - m_new);      // exp2(-inf) = 0 on the first tile
            m_run[r] = m_new;
            l_run[r] *= alpha[r];
        }
        uint32_t pa[kBc / 16][4];
#pragma unroll
        for (int nt = 0; nt < kBc / 8; ++nt) {
            const float p0 = fast_exp2(s[nt][0] - m_run[0]), p1 = fast_exp2(s[nt][1] - m_run[0]);
            const float p2 = fast_exp2(s[nt][2] - m_run[1]), p3 = fast_exp2(s[nt][3] - m_run[1]);
            l_run[0] += p0 + p1;
            l_run[1] += p2 + p3;
            pa[nt / 2][(nt & 1) * 2 + 0] = MmaType<T>::pack(p0, p1);
            pa[nt / 2][(nt & 1) * 2 + 1] = MmaType<T>::pack(p2, p3);
        }
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
            o[dt][0] *= alpha[0];
            o[dt][1] *= alpha[0];
            o[dt][2] *= alpha[1];
            o[dt][3] *= alpha[1];
        }

        cp_async_wait_all();
        __syncthreads();  // V of this tile is in; every warp is done with K of this tile
        if (t + 1 < n_tiles) {
            load_tile<T, D, kBc>(ks, q, [&](int r) { return key_row(hk, ck, a.k_tok, k0 + kBc + r); });
            cp_async_commit();
        }

        // O += P V
#pragma unroll
        for (int kk = 0; kk < kBc / 16; ++kk) {
#pragma unroll
            for (int dp = 0; dp < D / 16; ++dp) {
                uint32_t b[4];
                const int row = kk * 16 + (lane % 8) + ((lane / 8) & 1) * 8, cb = 2 * dp + lane / 16;
                ldmatrix_x4_trans(b, vs + swz<D>(row, cb));
                MmaType<T>::mma(o[2 * dp], pa[kk], b[0], b[1]);
                MmaType<T>::mma(o[2 * dp + 1], pa[kk], b[2], b[3]);
            }
        }
    }

    // normalize by the row sums (each thread holds a quarter of its rows' terms) and store
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        float l = l_run[r];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        inv[r] = 1.f / l;
    }
    T* out = static_cast<T*>(a.out) + head * a.o_head;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int64_t row = q0 + warp * 16 + g + r * 8;
        if (row >= a.lq) continue;
        T* po = out + row * a.o_tok + c2;
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
            const uint32_t v = MmaType<T>::pack(o[dt][2 * r] * inv[r], o[dt][2 * r + 1] * inv[r]);
            *reinterpret_cast<uint32_t*>(po + dt * 8) = v;
        }
    }
}

template <typename T, int D>
cudaError_t launch(const FlashAttentionArgs& a, cudaStream_t stream) {
    const size_t smem = size_t(kBr + 2 * kBc) * D * sizeof(T);
    auto kernel = flash_kernel<T, D>;
    if (smem > 48 * 1024) {
        const cudaError_t st =
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
        if (st != cudaSuccess) return st;
    }
    const dim3 grid(unsigned((a.lq + kBr - 1) / kBr), unsigned(a.heads));
    kernel<<<grid, kThreads, smem, stream>>>(a);
    return cudaGetLastError();
}

}  // namespace

bool flash_attention_supported(const FlashAttentionArgs& a) {
    if (a.dtype != DType::BF16 && a.dtype != DType::F16) return false;
    if (a.head_dim != 64 && a.head_dim != 128) return false;
    if (a.heads <= 0 || a.lq <= 0 || a.hist_len + a.cur_len <= 0 || a.hist_len < 0 || a.cur_len < 0)
        return false;
    if (a.heads > 65535 || (a.lq + kBr - 1) / kBr > int64_t(0x7fffffff)) return false;
    const size_t es = dtype_size(a.dtype);
    bool ok = aligned16(a.q) && aligned16(a.out) && aligned16_stride(a.q_tok, es) &&
              aligned16_stride(a.q_head, es) && aligned16_stride(a.o_tok, es) && aligned16_stride(a.o_head, es);
    if (a.cur_len > 0)
        ok = ok && aligned16(a.k) && aligned16(a.v) && aligned16_stride(a.k_tok, es) &&
             aligned16_stride(a.k_head, es) && aligned16_stride(a.v_tok, es) && aligned16_stride(a.v_head, es);
    if (a.hist_len > 0)
        ok = ok && a.table != nullptr && a.block_size > 0 && aligned16(a.hist_k) && aligned16(a.hist_v) &&
             aligned16_stride(a.hist_tok, es) && aligned16_stride(a.hist_head, es);
    return ok;
}

cudaError_t flash_attention(const FlashAttentionArgs& a, cudaStream_t stream) {
    if (!flash_attention_supported(a)) return cudaErrorNotSupported;
    if (a.dtype == DType::BF16)
        return a.head_dim == 128 ? launch<bf16, 128>(a, stream) : launch<bf16, 64>(a, stream);
    return a.head_dim == 128 ? launch<__half, 128>(a, stream) : launch<__half, 64>(a, stream);
}

}  // namespace dzr::kernels
