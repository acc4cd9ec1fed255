// Several sessions on one GPU engine (PolicyOptions::max_sessions, `dzr serve --max-sessions`): two sessions whose
// calls interleave, each with its own CUDA graphs, give the actions each gives alone bit for bit; sessions opened and
// closed one after another leave the device memory where the first left it.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "config/run_config.h"
#include "model/inventory.h"
#include "policy/engine.h"
#include "rollout/bench_rollout.h"
#include "rollout/runner.h"
#include "support/gpu_engine.h"
#include "support/test_support.h"
#include "weights/random_weights.h"

DZR_TEST_REQUIRES_GPU()

using namespace dzr;

namespace {

constexpr int kCalls = 9;  // a first call, commits to a full window, a window reset, commits after it

const test::RandomModel& tiny() {
    static const test::RandomModel m({}, 17);
    return m;
}

std::unique_ptr<Engine> make_engine(Numerics numerics, int max_sessions) {
    return test::gpu_engine(tiny(), numerics, [&](PolicyOptions& po) {
        po.max_sessions = max_sessions;
        // NOTE: an engine of several sessions has no in-place KV lanes; in fast numerics the lanes' attention reads
        // its rows in place, another kernel path than the gathered one, so the one-session engines go without too
        po.kv.in_place = KvInPlace::Off;
    });
}

/// Session `client`'s call `call`: the bench's frames, another sequence per client.
std::vector<float> step(Engine& engine, Session& session, int client, int call) {
    rollout::BenchFrames f(call == 0 ? 1 : 4, call + 100 * client);
    return session.step(engine.prepare(f.obs)).actions_normalized;
}

void check_interleaved(Numerics numerics) {
    std::vector<std::vector<float>> alone[2];
    for (int client = 0; client < 2; ++client) {
        const auto engine = make_engine(numerics, 1);
        auto session = engine->open_session();
        int calls = 0;
        rollout::run_warmup(*engine, *session, calls);
        for (int c = 0; c < kCalls; ++c) alone[client].push_back(step(*engine, *session, client, c));
    }
    const auto engine = make_engine(numerics, 2);
    auto a = engine->open_session();
    auto b = engine->open_session();
    int calls = 0;
    rollout::run_warmup(*engine, *a, calls);
    rollout::run_warmup(*engine, *b, calls);
    CHECK_THROWS(engine->open_session());
    for (int c = 0; c < kCalls; ++c) {
        CAPTURE(c);
        CHECK(test::same_bits(step(*engine, *a, 0, c), alone[0][size_t(c)]));
        CHECK(test::same_bits(step(*engine, *b, 1, c), alone[1][size_t(c)]));
    }
    CHECK(a->graph_stats().enabled);
    CHECK(a->graph_stats().failed == 0);
    CHECK(b->graph_stats().failed == 0);
}

}  // namespace

TEST_CASE("two interleaved sessions on one GPU engine give each one's actions alone, in both numerics") {
    for (Numerics numerics : {Numerics::Reference, Numerics::Fast}) {
        CAPTURE(numerics_name(numerics));
        check_interleaved(numerics);
    }
}

TEST_CASE("sessions opened and closed one after another leave the device memory flat") {
    const auto engine = make_engine(Numerics::Fast, 1);
    std::vector<int64_t> in_use;
    for (int round = 0; round < 24; ++round) {
        auto session = engine->open_session();
        for (int c = 0; c < 3; ++c) step(*engine, *session, round % 2, c);
        session.reset();  // the session closes: its buffers, graphs and KV blocks go back
        engine->backend().synchronize();
        const auto used = engine->device_memory_in_use();
        REQUIRE(used.has_value());
        in_use.push_back(*used);
    }
    // NOTE: the libraries' pools may step up once while the first sessions settle; a leak grows with every session, so
    // the second half of the rounds must stay within the first half's highest. The reading is the device's (every
    // process's allocations): ctest runs this test alone (RUN_SERIAL)
    const int64_t first_half = *std::max_element(in_use.begin(), in_use.begin() + 12);
    for (size_t r = 12; r < in_use.size(); ++r) {
        CAPTURE(r);
        CHECK(in_use[r] <= first_half);
    }
    MESSAGE("device memory in use after each session: first " << in_use[0] << ", last " << in_use.back());
}
