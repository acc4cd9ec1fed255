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
#include "support/random_world.h"
#include "support/test_support.h"
#include "weights/checkpoint.h"
#include "weights/random_checkpoint.h"

using namespace dzr;

namespace {

/// The micro geometry's random checkpoint and an engine of `max_sessions` sessions over it.
struct MicroWorld : test::RandomWorld {
    MicroWorld() : RandomWorld(test::ci_geometry(), 5) {}
    std::unique_ptr<Engine> engine(int max_sessions) const {
        PolicyOptions o = options();
        o.max_sessions = max_sessions;
        return RandomWorld::engine(o);
    }
};

/// One client's call `call`: frames [T, 180, 320, 3] that differ per client, call and camera, its state and prompt.
test::DroidCall call_input(int client, int call) {
    return test::DroidCall(
        call == 0 ? 1 : 4,
        [&](size_t i, int c) { return uint8_t((i * (31 + 6 * size_t(client)) + size_t(call) * 17 + size_t(c) * 5) % 251); },
        [&](int j) { return 0.05 * j - 0.1 + 0.02 * call - 0.1 * client; }, 0.4,
        client == 0 ? "Put the marker in the cup" : "Pick up the red cube");
}

std::vector<float> step(Engine& engine, Session& session, int client, int call) {
    const test::DroidCall in = call_input(client, call);
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
