#pragma once
/// Host-side conversions between float and the 16/8-bit float formats (round to nearest even).
#include <cmath>
#include <cstdint>
#include <cstring>

namespace dzr {

inline float bf16_to_f32(uint16_t h) {
    uint32_t u = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // NaN stays a (quiet) NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return uint16_t(u >> 16);
}

inline float f16_to_f32(uint16_t h) {
    uint32_t sign = uint32_t(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else {  // subnormal: renormalize
            exp = 127 - 15 + 1;
            while ((man & 0x400u) == 0) {
                man <<= 1;
                --exp;
            }
            man &= 0x3ffu;
            u = sign | (exp << 23) | (man << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

inline uint16_t f32_to_f16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t absu = u & 0x7fffffffu;
    if (absu > 0x7f800000u) return uint16_t(sign | 0x7e00u);    // NaN
    if (absu >= 0x477ff000u) return uint16_t(sign | 0x7c00u);   // overflow -> inf
    if (absu < 0x38800000u) {                                    // subnormal or zero
        uint32_t mant = (absu & 0x7fffffu) | 0x800000u;
        int shift = 126 - int(absu >> 23);  // value / 2^-24 = mant24 * 2^(exp - 126)
        if (shift > 31) return uint16_t(sign);
        uint32_t half_bits = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1u);
        uint32_t halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (half_bits & 1u))) ++half_bits;
        return uint16_t(sign | half_bits);
    }
    uint32_t r = absu + 0xfffu + ((absu >> 13) & 1u);  // round to nearest even at bit 13
    return uint16_t(sign | ((r - 0x38000000u) >> 13));
}

/// OCP FP8 E4M3 ("fn": no infinities, 0x7f/0xff = NaN, max 448, subnormals m * 2^-9).
inline float f8e4m3_to_f32(uint8_t v) {
    uint32_t sign = (v & 0x80u) ? 1u : 0u;
    uint32_t exp = (v >> 3) & 0xfu;
    uint32_t man = v & 0x7u;
    float out;
    if ((v & 0x7fu) == 0x7fu) {
        out = NAN;
    } else if (exp == 0) {
        out = std::ldexp(float(man), -9);  // subnormal: man * 2^-6 * 2^-3
    } else {
        out = std::ldexp(1.0f + float(man) / 8.0f, int(exp) - 7);
    }
    return sign ? -out : out;
}

/// float -> OCP FP8 E4M3, rounding to nearest even and saturating: |f| >= 448 (infinities included) gives
/// ±448 (0x7e / 0xfe), NaN gives the canonical NaN 0x7f. The same bits as CUDA's
/// __nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3) (checked against its host implementation on every third f32
/// bit pattern, and on the device by tests/cuda/test_fp8.cpp). Integer arithmetic only, so the result does not depend
/// on the FPU's rounding mode.
inline uint8_t f32_to_f8e4m3(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    const uint8_t sign = uint8_t((u >> 24) & 0x80u);
    const uint32_t absu = u & 0x7fffffffu;
    if (absu > 0x7f800000u) return 0x7fu;                   // NaN (canonical, as CUDA's conversion)
    if (absu >= 0x43e00000u) return uint8_t(sign | 0x7eu);  // >= 448 (and inf): saturate
    if (absu < 0x3c800000u) {                               // below 2^-6: subnormal (m * 2^-9) or zero
        const uint32_t e = absu >> 23;
        if (e == 0) return sign;                            // f32 zero or subnormal (< 2^-126)
        const uint32_t mant = (absu & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 141u - e;  // |f| / 2^-9 = mant * 2^(e - 150 + 9)
        if (shift > 24) return sign;      // below half the smallest subnormal (2^-10)
        uint32_t m = mant >> shift;
        const uint32_t rem = mant & ((1u << shift) - 1u), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (m & 1u))) ++m;  // m == 8 is the smallest normal, 0x08
        return uint8_t(sign | m);
    }
    // normal: keep 3 of the 23 mantissa bits, round to nearest even; a carry moves into the exponent
    const uint32_t r = absu + 0x7ffffu + ((absu >> 20) & 1u);
    return uint8_t(sign | ((r >> 20) - ((127u - 7u) << 3)));
}

}  // namespace dzr
