// State normalization and action post-processing against hand-computed values.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "policy/normalization.h"
#include "policy/postprocess.h"

using namespace dzr;

namespace {

EmbodimentStatistics make_stats() {
    EmbodimentStatistics s;
    s.tag = "oxe_droid";
    KeyStatistics sj, sg, aj, ag;
    sj.q01 = {-1.f, -2.f, 0.f, 0.5f, -3.f, 0.f, 1.f};
    sj.q99 = {3.f, 2.f, 1.f, 0.5f, 3.f, 4.f, 2.f};  // dim 3: q01 == q99
    sg.q01 = {0.f};
    sg.q99 = {1.f};
    aj.q01 = {-0.1f, -0.2f, -0.3f, -0.4f, -0.5f, -0.6f, -0.7f};
    aj.q99 = {0.1f, 0.25f, 0.3f, 0.45f, 0.5f, 0.65f, 0.7f};
    ag.q01 = {0.02f};
    ag.q99 = {0.98f};
    s.state["joint_position"] = sj;
    s.state["gripper_position"] = sg;
    s.action["joint_position"] = aj;
    s.action["gripper_position"] = ag;
    return s;
}

}  // namespace

TEST_CASE("q99 normalization maps q01..q99 to -1..1, clamps, and passes constant dims through") {
    KeyStatistics st;
    st.q01 = {-1.f, 0.5f};
    st.q99 = {3.f, 0.5f};
    std::vector<double> out(2);
    const std::vector<double> cases[] = {{1.0, 0.7}, {3.0, 2.0}, {5.0, -4.0}, {-2.0, 0.25}, {-1.0, -0.3}};
    const std::vector<double> want[] = {{0.0, 0.7}, {1.0, 1.0}, {1.0, -1.0}, {-1.0, 0.25}, {-1.0, -0.3}};
    for (size_t i = 0; i < 5; ++i) {
        q99_normalize(cases[i], st, out, "test");
        CHECK(out == want[i]);
    }
    q99_normalize(std::vector<double>{0.2, 0.0}, st, out, "test");
    CHECK(out[0] == 2.0 * ((0.2 + 1.0) / 4.0) - 1.0);
    CHECK_THROWS_AS(q99_normalize(std::vector<double>{1.0}, st, std::span<double>(out.data(), 1), "test"),
                    Error);
}

TEST_CASE("state input is joint then gripper, normalized, zero-padded to 64") {
    const EmbodimentStatistics stats = make_stats();
    const std::vector<double> joint = {1.0, 0.0, 0.25, 0.9, 6.0, 2.0, 1.5};
    const std::vector<double> grip = {0.3};
    const std::vector<double> s = prepare_state(joint, grip, stats);
    REQUIRE(s.size() == 64);
    CHECK(s[0] == 0.0);  // (1 + 1) / 4 * 2 - 1
    CHECK(s[1] == 0.0);
    CHECK(s[2] == -0.5);
    CHECK(s[3] == 0.9);  // q01 == q99: passed through
    CHECK(s[4] == 1.0);  // clamped
    CHECK(s[5] == 0.0);
    CHECK(s[6] == 0.0);
    CHECK(s[7] == 2.0 * 0.3 - 1.0);
    for (size_t i = 8; i < 64; ++i) CHECK(s[i] == 0.0);
    CHECK_THROWS_AS(prepare_state(std::vector<double>(6, 0.0), grip, stats), Error);
    CHECK_THROWS_AS(prepare_state(joint, grip, stats, 4), Error);
    EmbodimentStatistics missing = stats;
    missing.state.erase("gripper_position");
    CHECK_THROWS_AS(prepare_state(joint, grip, missing), Error);
}

TEST_CASE("float64 to bf16 rounds once, unlike a detour through float32") {
    CHECK(round_f64_to_bf16(1.0) == 1.0f);
    CHECK(round_f64_to_bf16(1.0 + 1.0 / 256) == 1.0f);              // tie -> even
    CHECK(round_f64_to_bf16(1.0 + 3.0 / 256) == 1.0f + 1.0f / 64);  // tie -> even (up)
    CHECK(round_f64_to_bf16(-0.75) == -0.75f);
    CHECK(round_f64_to_bf16(0.0) == 0.0f);
    const double above_tie = 1.0 + 1.0 / 256 + std::ldexp(1.0, -30);
    CHECK(round_f64_to_bf16(above_tie) == 1.0f + 1.0f / 128);   // just above the tie: up
    CHECK(bf16_to_f32(f32_to_bf16(float(above_tie))) == 1.0f);  // float32 first loses it
    for (double v : {0.123456789, -0.987654321, 3.3e-3, 0.5 + 1e-9}) {
        const float r = round_f64_to_bf16(v);
        CHECK(bf16_to_f32(f32_to_bf16(r)) == r);  // representable in bf16
        CHECK(std::fabs(r - v) <= std::fabs(v) / 256.0);
    }
}

TEST_CASE("actions are un-normalized, joints made absolute, gripper kept, extra dims dropped") {
    const EmbodimentStatistics stats = make_stats();
    const int horizon = kPolicyActionHorizon, dim = kModelActionDim;
    std::vector<float> pred(size_t(horizon) * dim);
    for (int t = 0; t < horizon; ++t)
        for (int d = 0; d < dim; ++d)
            pred[size_t(t) * dim + size_t(d)] = d < 8 ? -1.f + 2.f * float(t) / 23.f : 1e6f;
    const std::vector<double> joint = {0.1, -0.2, 0.3, -0.4, 0.5, -0.6, 0.7};
    const std::vector<float> out = postprocess_actions(pred, horizon, dim, joint, stats);
    REQUIRE(out.size() == size_t(horizon) * 8);
    const KeyStatistics& aj = stats.action.at("joint_position");
    for (int t = 0; t < horizon; ++t) {
        CAPTURE(t);
        const float n = pred[size_t(t) * dim];
        for (int d = 0; d < 7; ++d) {
            const float rel = (n + 1.0f) / 2.0f * (aj.q99[size_t(d)] - aj.q01[size_t(d)]) + aj.q01[size_t(d)];
            CHECK(out[size_t(t) * 8 + size_t(d)] == float(double(rel) + joint[size_t(d)]));
        }
        CHECK(out[size_t(t) * 8 + 7] == (n + 1.0f) / 2.0f * (0.98f - 0.02f) + 0.02f);
    }
    // the ends of the range map to q01 and q99 (plus the state for joints); no clamp outside
    CHECK(out[0] == float(double(-0.1f) + 0.1));
    CHECK(std::fabs(out[size_t(23) * 8 + 1] - 0.05f) < 1e-6f);
    CHECK(q99_unnormalize(3.0f, 0.f, 1.f) == 2.0f);
    CHECK_THROWS_AS(postprocess_actions(std::vector<float>(10), horizon, dim, joint, stats), Error);
    CHECK_THROWS_AS(postprocess_actions(pred, horizon, dim, std::vector<double>(8, 0.0), stats), Error);
    EmbodimentStatistics bad = stats;
    bad.action["gripper_position"].q01 = {0.f, 0.f};
    CHECK_THROWS_AS(postprocess_actions(pred, horizon, dim, joint, bad), Error);
}
