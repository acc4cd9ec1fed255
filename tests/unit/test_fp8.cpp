// FP8 (E4M3) on the host: the float <-> e4m3 conversion against exact bit patterns and the format's own
// rounding rule, the row quantization every FP8 path follows (core/fp8.h), and F8_E4M3 safetensors data.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/convert.h"
#include "core/fp8.h"
#include "core/half.h"
#include "support/test_support.h"
#include "weights/safetensors.h"

using namespace dzr;

namespace {

float next_up(float f) { return std::nextafter(f, INFINITY); }
float next_down(float f) { return std::nextafter(f, -INFINITY); }

}  // namespace

TEST_CASE("f32 to e4m3 gives the format's exact bit patterns") {
    CHECK(f32_to_f8e4m3(0.0f) == 0x00);
    CHECK(f32_to_f8e4m3(-0.0f) == 0x80);
    CHECK(f32_to_f8e4m3(1.0f) == 0x38);             // exponent 7, mantissa 0
    CHECK(f32_to_f8e4m3(-1.0f) == 0xb8);
    CHECK(f32_to_f8e4m3(1.125f) == 0x39);
    CHECK(f32_to_f8e4m3(240.0f) == 0x77);           // 1.875 * 2^7
    CHECK(f32_to_f8e4m3(416.0f) == 0x7d);           // 1.625 * 2^8
    CHECK(f32_to_f8e4m3(448.0f) == 0x7e);           // the largest finite value
    CHECK(f32_to_f8e4m3(-448.0f) == 0xfe);
    CHECK(f32_to_f8e4m3(0.015625f) == 0x08);        // 2^-6, the smallest normal
    CHECK(f32_to_f8e4m3(std::ldexp(1.0f, -9)) == 0x01);      // the smallest subnormal
    CHECK(f32_to_f8e4m3(std::ldexp(7.0f, -9)) == 0x07);      // the largest subnormal
    CHECK(f32_to_f8e4m3(std::ldexp(1.0f, -7)) == 0x04);
}

TEST_CASE("f32 to e4m3 saturates at 448 and keeps NaN") {
    CHECK(f32_to_f8e4m3(464.0f) == 0x7e);  // the midpoint to the (absent) 480
    CHECK(f32_to_f8e4m3(500.0f) == 0x7e);
    CHECK(f32_to_f8e4m3(1e30f) == 0x7e);
    CHECK(f32_to_f8e4m3(INFINITY) == 0x7e);
    CHECK(f32_to_f8e4m3(-INFINITY) == 0xfe);
    CHECK(f32_to_f8e4m3(NAN) == 0x7f);
    CHECK(f32_to_f8e4m3(-NAN) == 0x7f);  // the canonical NaN, as CUDA's conversion
    CHECK(std::isnan(f8e4m3_to_f32(f32_to_f8e4m3(NAN))));
}

TEST_CASE("f32 to e4m3 rounds ties to the even code and everything else to the nearest") {
    CHECK(f32_to_f8e4m3(1.0625f) == 0x38);                    // between 0x38 and 0x39: even 0x38
    CHECK(f32_to_f8e4m3(1.1875f) == 0x3a);                    // between 0x39 and 0x3a: even 0x3a
    CHECK(f32_to_f8e4m3(432.0f) == 0x7e);                     // between 416 (0x7d) and 448 (0x7e)
    CHECK(f32_to_f8e4m3(std::ldexp(1.0f, -10)) == 0x00);      // half the smallest subnormal: even 0
    CHECK(f32_to_f8e4m3(std::ldexp(3.0f, -10)) == 0x02);      // 1.5 subnormal units: even 2
    CHECK(f32_to_f8e4m3(std::ldexp(15.0f, -10)) == 0x08);     // 7.5 units: even 8 = the smallest normal
    CHECK(f32_to_f8e4m3(next_up(std::ldexp(1.0f, -10))) == 0x01);
    CHECK(f32_to_f8e4m3(1e-30f) == 0x00);
    CHECK(f32_to_f8e4m3(1e-40f) == 0x00);  // an f32 subnormal

    // Every pair of neighbouring finite codes: the midpoint goes to the even one, one f32 ulp either side to the
    // nearer one (a check of the rule itself, not of the implementation's arithmetic).
    for (int code = 0; code < 0x7e; ++code) {
        const float lo = f8e4m3_to_f32(uint8_t(code)), hi = f8e4m3_to_f32(uint8_t(code + 1));
        const float mid = (lo + hi) / 2;  // exact: both are short binary fractions
        const uint8_t even = (code & 1) == 0 ? uint8_t(code) : uint8_t(code + 1);
        INFO("code " << code);
        CHECK(f32_to_f8e4m3(mid) == even);
        CHECK(f32_to_f8e4m3(next_down(mid)) == code);
        CHECK(f32_to_f8e4m3(next_up(mid)) == code + 1);
        CHECK(f32_to_f8e4m3(-mid) == (even | 0x80));
    }
}

TEST_CASE("every finite e4m3 code decodes and encodes back to itself") {
    for (int code = 0; code < 256; ++code) {
        if ((code & 0x7f) == 0x7f) continue;  // NaN
        INFO("code " << code);
        CHECK(f32_to_f8e4m3(f8e4m3_to_f32(uint8_t(code))) == code);
    }
}

TEST_CASE("host conversion to f8_e4m3 is a saturating cast") {
    const std::vector<float> v = {1.0f, -0.5f, 1000.0f, 0.0f};
    std::vector<uint8_t> q(v.size());
    convert_copy_host(TensorView(const_cast<float*>(v.data()), DType::F32, Shape{4}),
                      TensorView(q.data(), DType::F8_E4M3, Shape{4}));
    CHECK(q == std::vector<uint8_t>{0x38, 0xb0, 0x7e, 0x00});
    std::vector<float> back(v.size());
    convert_copy_host(TensorView(q.data(), DType::F8_E4M3, Shape{4}), TensorView(back.data(), DType::F32, Shape{4}));
    CHECK(back == std::vector<float>{1.0f, -0.5f, 448.0f, 0.0f});
}

TEST_CASE("a row quantizes to its absolute maximum over 448") {
    // amax 2: scale 2/448, multiplier 224; 2 -> 448 exactly, 1 -> 224 (0x76), -0.5 -> -112 (0xee)
    const std::vector<float> x = {1.0f, -2.0f, -0.5f, 0.0f};
    std::vector<uint8_t> q(4);
    const float scale = quantize_row_fp8(x.data(), 4, q.data());
    CHECK(scale == 2.0f / 448.0f);
    CHECK(q == std::vector<uint8_t>{0x76, 0xfe, 0xee, 0x00});

    // all zero: the floor keeps the scale positive and the codes zero
    const std::vector<float> z(8, 0.0f);
    std::vector<uint8_t> qz(8, 0xaa);
    CHECK(quantize_row_fp8(z.data(), 8, qz.data()) == kFp8MinAmax / 448.0f);
    CHECK(qz == std::vector<uint8_t>(8, 0x00));
}

TEST_CASE("quantized rows dequantize to within e4m3's half-ulp of the input") {
    const int64_t rows = 5, cols = 64;
    std::vector<float> x = test::random_floats(size_t(rows * cols), 21, -3.0f, 3.0f);
    for (int64_t c = 0; c < cols; ++c) x[size_t(2 * cols + c)] *= 1e-3f;  // a row of small values
    std::vector<uint8_t> q(x.size());
    std::vector<float> s(static_cast<size_t>(rows)), back(x.size());
    quantize_rows_fp8_host(TensorView(x.data(), DType::F32, Shape{rows, cols}),
                           TensorView(q.data(), DType::F8_E4M3, Shape{rows, cols}),
                           TensorView(s.data(), DType::F32, Shape{rows}));
    dequantize_rows_fp8_host(TensorView(q.data(), DType::F8_E4M3, Shape{rows, cols}),
                             TensorView(s.data(), DType::F32, Shape{rows}),
                             TensorView(back.data(), DType::F32, Shape{rows, cols}));
    for (int64_t r = 0; r < rows; ++r) {
        float amax = 0;
        for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(x[size_t(r * cols + c)]));
        CHECK(s[size_t(r)] == amax / 448.0f);
        for (int64_t c = 0; c < cols; ++c) {
            const float v = x[size_t(r * cols + c)], d = back[size_t(r * cols + c)];
            // NOTE: 3 mantissa bits: a normal code is within 2^-4 relative; below 2^-6 (in units of the scale) the
            // subnormal step 2^-9 bounds the error; plus an f32 rounding of the scale product.
            const float bound = std::max(std::fabs(v) * 0.0625f, s[size_t(r)] * std::ldexp(1.0f, -10)) * 1.0001f;
            INFO("row " << r << " col " << c << ": " << v << " -> " << d);
            CHECK(std::fabs(d - v) <= bound);
        }
    }
    // each row's maximum lands on ±448 (codes 0x7e / 0xfe)
    for (int64_t r = 0; r < rows; ++r) {
        bool has_max = false;
        for (int64_t c = 0; c < cols; ++c) has_max = has_max || (q[size_t(r * cols + c)] & 0x7f) == 0x7e;
        CHECK(has_max);
    }
}

TEST_CASE("bf16 rows quantize like their f32 values") {
    const int64_t rows = 3, cols = 16;
    const std::vector<float> f = test::random_floats(size_t(rows * cols), 5);
    std::vector<uint16_t> h(f.size());
    std::vector<float> hf(f.size());
    for (size_t i = 0; i < f.size(); ++i) {
        h[i] = f32_to_bf16(f[i]);
        hf[i] = bf16_to_f32(h[i]);
    }
    std::vector<uint8_t> q1(f.size()), q2(f.size());
    std::vector<float> s1(static_cast<size_t>(rows)), s2(static_cast<size_t>(rows));
    quantize_rows_fp8_host(TensorView(h.data(), DType::BF16, Shape{rows, cols}),
                           TensorView(q1.data(), DType::F8_E4M3, Shape{rows, cols}),
                           TensorView(s1.data(), DType::F32, Shape{rows}));
    quantize_rows_fp8_host(TensorView(hf.data(), DType::F32, Shape{rows, cols}),
                           TensorView(q2.data(), DType::F8_E4M3, Shape{rows, cols}),
                           TensorView(s2.data(), DType::F32, Shape{rows}));
    CHECK(q1 == q2);
    CHECK(s1 == s2);
}

TEST_CASE("f8_e4m3 tensors round-trip through a safetensors file byte for byte") {
    test::TempDir dir;
    std::vector<uint8_t> codes(256);
    for (int i = 0; i < 256; ++i) codes[size_t(i)] = uint8_t(i);
    std::vector<float> scales = {0.5f, 2.0f};
    write_safetensors(dir / "q.safetensors",
                      {{"w", TensorView(codes.data(), DType::F8_E4M3, Shape{2, 128})},
                       {"w_scale", TensorView(scales.data(), DType::F32, Shape{2})}});
    const auto f = SafetensorsFile::open(dir / "q.safetensors");
    const auto w = f->find("w");
    REQUIRE(w.has_value());
    CHECK(w->dtype == DType::F8_E4M3);
    CHECK(w->shape == Shape{2, 128});
    CHECK(std::memcmp(w->data, codes.data(), codes.size()) == 0);
    CHECK(f->entry("w")->nbytes() == 256);
}
