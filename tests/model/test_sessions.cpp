// Several sessions on one engine (PolicyOptions::max_sessions, `dzr serve --max-sessions`): each keeps its own KV
// blocks, cross caches, buffers and samplers, so two sessions whose calls interleave give the actions each gives alone.
// NOTE: on the micro geometry (support/micro_geometry.h): what is compared does not depend on the canvas.
#include <doctest/doctest.h>

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "config/run_config.h"
#include "core/error.h"
#include "model/inventory.h"
#include "policy/engine.h"
#include "policy/normalization.h"
#include "support/micro_geometry.h"
#include "support/test_support.h"
#include "weights/checkpoint.h"
#include "weights/random_checkpoint.h"

using namespace dzr;

namespace {

struct MicroWorld {
    test::TempDir dir;
    config::RunConfig cfg;
    std::unique_ptr<Checkpoint> ckpt;

    MicroWorld() {
        cfg = config::load_run_config(test::source_dir() / "configs/tiny.yaml", test::ci_geometry());
        MakeOptions mo;
        mo.seed = 5;
        mo.dtype = DType::F32;
        mo.tokenizer = test::data_dir() / "tokenizer/spiece.model";
        write_random_checkpoint(cfg.model, mo, dir / "ckpt");
        ckpt = std::make_unique<Checkpoint>(dir / "ckpt");
    }

    std::unique_ptr<Engine> engine(int max_sessions) const {
        PolicyOptions o;
        o.sampling = cfg.sampling;
        o.kv = cfg.kv;
        o.max_sessions = max_sessions;
        return Engine::create(ckpt->model_config(), *ckpt, droid_embodiment(ckpt->statistics("oxe_droid")),
                              test::data_dir() / "tokenizer/spiece.model", o, {Device::cpu()}, BackendOptions{});
    }
};

/// One client's call `call`: frames [T, 180, 320, 3] that differ per client, call and camera, its state and prompt.
struct CallInput {
    std::vector<uint8_t> data[3];
    Observation obs;
    CallInput(int client, int call) {
        const int T = call == 0 ? 1 : 4;
        const Shape s{T, 180, 320, 3};
        TensorView views[3];
        for (int c = 0; c < 3; ++c) {
            data[c].resize(size_t(s.numel()));
            for (size_t i = 0; i < data[c].size(); ++i)
                data[c][i] = uint8_t((i * (31 + 6 * size_t(client)) + size_t(call) * 17 + size_t(c) * 5) % 251);
            views[c] = TensorView(data[c].data(), DType::U8, s);
        }
        double joints[7];
        for (int j = 0; j < 7; ++j) joints[j] = 0.05 * j - 0.1 + 0.02 * call - 0.1 * client;
        obs = droid_observation(views[0], views[1], views[2], joints, 0.4,
                                client == 0 ? "Put the marker in the cup" : "Pick up the red cube");
    }
};

std::vector<float> step(Engine& engine, Session& session, int client, int call) {
    const CallInput in(client, call);
    return session.step(engine.prepare(in.obs)).actions;
}

}  // namespace

TEST_CASE("two sessions whose calls interleave get the actions each gets alone, byte for byte") {
    MicroWorld world;
    // 6 calls: the window cycle (1, 3, 5, 7 frames of history) and its reset at call 4
    constexpr int kCalls = 6;
    std::vector<float> alone[2][kCalls];
    {
        const auto engine = world.engine(1);
        for (int client = 0; client < 2; ++client) {
            const auto session = engine->open_session();
            for (int call = 0; call < kCalls; ++call) alone[client][call] = step(*engine, *session, client, call);
        }
    }
    CHECK(alone[0][1] != alone[1][1]);  // the clients' inputs differ, so a mixed-up session would show

    const auto engine = world.engine(2);
    const KvCacheManager& kv = *engine->kv_manager();
    CHECK(kv.geometry().sessions == 2);
    auto a = engine->open_session();
    auto b = engine->open_session();
    CHECK_THROWS_WITH_AS(engine->open_session(), doctest::Contains("max_sessions 2"), Error);
    for (int call = 0; call < kCalls; ++call) {
        CAPTURE(call);
        CHECK(step(*engine, *a, 0, call) == alone[0][call]);
        CHECK(step(*engine, *b, 1, call) == alone[1][call]);
    }
    // a closed session frees its place (and its blocks) for the next, which starts clean
    b.reset();
    CHECK(kv.pool().num_free() < kv.pool().num_blocks());  // a still holds its window
    const auto c = engine->open_session();
    CHECK(step(*engine, *c, 1, 0) == alone[1][0]);
    a->reset();
    c->reset();
    CHECK(engine->kv_pools_whole());
}
