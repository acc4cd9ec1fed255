#pragma once
/// E4M3 conversions and the row scale of core/fp8.h on the device, shared by the FP8 kernels and the fused row
/// kernels that quantize their output (kernels/fp8.cu, dit_fused.cu, dit_rows.cu): amax by fmaxf, scale =
/// max(amax, 1e-12) / 448 and the multiplier 448 / max(amax, 1e-12) by IEEE divisions, codes by cvt.rn.satfinite;
/// and the codes of a thread's chunks of a bf16 row, written one way by all of them.
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/common.cuh"

namespace dzr::kernels::fp8 {

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

/// The codes of 8 values times `mul`, packed little-endian (value i in byte i).
__device__ __forceinline__ uint2 codes8(const float (&v)[8], float mul) {
    uint32_t lo = 0, hi = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        lo |= uint32_t(to_e4m3(__fmul_rn(v[i], mul))) << (8 * i);
        hi |= uint32_t(to_e4m3(__fmul_rn(v[i + 4], mul))) << (8 * i);
    }
    return make_uint2(lo, hi);
}

/// The chunk rounded to bf16 (as an output row would hold it) back into `raw` and `o`, its absolute maximum folded
/// into `amax`: what an E4M3 row quantizes.
__device__ __forceinline__ void round_for_codes(uint4& raw, float (&o)[8], float& amax) {
    raw = pack8(o);
    unpack8(raw, o);
#pragma unroll
    for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(o[i]));
}

/// Writes the E4M3 codes of a thread's chunks of a bf16 row: chunk k is the row's chunk first + k · stride, the
/// codes of its values times `mul` (row_scale's multiplier) into out[chunk].
template <int N>
__device__ __forceinline__ void write_codes(const uint4 (&raw)[N], int chunks, int first, int stride, float mul,
                                            uint2* out) {
#pragma unroll
    for (int k = 0; k < N; ++k) {
        const int ch = first + k * stride;
        if (ch < chunks) {
            float v[8];
            unpack8(raw[k], v);
            out[ch] = codes8(v, mul);
        }
    }
}

}  // namespace dzr::kernels::fp8
