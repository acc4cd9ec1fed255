// The seeded noise generator (Philox4x32-10 + Box-Muller) and the noise sources.
#include <doctest/doctest.h>

#include <cmath>
#include <numbers>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "core/half.h"
#include "io/npy.h"
#include "rollout/noise_files.h"
#include "support/test_support.h"

using namespace dzr;

TEST_CASE("philox4x32-10 matches the Random123 known-answer vectors") {
    using A4 = std::array<uint32_t, 4>;
    CHECK(philox4x32_10({0, 0, 0, 0}, {0, 0}) == A4{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u});
    CHECK(philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu}) ==
          A4{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu});
    CHECK(philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u}) ==
          A4{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u});
}

TEST_CASE("normal fill applies Box-Muller to the documented Philox block layout") {
    // seed 0, stream 0, block 0 is the first known-answer vector above.
    std::vector<float> z(8);
    philox_normal_fill(0, 0, z);
    const double u[4] = {double(0x6627e8d5u), double(0xe169c58du), double(0xbc57ac4cu), double(0x9b00dbd8u)};
    for (int p = 0; p < 2; ++p) {
        const double a = (u[2 * p] + 0.5) / 4294967296.0, b = (u[2 * p + 1] + 0.5) / 4294967296.0;
        const double r = std::sqrt(-2.0 * std::log(a));
        CHECK(z[size_t(2 * p)] == float(r * std::cos(2.0 * std::numbers::pi * b)));
        CHECK(z[size_t(2 * p + 1)] == float(r * std::sin(2.0 * std::numbers::pi * b)));
    }
    // block 1 uses counter {1, 0, stream, 0}
    const auto blk = philox4x32_10({1, 0, 0, 0}, {0, 0});
    const double a = (double(blk[0]) + 0.5) / 4294967296.0, b = (double(blk[1]) + 0.5) / 4294967296.0;
    CHECK(z[4] == float(std::sqrt(-2.0 * std::log(a)) * std::cos(2.0 * std::numbers::pi * b)));
}

TEST_CASE("seeded noise is the same on every call and depends on seed, stream and offset") {
    std::vector<float> a(1000), b(1000), c(1000), d(1000), tail(990);
    philox_normal_fill(1140, 0, a);
    philox_normal_fill(1140, 0, b);
    CHECK(a == b);
    philox_normal_fill(1141, 0, c);
    philox_normal_fill(1140, 1, d);
    CHECK(a != c);
    CHECK(a != d);
    philox_normal_fill(1140, 0, tail, 10);  // an offset continues the same stream
    for (size_t i = 0; i < tail.size(); ++i) CHECK(tail[i] == a[i + 10]);

    SeededNoise noise;  // seed 1140
    std::vector<float> v1(size_t(kVideoNoiseShape.numel())), v2(v1.size()),
        act(size_t(kActionNoiseShape.numel()));
    noise.fill(NoiseKind::Video, 0, kVideoNoiseShape, v1);
    noise.fill(NoiseKind::Video, 7, kVideoNoiseShape, v2);
    noise.fill(NoiseKind::Action, 0, kActionNoiseShape, act);
    CHECK(v1 == v2);
    CHECK(noise.same_every_call());
    // a fresh same-seed generator per tensor: the action noise is the video noise's prefix
    for (size_t i = 0; i < act.size(); ++i) CHECK(act[i] == v1[i]);
    CHECK(v1.size() == 16u * 2 * 44 * 80);
    CHECK(act.size() == 24u * 32);
}

TEST_CASE("seeded noise has standard normal moments") {
    std::vector<float> z(1 << 18);
    philox_normal_fill(kDreamZeroSeed, 0, z);
    double s1 = 0, s2 = 0, s4 = 0;
    int64_t beyond3 = 0;
    for (float v : z) {
        s1 += v;
        s2 += double(v) * v;
        s4 += double(v) * v * v * v;
        beyond3 += std::fabs(v) > 3.f ? 1 : 0;
    }
    const double n = double(z.size());
    // standard errors at n = 2^18: mean 0.002, variance 0.003, fourth moment 0.02
    CHECK(std::fabs(s1 / n) < 0.01);
    CHECK(std::fabs(s2 / n - 1.0) < 0.015);
    CHECK(std::fabs(s4 / n - 3.0) < 0.1);
    CHECK(double(beyond3) / n == doctest::Approx(0.0027).epsilon(0.15));  // P(|z| > 3) = 0.0027
}

TEST_CASE("fixed noise checks shapes and ignores a leading batch dimension") {
    std::vector<float> video(2 * 3, 0.5f), action(4, -1.f);
    FixedNoise src(Shape{1, 2, 3}, video, Shape{4}, action, "test");
    std::vector<float> out(6);
    src.fill(NoiseKind::Video, 3, Shape{2, 3}, out);
    CHECK(out == video);
    std::vector<float> aout(4);
    src.fill(NoiseKind::Action, 0, Shape{1, 4}, aout);
    CHECK(aout == action);
    CHECK_THROWS_AS(src.fill(NoiseKind::Video, 0, Shape{3, 2}, out), Error);
    CHECK_THROWS_AS(FixedNoise(Shape{2, 3}, std::vector<float>(5), Shape{4}, action), Error);
    CHECK(src.describe().find("test") != std::string::npos);
}

TEST_CASE("uploaded noise is rounded to the destination dtype") {
    auto be = make_cpu_backend(size_t(16) << 20);
    SeededNoise noise(7);
    Tensor f32 = Tensor::host(Shape{6, 5}, DType::F32);
    upload_noise(*be, noise, NoiseKind::Action, 0, f32);
    std::vector<float> ref(30);
    philox_normal_fill(7, 0, ref);
    for (size_t i = 0; i < 30; ++i) CHECK(f32.ptr<float>()[i] == ref[i]);
    Tensor b16 = Tensor::host(Shape{6, 5}, DType::BF16);
    upload_noise(*be, noise, NoiseKind::Action, 0, b16);
    for (size_t i = 0; i < 30; ++i) CHECK(b16.ptr<uint16_t>()[i] == f32_to_bf16(ref[i]));
}

TEST_CASE("noise dumped to npy files is injected as is for every call") {
    test::TempDir dir;
    std::vector<float> video(size_t(kVideoNoiseShape.numel())), action(size_t(kActionNoiseShape.numel()));
    philox_normal_fill(3, 5, video);
    philox_normal_fill(4, 5, action);
    io::write_npy_f32(dir / "video.npy", {1, 16, 2, 44, 80}, video);
    io::write_npy_f32(dir / "action.npy", {1, 24, 32}, action);
    auto src = load_noise_npy(dir / "video.npy", dir / "action.npy");
    std::vector<float> v(video.size()), a(action.size());
    src->fill(NoiseKind::Video, 0, kVideoNoiseShape, v);
    src->fill(NoiseKind::Action, 5, kActionNoiseShape, a);
    CHECK(v == video);
    CHECK(a == action);
    CHECK(src->same_every_call());
    CHECK(src->describe().find("video.npy") != std::string::npos);
    // wrong shape, missing file, integer array
    io::write_npy_f32(dir / "short.npy", {24, 31}, std::vector<float>(24 * 31));
    auto wrong = load_noise_npy(dir / "video.npy", dir / "short.npy");
    CHECK_THROWS_AS(wrong->fill(NoiseKind::Action, 0, kActionNoiseShape, a), Error);
    CHECK_THROWS_AS(load_noise_npy(dir / "video.npy", dir / "missing.npy"), Error);
    const std::vector<int32_t> ints(4, 1);
    io::write_npy(dir / "ints.npy", io::NpyDType::I4, {4}, ints.data());
    CHECK_THROWS_AS(load_noise_npy(dir / "ints.npy", dir / "action.npy"), Error);
}
