// The VAE building blocks against naive double-precision loops (tests/unit/test_vae_support.h).
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "model/wan_vae_blocks.h"
#include "test_vae_support.h"

using namespace dzr;
using namespace dzr::test;

namespace {

struct Harness {
    std::unique_ptr<Backend> be = make_cpu_backend(size_t(64) << 20);
    VaeWeightSource src;
    uint64_t seed = 100;

    /// Random tensor under `key` (weights: variance 1/fan_in; "gamma" around 1; "bias" small).
    void put(const std::string& key, const Shape& shape) {
        const size_t n = size_t(shape.numel());
        std::vector<float> v;
        if (key.ends_with("gamma")) {
            v = random_floats(n, ++seed, 0.8f, 1.2f);
        } else if (key.ends_with("bias")) {
            v = random_floats(n, ++seed, -0.1f, 0.1f);
        } else {
            const float a = float(std::sqrt(3.0 * double(shape[0]) / double(shape.numel())));
            v = random_floats(n, ++seed, -a, a);
        }
        src.tensors[key] = Tensor::host_f32(shape, v);
    }
    void put_conv(const std::string& path, const Shape& weight_shape) {
        put(path + "weight", weight_shape);
        put(path + "bias", Shape{weight_shape[0]});
    }
};

Tensor host_tensor(const Shape& shape, uint64_t seed, float lo = -1.f, float hi = 1.f) {
    return Tensor::host_f32(shape, random_floats(size_t(shape.numel()), seed, lo, hi));
}

void check_close(const Tensor& got, const Vol& ref, double tol) {
    REQUIRE(got.numel() == int64_t(ref.v.size()));
    CHECK(got.shape() == (Shape{ref.C, ref.T, ref.H, ref.W}));
    const double err = max_abs_diff(to_f32_vector(got.view()), ref);
    CHECK(err <= tol * std::max(1.0, max_abs(ref)));
}

/// Runs a causal conv over `x` in the reference chunk schedule (1 frame, then `step` frames) with a
/// cache, returning the concatenated output.
Tensor chunked_conv(Backend& be, const vae::CausalConv3d& conv, const vae::ChannelRmsNorm* norm,
                    const TensorView& x, int64_t step) {
    const int64_t C = x.dim(0), T = x.dim(1), H = x.dim(2), W = x.dim(3);
    Tensor cache_buf = Tensor::host(Shape{vae::kCacheFrames, H * W, C}, DType::F32);
    vae::TemporalCache cache;
    cache.buf = cache_buf.view();
    std::vector<float> all;
    for (int64_t t0 = 0; t0 < T;) {
        const int64_t n = t0 == 0 ? 1 : std::min(step, T - t0);
        Tensor xc = Tensor::host(Shape{C, n, H, W}, DType::F32);
        be.copy(x.slice(1, t0, n), xc.view());
        Tensor yc = Tensor::host(Shape{conv.out_channels(), n, H, W}, DType::F32);
        if (norm)
            conv.forward_normed(be, *norm, xc.view(), &cache, yc.view());
        else
            conv.forward(be, xc.view(), &cache, yc.view());
        all.insert(all.end(), yc.ptr<float>(), yc.ptr<float>() + yc.numel());
        t0 += n;
    }
    // chunks are [Co, n, H, W] each: reorder into [Co, T, H, W]
    const int64_t Co = conv.out_channels(), HW = H * W;
    Tensor out = Tensor::host(Shape{Co, T, H, W}, DType::F32);
    int64_t offset = 0;
    for (int64_t t0 = 0; t0 < T;) {
        const int64_t n = t0 == 0 ? 1 : std::min(step, T - t0);
        for (int64_t c = 0; c < Co; ++c)
            std::copy_n(all.begin() + offset + c * n * HW, n * HW, out.ptr<float>() + (c * T + t0) * HW);
        offset += Co * n * HW;
        t0 += n;
    }
    return out;
}

}  // namespace

TEST_CASE("vae rms norm equals F.normalize over channels times sqrt(C) and gamma, with and without SiLU") {
    Harness h;
    const int64_t C = 12;
    h.put("n.gamma", Shape{C, 1, 1, 1});
    WeightLoader loader(h.src, *h.be);
    vae::ChannelRmsNorm norm;
    norm.load(loader, "n.gamma", int(C), false);

    // rows: random, all zero, tiny (norm far below 1e-12), large
    const int64_t N = 6;
    std::vector<float> x = random_floats(size_t(N * C), 3);
    for (int64_t c = 0; c < C; ++c) {
        x[size_t(1 * C + c)] = 0.0f;
        x[size_t(2 * C + c)] *= 1e-20f;
        x[size_t(3 * C + c)] *= 1e4f;
    }
    Tensor in = Tensor::host_f32(Shape{N, C}, x);
    const std::vector<float> g = h.src.values("n.gamma");
    for (bool silu : {false, true}) {
        for (VaePrecision precision : {VaePrecision::Autocast, VaePrecision::Eager}) {
            CAPTURE(silu);
            CAPTURE(int(precision));
            Tensor out = Tensor::host(Shape{N, C}, DType::F32);
            AutocastScope autocast(*h.be, precision == VaePrecision::Autocast);
            norm.forward_rows(*h.be, in.view(), out.view(), silu);
            for (int64_t r = 0; r < N; ++r) {
                double ss = 0;
                for (int64_t c = 0; c < C; ++c) ss += double(x[size_t(r * C + c)]) * x[size_t(r * C + c)];
                const double denom = std::max(std::sqrt(ss), 1e-12);
                for (int64_t c = 0; c < C; ++c) {
                    double ref = x[size_t(r * C + c)] / denom * std::sqrt(double(C)) * g[size_t(c)];
                    if (silu) ref = ref / (1.0 + std::exp(-ref));
                    const float got = out.ptr<float>()[r * C + c];
                    CHECK(std::isfinite(got));
                    CHECK(got == doctest::Approx(ref).epsilon(2e-6).scale(1e-30));
                }
            }
            for (int64_t c = 0; c < C; ++c) CHECK(out.ptr<float>()[C + c] == 0.0f);
        }
    }
    // in place
    Tensor io = Tensor::host_f32(Shape{N, C}, x);
    Tensor sep = Tensor::host(Shape{N, C}, DType::F32);
    AutocastScope autocast(*h.be, true);
    norm.forward_rows(*h.be, in.view(), sep.view(), true);
    norm.forward_rows(*h.be, io.view(), io.view(), true);
    CHECK(bit_equal(io.view(), sep.view()));
}

TEST_CASE("vae attention block matches a naive per-frame single-head attention") {
    Harness h;
    const int64_t C = 8;
    h.put("a.norm.gamma", Shape{C, 1, 1});
    h.put_conv("a.to_qkv.", Shape{3 * C, C, 1, 1});
    h.put_conv("a.proj.", Shape{C, C, 1, 1});
    WeightLoader loader(h.src, *h.be);
    vae::AttentionBlock attn;
    attn.load(loader, "a.", int(C));
    CHECK(loader.unused("a.").empty());

    Tensor x = host_tensor(Shape{C, 3, 3, 5}, 11, -2.f, 2.f);
    Tensor y = Tensor::host(x.shape(), DType::F32);
    attn.forward(*h.be, x.view(), y.view());
    check_close(y, attention_block_ref(vol_from(x.view()), h.src, "a."), 1e-5);
}

TEST_CASE("vae attention block on channels-last rows in fast numerics (GEMMs around a softmax) matches it too") {
    Harness h;
    BackendOptions o;
    o.numerics = Numerics::Fast;
    o.workspace_bytes = size_t(64) << 20;
    h.be = make_cpu_backend(o);
    const int64_t C = 8, T = 3, H = 3, W = 5;
    h.put("a.norm.gamma", Shape{C, 1, 1});
    h.put_conv("a.to_qkv.", Shape{3 * C, C, 1, 1});
    h.put_conv("a.proj.", Shape{C, C, 1, 1});
    WeightLoader loader(h.src, *h.be);
    vae::AttentionBlock attn;
    attn.load(loader, "a.", int(C));

    // several frames, so that a frame attending to another frame's tokens shows
    const Tensor x = host_tensor(Shape{C, T, H, W}, 12, -2.f, 2.f);
    Tensor x_rows = Tensor::host(Shape{T, H, W, C}, DType::F32), y_rows = Tensor::host(x_rows.shape(), DType::F32);
    h.be->copy(x.view().permute({1, 2, 3, 0}), x_rows.view());  // [C, T, H, W] -> [T, H, W, C]
    const size_t used = h.be->workspace().used();
    attn.forward(*h.be, vae::cl_view(x_rows.view()), vae::cl_view(y_rows.view()));
    CHECK(h.be->workspace().used() == used);
    Tensor y = Tensor::host(x.shape(), DType::F32);
    h.be->copy(vae::cl_view(y_rows.view()), y.view());
    check_close(y, attention_block_ref(vol_from(x.view()), h.src, "a."), 1e-5);
}

TEST_CASE("causal conv over chunks with a cache equals one causal pass over the clip") {
    Harness h;
    const int64_t Ci = 5, Co = 6;
    h.put_conv("c.", Shape{Co, Ci, 3, 3, 3});
    h.put("n.gamma", Shape{Ci, 1, 1, 1});
    WeightLoader loader(h.src, *h.be);
    vae::CausalConv3d conv;
    conv.load(loader, "c.", int(Ci), int(Co), {3, 3, 3}, {1, 1, 1});
    vae::ChannelRmsNorm norm;
    norm.load(loader, "n.gamma", int(Ci), false);
    CHECK(conv.history() == 2);

    Tensor x = host_tensor(Shape{Ci, 9, 4, 6}, 21);
    Tensor whole = Tensor::host(Shape{Co, 9, 4, 6}, DType::F32);
    conv.forward(*h.be, x.view(), nullptr, whole.view());
    // causal: 2 zero frames before, none after; symmetric spatial padding 1
    const Vol ref = conv3d_ref(vol_from(x.view()), h.src.values("c.weight"), h.src.values("c.bias"), Co,
                               {3, 3, 3}, {1, 1, 1}, {2, 1, 1}, {0, 1, 1});
    check_close(whole, ref, 1e-5);
    for (int64_t step : {4, 1, 3}) {
        CAPTURE(step);
        CHECK(bit_equal(chunked_conv(*h.be, conv, nullptr, x.view(), step).view(), whole.view()));
    }

    Tensor whole_normed = Tensor::host(Shape{Co, 9, 4, 6}, DType::F32);
    conv.forward_normed(*h.be, norm, x.view(), nullptr, whole_normed.view());
    const Vol act = silu_ref(rms_ref(vol_from(x.view()), h.src.values("n.gamma")));
    check_close(whole_normed,
                conv3d_ref(act, h.src.values("c.weight"), h.src.values("c.bias"), Co, {3, 3, 3}, {1, 1, 1},
                           {2, 1, 1}, {0, 1, 1}),
                1e-5);
    CHECK(bit_equal(chunked_conv(*h.be, conv, &norm, x.view(), 4).view(), whole_normed.view()));
}

TEST_CASE("residual block matches the naive residual with and without a shortcut") {
    for (auto [ci, co] : {std::pair<int, int>{4, 4}, {4, 8}}) {
        CAPTURE(ci);
        CAPTURE(co);
        Harness h;
        h.put("r.residual.0.gamma", Shape{ci, 1, 1, 1});
        h.put_conv("r.residual.2.", Shape{co, ci, 3, 3, 3});
        h.put("r.residual.3.gamma", Shape{co, 1, 1, 1});
        h.put_conv("r.residual.6.", Shape{co, co, 3, 3, 3});
        if (ci != co) h.put_conv("r.shortcut.", Shape{co, ci, 1, 1, 1});
        WeightLoader loader(h.src, *h.be);
        vae::ResidualBlock block;
        block.load(loader, "r.", ci, co);
        CHECK(loader.unused("r.").empty());

        Tensor x = host_tensor(Shape{ci, 5, 4, 6}, 31);
        Tensor y = Tensor::host(Shape{co, 5, 4, 6}, DType::F32);
        block.forward(*h.be, x.view(), nullptr, y.view());

        const Vol xv = vol_from(x.view());
        auto conv3 = [&](const Vol& v, const std::string& p, int64_t out) {
            return conv3d_ref(v, h.src.values(p + "weight"), h.src.values(p + "bias"), out, {3, 3, 3},
                              {1, 1, 1}, {2, 1, 1}, {0, 1, 1});
        };
        Vol r = conv3(silu_ref(rms_ref(xv, h.src.values("r.residual.0.gamma"))), "r.residual.2.", co);
        r = conv3(silu_ref(rms_ref(r, h.src.values("r.residual.3.gamma"))), "r.residual.6.", co);
        const Vol sc =
            ci == co ? xv
                     : conv3d_ref(xv, h.src.values("r.shortcut.weight"), h.src.values("r.shortcut.bias"), co,
                                  {1, 1, 1}, {1, 1, 1}, {0, 0, 0}, {0, 0, 0});
        check_close(y, add_ref(r, sc), 1e-5);
    }
}

TEST_CASE("spatial downsample zero-pads right and bottom and convolves 3x3 with stride 2") {
    Harness h;
    const int64_t C = 4;
    h.put_conv("d.resample.1.", Shape{C, C, 3, 3});
    WeightLoader loader(h.src, *h.be);
    vae::Resample down;
    down.load(loader, "d.", int(C), vae::ResampleMode::Down2d);
    CHECK(!down.has_time_conv());

    Tensor x = host_tensor(Shape{C, 2, 6, 10}, 41);
    const Shape out_shape = down.output_shape(x.shape(), true);
    CHECK(out_shape == (Shape{C, 2, 3, 5}));
    Tensor y = Tensor::host(out_shape, DType::F32);
    down.forward(*h.be, x.view(), nullptr, y.view());
    check_close(y,
                conv3d_ref(vol_from(x.view()), h.src.values("d.resample.1.weight"),
                           h.src.values("d.resample.1.bias"), C, {1, 3, 3}, {1, 2, 2}, {0, 0, 0}, {0, 1, 1}),
                1e-5);
}

TEST_CASE("temporal downsample passes the first frame through and convolves stride-2 windows after it") {
    Harness h;
    const int64_t C = 4;
    h.put_conv("d.resample.1.", Shape{C, C, 3, 3});
    h.put_conv("d.time_conv.", Shape{C, C, 3, 1, 1});
    WeightLoader loader(h.src, *h.be);
    vae::Resample down;
    down.load(loader, "d.", int(C), vae::ResampleMode::Down3d);
    CHECK(loader.unused("d.").empty());

    Tensor x = host_tensor(Shape{C, 9, 4, 6}, 51);
    CHECK(down.output_shape(x.shape(), true) == (Shape{C, 5, 2, 3}));
    CHECK(down.output_shape(Shape{C, 4, 4, 6}, false) == (Shape{C, 2, 2, 3}));
    Tensor whole = Tensor::host(Shape{C, 5, 2, 3}, DType::F32);
    down.forward(*h.be, x.view(), nullptr, whole.view());

    // naive: s = per-frame downsample; out = [s0, conv(s0,s1,s2), conv(s2,s3,s4), ...]
    const Vol s =
        conv3d_ref(vol_from(x.view()), h.src.values("d.resample.1.weight"), h.src.values("d.resample.1.bias"),
                   C, {1, 3, 3}, {1, 2, 2}, {0, 0, 0}, {0, 1, 1});
    const Vol windows = conv3d_ref(s, h.src.values("d.time_conv.weight"), h.src.values("d.time_conv.bias"), C,
                                   {3, 1, 1}, {2, 1, 1}, {0, 0, 0}, {0, 0, 0});
    check_close(whole, cat_time(frames_of(s, 0, 1), windows), 1e-5);

    // the reference chunks (1 frame, then 4) with the cache give the same frames bit for bit
    Tensor cache_buf = Tensor::host(down.cache_shape(x.shape()), DType::F32);
    CHECK(cache_buf.shape() == (Shape{1, 6, C}));
    vae::TemporalCache cache;
    cache.buf = cache_buf.view();
    std::vector<float> got = to_f32_vector(whole.view());
    int64_t out_t = 0;
    for (int64_t t0 = 0; t0 < 9;) {
        const int64_t n = t0 == 0 ? 1 : 4;
        Tensor xc = Tensor::host(Shape{C, n, 4, 6}, DType::F32);
        h.be->copy(x.view().slice(1, t0, n), xc.view());
        const Shape os = down.output_shape(xc.shape(), !cache.started);
        Tensor yc = Tensor::host(os, DType::F32);
        down.forward(*h.be, xc.view(), &cache, yc.view());
        CHECK(cache.started);
        CHECK(bit_equal(yc.view(), whole.view().slice(1, out_t, os[1])));
        out_t += os[1];
        t0 += n;
    }
    CHECK(out_t == 5);
}

TEST_CASE("spatial upsample repeats each pixel 2x2 and convolves 3x3 with padding 1") {
    Harness h;
    const int64_t C = 8;
    h.put_conv("u.resample.1.", Shape{C / 2, C, 3, 3});
    WeightLoader loader(h.src, *h.be);
    vae::Resample up;
    up.load(loader, "u.", int(C), vae::ResampleMode::Up2d);
    CHECK(up.out_channels() == C / 2);

    Tensor x = host_tensor(Shape{C, 2, 3, 5}, 61);
    Tensor y = Tensor::host(up.output_shape(x.shape(), true), DType::F32);
    CHECK(y.shape() == (Shape{C / 2, 2, 6, 10}));
    up.forward(*h.be, x.view(), nullptr, y.view());
    const Vol xv = vol_from(x.view());
    Vol u(C, 2, 6, 10);
    for (int64_t c = 0; c < C; ++c)
        for (int64_t t = 0; t < 2; ++t)
            for (int64_t i = 0; i < 6; ++i)
                for (int64_t j = 0; j < 10; ++j) u.at(c, t, i, j) = xv.at(c, t, i / 2, j / 2);
    check_close(y,
                conv3d_ref(u, h.src.values("u.resample.1.weight"), h.src.values("u.resample.1.bias"), C / 2,
                           {1, 3, 3}, {1, 1, 1}, {0, 1, 1}, {0, 1, 1}),
                1e-5);
}

TEST_CASE("temporal upsample keeps the first frame single and doubles later frames through the time conv") {
    Harness h;
    const int64_t C = 4;
    h.put_conv("u.resample.1.", Shape{C / 2, C, 3, 3});
    h.put_conv("u.time_conv.", Shape{2 * C, C, 3, 1, 1});
    WeightLoader loader(h.src, *h.be);
    vae::Resample up;
    up.load(loader, "u.", int(C), vae::ResampleMode::Up3d);
    CHECK(loader.unused("u.").empty());

    const int64_t T = 4, H = 2, W = 3;
    Tensor x = host_tensor(Shape{C, T, H, W}, 71);
    const Shape out_shape = up.output_shape(x.shape(), true);
    CHECK(out_shape == (Shape{C / 2, 1 + 2 * (T - 1), 2 * H, 2 * W}));
    Tensor whole = Tensor::host(out_shape, DType::F32);
    up.forward(*h.be, x.view(), nullptr, whole.view());

    // naive: d = [x0, tc(1)[:C], tc(1)[C:], tc(2)[:C], ...] where tc = causal time conv over x[1:]
    // (zero history), then nearest x2 and the 3x3 conv per frame
    const Vol xv = vol_from(x.view());
    const Vol tc =
        conv3d_ref(frames_of(xv, 1, T - 1), h.src.values("u.time_conv.weight"),
                   h.src.values("u.time_conv.bias"), 2 * C, {3, 1, 1}, {1, 1, 1}, {2, 0, 0}, {0, 0, 0});
    Vol d(C, 1 + 2 * (T - 1), H, W);
    for (int64_t c = 0; c < C; ++c)
        for (int64_t i = 0; i < H; ++i)
            for (int64_t j = 0; j < W; ++j) {
                d.at(c, 0, i, j) = xv.at(c, 0, i, j);
                for (int64_t t = 0; t < T - 1; ++t)
                    for (int64_t s = 0; s < 2; ++s) d.at(c, 1 + 2 * t + s, i, j) = tc.at(s * C + c, t, i, j);
            }
    Vol u(C, d.T, 2 * H, 2 * W);
    for (int64_t c = 0; c < C; ++c)
        for (int64_t t = 0; t < d.T; ++t)
            for (int64_t i = 0; i < 2 * H; ++i)
                for (int64_t j = 0; j < 2 * W; ++j) u.at(c, t, i, j) = d.at(c, t, i / 2, j / 2);
    check_close(whole,
                conv3d_ref(u, h.src.values("u.resample.1.weight"), h.src.values("u.resample.1.bias"), C / 2,
                           {1, 3, 3}, {1, 1, 1}, {0, 1, 1}, {0, 1, 1}),
                1e-5);

    // the decoder's schedules (one latent frame per call; after the first temporal upsample, 1 frame
    // then 2 per call) give the same frames bit for bit
    for (const std::vector<int64_t>& schedule :
         {std::vector<int64_t>{1, 1, 1, 1}, std::vector<int64_t>{1, 2, 1}}) {
        Tensor cache_buf = Tensor::host(up.cache_shape(x.shape()), DType::F32);
        vae::TemporalCache cache;
        cache.buf = cache_buf.view();
        int64_t t = 0, out_t = 0;
        for (int64_t n : schedule) {
            CAPTURE(t);
            Tensor xc = Tensor::host(Shape{C, n, H, W}, DType::F32);
            h.be->copy(x.view().slice(1, t, n), xc.view());
            const Shape os = up.output_shape(xc.shape(), !cache.started);
            CHECK(os[1] == (t == 0 ? 1 : 2 * n));
            Tensor yc = Tensor::host(os, DType::F32);
            up.forward(*h.be, xc.view(), &cache, yc.view());
            CHECK(bit_equal(yc.view(), whole.view().slice(1, out_t, os[1])));
            out_t += os[1];
            t += n;
        }
        CHECK(out_t == out_shape[1]);
    }
}

TEST_CASE("clamp to [-1, 1] leaves in-range values bit-unchanged and saturates the rest exactly") {
    auto be = make_cpu_backend(size_t(1) << 20);
    std::vector<float> v = {0.0f,  -0.0f,      1e-30f, 0.3f,  -0.99999994f, 1.0f,
                            -1.0f, 1.0000001f, 2.5f,   -7.0f, 1e7f,         -1e7f};
    const std::vector<float> expect = {0.0f,  0.0f, 1e-30f, 0.3f,  -0.99999994f, 1.0f,
                                       -1.0f, 1.0f, 1.0f,   -1.0f, 1.0f,         -1.0f};
    Tensor x = Tensor::host_f32(Shape{int64_t(v.size())}, v);
    vae::clamp_unit(*be, x.view(), x.view());  // in place
    for (size_t i = 0; i < v.size(); ++i) {
        CAPTURE(v[i]);
        CHECK(x.ptr<float>()[i] == expect[i]);
    }
}

TEST_CASE("nearest x2 upsample copies each source pixel into a 2x2 block") {
    auto be = make_cpu_backend(size_t(1) << 20);
    Tensor x = host_tensor(Shape{2, 3, 2, 3}, 81);
    Tensor y = Tensor::host(Shape{2, 3, 4, 6}, DType::F32);
    vae::upsample_nearest2x(*be, x.view(), y.view());
    for (int64_t c = 0; c < 2; ++c)
        for (int64_t t = 0; t < 3; ++t)
            for (int64_t i = 0; i < 4; ++i)
                for (int64_t j = 0; j < 6; ++j)
                    CHECK(y.ptr<float>()[((c * 3 + t) * 4 + i) * 6 + j] ==
                          x.ptr<float>()[((c * 3 + t) * 2 + i / 2) * 3 + j / 2]);
}
