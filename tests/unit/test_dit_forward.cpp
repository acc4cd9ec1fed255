// The causal DiT end to end on a tiny geometry: prefill -> commit -> denoise against a naive
// double-precision re-computation (tests/unit/test_dit_support.h), stage by stage, plus KV-cache
// behaviour, determinism, finiteness and input validation.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <memory>

#include "backend/profiler.h"
#include "kv/kv_cache_manager.h"
#include "kv/paged_self_attention_cache.h"
#include "model/causal_dit.h"
#include "support/test_support.h"
#include "unit/test_dit_support.h"

using namespace dzr;
using namespace dzr::test;

namespace {

// NOTE: the library runs in f32 against a double reference; 1e-4 of the tensor's magnitude is
// two orders above f32 accumulation noise at these sizes and far below any wiring mistake (O(1)).
constexpr double kTol = 1e-4;

struct Inputs {
    int frames = 1;
    int start_frame = 0;
    int64_t timestep = 0;
    std::vector<float> x, y;
    std::optional<NaiveDit::Registers> regs;
};

Inputs make_inputs(const DitConfig& c, int frames, int start_frame, int64_t timestep, bool regs,
                   uint64_t seed, int64_t action_timestep = 0) {
    Inputs in;
    in.frames = frames;
    in.start_frame = start_frame;
    in.timestep = timestep;
    const size_t plane = size_t(frames) * kTinyLatentH * kTinyLatentW;
    in.x = random_floats(size_t(c.out_dim) * plane, seed);
    in.y = random_floats(size_t(c.in_dim - c.out_dim) * plane, seed + 1);
    if (regs) {
        in.regs = NaiveDit::Registers{
            random_floats(size_t(c.num_action_per_block) * c.action_dim, seed + 2), action_timestep,
            random_floats(size_t(c.num_state_per_block) * c.max_state_dim, seed + 3)};
    }
    return in;
}

/// Everything one test needs: weights, backend, model, one branch's context and cross K/V.
/// A CPU backend in `numerics`.
std::unique_ptr<Backend> cpu_backend(Numerics numerics) {
    BackendOptions o;
    o.numerics = numerics;
    return make_cpu_backend(o);
}

/// The DiT's view of `in` (its buffers, at the tiny latent size).
DitInputs dit_inputs(const DitConfig& c, Inputs& in) {
    DitInputs di;
    di.x = TensorView(in.x.data(), DType::F32, Shape{c.out_dim, in.frames, kTinyLatentH, kTinyLatentW});
    di.y = TensorView(in.y.data(), DType::F32, Shape{c.in_dim - c.out_dim, in.frames, kTinyLatentH, kTinyLatentW});
    di.start_frame = in.start_frame;
    di.timestep = in.timestep;
    if (in.regs)
        di.registers = DitRegisterInputs{
            TensorView(in.regs->action.data(), DType::F32, Shape{c.num_action_per_block, c.action_dim}),
            in.regs->timestep,
            TensorView(in.regs->state.data(), DType::F32, Shape{c.num_state_per_block, c.max_state_dim})};
    return di;
}

struct Fixture {
    DitConfig cfg;
    MapWeightSource src;
    std::unique_ptr<Backend> be;
    std::unique_ptr<CausalDit> dit;
    std::vector<float> clip, text;
    DitCrossKv kv;

    explicit Fixture(int heads = 1, uint64_t seed = 7, float poison = 0.0f, Precision precision = Precision::Bf16,
                     Numerics numerics = Numerics::Reference)
        : cfg(tiny_dit_config(heads)), be(cpu_backend(numerics)) {
        fill_dit_weights(src, cfg, seed);
        if (poison != 0.0f) src.tensors["action_head.model.blocks.1.ffn.2.bias"].ptr<float>()[3] = poison;
        WeightLoader loader(src, *be);
        loader.set_precision(precision);
        dit = std::make_unique<CausalDit>(cfg, kTinyLatentH, kTinyLatentW, loader);
        clip = random_floats(size_t(kTinyImageTokens) * cfg.image_dim, seed + 100);
        text = random_floats(size_t(cfg.text_len) * cfg.text_dim, seed + 101);
        kv = dit->make_cross_kv(*be, kTinyImageTokens);
        dit->compute_cross_kv(*be,
                              TensorView(clip.data(), DType::F32, Shape{kTinyImageTokens, cfg.image_dim}),
                              TensorView(text.data(), DType::F32, Shape{cfg.text_len, cfg.text_dim}), kv);
    }

    DenseTestCache make_cache() const {
        return DenseTestCache(cfg.num_layers, cfg.num_heads, cfg.dim / cfg.num_heads);
    }
};

struct Output {
    std::vector<float> video, action;
    std::map<std::string, std::map<int, std::vector<float>>> traces;  // name -> layer -> values
};

/// One forward; `stage`: a committing forward (video K/V staged), committed unless `keep_staged`.
Output run(Fixture& fx, DenseTestCache& cache, Inputs& in, bool stage, bool trace = false,
           bool check_finite = false, bool keep_staged = false) {
    const DitConfig& c = fx.cfg;
    Output o;
    o.video.assign(in.x.size(), std::numeric_limits<float>::quiet_NaN());  // poisoned
    o.action.assign(size_t(c.num_action_per_block) * c.action_dim, std::numeric_limits<float>::quiet_NaN());
    const DitInputs di = dit_inputs(c, in);
    DitOutputs out;
    out.video_velocity = TensorView(o.video.data(), DType::F32, di.x.shape);
    out.action_velocity =
        TensorView(o.action.data(), DType::F32, Shape{c.num_action_per_block, c.action_dim});
    DitForwardOptions opt;
    opt.check_finite = check_finite;
    if (trace)
        opt.trace = [&o](std::string_view name, int layer, const TensorView& t) {
            o.traces[std::string(name)][layer] = to_f32_vector(t);
        };
    cache.begin(stage);
    fx.dit->forward(*fx.be, di, fx.kv, cache, out, opt);
    if (stage && !keep_staged) cache.commit();
    return o;
}

Vec flatten(const std::vector<Vec>& rows) {
    Vec out;
    for (const Vec& r : rows) out.insert(out.end(), r.begin(), r.end());
    return out;
}

/// The three forward kinds of a policy call in order, on the library and on the naive model.
struct Chain {
    Fixture fx;
    DenseTestCache cache;
    NaiveDit naive;
    Inputs prefill, commit, denoise;
    Output out_prefill, out_commit, out_denoise;
    NaiveDit::Result ref_prefill, ref_commit, ref_denoise;
    std::map<std::string, std::vector<std::vector<Vec>>> naive_denoise_trace;

    explicit Chain(int heads)
        : fx(heads), cache(fx.make_cache()), naive(fx.cfg, fx.src, kTinyLatentH, kTinyLatentW) {
        const DitConfig& c = fx.cfg;
        prefill = make_inputs(c, 1, 0, 0, false, 11);
        commit = make_inputs(c, 2, 1, 0, false, 21);
        // NOTE: different video and action timesteps so a swapped time-embedding row shows.
        denoise = make_inputs(c, 2, 3, 986, true, 31, 972);

        out_prefill = run(fx, cache, prefill, true, true);
        ref_prefill = naive.forward(prefill.x, prefill.y, 1, 0, 0, std::nullopt, fx.clip, fx.text, true);
        out_commit = run(fx, cache, commit, true, true);
        ref_commit = naive.forward(commit.x, commit.y, 2, 1, 0, std::nullopt, fx.clip, fx.text, true);
        out_denoise = run(fx, cache, denoise, false, true);
        ref_denoise = naive.forward(denoise.x, denoise.y, 2, 3, 986, denoise.regs, fx.clip, fx.text, false);
        naive_denoise_trace = naive.trace;
    }
};

}  // namespace

TEST_CASE("prefill, commit and denoise forwards match a naive re-computation") {
    for (int heads : {1, 2}) {
        CAPTURE(heads);
        Chain ch(heads);
        const double e_prefill = rel_max_err(ch.out_prefill.video, ch.ref_prefill.video);
        const double e_commit = rel_max_err(ch.out_commit.video, ch.ref_commit.video);
        const double e_video = rel_max_err(ch.out_denoise.video, ch.ref_denoise.video);
        const double e_action = rel_max_err(ch.out_denoise.action, ch.ref_denoise.action);
        MESSAGE("heads " << heads << ": prefill " << e_prefill << ", commit " << e_commit
                         << ", denoise video " << e_video << ", action " << e_action);
        CHECK(e_prefill < kTol);
        CHECK(e_commit < kTol);
        CHECK(e_video < kTol);
        CHECK(e_action < kTol);
        for (int li = 0; li < ch.fx.cfg.num_layers; ++li) {
            CAPTURE(li);
            CHECK(rel_max_err(ch.out_denoise.traces["layer_out"][li],
                              flatten(ch.naive_denoise_trace["layer_out"][size_t(li)])) < kTol);
            CHECK(rel_max_err(ch.out_denoise.traces["x_self"][li],
                              flatten(ch.naive_denoise_trace["x_self"][size_t(li)])) < kTol);
        }
    }
}

TEST_CASE("time embedding is computed once per timestep and equals the per-token computation") {
    Chain ch(1);
    const DitConfig& c = ch.fx.cfg;
    const std::vector<float>& rows = ch.out_denoise.traces["time_e0"][-1];  // [2, 6, C]
    REQUIRE(rows.size() == size_t(2 * 6 * c.dim));
    const std::vector<Vec>& per_token = ch.naive_denoise_trace["time_e0"][0];  // [L][6C]
    const int64_t Lv = 2 * c.frame_seqlen;
    REQUIRE(per_token.size() == size_t(Lv + c.num_action_per_block + c.num_state_per_block));
    for (size_t t = 0; t < per_token.size(); ++t) {
        const size_t g = int64_t(t) < Lv ? 0 : 1;
        const std::vector<float> row(rows.begin() + ptrdiff_t(g * 6 * c.dim),
                                     rows.begin() + ptrdiff_t((g + 1) * 6 * c.dim));
        CAPTURE(t);
        CHECK(rel_max_err(row, per_token[t]) < kTol);
    }
    // The two groups really differ (986 vs 972), so the check above is not vacuous.
    CHECK(std::abs(rows[0] - rows[size_t(6 * c.dim)]) > 1e-4);
}

TEST_CASE("cross-attention sums two separate softmaxes over text and image keys") {
    Chain ch(2);
    const DitConfig& c = ch.fx.cfg;
    const std::vector<Vec> ctx_txt = ch.naive.text_context(ch.fx.text);
    const std::vector<Vec> ctx_img = ch.naive.image_context(ch.fx.clip, kTinyImageTokens);
    for (int li = 0; li < c.num_layers; ++li) {
        // feed the library's own residual stream after self-attention into the naive cross-attention
        const std::vector<float>& x_self = ch.out_denoise.traces["x_self"][li];
        std::vector<Vec> xs;
        for (size_t t = 0; t * size_t(c.dim) < x_self.size(); ++t)
            xs.emplace_back(x_self.begin() + ptrdiff_t(t * c.dim),
                            x_self.begin() + ptrdiff_t((t + 1) * c.dim));
        const Vec ref = flatten(ch.naive.cross_attention(li, xs, ctx_txt, ctx_img));
        CAPTURE(li);
        CHECK(rel_max_err(ch.out_denoise.traces["cross_attn"][li], ref) < kTol);

        // One joint softmax over [text | image] is a different function: it must not match.
        // (A sanity check on the reference itself, so the comparison above can fail.)
        std::vector<Vec> joint_k, joint_v;
        const std::string b = "blocks." + std::to_string(li) + ".";
        NaiveWeights w{ch.fx.src};
        for (const Vec& r : ctx_txt) {
            joint_k.push_back(
                nv_rms_norm(nv_linear(w.get(b + "cross_attn.k.weight"), w.get(b + "cross_attn.k.bias"), r),
                            w.get(b + "cross_attn.norm_k.weight"), c.eps));
            joint_v.push_back(nv_linear(w.get(b + "cross_attn.v.weight"), w.get(b + "cross_attn.v.bias"), r));
        }
        for (const Vec& r : ctx_img) {
            joint_k.push_back(nv_rms_norm(
                nv_linear(w.get(b + "cross_attn.k_img.weight"), w.get(b + "cross_attn.k_img.bias"), r),
                w.get(b + "cross_attn.norm_k_img.weight"), c.eps));
            joint_v.push_back(
                nv_linear(w.get(b + "cross_attn.v_img.weight"), w.get(b + "cross_attn.v_img.bias"), r));
        }
        const Vec n3w = w.get(b + "norm3.weight"), n3b = w.get(b + "norm3.bias");
        std::vector<Vec> qs;
        for (const Vec& x : xs)
            qs.push_back(
                nv_rms_norm(nv_linear(w.get(b + "cross_attn.q.weight"), w.get(b + "cross_attn.q.bias"),
                                      nv_layer_norm(x, c.eps, &n3w, &n3b)),
                            w.get(b + "cross_attn.norm_q.weight"), c.eps));
        std::vector<Vec> joint;
        for (const Vec& o : nv_attention(qs, joint_k, joint_v, c.num_heads))
            joint.push_back(nv_linear(w.get(b + "cross_attn.o.weight"), w.get(b + "cross_attn.o.bias"), o));
        CHECK(rel_max_err(ch.out_denoise.traces["cross_attn"][li], flatten(joint)) > 10 * kTol);
    }
}

TEST_CASE("the cache holds 1 then 3 frames of K after norm and RoPE and never stores register tokens") {
    Fixture fx(1);
    const DitConfig& c = fx.cfg;
    DenseTestCache cache = fx.make_cache();
    NaiveDit naive(c, fx.src, kTinyLatentH, kTinyLatentW);
    const int64_t F = c.frame_seqlen;

    Inputs prefill = make_inputs(c, 1, 0, 0, false, 41);
    run(fx, cache, prefill, true);
    naive.forward(prefill.x, prefill.y, 1, 0, 0, std::nullopt, fx.clip, fx.text, true);
    CHECK(cache.history_tokens() == F);
    for (int l = 0; l < c.num_layers; ++l) {
        CHECK(cache.last_keys[size_t(l)] == F);
        CHECK(cache.last_queries[size_t(l)] == F);
        CHECK(rel_max_err(cache.history_k(l), flatten(naive.k_hist[size_t(l)])) < kTol);
        CHECK(rel_max_err(cache.history_v(l), flatten(naive.v_hist[size_t(l)])) < kTol);
    }

    Inputs commit = make_inputs(c, 2, 1, 0, false, 42);
    run(fx, cache, commit, true);
    CHECK(cache.history_tokens() == 3 * F);
    for (int l = 0; l < c.num_layers; ++l) CHECK(cache.last_keys[size_t(l)] == 3 * F);

    const int64_t R = c.num_action_per_block + c.num_state_per_block;
    Inputs denoise = make_inputs(c, 2, 3, 999, true, 43, 999);
    run(fx, cache, denoise, false);
    CHECK(cache.history_tokens() == 3 * F);
    for (int l = 0; l < c.num_layers; ++l) {
        CHECK(cache.last_keys[size_t(l)] == 3 * F + 2 * F + R);
        CHECK(cache.last_queries[size_t(l)] == 2 * F + R);
        CHECK(cache.staged_rows[size_t(l)] == 0);
    }

    // Even a (policy-wise wrong) committing denoise stages only the video rows.
    Inputs again = make_inputs(c, 2, 3, 999, true, 44, 999);
    run(fx, cache, again, true, false, false, true);
    for (int l = 0; l < c.num_layers; ++l) CHECK(cache.staged_rows[size_t(l)] == 2 * F);
}

TEST_CASE("two denoise forwards with the same inputs are bit-identical and finite") {
    Fixture fx(2);
    const DitConfig& c = fx.cfg;
    Output o[2];
    for (auto& oi : o) {
        DenseTestCache cache = fx.make_cache();
        Inputs prefill = make_inputs(c, 1, 0, 0, false, 51);
        run(fx, cache, prefill, true);
        Inputs denoise = make_inputs(c, 2, 1, 624, true, 52, 624);
        oi = run(fx, cache, denoise, false, false, true);
    }
    CHECK(std::memcmp(o[0].video.data(), o[1].video.data(), o[0].video.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(o[0].action.data(), o[1].action.data(), o[0].action.size() * sizeof(float)) == 0);
    for (float v : o[0].video) REQUIRE(std::isfinite(v));
    for (float v : o[0].action) REQUIRE(std::isfinite(v));
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    REQUIRE(a.size() == b.size());
    double m = 0;
    for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
    return m;
}

TEST_CASE("a batched forward of two CFG branches gives each branch its own forward's outputs, layer 0 shared or not") {
    Fixture fx(2, 7, 0.0f, Precision::Bf16, Numerics::Fast);
    const DitConfig& c = fx.cfg;
    // branch 0: the fixture's text; branch 1: another text; both read one image cache (shared) or each its own
    std::vector<float> text_b = random_floats(size_t(c.text_len) * c.text_dim, 303);
    const TensorView clip(fx.clip.data(), DType::F32, Shape{kTinyImageTokens, c.image_dim});
    DitCrossKv kv_a = fx.dit->make_cross_kv(*fx.be, kTinyImageTokens);
    fx.dit->compute_cross_kv(*fx.be, clip, TensorView(fx.text.data(), DType::F32, Shape{c.text_len, c.text_dim}), kv_a);
    DitCrossKv kv_b = fx.dit->make_cross_kv(*fx.be, kTinyImageTokens);
    fx.dit->compute_cross_kv(*fx.be, clip, TensorView(text_b.data(), DType::F32, Shape{c.text_len, c.text_dim}), kv_b);
    for (const auto& [shared_image, share_layer0] : {std::pair{true, false}, {false, false}, {true, true}}) {
        CAPTURE(shared_image);
        CAPTURE(share_layer0);
        DitForwardOptions opt;
        opt.share_first_self_attention = share_layer0;
        if (shared_image)
            for (size_t l = 0; l < kv_b.layers.size(); ++l) {
                kv_b.layers[l].k_img = kv_a.layers[l].k_img;
                kv_b.layers[l].v_img = kv_a.layers[l].v_img;
            }
        const DitCrossKv* kvs[2] = {&kv_a, &kv_b};
        // single forwards: prefill then denoise, per branch; batched: one prefill of both, then one denoise of both
        DenseTestCache single[2] = {fx.make_cache(), fx.make_cache()};
        DenseTestCache batched[2] = {fx.make_cache(), fx.make_cache()};
        Inputs prefill = make_inputs(c, 1, 0, 0, false, 61);
        Inputs denoise = make_inputs(c, 2, 1, 624, true, 62, 731);
        std::vector<float> video[2][2], action[2];  // [single | batched][branch]
        const auto inputs = [&](Inputs& in) { return dit_inputs(c, in); };
        const auto video_out = [&](std::vector<float>& v, const Inputs& in) {
            v.assign(in.x.size(), std::numeric_limits<float>::quiet_NaN());
            return TensorView(v.data(), DType::F32, Shape{c.out_dim, in.frames, kTinyLatentH, kTinyLatentW});
        };
        const auto action_out = [&](std::vector<float>& v) {
            v.assign(size_t(c.num_action_per_block) * c.action_dim, std::numeric_limits<float>::quiet_NaN());
            return TensorView(v.data(), DType::F32, Shape{c.num_action_per_block, c.action_dim});
        };
        std::vector<float> scratch_video, scratch_action;
        for (int b = 0; b < 2; ++b) {
            single[b].begin(true);
            fx.dit->forward(*fx.be, inputs(prefill), *kvs[b], single[b], DitOutputs{video_out(scratch_video, prefill), {}});
            single[b].commit();
            single[b].begin(false);
            fx.dit->forward(*fx.be, inputs(denoise), *kvs[b], single[b],
                            DitOutputs{video_out(video[0][b], denoise), action_out(b == 0 ? action[0] : scratch_action)});
        }
        {
            batched[0].begin(true);
            batched[1].begin(true);
            std::vector<float> scratch_b;
            const DitBranch pre[2] = {{kvs[0], &batched[0], DitOutputs{video_out(scratch_video, prefill), {}}, {}},
                                      {kvs[1], &batched[1], DitOutputs{video_out(scratch_b, prefill), {}}, {}}};
            fx.dit->forward_batch(*fx.be, inputs(prefill), pre, opt);
            batched[0].commit();
            batched[1].commit();
            batched[0].begin(false);
            batched[1].begin(false);
            // branch 1 without an action output: its decoder is skipped
            const DitBranch den[2] = {
                {kvs[0], &batched[0], DitOutputs{video_out(video[1][0], denoise), action_out(action[1])}, {}},
                {kvs[1], &batched[1], DitOutputs{video_out(video[1][1], denoise), {}}, {}}};
            fx.dit->forward_batch(*fx.be, inputs(denoise), den, opt);
        }
        // the history each branch committed: the same rows, batched or not
        for (int b = 0; b < 2; ++b) CHECK(batched[b].history_tokens() == single[b].history_tokens());
        // NOTE: the same arithmetic up to f32 summation order (the CPU's GEMM blocks its rows by the row count):
        // kTol of the outputs' magnitude, far below a branch's rows mixed with the other's or a wrong cache (O(1))
        const auto close = [](const std::vector<float>& got, const std::vector<float>& want) {
            double scale = 1.0;
            for (float v : want) scale = std::max(scale, std::fabs(double(v)));
            return max_abs_diff(got, want) <= kTol * scale;
        };
        for (int b = 0; b < 2; ++b) {
            CAPTURE(b);
            CHECK(close(video[1][b], video[0][b]));
        }
        CHECK(close(action[1], action[0]));
        // every layer's committed K/V (layer 0's from branch 0's rows when shared: both branches hold the same)
        for (int l = 0; l < c.num_layers; ++l)
            for (int b = 0; b < 2; ++b) {
                CAPTURE(l);
                CAPTURE(b);
                CHECK(close(batched[b].history_k(l), single[b].history_k(l)));
                CHECK(close(batched[b].history_v(l), single[b].history_v(l)));
            }
        if (share_layer0) {
            CHECK(batched[1].history_k(0) == batched[0].history_k(0));
            CHECK(batched[1].history_v(0) == batched[0].history_v(0));
        }
        // the branches differ (a test of two equal branches would not see them swapped)
        CHECK(max_abs_diff(video[0][0], video[0][1]) > 1e-3);
        for (float v : video[1][1]) REQUIRE(std::isfinite(v));
    }
}

TEST_CASE("a kv_only committing forward stores every layer's K/V as the full forward does, and writes no output") {
    for (const Numerics numerics : {Numerics::Fast, Numerics::Reference}) {
        CAPTURE(int(numerics));
        Fixture fx(2, 7, 0.0f, Precision::Bf16, numerics);
        const DitConfig& c = fx.cfg;
        Inputs prefill = make_inputs(c, 1, 0, 0, false, 81);
        DitInputs di;
        di.x = TensorView(prefill.x.data(), DType::F32, Shape{c.out_dim, 1, kTinyLatentH, kTinyLatentW});
        di.y = TensorView(prefill.y.data(), DType::F32, Shape{c.in_dim - c.out_dim, 1, kTinyLatentH, kTinyLatentW});
        DenseTestCache full = fx.make_cache(), kv = fx.make_cache();
        std::vector<float> video_full(prefill.x.size(), 0.f), video_kv(prefill.x.size(), -7.f);
        const Shape vs{c.out_dim, 1, kTinyLatentH, kTinyLatentW};
        full.begin(true);
        fx.dit->forward(*fx.be, di, fx.kv, full, DitOutputs{TensorView(video_full.data(), DType::F32, vs), {}});
        DitForwardOptions opt;
        opt.kv_only = true;
        kv.begin(true);
        fx.dit->forward(*fx.be, di, fx.kv, kv, DitOutputs{TensorView(video_kv.data(), DType::F32, vs), {}}, opt);
        full.commit();
        kv.commit();
        for (int l = 0; l < c.num_layers; ++l) {
            CAPTURE(l);
            CHECK(kv.history_k(l) == full.history_k(l));  // bit for bit: the same ops up to the last K/V
            CHECK(kv.history_v(l) == full.history_v(l));
        }
        if (numerics == Numerics::Fast) {
            // the last layer stored without attending; the outputs were not written
            CHECK(kv.stores == 1);
            CHECK(kv.last_keys[size_t(c.num_layers - 1)] == -1);
            CHECK(std::all_of(video_kv.begin(), video_kv.end(), [](float v) { return v == -7.f; }));
        } else {
            // reference numerics run the official forward whole
            CHECK(kv.stores == 0);
            CHECK(video_kv == video_full);
        }
    }
}

TEST_CASE("fast numerics with FP8 Linears: the norms' fused quantization gives the two ops' outputs") {
    // NOTE: a traced forward runs the norm, then the quantization (the trace wants the rows); an untraced one the
    // fused ops (Backend::ada_layer_norm_fp8, activation_quantize_fp8), whose base implementations are the same ops:
    // on the CPU the outputs are the same bits
    Fixture fx(2, 7, 0.0f, Precision::Fp8, Numerics::Fast);
    const DitConfig& c = fx.cfg;
    Output o[2];
    for (int traced = 0; traced < 2; ++traced) {
        DenseTestCache cache = fx.make_cache();
        Inputs prefill = make_inputs(c, 1, 0, 0, false, 81);
        run(fx, cache, prefill, true, traced == 1);
        Inputs denoise = make_inputs(c, 2, 1, 624, true, 82, 624);
        o[traced] = run(fx, cache, denoise, false, traced == 1);
    }
    CHECK(std::memcmp(o[0].video.data(), o[1].video.data(), o[0].video.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(o[0].action.data(), o[1].action.data(), o[0].action.size() * sizeof(float)) == 0);
    CHECK_FALSE(o[1].traces.empty());
    for (float v : o[0].video) REQUIRE(std::isfinite(v));
}

TEST_CASE("a batched forward needs fast numerics and takes the workspace it measures") {
    Fixture fx(2);
    const DitConfig& c = fx.cfg;
    DenseTestCache caches[2] = {fx.make_cache(), fx.make_cache()};
    Inputs in = make_inputs(c, 1, 0, 0, false, 71);
    std::vector<float> v0(in.x.size()), v1(in.x.size());
    DitInputs di;
    di.x = TensorView(in.x.data(), DType::F32, Shape{c.out_dim, 1, kTinyLatentH, kTinyLatentW});
    di.y = TensorView(in.y.data(), DType::F32, Shape{c.in_dim - c.out_dim, 1, kTinyLatentH, kTinyLatentW});
    const DitBranch two[2] = {{&fx.kv, &caches[0], DitOutputs{TensorView(v0.data(), DType::F32, di.x.shape), {}}, {}},
                              {&fx.kv, &caches[1], DitOutputs{TensorView(v1.data(), DType::F32, di.x.shape), {}}, {}}};
    caches[0].begin(true);
    caches[1].begin(true);
    const std::string msg = error_of([&] { fx.dit->forward_batch(*fx.be, di, two); });
    CHECK(contains(msg, "fast numerics"));

    Fixture fast(2, 7, 0.0f, Precision::Bf16, Numerics::Fast);
    const size_t one = fast.dit->forward_workspace_bytes(*fast.be, 1, false);
    const size_t planned = fast.dit->forward_workspace_bytes(*fast.be, 1, false, 2);
    CHECK(planned > one);
    fast.be->reserve_workspace(planned);
    const DitBranch fast_two[2] = {{&fast.kv, &caches[0], two[0].out, {}}, {&fast.kv, &caches[1], two[1].out, {}}};
    caches[0].begin(true);
    caches[1].begin(true);
    CHECK_NOTHROW(fast.dit->forward_batch(*fast.be, di, fast_two));
    CHECK(fast.be->workspace().used() == 0);
    CHECK(fast.be->workspace().high_water() == planned);
}

TEST_CASE("forwards run in a workspace of exactly their measured size and take all of it, with bf16 and with FP8 Linears") {
  for (Precision precision : {Precision::Bf16, Precision::Fp8}) {
    CAPTURE(precision_name(precision));
    Fixture fx(2, 7, 0.0f, precision);
    const DitConfig& c = fx.cfg;
    // NOTE: a fresh arena of exactly the measured size: one byte short, the arena's alloc throws
    const size_t cross = fx.dit->cross_kv_workspace_bytes(*fx.be, kTinyImageTokens);
    fx.be->reserve_workspace(cross);
    fx.dit->compute_cross_kv(*fx.be,
                             TensorView(fx.clip.data(), DType::F32, Shape{kTinyImageTokens, c.image_dim}),
                             TensorView(fx.text.data(), DType::F32, Shape{c.text_len, c.text_dim}), fx.kv);
    CHECK(fx.be->workspace().high_water() == cross);
    for (int frames : {1, 2}) {
        for (bool regs : {false, true}) {
            CAPTURE(frames);
            CAPTURE(regs);
            const size_t planned = fx.dit->forward_workspace_bytes(*fx.be, frames, regs);
            fx.be->reserve_workspace(planned);
            DenseTestCache cache = fx.make_cache();
            Inputs in = make_inputs(c, frames, 1, 500, regs, 90, 500);
            CHECK_NOTHROW(run(fx, cache, in, false));
            CHECK(fx.be->workspace().used() == 0);
            CHECK(fx.be->workspace().high_water() == planned);
        }
    }
    // more frames and the registers take more
    CHECK(fx.dit->forward_workspace_bytes(*fx.be, 2, true) > fx.dit->forward_workspace_bytes(*fx.be, 1, false));
  }
}

TEST_CASE("a DiT with FP8 Linears stays within FP8's rounding of the f32 DiT") {
    // NOTE: E4M3 keeps 3 mantissa bits: a rounding error of at most 2^-4 (6.25%) of each value, about 3.6% RMS for
    // values spread over a binade. One GEMM with both operands rounded then has ~5% relative RMS error (the two
    // independent roundings add in quadrature; the sum over k averages the signs but not the relative size). The DiT
    // adds such GEMM outputs into its residual stream, so its outputs should stay near that: the bound is twice it
    // (10%), while a wrong scale, a transposed operand or a missing bias moves them by O(100%).
    Fixture f32(1, 7), fp8(1, 7, 0.0f, Precision::Fp8);
    const DitConfig& c = f32.cfg;
    const auto rel_l2 = [](const std::vector<float>& a, const std::vector<float>& b) {
        double e = 0, n = 0;
        for (size_t i = 0; i < a.size(); ++i) {
            e += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
            n += double(b[i]) * b[i];
        }
        return std::sqrt(e / n);
    };
    DenseTestCache c32 = f32.make_cache(), c8 = fp8.make_cache();
    Inputs prefill = make_inputs(c, 1, 0, 0, false, 61);
    run(f32, c32, prefill, true);
    run(fp8, c8, prefill, true);
    Inputs denoise = make_inputs(c, 2, 1, 700, true, 62, 700);
    const Output a = run(f32, c32, denoise, false), b = run(fp8, c8, denoise, false);
    for (float v : b.video) REQUIRE(std::isfinite(v));
    for (float v : b.action) REQUIRE(std::isfinite(v));
    const double video = rel_l2(b.video, a.video), action = rel_l2(b.action, a.action);
    MESSAGE("FP8 vs f32 DiT: video rel-L2 " << video << ", action rel-L2 " << action);
    CHECK(video > 0.0);  // the FP8 path ran
    CHECK(video < 0.1);
    CHECK(action < 0.1);
}

TEST_CASE("recomputing the cross-attention K/V gives the same tensors") {
    Fixture fx(1);
    DitCrossKv again = fx.dit->make_cross_kv(*fx.be, kTinyImageTokens);
    fx.dit->compute_cross_kv(
        *fx.be, TensorView(fx.clip.data(), DType::F32, Shape{kTinyImageTokens, fx.cfg.image_dim}),
        TensorView(fx.text.data(), DType::F32, Shape{fx.cfg.text_len, fx.cfg.text_dim}), again);
    for (size_t l = 0; l < again.layers.size(); ++l) {
        CHECK(to_f32_vector(again.layers[l].k_txt) == to_f32_vector(fx.kv.layers[l].k_txt));
        CHECK(to_f32_vector(again.layers[l].v_img) == to_f32_vector(fx.kv.layers[l].v_img));
    }
}

TEST_CASE("the finite check names the stage and layer of a NaN") {
    Fixture fx(1, 7, std::numeric_limits<float>::quiet_NaN());
    DenseTestCache cache = fx.make_cache();
    Inputs prefill = make_inputs(fx.cfg, 1, 0, 0, false, 61);
    // Without the debug option the NaN flows through silently.
    Output o = run(fx, cache, prefill, false);
    CHECK(std::isnan(o.video[0]));
    try {
        run(fx, cache, prefill, false, false, true);
        FAIL("expected dzr::Error");
    } catch (const Error& e) {
        const std::string msg = e.what();
        CHECK(msg.find("feed-forward") != std::string::npos);
        CHECK(msg.find("layer 1") != std::string::npos);
    }
}

TEST_CASE("the trace hook sees every layer's stages") {
    Fixture fx(1);
    DenseTestCache cache = fx.make_cache();
    Inputs prefill = make_inputs(fx.cfg, 1, 0, 0, false, 71);
    Output o = run(fx, cache, prefill, true, true);
    for (const char* name : {"self_attn_in", "q", "k", "v", "self_attn", "x_self", "cross_attn", "x_cross",
                             "ffn", "layer_out"}) {
        CAPTURE(name);
        CHECK(o.traces[name].size() == size_t(fx.cfg.num_layers));
    }
    CHECK(o.traces["patch_embed"][-1].size() == size_t(fx.cfg.frame_seqlen * fx.cfg.dim));
    CHECK(o.traces["head"][-1].size() == size_t(fx.cfg.frame_seqlen * 4 * fx.cfg.out_dim));
    // the head's LayerNorm output (no affine: every row has mean 0 and variance 1) and the Linear's input after the
    // modulation
    const std::vector<float>& norm = o.traces["head_norm"][-1];
    const std::vector<float>& head_in = o.traces["head_in"][-1];
    REQUIRE(norm.size() == size_t(fx.cfg.frame_seqlen * fx.cfg.dim));
    REQUIRE(head_in.size() == norm.size());
    for (int64_t r = 0; r < fx.cfg.frame_seqlen; r += 97) {
        double mean = 0, sq = 0;
        for (int64_t c = 0; c < fx.cfg.dim; ++c) mean += norm[size_t(r * fx.cfg.dim + c)];
        mean /= double(fx.cfg.dim);
        for (int64_t c = 0; c < fx.cfg.dim; ++c) sq += std::pow(norm[size_t(r * fx.cfg.dim + c)] - mean, 2);
        CHECK(std::abs(mean) < 1e-4);
        CHECK(std::abs(sq / double(fx.cfg.dim) - 1.0) < 1e-3);
    }
    double moved = 0;  // scaled and shifted
    for (size_t i = 0; i < norm.size(); ++i) moved = std::max(moved, double(std::abs(head_in[i] - norm[i])));
    CHECK(moved > 1e-3);
    CHECK(o.traces.count("action_tokens") == 0);  // a prefill carries no register tokens
    CHECK(o.traces.count("state_tokens") == 0);
}

namespace {

/// A cache that reports a fixed history and must never be asked to attend.
class FixedHistoryCache final : public SelfAttentionCache {
  public:
    explicit FixedHistoryCache(int64_t tokens) : tokens_(tokens) {}
    int64_t history_tokens() const override { return tokens_; }
    bool committing() const override { return false; }
    void attend(Backend&, int, const TensorView&, const TensorView&, const TensorView&, int64_t, float,
                const TensorView&) override {
        DZR_THROW("attend must not be reached");
    }
    void store(Backend&, int, const TensorView&, const TensorView&, int64_t) override {
        DZR_THROW("store must not be reached");
    }

  private:
    int64_t tokens_;
};

std::string forward_error(Fixture& fx, SelfAttentionCache& cache, DitInputs di, Shape out_shape) {
    std::vector<float> video(size_t(out_shape.numel())),
        action(size_t(fx.cfg.num_action_per_block) * fx.cfg.action_dim);
    DitOutputs out{
        TensorView(video.data(), DType::F32, out_shape),
        TensorView(action.data(), DType::F32, Shape{fx.cfg.num_action_per_block, fx.cfg.action_dim})};
    try {
        fx.dit->forward(*fx.be, di, fx.kv, cache, out);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

}  // namespace

TEST_CASE("forward rejects bad shapes, timesteps, start frames and window overflow") {
    Fixture fx(1);
    const DitConfig& c = fx.cfg;
    Inputs in = make_inputs(c, 2, 3, 999, true, 81, 999);
    const Shape xs{c.out_dim, 2, kTinyLatentH, kTinyLatentW};
    auto base = [&] {
        DitInputs di;
        di.x = TensorView(in.x.data(), DType::F32, xs);
        di.y =
            TensorView(in.y.data(), DType::F32, Shape{c.in_dim - c.out_dim, 2, kTinyLatentH, kTinyLatentW});
        di.start_frame = 3;
        di.timestep = 999;
        di.registers = DitRegisterInputs{
            TensorView(in.regs->action.data(), DType::F32, Shape{c.num_action_per_block, c.action_dim}), 999,
            TensorView(in.regs->state.data(), DType::F32, Shape{1, c.max_state_dim})};
        return di;
    };
    DenseTestCache cache = fx.make_cache();
    DitInputs di = base();
    di.x = TensorView(in.x.data(), DType::F32, Shape{c.out_dim, 2, kTinyLatentW, kTinyLatentH});
    CHECK(forward_error(fx, cache, di, di.x.shape).find("latent x") != std::string::npos);

    di = base();
    di.timestep = 1000;
    CHECK(forward_error(fx, cache, di, xs).find("timestep 1000") != std::string::npos);

    di = base();
    di.registers->timestep = -1;
    CHECK(forward_error(fx, cache, di, xs).find("timestep -1") != std::string::npos);

    di = base();
    di.start_frame = 0;
    CHECK(forward_error(fx, cache, di, xs).find("start frame") != std::string::npos);

    di = base();
    di.registers->state = TensorView(in.regs->state.data(), DType::F32, Shape{1, c.max_state_dim / 2});
    CHECK(forward_error(fx, cache, di, xs).find("state") != std::string::npos);

    // 8 committed frames + 2 new ones exceed the 9-frame window (max_chunk_size 4 × 2 + 1)
    FixedHistoryCache full(8 * c.frame_seqlen);
    CHECK(forward_error(fx, full, base(), xs).find("attention window") != std::string::npos);
    FixedHistoryCache fits(7 * c.frame_seqlen);
    CHECK(forward_error(fx, fits, base(), xs).find("attend must not be reached") != std::string::npos);

    DitCrossKv empty;
    std::vector<float> video(size_t(xs.numel()));
    CHECK_THROWS_WITH_AS(fx.dit->forward(*fx.be, base(), empty, cache,
                                         DitOutputs{TensorView(video.data(), DType::F32, xs), {}}),
                         doctest::Contains("compute_cross_kv"), Error);
}

TEST_CASE("fast numerics (the fused block ops) give the reference forwards' outputs on the f32 backend") {
    // The CPU backend runs the fused ops as their composition of plain ops in f32, so both modes compute the same
    // block; what this checks is the fast layer's wiring (token groups, modulation vectors, RoPE tables of video and
    // register rows, gates) through prefill, commit and a denoising forward with registers.
    for (int heads : {1, 2}) {
        Fixture fx(heads);
        BackendOptions fast_options;
        fast_options.numerics = Numerics::Fast;
        std::unique_ptr<Backend> fast = make_cpu_backend(fast_options);
        fast->attach_profiler();
        const DitConfig& c = fx.cfg;
        Output ref[3], got[3];
        for (int mode = 0; mode < 2; ++mode) {
            if (mode == 1) std::swap(fx.be, fast);
            DenseTestCache cache = fx.make_cache();
            Inputs prefill = make_inputs(c, 1, 0, 0, false, 61);
            Inputs commit = make_inputs(c, 2, 1, 0, false, 62);
            Inputs denoise = make_inputs(c, 2, 3, 512, true, 63, 431);
            Output* o = mode == 0 ? ref : got;
            o[0] = run(fx, cache, prefill, true);
            o[1] = run(fx, cache, commit, true);
            o[2] = run(fx, cache, denoise, false);
            if (mode == 1) std::swap(fx.be, fast);
        }
        // the fast layer ran: its fused ops were called
        fast->profiler()->end_call();
        const auto ops = fast->profiler()->to_json()["totals"]["(none)"]["ops_by_time"];
        int fused = 0;
        for (const auto& op : ops) {
            const std::string key = op["op"];
            if (key.rfind("ada_layer_norm", 0) == 0 || key.rfind("rms_norm_rope", 0) == 0 ||
                key.rfind("gated_residual", 0) == 0)
                ++fused;
        }
        CHECK(fused >= 3);
        for (int k = 0; k < 3; ++k) {
            REQUIRE(ref[k].video.size() == got[k].video.size());
            for (size_t i = 0; i < ref[k].video.size(); ++i)
                REQUIRE(got[k].video[i] == doctest::Approx(ref[k].video[i]).epsilon(1e-5));
        }
        for (size_t i = 0; i < ref[2].action.size(); ++i)
            REQUIRE(got[2].action[i] == doctest::Approx(ref[2].action[i]).epsilon(1e-5));
    }
}

TEST_CASE("a batched forward over mirrored lanes, K and V written into their middle, gives the paged forward's outputs") {
    // NOTE: kv.in_place's mirrored lanes on the CPU backend (kernel path: the reference paged attention reads the
    // history through the table and the current rows where the DiT wrote them, the lanes' middle); against the same
    // forwards over a pool without lanes, bit for bit (the same f32 arithmetic over the same rows)
    Fixture fx(2, 7, 0.0f, Precision::Bf16, Numerics::Fast);
    const DitConfig& c = fx.cfg;
    std::vector<float> text_b = random_floats(size_t(c.text_len) * c.text_dim, 404);
    const TensorView clip(fx.clip.data(), DType::F32, Shape{kTinyImageTokens, c.image_dim});
    DitCrossKv kv_b = fx.dit->make_cross_kv(*fx.be, kTinyImageTokens);
    fx.dit->compute_cross_kv(*fx.be, clip, TensorView(text_b.data(), DType::F32, Shape{c.text_len, c.text_dim}), kv_b);
    const DitCrossKv* kvs[2] = {&fx.kv, &kv_b};
    KvGeometry g;
    g.num_layers = c.num_layers;
    g.num_kv_heads = c.num_heads;
    g.head_dim = c.dim / c.num_heads;
    g.tokens_per_frame = c.frame_seqlen;
    g.chunk_frames = c.num_frame_per_block;
    g.prefill_frames = 1;
    g.register_tokens = c.num_action_per_block + c.num_state_per_block;
    g.text_tokens = c.text_len;
    g.image_tokens = kTinyImageTokens;
    g.num_branches = 2;
    g.dtype = DType::F32;
    const KvConfig kc;
    std::vector<float> outputs[2];  // [without lanes | with lanes]: every forward's video and action rows
    for (const bool lanes : {false, true}) {
        CAPTURE(lanes);
        KvGeometry gl = g;
        gl.lanes = lanes;
        KvCacheManager m(gl, kc, kv_session_bytes(gl, kc), fx.be.get());
        REQUIRE(m.has_lanes() == lanes);
        auto session = m.open_session("dit");
        PagedSelfAttentionCache caches[2] = {{*session, 0, PagedAttentionPath::Kernel},
                                             {*session, 1, PagedAttentionPath::Kernel}};
        SelfAttentionCache* both[2] = {&caches[0], &caches[1]};
        // prefill, denoise, commit, denoise, commit, denoise (histories of 1, 3 and 5 frames)
        struct Step {
            KvForwardSpec spec;
            int start;
            int64_t t;
        };
        std::vector<Step> steps = {{KvForwardSpec::prefill(g), 0, 0}, {KvForwardSpec::denoise(g), 1, 700}};
        for (int i = 0; i < 2; ++i)
            steps.insert(steps.end(), {{KvForwardSpec::commit_chunk(g), 1 + 2 * i, 0},
                                       {KvForwardSpec::denoise(g), 3 + 2 * i, 500}});
        uint64_t seed = 80;
        for (const Step& st : steps) {
            for (auto& p : caches) p.begin(st.spec);
            const bool denoise = !st.spec.commit;
            Inputs in = make_inputs(c, st.spec.video_frames, st.start, st.t, denoise, seed++, st.t);
            const int64_t L = int64_t(st.spec.video_frames) * c.frame_seqlen + st.spec.register_tokens;
            TensorView k, v;
            // the DiT's current rows go to the middle exactly where lanes are on and the forward denoises
            CHECK(current_rows_in_place(*fx.be, 0, both, L, k, v) == (lanes && denoise));
            const DitInputs di = dit_inputs(c, in);
            std::vector<float> video[2], action(size_t(c.num_action_per_block) * c.action_dim, NAN);
            for (auto& vb : video) vb.assign(in.x.size(), NAN);
            const auto vview = [&](std::vector<float>& vb) {
                return TensorView(vb.data(), DType::F32, Shape{c.out_dim, in.frames, kTinyLatentH, kTinyLatentW});
            };
            const TensorView aview =
                denoise ? TensorView(action.data(), DType::F32, Shape{c.num_action_per_block, c.action_dim}) : TensorView{};
            const DitBranch branches[2] = {{kvs[0], &caches[0], DitOutputs{vview(video[0]), aview}, {}},
                                           {kvs[1], &caches[1], DitOutputs{vview(video[1]), {}}, {}}};
            fx.dit->forward_batch(*fx.be, di, branches);
            for (auto& p : caches) p.commit();
            for (const auto& vb : video) outputs[lanes].insert(outputs[lanes].end(), vb.begin(), vb.end());
            if (denoise) outputs[lanes].insert(outputs[lanes].end(), action.begin(), action.end());
        }
        session->close();
    }
    REQUIRE(outputs[0].size() == outputs[1].size());
    CHECK(std::memcmp(outputs[0].data(), outputs[1].data(), outputs[0].size() * sizeof(float)) == 0);
    for (float x : outputs[1]) REQUIRE(std::isfinite(x));
}
