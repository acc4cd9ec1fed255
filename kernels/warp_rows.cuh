#pragma once
/// What the one-warp-per-row kernels share (the warp kernels of kernels/dit_fused.cu, the streamed kernels of
/// kernels/dit_rows.cu): a lane holds chunk 32k + lane of a bf16 row as packed bf16 (a uint4 of 8 values), so both
/// families reduce and rotate a row in one order and give the same bits (their E4M3 codes: fp8_convert.cuh).
/// Internal to kernels/: included by kernels/*.cu(h) only.
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/common.cuh"

namespace dzr::kernels {

/// Chunks of 8 a lane holds at most: rows of up to 24 · 256 = 6144 columns.
constexpr int kWarpMaxChunks = 24;
constexpr int64_t kWarpMaxCols = int64_t(kWarpMaxChunks) * kWarp * 8;

/// Calls f(std::integral_constant<int, N>) with the smallest instantiated N (chunks per lane) that covers `cols`.
template <typename F>
cudaError_t dispatch_warp_chunks(int64_t cols, F&& f) {
    const int64_t per_lane = (cols / 8 + kWarp - 1) / kWarp;
    if (per_lane <= 4) return f(std::integral_constant<int, 4>{});
    if (per_lane <= 8) return f(std::integral_constant<int, 8>{});
    if (per_lane <= 16) return f(std::integral_constant<int, 16>{});
    if (per_lane <= 20) return f(std::integral_constant<int, 20>{});
    return f(std::integral_constant<int, kWarpMaxChunks>{});
}

/// Sum over the warp's row of f(value), per lane in chunk order, then across lanes: every lane gets it.
template <int N, typename F>
__device__ __forceinline__ float warp_row_sum(const uint4 (&raw)[N], int chunks, int lane, F f) {
    float acc = 0.f;
#pragma unroll
    for (int k = 0; k < N; ++k) {
        if (k * kWarp + lane < chunks) {
            float v[8];
            unpack8(raw[k], v);
#pragma unroll
            for (int i = 0; i < 8; ++i) acc += f(v[i]);
        }
    }
    return warp_sum(acc);
}

/// (cos, sin) of the 4 pairs of the chunk at column c0 of row `row` from the RoPE tables of `a` (table_a for the
/// first `split` rows of every `period`, table_b after; kEntry floats an entry: (cos, sin) or double-float
/// (cos hi, cos lo, sin hi, sin lo)); false: no rotation (pairs % 4 == 0: a chunk is wholly rotated or not).
template <int kEntry, typename Args>
__device__ __forceinline__ bool rope_fetch(const Args& a, int64_t row, int c0, float (&cs)[4], float (&sn)[4]) {
    const int64_t rr = row % a.period;
    const float* table = rr < a.split ? a.table_a : a.table_b;
    const int j0 = (c0 % a.head_dim) / 2;
    if (!table || j0 >= a.pairs) return false;
    const float* e = table + ((rr < a.split ? rr : rr - a.split) * int64_t(a.pairs) + j0) * kEntry;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        if constexpr (kEntry == 4) {
            const float4 t = reinterpret_cast<const float4*>(e)[q];
            cs[q] = t.x + t.y;
            sn[q] = t.z + t.w;
        } else {
            const float2 t = reinterpret_cast<const float2*>(e)[q];
            cs[q] = t.x;
            sn[q] = t.y;
        }
    }
    return true;
}

/// Rotates the 4 pairs of a chunk by their (cos, sin).
__device__ __forceinline__ void rotate_pairs(float (&o)[8], const float (&cs)[4], const float (&sn)[4]) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        const float x0 = o[2 * q], x1 = o[2 * q + 1];
        o[2 * q] = x0 * cs[q] - x1 * sn[q];
        o[2 * q + 1] = x0 * sn[q] + x1 * cs[q];
    }
}

}  // namespace dzr::kernels
