// Bicubic resize (lib/model/image_resize.h) against a per-pixel implementation written from the PyTorch
// semantics, closed-form cases, and (when present) golden outputs of torch's F.interpolate.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/convert.h"
#include "core/error.h"
#include "model/image_resize.h"
#include "support/test_support.h"

using namespace dzr;

namespace {

constexpr double kA = -0.75;

// Keys' cubic convolution kernel as a function of the distance to the tap.
double keys_kernel(double x) {
    x = std::abs(x);
    if (x <= 1.0) return (kA + 2.0) * x * x * x - (kA + 3.0) * x * x + 1.0;
    if (x < 2.0) return kA * x * x * x - 5.0 * kA * x * x + 8.0 * kA * x - 4.0 * kA;
    return 0.0;
}

// The half-pixel source coordinate, in f32 like PyTorch (opmath_t = float for f32 and bf16 images): at the
// far edge of the canvas the f32 rounding of in/out moves it by ~4e-5 pixels, which matters at 1e-6.
double source_coord(int in, int out, int o) {
    const float scale = float(in) / float(out);
    return double(scale * (float(o) + 0.5f) - 0.5f);
}

// One output pixel the way PyTorch's upsample_bicubic2d does it: four clamped rows, each interpolated
// along x first, then the four row values along y.
std::vector<float> naive_resize(const std::vector<float>& img, int c, int h, int w, int oh, int ow) {
    std::vector<float> out(size_t(c) * oh * ow);
    auto at = [&](int ch, int y, int x) {
        y = std::clamp(y, 0, h - 1);
        x = std::clamp(x, 0, w - 1);
        return double(img[(size_t(ch) * h + y) * w + x]);
    };
    for (int ch = 0; ch < c; ++ch)
        for (int oy = 0; oy < oh; ++oy) {
            const double fy = source_coord(h, oh, oy);
            const int y0 = int(std::floor(fy));
            for (int ox = 0; ox < ow; ++ox) {
                const double fx = source_coord(w, ow, ox);
                const int x0 = int(std::floor(fx));
                double acc = 0.0;
                for (int ky = -1; ky <= 2; ++ky) {
                    double row = 0.0;
                    for (int kx = -1; kx <= 2; ++kx)
                        row += keys_kernel(fx - (x0 + kx)) * at(ch, y0 + ky, x0 + kx);
                    acc += keys_kernel(fy - (y0 + ky)) * row;
                }
                out[(size_t(ch) * oh + oy) * ow + ox] = float(acc);
            }
        }
    return out;
}

// Runs the library resize on the CPU backend.
std::vector<float> library_resize(const std::vector<float>& img, int c, int h, int w, int oh, int ow) {
    auto be = make_cpu_backend(size_t(64) << 20);
    BicubicResize resize(*be, h, w, oh, ow);
    Tensor src = Tensor::host_f32(Shape{c, h, w}, img);
    Tensor dst = Tensor::host(Shape{c, oh, ow}, DType::F32);
    resize.apply(*be, src, dst);
    CHECK(be->workspace().used() == 0);
    return to_f32_vector(dst);
}

// The integer-hash image of scripts/parity/gen_bicubic_golden.py: (v − 2^(bits−1)) / 2^(bits−1), v the top
// `bits` bits of a 32-bit hash of the flat index.
std::vector<float> hashed_image(int c, int h, int w, uint64_t seed, int bits) {
    std::vector<float> v(size_t(c) * h * w);
    const uint64_t mask = 0xFFFFFFFFull;
    const double half = double(uint64_t(1) << (bits - 1));
    for (uint64_t i = 0; i < v.size(); ++i) {
        uint64_t u = (i * 2654435761ull + seed * 40503ull) & mask;
        u ^= u >> 13;
        u = (u * 1274126177ull) & mask;
        u ^= u >> 16;
        const int64_t q = int64_t(u >> (32 - bits));
        v[i] = float(double(q - int64_t(half)) / half);
    }
    return v;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    REQUIRE(a.size() == b.size());
    double m = 0.0;
    for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double(a[i]) - double(b[i])));
    return m;
}

// ---- a minimal safetensors reader for the golden file (F32 / BF16 only) ------------------------------
struct Golden {
    nlohmann::json header;
    std::vector<char> data;

    std::vector<float> tensor(const std::string& name, std::vector<int64_t>* shape = nullptr) const {
        REQUIRE_MESSAGE(header.contains(name), "golden file has no tensor " << name);
        const auto& e = header.at(name);
        const auto off = e.at("data_offsets").get<std::vector<size_t>>();
        const auto dims = e.at("shape").get<std::vector<int64_t>>();
        if (shape) *shape = dims;
        const std::string code = e.at("dtype").get<std::string>();
        const DType dt = code == "F32" ? DType::F32 : DType::BF16;
        REQUIRE((code == "F32" || code == "BF16"));
        REQUIRE(off[1] <= data.size());
        TensorView view(const_cast<char*>(data.data()) + off[0], dt, Shape(dims));
        REQUIRE(view.nbytes() == off[1] - off[0]);
        return to_f32_vector(view);
    }
};

std::filesystem::path golden_path() {
    return test::data_dir() / "bicubic_golden.safetensors";
}

Golden read_golden() {
    std::ifstream f(golden_path(), std::ios::binary);
    REQUIRE(f.good());
    uint64_t n = 0;
    f.read(reinterpret_cast<char*>(&n), 8);
    std::string text(n, '\0');
    f.read(text.data(), std::streamsize(n));
    Golden g;
    g.header = nlohmann::json::parse(text);
    g.data.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    return g;
}

}  // namespace

TEST_CASE("bicubic resize of the canvas to 224x224 matches a per-pixel reference") {
    const int c = 3, h = 352, w = 640, o = 224;
    const auto img = test::random_floats(size_t(c) * h * w, 11);
    const auto got = library_resize(img, c, h, w, o, o);
    const auto want = naive_resize(img, c, h, w, o, o);
    CHECK(max_abs_diff(got, want) < 2e-6);
}

TEST_CASE("bicubic resize matches the per-pixel reference for up-scaling and border-heavy sizes") {
    struct Case {
        int c, h, w, oh, ow;
    };
    for (const Case k :
         {Case{2, 37, 53, 100, 75}, Case{1, 5, 7, 12, 3}, Case{1, 1, 4, 3, 9}, Case{2, 9, 9, 4, 17}}) {
        CAPTURE(k.h);
        CAPTURE(k.w);
        const auto img = test::random_floats(size_t(k.c) * k.h * k.w, 100 + uint64_t(k.h));
        CHECK(max_abs_diff(library_resize(img, k.c, k.h, k.w, k.oh, k.ow),
                           naive_resize(img, k.c, k.h, k.w, k.oh, k.ow)) < 2e-6);
    }
}

TEST_CASE("bicubic weight rows follow Keys' kernel at the tap distances and sum to one") {
    const int in = 40, out = 17;
    const auto wm = bicubic_weight_matrix(in, out);
    for (int o = 0; o < out; ++o) {
        const double src = source_coord(in, out, o);
        double sum = 0.0;
        for (int j = 0; j < in; ++j) sum += wm[size_t(o) * in + j];
        CHECK(sum == doctest::Approx(1.0).epsilon(1e-6));
        if (src < 1.0 || src > in - 3.0) continue;  // clamped border rows fold several taps into one
        for (int j = 0; j < in; ++j)
            CHECK(wm[size_t(o) * in + j] == doctest::Approx(keys_kernel(src - j)).epsilon(1e-5));
    }
}

TEST_CASE("bicubic resize keeps a constant image constant") {
    const std::vector<float> img(size_t(2) * 30 * 50, 0.37f);
    for (float v : library_resize(img, 2, 30, 50, 224, 13)) CHECK(v == doctest::Approx(0.37f).epsilon(1e-6));
}

TEST_CASE("bicubic resize to the same size is the identity") {
    const auto img = test::random_floats(size_t(3) * 11 * 19, 5);
    CHECK(library_resize(img, 3, 11, 19, 11, 19) == img);
}

TEST_CASE("halving a linear ramp samples the ramp at the half-pixel source positions inside the border") {
    // in 16 -> out 8: src = 2·o + 0.5 sits midway between two taps, where the symmetric kernel reproduces
    // linear functions exactly (A = −0.75 does not reproduce them at other phases).
    const int h = 16, w = 16, o = 8;
    std::vector<float> img(size_t(h) * w);
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) img[size_t(y) * w + x] = 0.25f * float(x) - 0.5f * float(y) + 1.0f;
    const auto got = library_resize(img, 1, h, w, o, o);
    for (int oy = 1; oy < o - 1; ++oy)
        for (int ox = 1; ox < o - 1; ++ox) {
            const double sx = 2.0 * ox + 0.5, sy = 2.0 * oy + 0.5;
            CHECK(got[size_t(oy) * o + ox] == doctest::Approx(0.25 * sx - 0.5 * sy + 1.0).epsilon(1e-6));
        }
}

TEST_CASE("bicubic resize of a bf16 image accumulates in f32 and rounds once") {
    auto be = make_cpu_backend(size_t(16) << 20);
    const int c = 2, h = 40, w = 64, oh = 24, ow = 24;
    BicubicResize resize(*be, h, w, oh, ow);
    const auto img = test::random_floats(size_t(c) * h * w, 21);
    Tensor src = Tensor::host(Shape{c, h, w}, DType::BF16);
    convert_copy_host(Tensor::host_f32(Shape{c, h, w}, img), src);
    const auto img_bf16 = to_f32_vector(src);  // the exact bf16 input values
    Tensor dst = Tensor::host(Shape{c, oh, ow}, DType::BF16);
    const size_t planned = resize.workspace_bytes(*be, c, DType::BF16);
    be->reserve_workspace(planned);  // exactly the measured size
    resize.apply(*be, src, dst);
    CHECK(be->workspace().high_water() == planned);
    const auto got = to_f32_vector(dst);
    const auto want = naive_resize(img_bf16, c, h, w, oh, ow);
    for (size_t i = 0; i < got.size(); ++i)  // one rounding to bf16: within half an ulp (<= 2^-8 relative)
        REQUIRE(std::abs(got[i] - want[i]) <= std::abs(want[i]) * (1.0 / 256.0) + 1e-6);
    // A flat bf16 image stays exactly flat (taps summed in f32, not in bf16).
    Tensor flat = Tensor::host(Shape{c, h, w}, DType::BF16);
    convert_copy_host(Tensor::host_f32(Shape{c, h, w}, std::vector<float>(size_t(c) * h * w, 0.375f)), flat);
    resize.apply(*be, flat, dst);
    for (float v : to_f32_vector(dst)) REQUIRE(v == 0.375f);
}

TEST_CASE("bicubic resize rejects images of the wrong size") {
    auto be = make_cpu_backend(size_t(8) << 20);
    BicubicResize resize(*be, 10, 12, 4, 4);
    Tensor ok = Tensor::host(Shape{3, 10, 12}, DType::F32);
    Tensor wrong_in = Tensor::host(Shape{3, 12, 10}, DType::F32);
    Tensor out = Tensor::host(Shape{3, 4, 4}, DType::F32);
    Tensor wrong_out = Tensor::host(Shape{2, 4, 4}, DType::F32);
    CHECK_THROWS_AS(resize.apply(*be, wrong_in, out), Error);
    CHECK_THROWS_AS(resize.apply(*be, ok, wrong_out), Error);
    CHECK_THROWS_AS(bicubic_weight_matrix(0, 4), Error);
    CHECK_NOTHROW(resize.apply(*be, ok, out));
}

TEST_CASE("bicubic resize matches torch F.interpolate goldens" *
          doctest::skip(!std::filesystem::exists(golden_path()))) {
    // tests/data/bicubic_golden.safetensors comes from scripts/parity/gen_bicubic_golden.py.
    const Golden g = read_golden();
    const auto& meta = g.header.at("__metadata__");
    std::stringstream cases(meta.at("cases").get<std::string>());
    int checked = 0;
    for (std::string name; std::getline(cases, name, ',');) {
        CAPTURE(name);
        std::stringstream params(meta.at(name).get<std::string>());
        std::vector<int> p;
        for (std::string v; std::getline(params, v, ',');) p.push_back(std::stoi(v));
        REQUIRE(p.size() == 7);  // channels, in_h, in_w, out_h, out_w, seed, bits
        const auto img = hashed_image(p[0], p[1], p[2], uint64_t(p[5]), p[6]);
        std::vector<int64_t> shape;
        const auto want = g.tensor(name + ".resized", &shape);
        CHECK(shape == std::vector<int64_t>{p[0], p[3], p[4]});
        const auto got = library_resize(img, p[0], p[1], p[2], p[3], p[4]);
        CHECK(max_abs_diff(got, want) < 2e-6);
        if (g.header.contains(name + ".resized_cuda_bf16")) {
            // The reference's own path (bf16 on CUDA) stays within bf16 rounding of the f32 result.
            CHECK(max_abs_diff(got, g.tensor(name + ".resized_cuda_bf16")) < 1.6e-2);
        }
        ++checked;
    }
    CHECK(checked >= 3);
}
