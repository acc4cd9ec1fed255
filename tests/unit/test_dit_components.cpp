// Components of the causal DiT against closed forms and naive loops: RoPE tables, timestep
// sinusoids, unpatchify, the action/state heads, and loading.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>

#include "backend/backend.h"
#include "model/action_heads.h"
#include "model/causal_dit.h"
#include "model/dit_ops.h"
#include "model/embeddings.h"
#include "model/rope.h"
#include "support/test_support.h"
#include "unit/test_dit_support.h"

using namespace dzr;
using namespace dzr::test;

namespace {

TensorView f32_view(std::vector<float>& v, Shape s) {
    return TensorView(v.data(), DType::F32, s);
}

/// (cos, sin) stored for token t, pair j of a [L, P, 2] table.
/// (cos, sin) of a table entry: double-float pairs (hi + lo).
std::pair<double, double> entry(const std::vector<float>& table, int pairs, int t, int j) {
    const size_t i = (size_t(t) * pairs + size_t(j)) * kRopeEntry;
    return {double(table[i]) + double(table[i + 1]), double(table[i + 2]) + double(table[i + 3])};
}

void check_angle(const std::vector<float>& table, int pairs, int t, int j, double angle) {
    CAPTURE(t);
    CAPTURE(j);
    const auto [c, s] = entry(table, pairs, t, j);
    // hi + lo carries ~48 bits of the double: far closer than f32 (which alone is off by up to 3e-8)
    CHECK(std::abs(c - std::cos(angle)) < 1e-13);
    CHECK(std::abs(s - std::sin(angle)) < 1e-13);
}

}  // namespace

TEST_CASE("video rope split gives d - 4(d/6) temporal and 2(d/6) row and column channels") {
    const VideoRopeSplit s128 = video_rope_split(128);
    CHECK(s128.t_pairs == 22);
    CHECK(s128.h_pairs == 21);
    CHECK(s128.w_pairs == 21);
    const VideoRopeSplit s64 = video_rope_split(64);
    CHECK(s64.t_pairs == 12);
    CHECK(s64.h_pairs == 10);
    CHECK(s64.w_pairs == 10);
    CHECK_THROWS_AS(video_rope_split(63), Error);
}

TEST_CASE("video rope table rotates time, row and column bands by their own frequencies") {
    // head_dim 128: pairs 0..21 time (44 dims), 22..42 rows (42 dims), 43..63 columns (42 dims)
    const int first = 3, frames = 2, gh = 2, gw = 3, P = 64;
    const std::vector<float> t = video_rope_table(128, first, frames, gh, gw);
    REQUIRE(t.size() == size_t(frames * gh * gw * P * kRopeEntry));
    // token (fi=1, hi=1, wi=2) = 1·6 + 1·3 + 2 = 11; its time position is first + 1 = 4
    check_angle(t, P, 11, 0, 4.0);
    check_angle(t, P, 11, 1, 4.0 * std::pow(10000.0, -2.0 / 44.0));
    check_angle(t, P, 11, 21, 4.0 * std::pow(10000.0, -42.0 / 44.0));
    check_angle(t, P, 11, 22, 1.0);
    check_angle(t, P, 11, 23, 1.0 * std::pow(10000.0, -2.0 / 42.0));
    check_angle(t, P, 11, 43, 2.0);
    check_angle(t, P, 11, 63, 2.0 * std::pow(10000.0, -40.0 / 42.0));
    // token 0 (fi=0, hi=0, wi=0): only the time band rotates, by position 3
    check_angle(t, P, 0, 5, 3.0 * std::pow(10000.0, -10.0 / 44.0));
    check_angle(t, P, 0, 30, 0.0);
    check_angle(t, P, 0, 50, 0.0);
    // every entry, against the formula
    for (int tok = 0; tok < frames * gh * gw; ++tok) {
        const int fi = tok / (gh * gw), hi = (tok / gw) % gh, wi = tok % gw;
        for (int j = 0; j < P; ++j) {
            double a;
            if (j < 22)
                a = (first + fi) * std::pow(10000.0, -2.0 * j / 44.0);
            else if (j < 43)
                a = hi * std::pow(10000.0, -2.0 * (j - 22) / 42.0);
            else
                a = wi * std::pow(10000.0, -2.0 * (j - 43) / 42.0);
            const auto [c, s] = entry(t, P, tok, j);
            REQUIRE(std::abs(c - std::cos(a)) < 1e-13);
            REQUIRE(std::abs(s - std::sin(a)) < 1e-13);
        }
    }
}

TEST_CASE("register rope table puts action a at 24k + a and the state at k over all pairs") {
    const int k = 2, P = 64;
    const std::vector<float> t = register_rope_table(128, k, 24, 1);
    REQUIRE(t.size() == size_t(25 * P * kRopeEntry));
    check_angle(t, P, 5, 0, 53.0);
    check_angle(t, P, 5, 7, 53.0 * std::pow(10000.0, -14.0 / 128.0));
    check_angle(t, P, 23, 63, 71.0 * std::pow(10000.0, -126.0 / 128.0));
    check_angle(t, P, 24, 0, 2.0);  // the state token
    check_angle(t, P, 24, 10, 2.0 * std::pow(10000.0, -20.0 / 128.0));
    const std::vector<float> t0 = register_rope_table(128, 0, 24, 1);
    check_angle(t0, P, 0, 9, 0.0);
    check_angle(t0, P, 24, 9, 0.0);
}

TEST_CASE("precomputed rope tables give the rows of any start frame and block index") {
    auto be = make_cpu_backend();
    const DitRopeTables tables(*be, 128, 2, 4, 11, 4, 24, 1);
    for (int start : {0, 1, 3, 7, 9}) {
        for (int frames : {1, 2}) {
            CAPTURE(start);
            CAPTURE(frames);
            CHECK(to_f32_vector(tables.video(start, frames)) == video_rope_table(128, start, frames, 2, 4));
        }
    }
    for (int k = 0; k <= 4; ++k)
        CHECK(to_f32_vector(tables.registers(k)) == register_rope_table(128, k, 24, 1));
    CHECK_THROWS_WITH_AS(tables.video(10, 2), doctest::Contains("start frame 10"), Error);
    CHECK_THROWS_WITH_AS(tables.registers(5), doctest::Contains("block index 5"), Error);
}

TEST_CASE("dit timestep sinusoid is [cos, sin] with omega 10000^(-j/half)") {
    const std::vector<double> s = dit_timestep_sinusoid(256, 999.0);
    REQUIRE(s.size() == 256);
    CHECK(s[0] == doctest::Approx(std::cos(999.0)));
    CHECK(s[128] == doctest::Approx(std::sin(999.0)));
    CHECK(s[1] == doctest::Approx(std::cos(999.0 * std::pow(10000.0, -1.0 / 128.0))));
    CHECK(s[255] == doctest::Approx(std::sin(999.0 * std::pow(10000.0, -127.0 / 128.0))));
    const std::vector<double> z = dit_timestep_sinusoid(256, 0.0);
    for (int j = 0; j < 128; ++j) {
        CHECK(z[size_t(j)] == 1.0);
        CHECK(z[size_t(128 + j)] == 0.0);
    }
}

TEST_CASE("action timestep sinusoid is [sin, cos] with omega exp(-j ln(10000)/half)") {
    const std::vector<float> s = action_timestep_sinusoid(8, 5.0f);
    REQUIRE(s.size() == 8);
    for (int j = 0; j < 4; ++j) {
        const double w = std::exp(-j * std::log(10000.0) / 4.0);
        CHECK(s[size_t(j)] == doctest::Approx(std::sin(5.0 * w)).epsilon(1e-5));
        CHECK(s[size_t(4 + j)] == doctest::Approx(std::cos(5.0 * w)).epsilon(1e-5));
    }
    const std::vector<float> big = action_timestep_sinusoid(5120, 999.0f);
    CHECK(big[0] == doctest::Approx(std::sin(999.0)).epsilon(1e-4));
    CHECK(big[2560] == doctest::Approx(std::cos(999.0)).epsilon(1e-4));
}

TEST_CASE("timestep tables hold both sinusoids for every integer timestep and reject others") {
    auto be = make_cpu_backend();
    const TimestepTables tables(*be, 256, 64);
    for (int64_t t : {0, 1, 535, 999}) {
        CAPTURE(t);
        const std::vector<double> d = dit_timestep_sinusoid(256, double(t));
        CHECK(to_f32_vector(tables.dit(t)) == std::vector<float>(d.begin(), d.end()));
        CHECK(to_f32_vector(tables.action(t)) == action_timestep_sinusoid(64, float(t)));
    }
    CHECK_THROWS_WITH_AS(tables.dit(1000), doctest::Contains("timestep 1000"), Error);
    CHECK_THROWS_WITH_AS(tables.action(-1), doctest::Contains("timestep -1"), Error);
}

TEST_CASE("unpatchify matches a naive loop over (p, q, r, c) with c fastest") {
    auto be = make_cpu_backend();
    const int f = 2, gh = 2, gw = 3, C = 16;
    std::vector<float> tok = random_floats(size_t(f * gh * gw * 4 * C), 4);
    std::vector<float> out(size_t(C * f * gh * 2 * gw * 2));
    unpatchify(*be, f32_view(tok, Shape{f * gh * gw, 4 * C}), f, gh, gw, 2, 2,
               f32_view(out, Shape{C, f, gh * 2, gw * 2}));
    for (int fi = 0; fi < f; ++fi)
        for (int hi = 0; hi < gh; ++hi)
            for (int wi = 0; wi < gw; ++wi)
                for (int q = 0; q < 2; ++q)
                    for (int r = 0; r < 2; ++r)
                        for (int c = 0; c < C; ++c) {
                            const float want =
                                tok[size_t(((fi * gh + hi) * gw + wi) * 4 * C + (q * 2 + r) * C + c)];
                            REQUIRE(out[size_t(((c * f + fi) * gh * 2 + 2 * hi + q) * gw * 2 + 2 * wi + r)] ==
                                    want);
                        }
}

TEST_CASE("state encoder, action encoder and action decoder match naive loops") {
    const DitConfig c = tiny_dit_config();
    MapWeightSource src;
    fill_dit_weights(src, c, 5);
    auto be = make_cpu_backend();
    WeightLoader loader(src, *be);
    const StateEncoder state_enc(c, loader);
    const ActionEncoder action_enc(c, loader);
    const ActionDecoder action_dec(c, loader);
    const NaiveWeights w{src};

    std::vector<float> state = random_floats(size_t(c.max_state_dim), 6);
    std::vector<float> out(size_t(c.dim));
    state_enc.forward(*be, f32_view(state, Shape{1, c.max_state_dim}), f32_view(out, Shape{1, c.dim}));
    Vec h = nv_xw(w.get("state_encoder.layer1.W"), w.get("state_encoder.layer1.b"),
                  Vec(state.begin(), state.end()));
    for (auto& v : h) v = std::max(v, 0.0);
    CHECK(rel_max_err(out, nv_xw(w.get("state_encoder.layer2.W"), w.get("state_encoder.layer2.b"), h)) <
          1e-5);

    const int A = c.num_action_per_block;
    const int64_t t = 972;
    std::vector<float> act = random_floats(size_t(A * c.action_dim), 7);
    std::vector<float> tau = action_timestep_sinusoid(c.dim, float(t));
    std::vector<float> enc(size_t(A * c.dim));
    action_enc.forward(*be, f32_view(act, Shape{A, c.action_dim}), f32_view(tau, Shape{1, c.dim}),
                       f32_view(enc, Shape{A, c.dim}));
    Vec ref;
    for (int a = 0; a < A; ++a) {
        Vec cat = nv_xw(w.get("action_encoder.W1.W"), w.get("action_encoder.W1.b"),
                        Vec(act.begin() + a * c.action_dim, act.begin() + (a + 1) * c.action_dim));
        cat.insert(cat.end(), tau.begin(), tau.end());  // [W1 a, sin..., cos...]
        Vec hh = nv_xw(w.get("action_encoder.W2.W"), w.get("action_encoder.W2.b"), cat);
        for (auto& v : hh) v = v / (1.0 + std::exp(-v));
        const Vec o = nv_xw(w.get("action_encoder.W3.W"), w.get("action_encoder.W3.b"), hh);
        ref.insert(ref.end(), o.begin(), o.end());
    }
    CHECK(rel_max_err(enc, ref) < 1e-5);

    std::vector<float> dec(size_t(A * c.action_dim));
    action_dec.forward(*be, f32_view(enc, Shape{A, c.dim}), f32_view(dec, Shape{A, c.action_dim}));
    Vec dref;
    for (int a = 0; a < A; ++a) {
        Vec hh = nv_xw(w.get("action_decoder.layer1.W"), w.get("action_decoder.layer1.b"),
                       Vec(enc.begin() + a * c.dim, enc.begin() + (a + 1) * c.dim));
        for (auto& v : hh) v = std::max(v, 0.0);
        const Vec o = nv_xw(w.get("action_decoder.layer2.W"), w.get("action_decoder.layer2.b"), hh);
        dref.insert(dref.end(), o.begin(), o.end());
    }
    CHECK(rel_max_err(dec, dref) < 1e-5);
}

TEST_CASE("loading consumes every DiT key and names a missing or misshapen one") {
    const DitConfig c = tiny_dit_config(2);
    auto be = make_cpu_backend();
    {
        MapWeightSource src;
        fill_dit_weights(src, c, 9);
        WeightLoader loader(src, *be);
        const CausalDit dit(c, kTinyLatentH, kTinyLatentW, loader);
        CHECK(loader.unused("action_head.model.").empty());
        CHECK(loader.used().size() == src.tensors.size());
    }
    {
        MapWeightSource src;
        fill_dit_weights(src, c, 9);
        src.tensors.erase("action_head.model.blocks.1.cross_attn.k_img.weight");
        WeightLoader loader(src, *be);
        CHECK_THROWS_WITH_AS(CausalDit(c, kTinyLatentH, kTinyLatentW, loader),
                             doctest::Contains("action_head.model.blocks.1.cross_attn.k_img.weight"), Error);
    }
    {
        MapWeightSource src;
        fill_dit_weights(src, c, 9);
        src.tensors["action_head.model.action_encoder.W2.W"] =
            Tensor::host(Shape{1, c.dim, c.dim}, DType::F32);
        WeightLoader loader(src, *be);
        CHECK_THROWS_WITH_AS(
            CausalDit(c, kTinyLatentH, kTinyLatentW, loader),
            doctest::Contains("action_head.model.action_encoder.W2.W: expected [1, 256, 128]"), Error);
    }
}

TEST_CASE("construction rejects a latent whose patch grid does not hold frame_seqlen tokens") {
    const DitConfig c = tiny_dit_config();
    MapWeightSource src;
    fill_dit_weights(src, c, 10);
    auto be = make_cpu_backend();
    WeightLoader loader(src, *be);
    CHECK_THROWS_WITH_AS(CausalDit(c, 4, 12, loader), doctest::Contains("frame_seqlen 8"), Error);
    CHECK_THROWS_WITH_AS(CausalDit(c, 5, 8, loader), doctest::Contains("not divisible"), Error);
}
