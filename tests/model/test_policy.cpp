// End-to-end DreamZero policy on the tiny config (CPU): the per-call state machine, the KV cycle,
// paged == dense, determinism.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <random>

#include "backend/backend.h"
#include "config/run_config.h"
#include "model/inventory.h"
#include "policy/dreamzero_policy.h"
#include "policy/normalization.h"
#include "support/test_support.h"
#include "weights/checkpoint.h"
#include "weights/random_checkpoint.h"

using namespace dzr;

namespace {

struct TinyWorld {
    test::TempDir dir;
    config::RunConfig cfg;
    std::unique_ptr<Checkpoint> ckpt;

    TinyWorld() {
        cfg = config::load_run_config(test::source_dir() / "configs/tiny.yaml");
        MakeOptions mo;
        mo.seed = 7;
        mo.dtype = DType::F32;
        write_random_checkpoint(cfg.model, mo, dir / "ckpt");
        ckpt = std::make_unique<Checkpoint>(dir / "ckpt");
    }

    std::unique_ptr<DreamZeroPolicy> policy(Backend& be, KvMode mode, KvInPlace in_place = KvInPlace::Auto) const {
        PolicyOptions o;
        o.sampling = cfg.sampling;
        o.kv = cfg.kv;
        o.kv.in_place = in_place;
        o.kv.mode = mode;
        return std::make_unique<DreamZeroPolicy>(ckpt->model_config(), *ckpt, droid_embodiment(ckpt->statistics("oxe_droid")),
                                                 test::data_dir() / "tokenizer/spiece.model", o, be);
    }
};

/// Frames [T, 180, 320, 3] with a moving square, different per call and camera.
std::vector<uint8_t> frames(int T, int call, int camera) {
    std::vector<uint8_t> f(size_t(T) * 180 * 320 * 3);
    for (int t = 0; t < T; ++t)
        for (int y = 0; y < 180; ++y)
            for (int x = 0; x < 320; ++x) {
                const int sx = (call * 24 + t * 6 + camera * 40) % 280, sy = 40 + camera * 30;
                const bool in = x >= sx && x < sx + 40 && y >= sy && y < sy + 40;
                for (int c = 0; c < 3; ++c)
                    f[((size_t(t) * 180 + y) * 320 + x) * 3 + c] = uint8_t(in ? 200 - 50 * c : 30 + (x + y + c * 20) % 60);
            }
    return f;
}

struct CallInput {
    std::vector<uint8_t> e1, e2, w;
    Observation obs;
    CallInput(int T, int call) : e1(frames(T, call, 0)), e2(frames(T, call, 1)), w(frames(T, call, 2)) {
        Shape s{T, 180, 320, 3};
        std::vector<double> joints;
        for (int j = 0; j < 7; ++j) joints.push_back(0.1 * j - 0.2 + 0.01 * call);
        obs = droid_observation(TensorView(e1.data(), DType::U8, s), TensorView(e2.data(), DType::U8, s),
                                TensorView(w.data(), DType::U8, s), joints, 0.3,
                                "Pick up the red cube and put it in the bowl");
    }
};

}  // namespace

TEST_CASE("the policy walks the reference's 7-call window cycle with paged KV equal to dense KV") {
    TinyWorld world;
    auto be = make_cpu_backend();
    auto paged = world.policy(*be, KvMode::Paged);
    std::vector<std::vector<float>> paged_actions;
    const int expect_start[7] = {1, 3, 5, 7, 1, 3, 5};
    const bool expect_reset[7] = {true, false, false, false, true, false, false};
    for (int call = 0; call < 7; ++call) {
        CallInput in(call == 0 ? 1 : 4, call);
        PolicyCallResult r = paged->step(in.obs);
        CAPTURE(call);
        CHECK(r.start_frame == expect_start[call]);
        CHECK(r.reset == expect_reset[call]);
        CHECK(r.kv_tokens == int64_t(expect_start[call]) * world.cfg.model.dit.frame_seqlen);
        CHECK(r.dit_evaluations == 8);
        REQUIRE(r.actions.size() == 24 * 8);
        for (float v : r.actions) REQUIRE(std::isfinite(v));
        paged_actions.push_back(r.actions);
    }
    CHECK(paged->kv_manager()->pool().num_free() > 0);

    // auto gives no lanes on the CPU (its attention reads through the table either way)
    CHECK_FALSE(paged->kv_manager()->geometry().lanes);

    auto dense = world.policy(*be, KvMode::Dense);
    for (int call = 0; call < 7; ++call) {
        CallInput in(call == 0 ? 1 : 4, call);
        PolicyCallResult r = dense->step(in.obs);
        CAPTURE(call);
        CHECK(r.actions == paged_actions[size_t(call)]);
    }

    // kv.in_place: true lays the branches' blocks in mirrored lanes on the CPU too (branch 1's slots shifted past the
    // middle; the CPU's gather path reads them through the table): the same actions
    auto lanes = world.policy(*be, KvMode::Paged, KvInPlace::On);
    REQUIRE(lanes->kv_manager()->geometry().lanes);
    const KvLimits& l = lanes->kv_manager()->limits();
    CHECK(l.mirrored());
    CHECK(lanes->kv_manager()->pool().num_ids() == l.lane_ids);
    CHECK(lanes->kv_manager()->pool().num_blocks() == 2 * l.lane_blocks);
    for (int call = 0; call < 7; ++call) {
        CallInput in(call == 0 ? 1 : 4, call);
        PolicyCallResult r = lanes->step(in.obs);
        CAPTURE(call);
        CHECK(r.actions == paged_actions[size_t(call)]);
    }
}
