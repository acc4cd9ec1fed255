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

/// OCP FP8 E4M3 (fn: no infinities, 0x7f/0xff = NaN, max 448).
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

}  // namespace dzr
