// CLIP visual tower (lib/model/clip_vision.h): a tiny tower against a naive re-computation in plain loops
// written from dreamzero-reference.md §2.2, the preprocessing formula, and the penultimate-block rule.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/convert.h"
#include "core/error.h"
#include "model/clip_vision.h"
#include "model/image_resize.h"
#include "support/test_support.h"
#include "weights/weight_source.h"
#include "support/map_weight_source.h"

using namespace dzr;
using dzr::test::MapSource;

namespace {


ClipConfig tiny_config() {
    ClipConfig c;
    c.image_size = 224;
    c.patch_size = 14;
    c.width = 64;
    c.num_layers = 3;
    c.num_heads = 2;
    c.mlp_dim = 128;
    c.embed_dim = 32;
    c.use_layers = 2;
    return c;
}

const std::string kPre = "action_head.image_encoder.model.";

std::string block_key(int i, const std::string& name) {
    return kPre + "visual.transformer." + std::to_string(i) + "." + name;
}

void put_block(MapSource& s, const ClipConfig& c, int i, uint64_t seed) {
    const int64_t w = c.width, m = c.mlp_dim;
    const float sw = 1.0f / std::sqrt(float(w)), sm = 1.0f / std::sqrt(float(m));
    s.put(block_key(i, "norm1.weight"), Shape{w}, seed++, 0.5f, 1.5f);
    s.put(block_key(i, "norm1.bias"), Shape{w}, seed++, -0.2f, 0.2f);
    s.put(block_key(i, "attn.to_qkv.weight"), Shape{3 * w, w}, seed++, -2 * sw, 2 * sw);
    s.put(block_key(i, "attn.to_qkv.bias"), Shape{3 * w}, seed++, -0.2f, 0.2f);
    s.put(block_key(i, "attn.proj.weight"), Shape{w, w}, seed++, -sw, sw);
    s.put(block_key(i, "attn.proj.bias"), Shape{w}, seed++, -0.2f, 0.2f);
    s.put(block_key(i, "norm2.weight"), Shape{w}, seed++, 0.5f, 1.5f);
    s.put(block_key(i, "norm2.bias"), Shape{w}, seed++, -0.2f, 0.2f);
    s.put(block_key(i, "mlp.0.weight"), Shape{m, w}, seed++, -sw, sw);
    s.put(block_key(i, "mlp.0.bias"), Shape{m}, seed++, -0.2f, 0.2f);
    s.put(block_key(i, "mlp.2.weight"), Shape{w, m}, seed++, -sm, sm);
    s.put(block_key(i, "mlp.2.bias"), Shape{w}, seed++, -0.2f, 0.2f);
}

// Random weights under the real key names (dreamzero-checkpoint-keys.tsv), unused ones included.
MapSource random_checkpoint(const ClipConfig& c, uint64_t seed) {
    MapSource s;
    const int64_t w = c.width, p = c.patch_size;
    s.put(kPre + "log_scale", Shape{}, seed++, 2.f, 3.f);
    s.put(kPre + "visual.cls_embedding", Shape{1, 1, w}, seed++, -1.f, 1.f);
    s.put(kPre + "visual.pos_embedding", Shape{1, c.num_tokens(), w}, seed++, -0.5f, 0.5f);
    s.put(kPre + "visual.head", Shape{w, c.embed_dim}, seed++, -0.1f, 0.1f);
    s.put(kPre + "visual.patch_embedding.weight", Shape{w, 3, p, p}, seed++, -0.05f, 0.05f);
    s.put(kPre + "visual.pre_norm.weight", Shape{w}, seed++, 0.5f, 1.5f);
    s.put(kPre + "visual.pre_norm.bias", Shape{w}, seed++, -0.2f, 0.2f);
    for (int i = 0; i < c.num_layers; ++i) put_block(s, c, i, seed + 100 * uint64_t(i + 1));
    s.put(kPre + "visual.post_norm.weight", Shape{w}, seed++, 0.5f, 1.5f);
    s.put(kPre + "visual.post_norm.bias", Shape{w}, seed++, -0.2f, 0.2f);
    return s;
}

// ---- the naive tower ---------------------------------------------------------------------------------
using Mat = std::vector<double>;  // row-major

Mat linear(const Mat& x, int64_t rows, int64_t in, const std::vector<float>& w, const std::vector<float>& b,
           int64_t out) {
    Mat y(size_t(rows * out));
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t o = 0; o < out; ++o) {
            double acc = b[size_t(o)];
            for (int64_t i = 0; i < in; ++i) acc += x[size_t(r * in + i)] * w[size_t(o * in + i)];
            y[size_t(r * out + o)] = acc;
        }
    return y;
}

Mat layer_norm(const Mat& x, int64_t rows, int64_t d, const std::vector<float>& w,
               const std::vector<float>& b) {
    Mat y(x.size());
    for (int64_t r = 0; r < rows; ++r) {
        double mean = 0.0, var = 0.0;
        for (int64_t i = 0; i < d; ++i) mean += x[size_t(r * d + i)];
        mean /= double(d);
        for (int64_t i = 0; i < d; ++i) var += (x[size_t(r * d + i)] - mean) * (x[size_t(r * d + i)] - mean);
        var /= double(d);
        for (int64_t i = 0; i < d; ++i)
            y[size_t(r * d + i)] =
                (x[size_t(r * d + i)] - mean) / std::sqrt(var + 1e-5) * w[size_t(i)] + b[size_t(i)];
    }
    return y;
}

// pixels: [3, S, S] preprocessed. Runs the first `blocks` blocks.
std::vector<float> naive_tower(const MapSource& s, const ClipConfig& c, const std::vector<float>& pixels,
                               int blocks) {
    const int64_t S = c.image_size, p = c.patch_size, g = S / p, w = c.width, t = c.num_tokens();
    const int64_t nh = c.num_heads, hd = w / nh, m = c.mlp_dim;
    const auto pw = s.get(kPre + "visual.patch_embedding.weight");
    const auto cls = s.get(kPre + "visual.cls_embedding");
    const auto pos = s.get(kPre + "visual.pos_embedding");
    Mat x(size_t(t * w));
    for (int64_t i = 0; i < w; ++i) x[size_t(i)] = cls[size_t(i)];
    // Conv2d(3 -> w, kernel = stride = p, no bias); output position (gy, gx) is token 1 + gy·g + gx.
    for (int64_t gy = 0; gy < g; ++gy)
        for (int64_t gx = 0; gx < g; ++gx)
            for (int64_t co = 0; co < w; ++co) {
                double acc = 0.0;
                for (int64_t ci = 0; ci < 3; ++ci)
                    for (int64_t ky = 0; ky < p; ++ky)
                        for (int64_t kx = 0; kx < p; ++kx)
                            acc += pw[size_t(((co * 3 + ci) * p + ky) * p + kx)] *
                                   pixels[size_t((ci * S + gy * p + ky) * S + gx * p + kx)];
                x[size_t((1 + gy * g + gx) * w + co)] = acc;
            }
    for (size_t i = 0; i < x.size(); ++i) x[i] += pos[i];
    x = layer_norm(x, t, w, s.get(kPre + "visual.pre_norm.weight"), s.get(kPre + "visual.pre_norm.bias"));
    for (int b = 0; b < blocks; ++b) {
        auto get = [&](const char* name) { return s.get(block_key(b, name)); };
        const Mat h = layer_norm(x, t, w, get("norm1.weight"), get("norm1.bias"));
        const Mat qkv =
            linear(h, t, w, get("attn.to_qkv.weight"), get("attn.to_qkv.bias"), 3 * w);  // [q | k | v]
        Mat att(size_t(t * w), 0.0);
        std::vector<double> pr(static_cast<size_t>(t));
        for (int64_t hh = 0; hh < nh; ++hh)
            for (int64_t i = 0; i < t; ++i) {
                double mx = -INFINITY;
                for (int64_t j = 0; j < t; ++j) {
                    double dot = 0.0;
                    for (int64_t e = 0; e < hd; ++e)
                        dot +=
                            qkv[size_t(i * 3 * w + hh * hd + e)] * qkv[size_t(j * 3 * w + w + hh * hd + e)];
                    pr[size_t(j)] = dot / std::sqrt(double(hd));
                    mx = std::max(mx, pr[size_t(j)]);
                }
                double sum = 0.0;
                for (int64_t j = 0; j < t; ++j) sum += (pr[size_t(j)] = std::exp(pr[size_t(j)] - mx));
                for (int64_t j = 0; j < t; ++j)
                    for (int64_t e = 0; e < hd; ++e)
                        att[size_t(i * w + hh * hd + e)] +=
                            pr[size_t(j)] / sum * qkv[size_t(j * 3 * w + 2 * w + hh * hd + e)];
            }
        const Mat o = linear(att, t, w, get("attn.proj.weight"), get("attn.proj.bias"), w);
        for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
        const Mat h2 = layer_norm(x, t, w, get("norm2.weight"), get("norm2.bias"));
        Mat a = linear(h2, t, w, get("mlp.0.weight"), get("mlp.0.bias"), m);
        for (double& v : a) v = 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)));
        const Mat y = linear(a, t, m, get("mlp.2.weight"), get("mlp.2.bias"), w);
        for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
    }
    return std::vector<float>(x.begin(), x.end());
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    REQUIRE(a.size() == b.size());
    double m = 0.0;
    for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double(a[i]) - double(b[i])));
    return m;
}

constexpr int kCanvasH = 352, kCanvasW = 640;

struct Fixture {
    ClipConfig cfg = tiny_config();
    MapSource src = random_checkpoint(cfg, 1);
    std::unique_ptr<Backend> be = make_cpu_backend(size_t(64) << 20);

    ClipVision load() {
        WeightLoader loader(src, *be);
        return ClipVision(loader, cfg, kCanvasH, kCanvasW);
    }
    std::vector<float> forward(const ClipVision& clip, const std::vector<float>& pixels) {
        const int64_t S = cfg.image_size;
        Tensor px = Tensor::host_f32(Shape{3, S, S}, pixels);
        Tensor out = Tensor::host(Shape{cfg.num_tokens(), cfg.width}, DType::F32);
        clip.forward(*be, px, out);
        CHECK(be->workspace().used() == 0);
        return to_f32_vector(out);
    }
};

}  // namespace

TEST_CASE("tiny CLIP tower matches a naive re-computation over its first use_layers blocks") {
    Fixture f;
    const ClipVision clip = f.load();
    const auto pixels = test::random_floats(size_t(3) * 224 * 224, 2, -2.f, 2.f);
    const auto got = f.forward(clip, pixels);
    CHECK(got.size() == size_t(257) * 64);  // all 257 tokens, class token first
    const auto want = naive_tower(f.src, f.cfg, pixels, f.cfg.use_layers);
    CHECK(max_abs_diff(got, want) < 2e-5);
    // The check is sharp enough to tell the blocks apart: one block fewer or more is far off.
    CHECK(max_abs_diff(got, naive_tower(f.src, f.cfg, pixels, f.cfg.use_layers - 1)) > 1e-2);
    CHECK(max_abs_diff(got, naive_tower(f.src, f.cfg, pixels, f.cfg.num_layers)) > 1e-2);
}

TEST_CASE("CLIP never reads the last block, post_norm, head or log_scale") {
    Fixture f;
    const auto pixels = test::random_floats(size_t(3) * 224 * 224, 3, -2.f, 2.f);
    WeightLoader loader(f.src, *f.be);
    const ClipVision clip(loader, f.cfg, kCanvasH, kCanvasW);
    const auto before = f.forward(clip, pixels);

    const auto unused = loader.unused(kPre);
    const auto skipped = ClipVision::skipped_keys(f.cfg);
    CHECK(std::set<std::string>(unused.begin(), unused.end()) ==
          std::set<std::string>(skipped.begin(), skipped.end()));
    CHECK(skipped.size() == 12 + 4);  // block 2's twelve tensors + post_norm weight/bias + head + log_scale

    // Other values in the skipped tensors give a bit-identical output...
    put_block(f.src, f.cfg, 2, 999);
    f.src.put(kPre + "visual.post_norm.weight", Shape{64}, 7, -3.f, 3.f);
    CHECK(f.forward(f.load(), pixels) == before);
    // ...while the penultimate block is used.
    put_block(f.src, f.cfg, 1, 998);
    CHECK(max_abs_diff(f.forward(f.load(), pixels), before) > 1e-2);
}

TEST_CASE("CLIP preprocessing is the bicubic resize then x*0.5+0.5 and the CLIP mean/std per channel") {
    Fixture f;
    const ClipVision clip = f.load();
    const auto frame = test::random_floats(size_t(3) * kCanvasH * kCanvasW, 4);
    Tensor fr = Tensor::host_f32(Shape{3, kCanvasH, kCanvasW}, frame);
    Tensor px = Tensor::host(Shape{3, 224, 224}, DType::F32);
    clip.preprocess(*f.be, fr, px);
    Tensor resized = Tensor::host(Shape{3, 224, 224}, DType::F32);
    BicubicResize(*f.be, kCanvasH, kCanvasW, 224, 224).apply(*f.be, fr, resized);
    const auto got = to_f32_vector(px);
    const auto r = to_f32_vector(resized);
    const double mean[3] = {0.48145466, 0.4578275, 0.40821073},
                 stdv[3] = {0.26862954, 0.26130258, 0.27577711};
    double worst = 0.0;
    for (size_t c = 0; c < 3; ++c)
        for (size_t i = 0; i < size_t(224) * 224; ++i) {
            const double want = (r[c * 224 * 224 + i] * 0.5 + 0.5 - mean[c]) / stdv[c];
            worst = std::max(worst, std::abs(want - got[c * 224 * 224 + i]));
        }
    CHECK(worst < 1e-5);
    // The reference's own f32 op sequence, one rounding per op: mul_(0.5), add_(0.5), sub_(mean),
    // div_(std). The library multiplies by 1/std (no division op), so it may differ by an ulp, never more;
    // a fused x·(0.5/std) + (0.5 − mean)/std would not (it loses the low bits where x·0.5 + 0.5 ≈ mean).
    const auto seq = [&](size_t c, float x) {
        const float y = x * 0.5f + 0.5f, z = y - float(mean[c]);
        return z / float(stdv[c]);
    };
    const auto fused = [&](size_t c, float x) {
        const float a = 0.5f / float(stdv[c]), b = (0.5f - float(mean[c])) / float(stdv[c]);
        return a * x + b;
    };
    int beyond_ulp = 0, fused_beyond_ulp = 0;
    for (size_t c = 0; c < 3; ++c)
        for (size_t i = 0; i < size_t(224) * 224; ++i) {
            const float x = r[c * 224 * 224 + i], want = seq(c, x);
            const float tol = std::ldexp(std::abs(want), -23);
            beyond_ulp += std::abs(got[c * 224 * 224 + i] - want) > tol ? 1 : 0;
            fused_beyond_ulp += std::abs(fused(c, x) - want) > tol ? 1 : 0;
        }
    CHECK(beyond_ulp == 0);
    CHECK(fused_beyond_ulp > 0);  // the check above can tell the op order apart
    // A black canvas (-1 everywhere) maps to -mean/std.
    Tensor black = Tensor::host_f32(Shape{3, kCanvasH, kCanvasW},
                                    std::vector<float>(size_t(3) * kCanvasH * kCanvasW, -1.f));
    clip.preprocess(*f.be, black, px);
    const auto b = to_f32_vector(px);
    for (size_t c = 0; c < 3; ++c)
        CHECK(b[c * 224 * 224 + 777] == doctest::Approx(-mean[c] / stdv[c]).epsilon(1e-5));
}

TEST_CASE("CLIP encode is preprocess then the tower and fits the workspace it reports") {
    Fixture f;
    const size_t need = f.load().workspace_bytes(*f.be);
    f.be = make_cpu_backend(need);
    const ClipVision clip = f.load();
    const auto frame = test::random_floats(size_t(3) * kCanvasH * kCanvasW, 5);
    Tensor fr = Tensor::host_f32(Shape{3, kCanvasH, kCanvasW}, frame);
    Tensor out = Tensor::host(Shape{257, 64}, DType::F32);
    std::vector<std::string> stages;
    clip.encode(*f.be, fr, out, [&](const char* name, int, const TensorView&) { stages.emplace_back(name); });
    CHECK(f.be->workspace().high_water() == need);  // a workspace of exactly the measured size, all of it taken
    CHECK(f.be->workspace().used() == 0);
    CHECK(stages ==
          std::vector<std::string>{"clip.pixels", "clip.patch_embed", "clip.pre_norm", "clip.layer_out", "clip.layer_out"});

    Tensor px = Tensor::host(Shape{3, 224, 224}, DType::F32);
    clip.preprocess(*f.be, fr, px);
    CHECK(max_abs_diff(to_f32_vector(out), naive_tower(f.src, f.cfg, to_f32_vector(px), f.cfg.use_layers)) <
          2e-5);
}

TEST_CASE("CLIP rejects wrong input sizes and names missing or misshapen tensors") {
    Fixture f;
    const ClipVision clip = f.load();
    Tensor out = Tensor::host(Shape{257, 64}, DType::F32);
    Tensor small = Tensor::host(Shape{3, 176, 320}, DType::F32);
    CHECK_THROWS_AS(clip.encode(*f.be, small, out), Error);
    Tensor px = Tensor::host(Shape{3, 224, 224}, DType::F32);
    Tensor short_out = Tensor::host(Shape{256, 64}, DType::F32);
    CHECK_THROWS_AS(clip.forward(*f.be, px, short_out), Error);
    CHECK_THROWS_AS(clip.forward(*f.be, Tensor::host(Shape{3, 223, 224}, DType::F32), out), Error);
    CHECK(f.be->workspace().used() == 0);

    MapSource missing = random_checkpoint(f.cfg, 6);
    missing.tensors.erase(block_key(1, "attn.to_qkv.bias"));
    WeightLoader l1(missing, *f.be);
    CHECK_THROWS_WITH_AS(
        ClipVision(l1, f.cfg, kCanvasH, kCanvasW),
        doctest::Contains("action_head.image_encoder.model.visual.transformer.1.attn.to_qkv.bias"), Error);

    MapSource misshapen = random_checkpoint(f.cfg, 7);
    misshapen.put(kPre + "visual.pos_embedding", Shape{1, 256, 64}, 1, -1.f, 1.f);
    WeightLoader l2(misshapen, *f.be);
    CHECK_THROWS_WITH_AS(ClipVision(l2, f.cfg, kCanvasH, kCanvasW),
                         doctest::Contains("expected [1, 257, 64]"), Error);

    ClipConfig bad = f.cfg;
    bad.use_layers = 4;
    WeightLoader l3(f.src, *f.be);
    CHECK_THROWS_AS(ClipVision(l3, bad, kCanvasH, kCanvasW), Error);
}
