// CUDA graphs of the DiT forwards (policy/forward_graphs.h) on the tiny config: a session that replays graphs gives
// the bit-identical actions and video of one that runs every forward op by op, over a window cycle with its reset,
// in reference and fast numerics; the denoising graphs, captured at one timestep, replay at every other; the warm-up
// captures every forward shape the rollout's calls then use (they run no forward op by op); without a warm-up the
// first calls capture on first use with the same results; the KV pool comes back whole.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "config/embodiment.h"
#include "config/run_config.h"
#include "model/inventory.h"
#include "policy/engine.h"
#include "policy/forward_graphs.h"
#include "policy/observation.h"
#include "rollout/bench_rollout.h"
#include "rollout/runner.h"
#include "support/test_support.h"
#include "weights/random_weights.h"

DZR_TEST_REQUIRES_GPU()

using namespace dzr;

namespace {

constexpr int kCalls = 9;  // a first call, commits to a full window, a window reset, commits after it

struct RunResult {
    std::vector<std::vector<float>> actions;  // per call: the normalized actions
    std::vector<std::vector<float>> video;    // per call: the video prediction
    std::vector<bool> resets;
    ForwardGraphStats after_warmup, after_calls;
    bool pool_whole = false;
};

const config::RunConfig& tiny() {
    static const config::RunConfig rc = config::load_run_config(test::source_dir() / "configs/tiny.yaml");
    return rc;
}

const RandomWeightSource& weights() {
    static const RandomWeightSource w(expected_weights(tiny().model), 11, 2);
    return w;
}

RunResult run_session(Numerics numerics, bool graphs, bool warmup) {
    PolicyOptions po;
    po.sampling = tiny().sampling;
    po.kv = tiny().kv;
    po.cuda_graphs = graphs;
    BackendOptions bo;
    bo.numerics = numerics;
    // NOTE: fast numerics tune each convolution by timing it (ConvTune::Auto), so two engines may pick different
    // cuDNN engines for one shape and differ in the last bits for that reason alone; this test compares graph replay
    // against op-by-op execution, so both engines take the untuned path
    bo.cuda.conv_tune = ConvTune::Off;
    const auto engine = Engine::create(tiny().model, weights(), rollout::bench_embodiment(), test::data_dir() / "tokenizer/spiece.model",
                                       po, {Device::cuda(0)}, bo);
    RunResult r;
    {
        auto session = engine->open_session();
        if (warmup) {
            int calls = 0;
            rollout::run_warmup(*engine, *session, calls);  // throws when the KV pool is not whole afterwards
        }
        r.after_warmup = session->graph_stats();
        for (int c = 0; c < kCalls; ++c) {
            rollout::BenchFrames f(c == 0 ? 1 : 4, c);
            const PreparedObservation p = engine->prepare(f.obs);
            const PolicyCallResult res = session->step(p);
            r.actions.push_back(res.actions_normalized);
            const Tensor v = session->video_prediction();
            r.video.emplace_back(v.ptr<float>(), v.ptr<float>() + v.numel());
            r.resets.push_back(res.reset);
        }
        r.after_calls = session->graph_stats();
        session->reset();
        const KvCacheManager* m = engine->kv_manager();
        r.pool_whole = m != nullptr && m->pool().num_free() == m->pool().num_blocks();
    }
    return r;
}

/// Bitwise equality of two float vectors (NaN payloads included).
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void check_identical(const RunResult& eager, const RunResult& graphs) {
    REQUIRE(eager.actions.size() == graphs.actions.size());
    for (size_t c = 0; c < eager.actions.size(); ++c) {
        CAPTURE(c);
        CHECK(same_bits(eager.actions[c], graphs.actions[c]));
        CHECK(same_bits(eager.video[c], graphs.video[c]));
        CHECK(eager.resets[c] == graphs.resets[c]);
    }
}

void check_numerics(Numerics numerics) {
    const RunResult eager = run_session(numerics, false, true);
    const RunResult graphs = run_session(numerics, true, true);
    CHECK_FALSE(eager.after_calls.enabled);
    REQUIRE(graphs.after_calls.enabled);
    INFO("first capture failure: " << graphs.after_calls.first_failure);
    CHECK(graphs.after_calls.failed == 0);
    // the calls covered a window reset (a prefill) and commits after it
    int resets = 0;
    for (bool r : eager.resets) resets += r ? 1 : 0;
    REQUIRE(resets >= 2);
    check_identical(eager, graphs);
    // every shape the calls used was captured in the warm-up: the calls ran no forward op by op, and captured
    // nothing new
    CHECK(graphs.after_warmup.captured > 0);
    CHECK(graphs.after_calls.captured == graphs.after_warmup.captured);
    CHECK(graphs.after_calls.eager == graphs.after_warmup.eager);
    CHECK(graphs.after_calls.replays > graphs.after_warmup.replays);
    CHECK(eager.pool_whole);
    CHECK(graphs.pool_whole);
}

}  // namespace

TEST_CASE("graph replay gives the eager run's actions and video bit for bit in reference numerics") {
    check_numerics(Numerics::Reference);
}

TEST_CASE("graph replay gives the eager run's actions and video bit for bit in fast numerics") {
    check_numerics(Numerics::Fast);
}

TEST_CASE("denoising graphs captured at one timestep replay at the others with the eager results") {
    // Without a warm-up each denoising shape is captured at its first step's timestep (999-ish) and replayed at the
    // later steps' timesteps; the eager run evaluates each step at its own timestep.
    const RunResult eager = run_session(Numerics::Reference, false, false);
    const RunResult graphs = run_session(Numerics::Reference, true, false);
    INFO("first capture failure: " << graphs.after_calls.first_failure);
    CHECK(graphs.after_calls.failed == 0);
    CHECK(graphs.after_calls.captured > 0);
    // per call the 2 branches x (num_dit_steps - 1) later steps replay at least
    CHECK(graphs.after_calls.replays >= int64_t(kCalls) * 2 * (tiny().sampling.num_dit_steps - 1));
    check_identical(eager, graphs);
    CHECK(graphs.pool_whole);
}

TEST_CASE("DZR_CUDA_GRAPHS=0 runs every forward op by op") {
    ::setenv("DZR_CUDA_GRAPHS", "0", 1);
    const RunResult r = run_session(Numerics::Reference, true, false);
    ::unsetenv("DZR_CUDA_GRAPHS");
    CHECK_FALSE(r.after_calls.enabled);
    CHECK(r.after_calls.captured == 0);
}
