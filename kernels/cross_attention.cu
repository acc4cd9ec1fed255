// The DiT's cross-attention of fast numerics (kernels/cross_attention.cuh): one CTA of 8 warps takes 128 query rows
// of one branch and head (16 per warp) and walks that branch's keys as one sequence of 64-key chunks, the text
// context's then the image context's. Per chunk: S = Q K^T with mma.sync m16n8k16 (bf16 in, f32 accumulate), an
// online softmax in registers (exp2 with the scale folded in), P rounded to bf16 and O += P V, as in kernels/
// attention.cu. At the last text chunk each warp normalizes its text output and parks it, in f32, in shared memory
// (each thread's own slots), then restarts the softmax for the image keys; the end adds the two outputs and rounds
// once. K and V of chunk c + 1 load (cp.async, zero-filled past a context's keys) while chunk c computes. A chunk
// computes only its 16-key steps that hold keys (the image's 257 keys: four full chunks and one step).
#include "kernels/common.cuh"
#include "kernels/cross_attention.cuh"
#include "kernels/mma.cuh"

namespace dzr::kernels {
namespace {

using namespace mma;

constexpr int kD = 128;
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * kWarp;
constexpr int kBr = 16 * kWarps;  // query rows per CTA
constexpr int kBc = 64;           // keys per chunk
constexpr int kStash = kD / 8 * 4;  // f32 accumulators per thread (16 rows x 128 columns per warp)
constexpr size_t kSmemBytes = size_t(kBr + 4 * kBc) * kD * sizeof(bf16) + size_t(kStash) * kThreads * sizeof(float);

/// One context of one branch and head, as the kernel walks it.
struct Context {
    const bf16* k;
    const bf16* v;
    int64_t k_tok, v_tok;
    int keys;        // rows attended
    int pad_key;     // the row standing for the equal rows after it (-1: none)
    float pad_log2;  // log2 of how many rows it stands for
};

__device__ __forceinline__ Context context(const CrossContextArgs& c, int head) {
    Context x;
    x.k = static_cast<const bf16*>(c.k) + head * c.k_head;
    x.v = static_cast<const bf16*>(c.v) + head * c.v_head;
    x.k_tok = c.k_tok, x.v_tok = c.v_tok;
    const int distinct = c.distinct ? min(max(*c.distinct, 1), c.rows) : c.rows;
    x.keys = distinct;
    x.pad_key = distinct < c.rows ? distinct - 1 : -1;
    x.pad_log2 = log2f(float(c.rows - distinct + 1));
    return x;
}

/// Rows [start, start + kBc) of one of a context's K or V into a swizzled [kBc][kD] tile (zeros past `keys`).
__device__ __forceinline__ void load_rows(bf16* tile, const bf16* base, int64_t tok, int start, int keys) {
    constexpr int kChunksPerRow = kD / 8, kChunks = kBc * kChunksPerRow;
#pragma unroll
    for (int i = 0; i < kChunks / kThreads; ++i) {
        const int c = i * kThreads + int(threadIdx.x), row = c / kChunksPerRow, cb = c % kChunksPerRow;
        const bool valid = start + row < keys;
        const bf16* src = valid ? base + int64_t(start + row) * tok + cb * 8 : base;
        cp_async16(tile + swz<kD>(row, cb), src, valid);
    }
}

__global__ void __launch_bounds__(kThreads, 1) cross_attention_kernel(CrossAttentionArgs a) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16* qs = reinterpret_cast<bf16*>(smem_raw);
    bf16* ks = qs + kBr * kD;      // two stages
    bf16* vs = ks + 2 * kBc * kD;  // two stages
    float* stash = reinterpret_cast<float*>(vs + 2 * kBc * kD);

    const int lane = int(threadIdx.x) % kWarp, warp = int(threadIdx.x) / kWarp;
    const int head = int(blockIdx.y), branch = int(blockIdx.z);
    const int64_t q0 = int64_t(blockIdx.x) * kBr;
    const Context txt = context(a.text[branch], head), img = context(a.image[branch], head);
    const int text_chunks = (txt.keys + kBc - 1) / kBc;
    const int chunks = text_chunks + (img.keys + kBc - 1) / kBc;
    const auto load_chunk = [&](int c, int stage) {
        const Context x = c < text_chunks ? txt : img;
        const int start = (c < text_chunks ? c : c - text_chunks) * kBc;
        load_rows(ks + stage * kBc * kD, x.k, x.k_tok, start, x.keys);
        load_rows(vs + stage * kBc * kD, x.v, x.v_tok, start, x.keys);
    };

    {  // this CTA's query rows (zeros past the branch's rows), then chunk 0
        const bf16* q = static_cast<const bf16*>(a.q) + (int64_t(branch) * a.lq) * a.q_tok + head * a.q_head;
        constexpr int kChunksPerRow = kD / 8, kChunks = kBr * kChunksPerRow;
#pragma unroll
        for (int i = 0; i < kChunks / kThreads; ++i) {
            const int c = i * kThreads + int(threadIdx.x), row = c / kChunksPerRow, cb = c % kChunksPerRow;
            const bool valid = q0 + row < a.lq;
            cp_async16(qs + swz<kD>(row, cb), valid ? q + (q0 + row) * a.q_tok + cb * 8 : q, valid);
        }
    }
    load_chunk(0, 0);
    cp_async_commit();

    const float scale_log2 = a.scale * 1.4426950408889634f;
    const int g = lane / 4, c2 = 2 * (lane % 4);
    uint32_t qf[kD / 16][4];
    float o[kD / 8][4];
#pragma unroll
    for (int i = 0; i < kD / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};

    // 1 / (row sums): each thread holds a quarter of its two rows' terms
    const auto inverse_sums = [&](float (&inv)[2]) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float l = l_run[r];
            l += __shfl_xor_sync(0xffffffffu, l, 1);
            l += __shfl_xor_sync(0xffffffffu, l, 2);
            inv[r] = 1.f / l;
        }
    };

    for (int c = 0; c < chunks; ++c) {
        const int stage = c & 1;
        if (c + 1 < chunks) {
            load_chunk(c + 1, stage ^ 1);  // its stage was last read in chunk c - 1, which every warp has left
            cp_async_commit();
            cp_async_wait_group<1>();
        } else {
            cp_async_wait_group<0>();
        }
        __syncthreads();
        if (c == 0) {
#pragma unroll
            for (int kk = 0; kk < kD / 16; ++kk) {
                const int row = warp * 16 + (lane % 8) + ((lane / 8) & 1) * 8, cb = 2 * kk + lane / 16;
                ldmatrix_x4(qf[kk], qs + swz<kD>(row, cb));
            }
        }
        const bool text = c < text_chunks;
        const Context x = text ? txt : img;
        const int start = (text ? c : c - text_chunks) * kBc;
        const int steps = min(kBc, x.keys - start + 15) / 16;  // 16-key steps holding keys: 1..4
        const bf16* kt = ks + stage * kBc * kD;
        const bf16* vt = vs + stage * kBc * kD;

        // S = Q K^T for this warp's 16 rows and the chunk's keys
        float s[kBc / 8][4];
#pragma unroll
        for (int i = 0; i < kBc / 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < kD / 16; ++kk) {
#pragma unroll
            for (int np = 0; np < kBc / 16; ++np) {
                if (np >= steps) continue;
                uint32_t b[4];
                const int row = np * 16 + (lane % 8) + (lane / 16) * 8, cb = 2 * kk + ((lane / 8) & 1);
                ldmatrix_x4(b, kt + swz<kD>(row, cb));
                MmaType<bf16>::mma(s[2 * np], qf[kk], b[0], b[1]);
                MmaType<bf16>::mma(s[2 * np + 1], qf[kk], b[2], b[3]);
            }
        }

        // online softmax on rows g (s[.][0..1]) and g + 8 (s[.][2..3]), in the log2 domain
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < kBc / 8; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int key = start + nt * 8 + c2 + (e & 1);
                float v = key < x.keys ? s[nt][e] * scale_log2 : -INFINITY;
                if (key == x.pad_key) v += x.pad_log2;
                s[nt][e] = v;
                mx[e / 2] = fmaxf(mx[e / 2], v);
            }
        }
        float alpha[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            const float m_new = fmaxf(m_run[r], mx[r]);  // finite: every chunk holds at least one key
            alpha[r] = fast_exp2(m_run[r] - m_new);      // exp2(-inf) = 0 on a context's first chunk
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
            pa[nt / 2][(nt & 1) * 2 + 0] = MmaType<bf16>::pack(p0, p1);
            pa[nt / 2][(nt & 1) * 2 + 1] = MmaType<bf16>::pack(p2, p3);
        }
#pragma unroll
        for (int dt = 0; dt < kD / 8; ++dt) {
            o[dt][0] *= alpha[0];
            o[dt][1] *= alpha[0];
            o[dt][2] *= alpha[1];
            o[dt][3] *= alpha[1];
        }

        // O += P V
#pragma unroll
        for (int kk = 0; kk < kBc / 16; ++kk) {
            if (kk >= steps) continue;
#pragma unroll
            for (int dp = 0; dp < kD / 16; ++dp) {
                uint32_t b[4];
                const int row = kk * 16 + (lane % 8) + ((lane / 8) & 1) * 8, cb = 2 * dp + lane / 16;
                ldmatrix_x4_trans(b, vt + swz<kD>(row, cb));
                MmaType<bf16>::mma(o[2 * dp], pa[kk], b[0], b[1]);
                MmaType<bf16>::mma(o[2 * dp + 1], pa[kk], b[2], b[3]);
            }
        }

        if (c == text_chunks - 1) {  // the text's softmax is complete: park its output, start the image's
            float inv[2];
            inverse_sums(inv);
#pragma unroll
            for (int dt = 0; dt < kD / 8; ++dt) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    stash[(dt * 4 + e) * kThreads + int(threadIdx.x)] = o[dt][e] * inv[e / 2];
                    o[dt][e] = 0.f;
                }
            }
            m_run[0] = m_run[1] = -INFINITY;
            l_run[0] = l_run[1] = 0.f;
        }
        __syncthreads();  // every warp is done with this chunk's stage before the next iteration refills it
    }

    float inv[2];
    inverse_sums(inv);
    bf16* out = static_cast<bf16*>(a.out) + (int64_t(branch) * a.lq) * a.o_tok + head * a.o_head;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int64_t row = q0 + warp * 16 + g + r * 8;
        if (row >= a.lq) continue;
        bf16* po = out + row * a.o_tok + c2;
#pragma unroll
        for (int dt = 0; dt < kD / 8; ++dt) {
            const float* t = stash + (dt * 4 + 2 * r) * kThreads + int(threadIdx.x);
            const uint32_t v = MmaType<bf16>::pack(o[dt][2 * r] * inv[r] + t[0], o[dt][2 * r + 1] * inv[r] + t[kThreads]);
            *reinterpret_cast<uint32_t*>(po + dt * 8) = v;
        }
    }
}

bool context_supported(const CrossContextArgs& c) {
    constexpr size_t es = sizeof(bf16);
    return c.k && c.v && c.rows >= 1 && aligned16(c.k) && aligned16(c.v) && aligned16_stride(c.k_tok, es) &&
           aligned16_stride(c.k_head, es) && aligned16_stride(c.v_tok, es) && aligned16_stride(c.v_head, es);
}

}  // namespace

bool cross_attention_supported(const CrossAttentionArgs& a) {
    if (a.branches < 1 || a.branches > kCrossMaxBranches || a.heads <= 0 || a.heads > 65535 || a.lq <= 0) return false;
    if ((a.lq + kBr - 1) / kBr > int64_t(0x7fffffff)) return false;
    constexpr size_t es = sizeof(bf16);
    if (!a.q || !a.out || !aligned16(a.q) || !aligned16(a.out) || !aligned16_stride(a.q_tok, es) ||
        !aligned16_stride(a.q_head, es) || !aligned16_stride(a.o_tok, es) || !aligned16_stride(a.o_head, es))
        return false;
    for (int b = 0; b < a.branches; ++b)
        if (!context_supported(a.text[b]) || !context_supported(a.image[b])) return false;
    return true;
}

cudaError_t cross_attention(const CrossAttentionArgs& a, cudaStream_t stream) {
    if (!cross_attention_supported(a)) return cudaErrorNotSupported;
    static const cudaError_t attr = cudaFuncSetAttribute(
        cross_attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmemBytes));
    if (attr != cudaSuccess) return attr;
    const dim3 grid(unsigned((a.lq + kBr - 1) / kBr), unsigned(a.heads), unsigned(a.branches));
    cross_attention_kernel<<<grid, kThreads, kSmemBytes, stream>>>(a);
    return cudaGetLastError();
}

}  // namespace dzr::kernels
