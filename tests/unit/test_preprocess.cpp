// Camera-frame preprocessing: crop offsets, the bilinear up-resize against a naive double-precision
// reference, PIL's fixed-point down-resize against closed-form weights, padding, canvas and range.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "policy/preprocess.h"
#include "support/rgb_images.h"
#include "support/test_support.h"
#include "weights/safetensors.h"

using namespace dzr;
using test::random_image;

namespace {

// Naive bilinear with half-pixel centres and edge clamping (align_corners=False), in double.
double naive_bilinear(const RgbImage& img, int top, int left, int h, int w, int oh, int ow, int y, int x,
                      int c) {
    auto src = [](int o, int in, int out) {
        const double s = (o + 0.5) * double(in) / double(out) - 0.5;
        return std::clamp(s, 0.0, double(in - 1));
    };
    const double sy = src(y, h, oh), sx = src(x, w, ow);
    const int y0 = int(std::floor(sy)), x0 = int(std::floor(sx));
    const int y1 = std::min(y0 + 1, h - 1), x1 = std::min(x0 + 1, w - 1);
    const double fy = sy - y0, fx = sx - x0;
    auto px = [&](int yy, int xx) { return double(img.at(top + yy, left + xx, c)) / 255.0; };
    const double a = px(y0, x0) * (1 - fx) + px(y0, x1) * fx;
    const double b = px(y1, x0) * (1 - fx) + px(y1, x1) * fx;
    return (a * (1 - fy) + b * fy) * 255.0;
}

// The hash of scripts/parity/gen_preprocess_golden.py (hashed_frame): top 8 bits of a 32-bit mix.
RgbImage hashed_frame(int h, int w, uint64_t seed) {
    RgbImage img(h, w);
    constexpr uint64_t kMask = 0xFFFFFFFFu;
    for (uint64_t i = 0; i < img.pixels.size(); ++i) {
        uint64_t u = (i * 2654435761u + seed * 40503u) & kMask;
        u ^= u >> 13;
        u = (u * 1274126177u) & kMask;
        u ^= u >> 16;
        img.pixels[i] = uint8_t(u >> 24);
    }
    return img;
}

RgbImage golden_frame(int h, int w, const std::string& kind, int seed) {
    if (kind == "hash") return hashed_frame(h, w, uint64_t(seed));
    RgbImage img(h, w);
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
            if (kind == "flat") {
                for (int c = 0; c < 3; ++c) img.at(y, x, c) = uint8_t(seed);
            } else {  // smooth
                img.at(y, x, 0) = uint8_t((x + 2 * y) % 256);
                img.at(y, x, 1) = uint8_t((3 * x + y) % 256);
                img.at(y, x, 2) = uint8_t((x * y) % 256);
            }
        }
    return img;
}

int64_t count_diff(const RgbImage& a, const TensorView& golden) {
    const auto* g = static_cast<const uint8_t*>(golden.data);
    int64_t d = 0;
    for (size_t i = 0; i < a.pixels.size(); ++i) d += a.pixels[i] != g[i] ? 1 : 0;
    return d;
}

}  // namespace

TEST_CASE("center crop anchors round half to even like torchvision") {
    CHECK(center_crop_offset(180, 171) == 4);  // 4.5 -> 4
    CHECK(center_crop_offset(320, 304) == 8);
    CHECK(center_crop_offset(10, 5) == 2);  // 2.5 -> 2
    CHECK(center_crop_offset(11, 4) == 4);  // 3.5 -> 4
    CHECK(center_crop_offset(7, 7) == 0);
    CHECK_THROWS_AS(center_crop_offset(10, 11), Error);
    CHECK_THROWS_AS(center_crop_offset(10, 0), Error);
}

TEST_CASE("bilinear up-resize of the crop matches a naive half-pixel bilinear before truncation") {
    const RgbImage frame = random_image(kFrameHeight, kFrameWidth, 5);
    const RgbImage out =
        resize_bilinear_aa_u8(frame.view(), 4, 8, kCropHeight, kCropWidth, kViewHeight, kViewWidth);
    REQUIRE(out.height == kViewHeight);
    REQUIRE(out.width == kViewWidth);
    int64_t exact = 0, total = 0;
    for (int y = 0; y < kViewHeight; ++y)
        for (int x = 0; x < kViewWidth; ++x)
            for (int c = 0; c < 3; ++c) {
                const double ref =
                    naive_bilinear(frame, 4, 8, kCropHeight, kCropWidth, kViewHeight, kViewWidth, y, x, c);
                const int got = out.at(y, x, c);
                // PyTorch keeps the sample centre in float32 (ulp 2^-15 near column 300), so its weights
                // differ from exact ones by up to ~3e-5: values within 0.01 of an integer may land on
                // either side of it.
                const bool ok = got == int(std::floor(ref + 1e-2)) || got == int(std::floor(ref - 1e-2));
                if (!ok) {
                    CAPTURE(y);
                    CAPTURE(x);
                    CAPTURE(ref);
                    CHECK(got == int(std::floor(ref)));
                }
                exact += got == int(std::floor(ref)) ? 1 : 0;
                ++total;
            }
    CHECK(double(exact) / double(total) > 0.99);
}

TEST_CASE("resize of constant and ramp images keeps values up to truncation") {
    for (int v : {0, 1, 77, 128, 200, 254, 255}) {
        CAPTURE(v);
        RgbImage flat(kFrameHeight, kFrameWidth);
        std::fill(flat.pixels.begin(), flat.pixels.end(), uint8_t(v));
        const RgbImage out =
            resize_bilinear_aa_u8(flat.view(), 4, 8, kCropHeight, kCropWidth, kViewHeight, kViewWidth);
        int64_t off = 0;
        for (uint8_t p : out.pixels) off += (p == v || p == v - 1) ? 0 : 1;
        CHECK(off == 0);
        // the first output row/column takes one source pixel with weight 1: exact u8 -> /255 -> *255
        CHECK(out.at(0, 0, 0) == v);
    }
    // horizontal ramp: value = source column; the interior follows src = (x + 0.5) * w / ow - 0.5
    RgbImage ramp(4, 200);
    for (int y = 0; y < 4; ++y)
        for (int x = 0; x < 200; ++x)
            for (int c = 0; c < 3; ++c) ramp.at(y, x, c) = uint8_t(x);
    const RgbImage out = resize_bilinear_aa_u8(ramp.view(), 0, 0, 4, 200, 4, 230);
    for (int x = 0; x < 230; ++x) {
        CAPTURE(x);
        const double src = std::clamp((x + 0.5) * 200.0 / 230.0 - 0.5, 0.0, 199.0);
        const int got = out.at(2, x, 1);
        CHECK((got == int(std::floor(src + 1e-4)) || got == int(std::floor(src - 1e-4))));
    }
}

TEST_CASE("unfused accumulation is an option that moves results by at most one level") {
    const RgbImage frame = random_image(kFrameHeight, kFrameWidth, 9);
    const RgbImage a =
        resize_bilinear_aa_u8(frame.view(), 4, 8, kCropHeight, kCropWidth, kViewHeight, kViewWidth);
    const RgbImage b = resize_bilinear_aa_u8(frame.view(), 4, 8, kCropHeight, kCropWidth, kViewHeight,
                                             kViewWidth, ResizeOptions{false});
    int64_t far = 0;
    for (size_t i = 0; i < a.pixels.size(); ++i)
        far += std::abs(int(a.pixels[i]) - int(b.pixels[i])) > 1 ? 1 : 0;
    CHECK(far == 0);
}

TEST_CASE("preprocess_view crops 171x304 at (4, 8) and resizes to 176x320") {
    const RgbImage frame = random_image(kFrameHeight, kFrameWidth, 3);
    const RgbImage view = preprocess_view(frame.view(), "wrist");
    const RgbImage direct = resize_bilinear_aa_u8(frame.view(), 4, 8, 171, 304, 176, 320);
    CHECK(view.pixels == direct.pixels);
    // pixels outside the crop window do not matter
    RgbImage changed = frame;
    for (int y = 0; y < kFrameHeight; ++y)
        for (int x = 0; x < kFrameWidth; ++x)
            if (y < 4 || y >= 175 || x < 8 || x >= 312)
                for (int c = 0; c < 3; ++c) changed.at(y, x, c) = 255 - changed.at(y, x, c);
    CHECK(preprocess_view(changed.view(), "wrist").pixels == view.pixels);
    // and one inside does
    changed.at(4, 8, 0) ^= 0x80;
    CHECK(preprocess_view(changed.view(), "wrist").pixels != view.pixels);
    CHECK_THROWS_AS(resize_bilinear_aa_u8(frame.view(), 10, 20, 171, 304, 176, 320), Error);
}

TEST_CASE("preprocess_view resizes to a configured view size with an anti-aliased triangle filter") {
    const RgbImage frame = random_image(kFrameHeight, kFrameWidth, 21);
    // the default is the reference's 176x320
    CHECK(ViewSize{} == ViewSize{176, 320});
    CHECK(preprocess_view(frame.view(), ViewSize{}, "wrist").pixels == preprocess_view(frame.view(), "wrist").pixels);
    // 88x160 (configs/tiny.yaml): the 171x304 crop at (4, 8) shrinks by ~1.9 with a triangle filter whose
    // support scales with the shrink factor (torchvision antialias=True), then truncates to uint8
    const int oh = 88, ow = 160;
    const RgbImage view = preprocess_view(frame.view(), ViewSize{oh, ow}, "wrist");
    REQUIRE(view.height == oh);
    REQUIRE(view.width == ow);
    auto weights = [](int in, int out, int o) {
        const double scale = double(in) / out, center = scale * (o + 0.5);
        std::vector<double> w(static_cast<size_t>(in));
        double total = 0;
        for (int i = 0; i < in; ++i) {
            w[size_t(i)] = std::max(0.0, 1.0 - std::fabs(i + 0.5 - center) / scale);
            total += w[size_t(i)];
        }
        for (double& v : w) v /= total;
        return w;
    };
    int far = 0;
    for (int y = 0; y < oh; y += 3)
        for (int x = 0; x < ow; x += 7) {
            const std::vector<double> wy = weights(kCropHeight, oh, y), wx = weights(kCropWidth, ow, x);
            for (int c = 0; c < 3; ++c) {
                double v = 0;
                for (int i = 0; i < kCropHeight; ++i) {
                    if (wy[size_t(i)] == 0) continue;
                    for (int j = 0; j < kCropWidth; ++j)
                        v += wy[size_t(i)] * wx[size_t(j)] * (frame.at(4 + i, 8 + j, c) / 255.0);
                }
                // float arithmetic may land a value that sits on an integer level one level lower
                const int expect = int(v * 255.0);
                far += std::abs(int(view.at(y, x, c)) - expect) > 1 ? 1 : 0;
            }
        }
    CHECK(far == 0);
    CHECK_THROWS_AS(preprocess_view(frame.view(), ViewSize{0, 160}), Error);
}

TEST_CASE("canvas and model input follow the view size") {
    const int h = 88, w = 160;
    RgbImage wrist(h, w), ext1(h, w), ext2(h, w);
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
            wrist.at(y, x, 0) = uint8_t(x);
            ext1.at(y, x, 1) = uint8_t(y);
            ext2.at(y, x, 2) = uint8_t(x + y);
        }
    const RgbImage cv = compose_canvas(wrist, ext1, ext2);
    REQUIRE(cv.height == 2 * h);
    REQUIRE(cv.width == 2 * w);
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < 2 * w; ++x) CHECK(cv.at(y, x, 0) == x / 2);  // wrist, columns doubled
    for (int y = h; y < 2 * h; ++y)
        for (int x = 0; x < 2 * w; ++x) {
            CHECK(cv.at(y, x, 1) == (x < w ? y - h : 0));                          // exterior 1 bottom-left
            CHECK(cv.at(y, x, 2) == (x < w ? 0 : uint8_t(x - w + y - h)));  // exterior 2 bottom-right
        }
    CHECK_THROWS_AS(compose_canvas(wrist, RgbImage(h, w + 1), ext2), Error);
    CHECK_THROWS_AS(compose_canvas(wrist, ext1, RgbImage(h - 1, w)), Error);

    std::vector<RgbImage> cvs{cv, cv};
    cvs[1].at(2 * h - 1, 2 * w - 1, 2) = 255;
    const size_t plane = size_t(4) * h * w;
    std::vector<float> out(3 * 2 * plane);
    canvases_to_model_input(cvs, out);
    CHECK(out[1] == -1.0f);                                // c0 t0 (0, 1): wrist x = 0, value 0
    CHECK(out[2] == (1.0f / 255.0f - 0.5f) / 0.5f);        // c0 t0 (0, 2): wrist x = 1, value 1
    CHECK(out[(2 * 2 + 1) * plane + plane - 1] == 1.0f);   // c2 t1 (175, 319)
    CHECK(out[(2 * 2 + 0) * plane + plane - 1] == (float(uint8_t(159 + 87)) / 255.0f - 0.5f) / 0.5f);  // c2 t0
    // a canvas of another size, or an output of the 352x640 size, is rejected
    std::vector<RgbImage> mixed{cv, RgbImage(kCanvasHeight, kCanvasWidth)};
    CHECK_THROWS_AS(canvases_to_model_input(mixed, out), Error);
    std::vector<float> big(3 * 2 * size_t(kCanvasHeight) * kCanvasWidth);
    CHECK_THROWS_AS(canvases_to_model_input(cvs, big), Error);
}

TEST_CASE("resize_with_pad halves a 360x640 frame with PIL's 1-3-3-1 taps") {
    const RgbImage big = random_image(360, 640, 11);
    const RgbImage out = resize_with_pad(big.view(), kFrameHeight, kFrameWidth);
    REQUIRE(out.height == 180);
    REQUIRE(out.width == 320);
    // Interior: horizontal pass to uint8 with round-half-up of (a + 3b + 3c + d) / 8, then vertical.
    auto tap = [](int a, int b, int c, int d) { return (a + 3 * b + 3 * c + d + 4) / 8; };
    for (int yy = 1; yy < 179; yy += 7)
        for (int xx = 1; xx < 319; xx += 5)
            for (int c = 0; c < 3; ++c) {
                int h[4];
                for (int k = 0; k < 4; ++k) {
                    const int y = 2 * yy - 1 + k;
                    h[k] = tap(big.at(y, 2 * xx - 1, c), big.at(y, 2 * xx, c), big.at(y, 2 * xx + 1, c),
                               big.at(y, 2 * xx + 2, c));
                }
                CHECK(out.at(yy, xx, c) == tap(h[0], h[1], h[2], h[3]));
            }
    // a constant frame stays constant, borders included
    RgbImage flat(360, 640);
    std::fill(flat.pixels.begin(), flat.pixels.end(), uint8_t(93));
    const RgbImage flat_out = resize_with_pad(flat.view(), 180, 320);
    CHECK(std::count(flat_out.pixels.begin(), flat_out.pixels.end(), uint8_t(93)) ==
          int64_t(flat_out.pixels.size()));
}

TEST_CASE("resize_with_pad keeps the aspect ratio and centres the image on black") {
    RgbImage tall(240, 320);  // 4:3 -> 180x240 centred: 40 black columns each side
    std::fill(tall.pixels.begin(), tall.pixels.end(), uint8_t(200));
    const RgbImage out = resize_with_pad(tall.view(), 180, 320);
    for (int y = 0; y < 180; ++y) {
        CHECK(out.at(y, 39, 0) == 0);
        CHECK(out.at(y, 40, 0) == 200);
        CHECK(out.at(y, 279, 2) == 200);
        CHECK(out.at(y, 280, 2) == 0);
    }
    RgbImage wide(240, 427);  // ratio 1.334375 -> 179x320, pad_h = int(0.5) = 0: the last row is black
    std::fill(wide.pixels.begin(), wide.pixels.end(), uint8_t(50));
    const RgbImage out2 = resize_with_pad(wide.view(), 180, 320);
    CHECK(out2.at(178, 100, 1) == 50);
    CHECK(out2.at(179, 100, 1) == 0);
    CHECK(out2.at(0, 0, 0) == 50);
    // the target size itself is returned unchanged
    const RgbImage same = random_image(180, 320, 2);
    CHECK(resize_with_pad(same.view(), 180, 320).pixels == same.pixels);
    // other sizes go through it inside preprocess_view
    const RgbImage big = random_image(360, 640, 4);
    const RgbImage padded = resize_with_pad(big.view(), 180, 320);
    CHECK(preprocess_view(big.view(), "exterior_image_1_left").pixels ==
          preprocess_view(padded.view()).pixels);
    CHECK_THROWS_AS(resize_with_pad(RgbImage(1, 400).view(), 180, 320), Error);  // would shrink to 0 rows
}

TEST_CASE("canvas puts the wrist view on top with doubled columns and the exteriors below") {
    RgbImage wrist(kViewHeight, kViewWidth), ext1(kViewHeight, kViewWidth), ext2(kViewHeight, kViewWidth);
    for (int y = 0; y < kViewHeight; ++y)
        for (int x = 0; x < kViewWidth; ++x) {
            wrist.at(y, x, 0) = uint8_t(x % 256);
            wrist.at(y, x, 1) = uint8_t(y);
            wrist.at(y, x, 2) = 1;
            ext1.at(y, x, 0) = 10;
            ext1.at(y, x, 1) = uint8_t(y);
            ext1.at(y, x, 2) = uint8_t(x % 256);
            ext2.at(y, x, 0) = 20;
            ext2.at(y, x, 1) = uint8_t(y);
            ext2.at(y, x, 2) = uint8_t(x % 256);
        }
    const RgbImage cv = compose_canvas(wrist, ext1, ext2);
    REQUIRE(cv.height == 352);
    REQUIRE(cv.width == 640);
    for (int y = 0; y < 176; y += 5)
        for (int x = 0; x < 640; x += 3) {
            CHECK(cv.at(y, x, 0) == (x / 2) % 256);
            CHECK(cv.at(y, x, 1) == y);
        }
    for (int y = 176; y < 352; y += 5)
        for (int x = 0; x < 640; x += 3) {
            CHECK(cv.at(y, x, 0) == (x < 320 ? 10 : 20));
            CHECK(cv.at(y, x, 1) == y - 176);
            CHECK(cv.at(y, x, 2) == (x % 320) % 256);
        }
    CHECK_THROWS_AS(compose_canvas(RgbImage(180, 320), ext1, ext2), Error);
}

TEST_CASE("canvases become [3, T, 352, 640] values in [-1, 1]") {
    std::vector<RgbImage> cvs(2, RgbImage(kCanvasHeight, kCanvasWidth));
    cvs[0].at(0, 0, 0) = 255;
    cvs[0].at(0, 1, 1) = 128;
    cvs[1].at(351, 639, 2) = 255;
    const size_t plane = size_t(kCanvasHeight) * kCanvasWidth;
    std::vector<float> out(3 * 2 * plane);
    canvases_to_model_input(cvs, out);
    CHECK(out[0] == 1.0f);                                                   // c0 t0 (0,0)
    CHECK(out[1] == -1.0f);                                                  // c0 t0 (0,1)
    CHECK(out[(1 * 2 + 0) * plane + 1] == (128.0f / 255.0f - 0.5f) / 0.5f);  // c1 t0 (0,1)
    CHECK(out[(2 * 2 + 1) * plane + plane - 1] == 1.0f);                     // c2 t1 (351,639)
    CHECK(out[(2 * 2 + 0) * plane + plane - 1] == -1.0f);                    // c2 t0
    // the bf16 reference mode gives bf16 values within one bf16 step of the f32 ones
    std::vector<RgbImage> ramp(1, RgbImage(kCanvasHeight, kCanvasWidth));
    for (int x = 0; x < 256; ++x) ramp[0].at(0, x, 0) = uint8_t(x);
    std::vector<float> f(3 * plane), b(3 * plane);
    canvases_to_model_input(ramp, f, UnitRangeMode::F32);
    canvases_to_model_input(ramp, b, UnitRangeMode::Bf16Reference);
    for (int x = 0; x < 256; ++x) {
        CAPTURE(x);
        CHECK(bf16_to_f32(f32_to_bf16(b[size_t(x)])) == b[size_t(x)]);
        CHECK(std::fabs(b[size_t(x)] - f[size_t(x)]) <= 1.0f / 128.0f);
    }
    CHECK(b[0] == -1.0f);
    CHECK(b[255] == 1.0f);
    std::vector<float> wrong(10);
    CHECK_THROWS_AS(canvases_to_model_input(cvs, wrong), Error);
}

TEST_CASE("frame views index uint8 [T, H, W, 3] tensors and reject other layouts") {
    Tensor frames = Tensor::host(Shape{2, 3, 4, 3}, DType::U8);
    frames.ptr<uint8_t>()[(1 * 3 * 4 + 2 * 4 + 3) * 3 + 1] = 42;
    const RgbView v = frame_view(frames, 1);
    CHECK(v.height == 3);
    CHECK(v.width == 4);
    CHECK(v.at(2, 3, 1) == 42);
    CHECK_THROWS_AS(frame_view(frames, 2), Error);
    Tensor f32 = Tensor::host(Shape{2, 3, 4, 3}, DType::F32);
    CHECK_THROWS_AS(frame_view(f32, 0), Error);
    Tensor gray = Tensor::host(Shape{2, 3, 4, 1}, DType::U8);
    CHECK_THROWS_AS(frame_view(gray, 0), Error);
}

TEST_CASE("preprocessing reproduces the reference transforms' golden outputs") {
    const std::filesystem::path path = test::data_dir() / "preprocess_golden.safetensors";
    if (!std::filesystem::exists(path)) {
        MESSAGE(
            "skipped: tests/data/preprocess_golden.safetensors not generated yet "
            "(scripts/parity/gen_preprocess_golden.py)");
        return;
    }
    const auto file = SafetensorsFile::open(path);
    std::stringstream cases(file->metadata().at("cases"));
    std::string name;
    while (std::getline(cases, name, ',')) {
        CAPTURE(name);
        std::stringstream spec(file->metadata().at(name));
        std::string h, w, kind, seed;
        std::getline(spec, h, ',');
        std::getline(spec, w, ',');
        std::getline(spec, kind, ',');
        std::getline(spec, seed, ',');
        const RgbImage frame = golden_frame(std::stoi(h), std::stoi(w), kind, std::stoi(seed));
        const RgbImage padded = resize_with_pad(frame.view(), kFrameHeight, kFrameWidth);
        const RgbImage view = preprocess_view(frame.view(), name);
        const RgbImage view_unfused = preprocess_view(frame.view(), name, ResizeOptions{false});
        if (const auto g = file->find(name + ".padded")) {
            REQUIRE(g->numel() == int64_t(padded.pixels.size()));
            const int64_t d = count_diff(padded, *g);
            MESSAGE(name << ": resize_with_pad differs at " << d << " of " << padded.pixels.size()
                         << " values");
            CHECK(d == 0);
        }
        if (const auto g = file->find(name + ".view")) {
            REQUIRE(g->numel() == int64_t(view.pixels.size()));
            const int64_t d = count_diff(view, *g), d_unfused = count_diff(view_unfused, *g);
            MESSAGE(name << ": view differs at " << d << " values (without FMA: " << d_unfused << ")");
            CHECK(d == 0);
        }
        const auto digest = file->metadata().find(name + ".fnv1a64");
        if (digest != file->metadata().end()) {
            uint64_t h = 0xCBF29CE484222325ull;
            for (uint8_t b : view.pixels) h = (h ^ b) * 0x100000001B3ull;
            CHECK(fmt::format("{:016x}", h) == digest->second);
        }
        const auto summary = file->metadata().find(name + ".summary");
        if (summary != file->metadata().end()) {
            const int v = std::stoi(seed);
            const auto [lo, hi] = std::minmax_element(view.pixels.begin(), view.pixels.end());
            const int64_t not_equal =
                int64_t(view.pixels.size()) - std::count(view.pixels.begin(), view.pixels.end(), uint8_t(v));
            const std::string ours =
                std::to_string(int(*lo)) + "," + std::to_string(int(*hi)) + "," + std::to_string(not_equal);
            CHECK(ours == summary->second);
        }
    }
}

TEST_CASE("the embodiments' crop and resize reproduce torchvision's golden views of 5 to 17 taps") {
    // tests/data/resize_golden.safetensors (scripts/parity/gen_resize_golden.py): 480x640 frames through
    // CenterCrop + Resize(BILINEAR, antialias=True) on PyTorch's AVX2/AVX512 CPU kernel, where outputs of more
    // than 4 taps round part of their accumulation unfused.
    const auto file = SafetensorsFile::open(test::data_dir() / "resize_golden.safetensors");
    std::stringstream cases(file->metadata().at("cases"));
    std::string name;
    int checked = 0;
    while (std::getline(cases, name, ',')) {
        CAPTURE(name);
        std::stringstream spec_text(file->metadata().at(name));
        std::vector<std::string> f;
        for (std::string item; std::getline(spec_text, item, ',');) f.push_back(item);
        REQUIRE(f.size() == 8);
        const int h = std::stoi(f[0]), w = std::stoi(f[1]), seed = std::stoi(f[3]), block = std::stoi(f[4]);
        RgbImage frame(h, w);
        if (f[2] == "blocks") {
            // the hash on a grid `block` times smaller, each value repeated over a block x block square
            const RgbImage small = hashed_frame((h + block - 1) / block, (w + block - 1) / block, uint64_t(seed));
            for (int y = 0; y < h; ++y)
                for (int x = 0; x < w; ++x)
                    for (int c = 0; c < 3; ++c) frame.at(y, x, c) = small.at(y / block, x / block, c);
        } else {
            frame = golden_frame(h, w, f[2], seed);
        }
        CanvasSpec spec;
        spec.layout = CanvasLayout::Single;
        spec.cameras = {name};
        spec.frame_height = h;
        spec.frame_width = w;
        spec.crop_scale = std::stod(f[5]);
        spec.view = ViewSize{std::stoi(f[6]), std::stoi(f[7])};
        const auto [ch, cw] = spec.crop_size(h, w);
        const RgbImage fast = preprocess_view(frame.view(), spec, name);
        const RgbImage ref = resize_bilinear_aa_u8(frame.view(), center_crop_offset(h, ch), center_crop_offset(w, cw),
                                                   ch, cw, spec.view.height, spec.view.width);
        REQUIRE(fast.height == spec.view.height);
        REQUIRE(fast.width == spec.view.width);
        CHECK(fast.pixels == ref.pixels);
        if (const auto g = file->find(name + ".view")) {
            REQUIRE(g->numel() == int64_t(ref.pixels.size()));
            const int64_t d = count_diff(ref, *g);
            MESSAGE(name << ": view differs at " << d << " of " << ref.pixels.size() << " values");
            CHECK(d == 0);
            ++checked;
        }
        const auto digest = file->metadata().find(name + ".fnv1a64");
        if (digest != file->metadata().end()) {
            uint64_t hash = 0xCBF29CE484222325ull;
            for (uint8_t b : ref.pixels) hash = (hash ^ b) * 0x100000001B3ull;
            CHECK(fmt::format("{:016x}", hash) == digest->second);
            ++checked;
        }
    }
    CHECK(checked == 4);
}
