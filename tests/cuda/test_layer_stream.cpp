// DiT layers streamed from pinned host memory on the GPU (offload_layers, model/layer_stream.h): with CUDA graphs
// captured from the forwards (the copies on the copy stream inside them), a session gives the actions of one with
// every layer resident bit for bit, over a window cycle with its reset, in reference and fast numerics.
// NOTE: the tiny config with 4 DiT layers, so 3 streamed layers take turns in the 2 slots.
#include <doctest/doctest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "config/run_config.h"
#include "model/causal_dit.h"
#include "model/inventory.h"
#include "policy/engine.h"
#include "policy/forward_graphs.h"
#include "rollout/bench_rollout.h"
#include "rollout/runner.h"
#include "support/gpu_engine.h"
#include "support/test_support.h"
#include "weights/random_weights.h"

DZR_TEST_REQUIRES_GPU()

using namespace dzr;

namespace {

const test::RandomModel& four_layers() {
    static const test::RandomModel m({{"model.dit.num_layers", "4"}}, 13);
    return m;
}

struct Run {
    std::vector<std::vector<float>> actions;
    ForwardGraphStats graphs;
    int streamed = 0;
};

Run run_session(Numerics numerics, int offload_layers) {
    const auto engine = test::gpu_engine(four_layers(), numerics,
                                         [&](PolicyOptions& po) { po.offload_layers = offload_layers; });
    Run r;
    r.streamed = engine->dit().layer_stream().count();
    auto session = engine->open_session();
    int calls = 0;
    rollout::run_warmup(*engine, *session, calls);
    for (int c = 0; c < 9; ++c) {  // a first call, commits to a full window, a window reset, commits after it
        rollout::BenchFrames f(c == 0 ? 1 : 4, c);
        r.actions.push_back(session->step(engine->prepare(f.obs)).actions_normalized);
    }
    r.graphs = session->graph_stats();
    return r;
}

void check_numerics(Numerics numerics) {
    const Run resident = run_session(numerics, 0);
    CHECK(resident.streamed == 0);
    for (int offload : {3, 4}) {
        CAPTURE(offload);
        const Run streamed = run_session(numerics, offload);
        CHECK(streamed.streamed == offload);
        INFO("first capture failure: " << streamed.graphs.first_failure);
        REQUIRE(streamed.graphs.enabled);
        CHECK(streamed.graphs.failed == 0);
        CHECK(streamed.graphs.replays > 0);
        REQUIRE(streamed.actions.size() == resident.actions.size());
        for (size_t c = 0; c < resident.actions.size(); ++c) {
            CAPTURE(c);
            const auto& a = resident.actions[c];
            const auto& b = streamed.actions[c];
            CHECK(test::same_bits(a, b));
        }
    }
}

}  // namespace

TEST_CASE("streamed DiT layers give the resident layers' actions bit for bit in both numerics (CUDA graphs)") {
    for (Numerics numerics : {Numerics::Reference, Numerics::Fast}) {
        CAPTURE(numerics_name(numerics));
        check_numerics(numerics);
    }
}
