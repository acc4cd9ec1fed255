// The fast host preprocessing (AaResizer, ObservationPreprocessor, parallel_for) against the
// operation-by-operation reference (resize_bilinear_aa_u8, compose_canvas, canvases_to_model_input):
// every byte and every float must be identical, whatever the thread count.
#include <doctest/doctest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "policy/dreamzero_policy.h"
#include "policy/preprocess.h"
#include "policy/tokenizer.h"
#include "support/rgb_images.h"
#include "support/test_support.h"

using namespace dzr;
using test::random_image;

namespace {

/// Smooth content with a few hard edges (closer to camera frames than noise; exercises values near
/// the truncation boundaries).
RgbImage scene_image(int h, int w, uint64_t seed) {
    RgbImage img(h, w);
    std::mt19937_64 rng(seed);
    const int cx = int(rng() % uint64_t(w)), cy = int(rng() % uint64_t(h));
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x)
            for (int c = 0; c < 3; ++c) {
                int v = (x * (c + 1) + y * 2) & 0xff;
                if ((x - cx) * (x - cx) + (y - cy) * (y - cy) < 400) v = 255 - c * 60;
                img.at(y, x, c) = uint8_t(v);
            }
    return img;
}

/// The reference pipeline of one view, spelled out with the per-channel float resize.
RgbImage reference_view(const RgbImage& frame, ViewSize size, bool fma = true) {
    const RgbImage padded = resize_with_pad(frame.view(), kFrameHeight, kFrameWidth);
    return resize_bilinear_aa_u8(padded.view(), center_crop_offset(kFrameHeight, kCropHeight),
                                 center_crop_offset(kFrameWidth, kCropWidth), kCropHeight, kCropWidth, size.height,
                                 size.width, ResizeOptions{fma});
}

}  // namespace

TEST_CASE("the fast resize is bit-identical to the reference resize, fused and unfused") {
    struct Geo {
        int in_h, in_w, out_h, out_w;
    };
    // DROID (up), tiny (down), identity, mixed directions, and outputs of more than 4 taps (AgiBot's 5 and 6
    // rows; 9 to 17 both ways), which accumulate partly unfused.
    for (const Geo g : {Geo{171, 304, 176, 320}, Geo{171, 304, 88, 160}, Geo{40, 50, 40, 50}, Geo{33, 70, 61, 35},
                        Geo{9, 9, 1, 1}, Geo{1, 7, 5, 2}, Geo{456, 608, 176, 320}, Geo{120, 480, 15, 60}}) {
        for (bool fma : {true, false}) {
            CAPTURE(g.in_h);
            CAPTURE(g.out_w);
            CAPTURE(fma);
            const AaResizer r(g.in_h, g.in_w, g.out_h, g.out_w, ResizeOptions{fma});
            for (uint64_t seed : {1u, 2u}) {
                const RgbImage img = seed == 1 ? random_image(g.in_h + 6, g.in_w + 9, seed)
                                               : scene_image(g.in_h + 6, g.in_w + 9, seed);
                const RgbImage want =
                    resize_bilinear_aa_u8(img.view(), 4, 8, g.in_h, g.in_w, g.out_h, g.out_w, ResizeOptions{fma});
                const RgbImage got = r.run(img.view(), 4, 8);
                REQUIRE(got.height == want.height);
                REQUIRE(got.width == want.width);
                CHECK(got.pixels == want.pixels);
            }
        }
    }
}

TEST_CASE("the fast resize writes doubled columns into a strided destination") {
    const RgbImage img = random_image(180, 320, 7);
    const AaResizer r(kCropHeight, kCropWidth, 88, 160);
    const RgbImage want = r.run(img.view(), 4, 8);
    const size_t stride = 400 * 3;
    std::vector<uint8_t> dst(size_t(88) * stride, 0xAB);
    r.run(img.view(), 4, 8, dst.data(), stride, true);
    for (int y = 0; y < 88; ++y) {
        for (int x = 0; x < 160; ++x)
            for (int c = 0; c < 3; ++c) {
                REQUIRE(dst[size_t(y) * stride + size_t(2 * x) * 3 + size_t(c)] == want.at(y, x, c));
                REQUIRE(dst[size_t(y) * stride + size_t(2 * x + 1) * 3 + size_t(c)] == want.at(y, x, c));
            }
        CHECK(dst[size_t(y) * stride + 320 * 3] == 0xAB);  // nothing written past the doubled row
    }
    CHECK_THROWS_AS(r.run(img.view(), 10, 8), Error);  // the crop leaves the frame
}

TEST_CASE("the observation preprocessor reproduces the reference canvases and model inputs") {
    for (const ViewSize view : {ViewSize{176, 320}, ViewSize{88, 160}}) {
        for (UnitRangeMode mode : {UnitRangeMode::F32, UnitRangeMode::Bf16Reference}) {
            for (int threads : {1, 3, 8}) {
                CAPTURE(view.height);
                CAPTURE(threads);
                const int T = 4;
                // Cameras of 180x320, except exterior 2 at 240x427 (padded first, as preprocess_view does).
                const std::array<std::pair<int, int>, 3> sizes = {{{180, 320}, {180, 320}, {240, 427}}};
                std::array<std::vector<uint8_t>, 3> data;
                std::array<TensorView, 3> cams;
                std::array<std::vector<RgbImage>, 3> frames;
                for (int v = 0; v < 3; ++v) {
                    const auto [h, w] = sizes[size_t(v)];
                    for (int t = 0; t < T; ++t) {
                        frames[size_t(v)].push_back(t % 2 ? scene_image(h, w, uint64_t(10 * v + t))
                                                          : random_image(h, w, uint64_t(10 * v + t)));
                        const auto& px = frames[size_t(v)].back().pixels;
                        data[size_t(v)].insert(data[size_t(v)].end(), px.begin(), px.end());
                    }
                    cams[size_t(v)] = TensorView(data[size_t(v)].data(), DType::U8, Shape{T, h, w, 3});
                }
                // Reference: views -> canvases -> inputs.
                std::vector<RgbImage> canvases;
                for (int t = 0; t < T; ++t)
                    canvases.push_back(compose_canvas(reference_view(frames[0][size_t(t)], view),
                                                      reference_view(frames[1][size_t(t)], view),
                                                      reference_view(frames[2][size_t(t)], view)));
                const std::vector<int> clip = {0, 0, 0, 1, 1, 2, 2, 3, 3};
                std::vector<RgbImage> clip_canvases;
                for (int i : clip) clip_canvases.push_back(canvases[size_t(i)]);
                const size_t plane = size_t(4) * size_t(view.height) * size_t(view.width);
                std::vector<float> want_ref(3 * plane), want_clip(3 * clip.size() * plane);
                canvases_to_model_input(std::span<const RgbImage>(&canvases[3], 1), want_ref, mode);
                canvases_to_model_input(clip_canvases, want_clip, mode);

                const ObservationPreprocessor pre(view, mode, threads);
                std::vector<float> ref(3 * plane, 7.f), out(3 * clip.size() * plane, 7.f);
                pre.run(cams[0], cams[1], cams[2], 3, clip, ref, out);
                CHECK(std::memcmp(ref.data(), want_ref.data(), ref.size() * sizeof(float)) == 0);
                CHECK(std::memcmp(out.data(), want_clip.data(), out.size() * sizeof(float)) == 0);

                // The bf16 outputs are the bf16 roundings of the f32 ones, element for element.
                std::vector<uint16_t> ref16(3 * plane, 7), out16(3 * clip.size() * plane, 7);
                pre.run_bf16(cams[0], cams[1], cams[2], 3, clip, ref16, out16);
                size_t bad16 = 0;
                for (size_t i = 0; i < ref16.size(); ++i) bad16 += ref16[i] != f32_to_bf16(want_ref[i]);
                for (size_t i = 0; i < out16.size(); ++i) bad16 += out16[i] != f32_to_bf16(want_clip[i]);
                CHECK(bad16 == 0);

                // A reused scratch holding stale bytes (as a recycled call's would) changes nothing: every
                // canvas byte is written before it is read.
                ObservationPreprocessor::Scratch scratch(5 * plane * 3, uint8_t(0xAB));
                std::vector<float> ref_s(3 * plane, 7.f), out_s(3 * clip.size() * plane, 7.f);
                pre.run(cams[0], cams[1], cams[2], 3, clip, ref_s, out_s, &scratch);
                CHECK(std::memcmp(ref_s.data(), want_ref.data(), ref_s.size() * sizeof(float)) == 0);
                CHECK(std::memcmp(out_s.data(), want_clip.data(), out_s.size() * sizeof(float)) == 0);
                std::fill(scratch.begin(), scratch.end(), uint8_t(0x55));
                std::vector<uint16_t> ref16_s(3 * plane, 7), out16_s(3 * clip.size() * plane, 7);
                pre.run_bf16(cams[0], cams[1], cams[2], 3, clip, ref16_s, out16_s, &scratch);
                CHECK(ref16_s == ref16);
                CHECK(out16_s == out16);

                std::vector<uint8_t> cv(plane * 3);
                pre.canvas(cams[0], cams[1], cams[2], 2, cv.data());
                CHECK(cv == canvases[2].pixels);

                // A 1-frame call: the reference input only.
                pre.run(cams[0], cams[1], cams[2], 0, {}, ref, {});
                std::vector<float> want0(3 * plane);
                canvases_to_model_input(std::span<const RgbImage>(&canvases[0], 1), want0, mode);
                CHECK(std::memcmp(ref.data(), want0.data(), ref.size() * sizeof(float)) == 0);
            }
        }
    }
}

TEST_CASE("the observation preprocessor rejects mismatched cameras and output sizes") {
    std::vector<uint8_t> a(size_t(4) * 180 * 320 * 3), b(size_t(3) * 180 * 320 * 3);
    const TensorView four(a.data(), DType::U8, Shape{4, 180, 320, 3});
    const TensorView three(b.data(), DType::U8, Shape{3, 180, 320, 3});
    const ObservationPreprocessor pre(ViewSize{88, 160}, UnitRangeMode::F32, 2);
    const size_t plane = size_t(176) * 320;
    std::vector<float> ref(3 * plane), clip(3 * 9 * plane);
    const std::vector<int> idx = {0, 0, 0, 1, 1, 2, 2, 3, 3};
    CHECK_THROWS_WITH_AS(pre.run(four, four, three, 3, idx, ref, clip), doctest::Contains("exterior_image_2_left"), Error);
    std::vector<float> small(3 * plane - 1);
    CHECK_THROWS_AS(pre.run(four, four, four, 3, idx, small, clip), Error);
    CHECK_THROWS_AS(pre.run(four, four, four, 4, idx, ref, clip), Error);  // reference frame out of range
    const TensorView f32(ref.data(), DType::F32, Shape{1, 88, 160, 3});
    CHECK_THROWS_AS(pre.run(f32, f32, f32, 0, {}, ref, {}), Error);
}

TEST_CASE("parallel_for runs every index once and rethrows a task's error") {
    for (int threads : {1, 2, 5}) {
        std::vector<std::atomic<int>> hits(37);
        parallel_for(37, threads, [&](int i) { hits[size_t(i)].fetch_add(1); });
        for (auto& h : hits) CHECK(h.load() == 1);
        std::atomic<int> ran{0};
        CHECK_THROWS_WITH_AS(parallel_for(20, threads,
                                          [&](int i) {
                                              ran.fetch_add(1);
                                              if (i == 11) throw std::runtime_error("task 11 failed");
                                          }),
                             "task 11 failed", std::runtime_error);
        CHECK(ran.load() == 20);  // the other tasks still ran
    }
    parallel_for(0, 4, [](int) { FAIL("no task expected"); });
}

TEST_CASE("prepare_observation takes over a recycled observation's buffers and writes the same inputs") {
    const ModelConfig model;  // the DROID geometry: 352x640 canvas
    const ObservationPreprocessor pre(ViewSize{model.canvas_height / 2, model.canvas_width / 2});
    const Embodiment droid = builtin_embodiment("oxe_droid");
    const Umt5Tokenizer tok(test::data_dir() / "tokenizer");
    const auto observation = [](std::vector<uint8_t>& data, int T, uint64_t seed) {
        data.clear();
        for (int t = 0; t < 3 * T; ++t) {
            const RgbImage img = random_image(180, 320, seed + uint64_t(t));
            data.insert(data.end(), img.pixels.begin(), img.pixels.end());
        }
        const size_t cam = size_t(T) * 180 * 320 * 3;
        return droid_observation(TensorView(data.data(), DType::U8, Shape{T, 180, 320, 3}),
                                 TensorView(data.data() + cam, DType::U8, Shape{T, 180, 320, 3}),
                                 TensorView(data.data() + 2 * cam, DType::U8, Shape{T, 180, 320, 3}),
                                 std::vector<double>(7, 0.0), 0.0, "pick up the cube");
    };
    std::vector<uint8_t> a, b;
    const Observation first = observation(a, 4, 1), second = observation(b, 4, 100);
    for (const bool bf16 : {true, false}) {
        CAPTURE(bf16);
        const PreparedObservation fresh = prepare_observation(second, model, droid, pre, tok, bf16);
        PreparedObservation used = prepare_observation(first, model, droid, pre, tok, bf16);
        const void* clip_buffer = bf16 ? static_cast<const void*>(used.clip_input_bf16.data())
                                       : static_cast<const void*>(used.clip_input.data());
        const void* scratch_buffer = used.canvas_scratch.data();
        const PreparedObservation again = prepare_observation(second, model, droid, pre, tok, bf16, &used);
        // the same memory, now holding the second observation's inputs
        CHECK((bf16 ? static_cast<const void*>(again.clip_input_bf16.data())
                    : static_cast<const void*>(again.clip_input.data())) == clip_buffer);
        CHECK(again.canvas_scratch.data() == scratch_buffer);
        CHECK(again.frames == 4);
        CHECK(again.reference_input_bf16 == fresh.reference_input_bf16);
        CHECK(again.clip_input_bf16 == fresh.clip_input_bf16);
        CHECK(again.reference_input.size() == fresh.reference_input.size());
        CHECK(again.clip_input.size() == fresh.clip_input.size());
        CHECK(std::memcmp(again.reference_input.data(), fresh.reference_input.data(),
                          fresh.reference_input.size() * sizeof(float)) == 0);
        CHECK(std::memcmp(again.clip_input.data(), fresh.clip_input.data(), fresh.clip_input.size() * sizeof(float)) ==
              0);
        CHECK(again.tokens.positive.ids == fresh.tokens.positive.ids);
        CHECK((bf16 ? again.reference_input.empty() : again.reference_input_bf16.empty()));
    }
}
