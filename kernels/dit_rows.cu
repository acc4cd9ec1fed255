// The streamed row kernels (kernels/dit_rows.cuh): LayerNorm with modulation (and its E4M3 twin) and RMSNorm + RoPE over
// bf16 rows at memory bandwidth.
//
// Why not the one-warp-per-row kernels of dit_fused.cu: the output may alias the per-column vectors, so no load is
// hoisted and every row pays ~20 dependent L2 round trips with nothing of the next row in flight. Here a block stays
// resident and loops over rows, each warp owning one row at a time: chunk 32k + lane of the row is lane's (the warp
// kernels' reduction order: the same bits), the warp's next row is copied into its shared-memory buffer by cp.async
// while the current one is normalized, and the per-column vectors are staged once per block (bf16 ones as they are,
// others as f32 in two planes, elements 0-3 and 4-7, so a lane's 16-byte reads are conflict-free). A block runs at
// most 16 warps at 128 registers, so 16 rows are in flight per SM; RowImpl::Stream8 keeps the earlier 8-warp shape
// with f32 staging (the same bits). Timings against that shape and the memory's speed: docs/PERF.md, "Row ops".
#include <algorithm>

#include "kernels/dit_rows.cuh"
#include "kernels/fp8_convert.cuh"

namespace dzr::kernels::rows {
namespace {

constexpr int kMaxWarps = 16;  // rows in flight per block
constexpr int kSlots = 6;     // staged vectors at most: weight, bias, scale of 2 groups, shift of 2 groups

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

/// One staged vector: 8 elements of chunk ch from src at off + 8 ch, plus `add` (1 for scale, else 0).
struct StageSrc {
    Vec8Ptr src;
    int64_t off = 0;
    float add = 0.f;
};

/// Where the staged vectors sit, in 16-byte units: packed (every source bf16), slot s's chunk ch at s · chunks + ch;
/// else f32 planes, slot s at 2 s · chunks (elements 0-3 of chunk ch at [ch], 4-7 at [chunks + ch]); -1: absent.
struct Slots {
    StageSrc src[kSlots];
    int count = 0;
    bool packed = true;
    int w = -1, b = -1, s[2] = {-1, -1}, h[2] = {-1, -1};
    int add(Vec8Ptr p, int64_t off, float a) {
        if (!p.defined()) return -1;
        src[count] = StageSrc{p, off, a};
        packed = packed && p.is_bf16;
        return count++;
    }
    /// 16-byte units the staged vectors take for rows of `chunks` chunks.
    __host__ __device__ int64_t units(int chunks) const { return int64_t(count) * (packed ? 1 : 2) * chunks; }
};

/// Every thread of the block copies its share of the vectors into shared memory (bf16 chunks as they are, or as f32).
template <bool kPacked>
__device__ __forceinline__ void stage(const Slots& sl, uint4* prm, int chunks) {
#pragma unroll
    for (int v = 0; v < kSlots; ++v) {
        if (v >= sl.count) break;
        if constexpr (kPacked) {
            // NOTE: off is a multiple of 8 elements (16-byte aligned vectors: the host's check)
            const uint4* src = static_cast<const uint4*>(sl.src[v].src.data) + sl.src[v].off / 8;
            for (int ch = threadIdx.x; ch < chunks; ch += blockDim.x) prm[int64_t(v) * chunks + ch] = src[ch];
        } else {
            for (int ch = threadIdx.x; ch < chunks; ch += blockDim.x) {
                float p[8];
                sl.src[v].src.load(sl.src[v].off + int64_t(ch) * 8, p);
#pragma unroll
                for (int i = 0; i < 8; ++i) p[i] += sl.src[v].add;
                float4* base = reinterpret_cast<float4*>(prm) + int64_t(v) * 2 * chunks;
                base[ch] = make_float4(p[0], p[1], p[2], p[3]);
                base[chunks + ch] = make_float4(p[4], p[5], p[6], p[7]);
            }
        }
    }
}

/// The 8 f32 values of slot `slot` at chunk ch: a packed slot adds its `add` (the slot's StageSrc::add, passed as a
/// constant: no indexing of the kernel's parameters by a run-time slot) here, as the f32 staging did when staging.
template <bool kPacked>
__device__ __forceinline__ void staged(const uint4* prm, int slot, float add, int chunks, int ch, float (&p)[8]) {
    if constexpr (kPacked) {
        // NOTE: one 16-byte shared load into a register (unpack8 on the shared element itself reads it 4 bytes at a time)
        const uint4 v = prm[int64_t(slot) * chunks + ch];
        unpack8(v, p);
#pragma unroll
        for (int i = 0; i < 8; ++i) p[i] += add;
    } else {
        const float4* base = reinterpret_cast<const float4*>(prm) + int64_t(slot) * 2 * chunks;
        const float4 lo = base[ch], hi = base[chunks + ch];
        p[0] = lo.x, p[1] = lo.y, p[2] = lo.z, p[3] = lo.w, p[4] = hi.x, p[5] = hi.y, p[6] = hi.z, p[7] = hi.w;
    }
}

/// Issues the copies of this lane's chunks of row `row` into the warp's buffer.
template <int N>
__device__ __forceinline__ void issue_row(const bf16* x, int64_t row, int cols, uint4* buf, int lane) {
    const uint4* src = reinterpret_cast<const uint4*>(x + row * cols);
    const int chunks = cols / 8;
#pragma unroll
    for (int k = 0; k < N; ++k) {
        const int ch = k * kWarp + lane;
        if (ch < chunks) cp_async16(buf + ch, src + ch);
    }
    cp_async_commit();
}

/// This lane's chunks of the row its own copies brought into the buffer.
template <int N>
__device__ __forceinline__ void take_row(const uint4* buf, int chunks, int lane, uint4 (&raw)[N]) {
    cp_async_wait_all();  // NOTE: a lane reads only the chunks it copied itself: no warp barrier needed
#pragma unroll
    for (int k = 0; k < N; ++k)
        if (k * kWarp + lane < chunks) raw[k] = buf[k * kWarp + lane];
}

struct NormKernelArgs {
    NormArgs a;
    Slots slots;
};

/// A row's staged slots (its group's scale and shift picked once per row; -1: absent).
struct RowSlots {
    int w, b, s, h;
};
__device__ __forceinline__ RowSlots row_slots(const Slots& sl, int g) {
    return RowSlots{sl.w, sl.b, g ? sl.s[1] : sl.s[0], g ? sl.h[1] : sl.h[0]};
}

/// The LayerNorm with its parameters applied to 8 normalized values (one function for the bf16 and the E4M3 kernels, so
/// both round the same f32 values). The adds are those ada_layer_norm stages each kind of vector with.
template <bool kPacked>
__device__ __forceinline__ void ada_apply(const uint4* prm, const RowSlots& rs, int chunks, int ch, float (&o)[8]) {
    float p[8];
    if (rs.w >= 0) {
        staged<kPacked>(prm, rs.w, 0.f, chunks, ch, p);
#pragma unroll
        for (int i = 0; i < 8; ++i) o[i] *= p[i];
    }
    if (rs.b >= 0) {
        staged<kPacked>(prm, rs.b, 0.f, chunks, ch, p);
#pragma unroll
        for (int i = 0; i < 8; ++i) o[i] += p[i];
    }
    if (rs.s >= 0) {
        staged<kPacked>(prm, rs.s, 1.f, chunks, ch, p);  // 1 + scale
#pragma unroll
        for (int i = 0; i < 8; ++i) o[i] *= p[i];
    }
    if (rs.h >= 0) {
        staged<kPacked>(prm, rs.h, 0.f, chunks, ch, p);
#pragma unroll
        for (int i = 0; i < 8; ++i) o[i] += p[i];
    }
}

// kFp8: the output rows rounded to bf16 (as `out` would hold them) and quantized per row instead of written.
template <int N, bool kFp8, bool kPacked>
__global__ void __launch_bounds__(kMaxWarps* kWarp, 1) ada_layer_norm_stream_kernel(const NormKernelArgs k) {
    extern __shared__ uint4 smem[];
    const NormArgs& a = k.a;
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
    const int chunks = a.cols / 8;
    uint4* prm = smem;
    uint4* buf = smem + k.slots.units(chunks) + int64_t(warp) * chunks;
    const int64_t step = int64_t(gridDim.x) * warps;
    int64_t r = int64_t(blockIdx.x) * warps + warp;
    if (r < a.rows) issue_row<N>(a.x, r, a.cols, buf, lane);
    stage<kPacked>(k.slots, prm, chunks);  // overlaps the first rows' copies
    __syncthreads();
    for (; r < a.rows; r += step) {
        uint4 raw[N];
        take_row<N>(buf, chunks, lane, raw);
        const float mean = warp_row_sum(raw, chunks, lane, [](float v) { return v; }) / float(a.cols);
        // NOTE: the sum consumed every value read from the buffer, so the next row's copies may overwrite it
        if (r + step < a.rows) issue_row<N>(a.x, r + step, a.cols, buf, lane);
        const float var = warp_row_sum(raw, chunks, lane, [mean](float v) {
                              const float d = v - mean;
                              return d * d;
                          }) / float(a.cols);
        const float rstd = rsqrtf(var + a.eps);
        const RowSlots rs = row_slots(k.slots, r % a.period < a.split ? 0 : 1);
        float amax = 0.f;
#pragma unroll
        for (int kk = 0; kk < N; ++kk) {
            const int ch = kk * kWarp + lane;
            if (ch < chunks) {
                float o[8];
                unpack8(raw[kk], o);
#pragma unroll
                for (int i = 0; i < 8; ++i) o[i] = (o[i] - mean) * rstd;
                ada_apply<kPacked>(prm, rs, chunks, ch, o);
                if constexpr (kFp8) {
                    fp8::round_for_codes(raw[kk], o, amax);  // the bf16 row, kept for the codes
                } else {
                    reinterpret_cast<uint4*>(a.out + r * a.cols)[ch] = pack8(o);
                }
            }
        }
        if constexpr (kFp8) {
            const float2 sc = fp8::row_scale(warp_max(amax));
            fp8::write_codes(raw, chunks, lane, kWarp, sc.y, reinterpret_cast<uint2*>(a.q + r * a.cols));
            if (lane == 0) a.q_scales[r] = sc.x;
        }
    }
}

struct RopeKernelArgs {
    RopeArgs a;
    Slots slots;  // the weight only
    bool lane_table;  // 256 % head_dim == 0: a lane's chunks all sit at one offset in their heads
};

template <int N, int kEntry, bool kPacked>
__global__ void __launch_bounds__(kMaxWarps* kWarp, 1) rms_norm_rope_stream_kernel(const RopeKernelArgs k) {
    extern __shared__ uint4 smem[];
    const RopeArgs& a = k.a;
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
    const int chunks = a.cols / 8;
    uint4* prm = smem;
    uint4* buf = smem + k.slots.units(chunks) + int64_t(warp) * chunks;
    const int64_t step = int64_t(gridDim.x) * warps;
    int64_t r = int64_t(blockIdx.x) * warps + warp;
    // the lane's (cos, sin) of the next row, fetched with its copies (lane_table)
    float ncs[4] = {}, nsn[4] = {};
    bool nrot = false;
    if (r < a.rows) {
        issue_row<N>(a.x, r, a.cols, buf, lane);
        if (k.lane_table) nrot = rope_fetch<kEntry>(a, r, lane * 8, ncs, nsn);
    }
    stage<kPacked>(k.slots, prm, chunks);
    __syncthreads();
    for (; r < a.rows; r += step) {
        uint4 raw[N];
        take_row<N>(buf, chunks, lane, raw);
        float cs[4], sn[4];
        bool rotate = nrot;
#pragma unroll
        for (int q = 0; q < 4; ++q) cs[q] = ncs[q], sn[q] = nsn[q];
        const float ss = warp_row_sum(raw, chunks, lane, [](float v) { return v * v; });
        // NOTE: the sum consumed every value read from the buffer, so the next row's copies may overwrite it
        if (r + step < a.rows) {
            issue_row<N>(a.x, r + step, a.cols, buf, lane);
            if (k.lane_table) nrot = rope_fetch<kEntry>(a, r + step, lane * 8, ncs, nsn);
        }
        const float rstd = rsqrtf(ss / float(a.cols) + a.eps);
        uint4* orow = reinterpret_cast<uint4*>(a.out + r * a.cols);
#pragma unroll
        for (int kk = 0; kk < N; ++kk) {
            const int ch = kk * kWarp + lane;
            if (ch < chunks) {
                float o[8];
                unpack8(raw[kk], o);
#pragma unroll
                for (int i = 0; i < 8; ++i) o[i] *= rstd;
                if (k.slots.w >= 0) {
                    float p[8];
                    staged<kPacked>(prm, k.slots.w, 0.f, chunks, ch, p);
#pragma unroll
                    for (int i = 0; i < 8; ++i) o[i] *= p[i];
                }
                if (!k.lane_table) rotate = rope_fetch<kEntry>(a, r, ch * 8, cs, sn);
                if (rotate) rotate_pairs(o, cs, sn);
                orow[ch] = pack8(o);
            }
        }
    }
}

/// The launch shape of a streamed kernel: warps (rows in flight) per block, dynamic shared memory, the blocks the rows
/// need, SMs.
struct Launch {
    int warps = 0;
    size_t smem = 0;
    int64_t needed = 0;
    int sms = 0;
};

/// Fits the staged vectors and one row buffer per warp into the block's shared memory; warps = 0: does not fit.
cudaError_t plan(int64_t rows, int cols, const Slots& slots, bool narrow, Launch& l) {
    int dev = 0, optin = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&l.sms, cudaDevAttrMultiProcessorCount, dev);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (e != cudaSuccess) return e;
    const size_t param_bytes = size_t(slots.units(cols / 8)) * 16, row_bytes = size_t(cols) * 2;
    if (param_bytes + row_bytes > size_t(optin)) return cudaSuccess;
    l.warps = int(std::min<size_t>(narrow ? 8 : kMaxWarps, (size_t(optin) - param_bytes) / row_bytes));
    l.warps = int(std::min<int64_t>(l.warps, rows));
    l.smem = param_bytes + size_t(l.warps) * row_bytes;
    l.needed = (rows + l.warps - 1) / l.warps;
    return cudaSuccess;
}

/// Launches as many blocks as stay resident at once (shared memory and registers both counted), or fewer when the
/// rows need fewer.
template <typename Kernel, typename Args>
cudaError_t launch(Kernel kernel, const Launch& l, const Args& args, cudaStream_t stream) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(l.smem));
    int per_sm = 0;
    if (e == cudaSuccess)
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, l.warps * kWarp, l.smem);
    if (e != cudaSuccess) return e;
    const int64_t blocks = std::min<int64_t>(l.needed, int64_t(l.sms) * std::max(1, per_sm));
    kernel<<<unsigned(blocks), l.warps * kWarp, l.smem, stream>>>(args);
    return cudaGetLastError();
}

bool fits(int64_t rows, int cols) { return rows > 0 && cols > 0 && cols % 8 == 0 && cols <= kWarpMaxCols; }

}  // namespace

cudaError_t ada_layer_norm(const NormArgs& a, cudaStream_t stream) {
    if (!fits(a.rows, a.cols)) return cudaErrorNotSupported;
    NormKernelArgs k;
    k.a = a;
    // NOTE: group 1 is staged only where some row takes it
    const bool two = a.split < std::min(a.period, a.rows);
    // NOTE: the adds (0 for the weight, bias and shift, 1 for the scale) are the constants ada_apply passes
    k.slots.w = k.slots.add(a.weight, 0, 0.f);
    k.slots.b = k.slots.add(a.bias, 0, 0.f);
    k.slots.s[0] = k.slots.add(a.scale, 0, 1.f);
    k.slots.s[1] = two ? k.slots.add(a.scale, a.mod_stride, 1.f) : k.slots.s[0];
    k.slots.h[0] = k.slots.add(a.shift, 0, 0.f);
    k.slots.h[1] = two ? k.slots.add(a.shift, a.mod_stride, 0.f) : k.slots.h[0];
    Launch l;
    if (a.narrow) k.slots.packed = false;
    const cudaError_t e = plan(a.rows, a.cols, k.slots, a.narrow, l);
    if (e != cudaSuccess) return e;
    if (l.warps == 0) return cudaErrorNotSupported;
    return dispatch_warp_chunks(a.cols, [&](auto n) {
        constexpr int N = decltype(n)::value;
        if (k.slots.packed)
            return a.q ? launch(ada_layer_norm_stream_kernel<N, true, true>, l, k, stream)
                       : launch(ada_layer_norm_stream_kernel<N, false, true>, l, k, stream);
        return a.q ? launch(ada_layer_norm_stream_kernel<N, true, false>, l, k, stream)
                   : launch(ada_layer_norm_stream_kernel<N, false, false>, l, k, stream);
    });
}

cudaError_t rms_norm_rope(const RopeArgs& a, cudaStream_t stream) {
    if (!fits(a.rows, a.cols) || a.head_dim % 8 != 0 || a.pairs % 4 != 0 || (a.entry != 2 && a.entry != 4))
        return cudaErrorNotSupported;
    RopeKernelArgs k;
    k.a = a;
    k.slots.w = k.slots.add(a.weight, 0, 0.f);
    k.lane_table = (kWarp * 8) % a.head_dim == 0;
    Launch l;
    if (a.narrow) k.slots.packed = false;
    const cudaError_t e = plan(a.rows, a.cols, k.slots, a.narrow, l);
    if (e != cudaSuccess) return e;
    if (l.warps == 0) return cudaErrorNotSupported;
    return dispatch_warp_chunks(a.cols, [&](auto n) {
        constexpr int N = decltype(n)::value;
        if (k.slots.packed)
            return a.entry == 4 ? launch(rms_norm_rope_stream_kernel<N, 4, true>, l, k, stream)
                                : launch(rms_norm_rope_stream_kernel<N, 2, true>, l, k, stream);
        return a.entry == 4 ? launch(rms_norm_rope_stream_kernel<N, 4, false>, l, k, stream)
                            : launch(rms_norm_rope_stream_kernel<N, 2, false>, l, k, stream);
    });
}

}  // namespace dzr::kernels::rows
