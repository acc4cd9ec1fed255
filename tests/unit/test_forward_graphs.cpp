// The host logic of the DiT's CUDA graphs (policy/forward_graphs.h) on a fake capturing stream: first use of a key
// runs eagerly then captures, later uses replay, a failed capture falls back to eager for that key only, keys differ
// in every field; the cuda_graphs run setting, --no-cuda-graphs' config twin and DZR_CUDA_GRAPHS.
#include <doctest/doctest.h>

#include <memory>
#include <stdexcept>
#include <string>

#include "backend/backend.h"
#include "config/run_config.h"
#include "config/run_fields.h"
#include "policy/branch_runner.h"
#include "policy/forward_graphs.h"
#include "support/test_support.h"

using namespace dzr;
using dzr::test::contains;
using dzr::test::error_of;

namespace {

/// A stream that records what it is asked to do: forwards "run" by bumping `executed` unless capturing, captures
/// end in a graph whose launch bumps `launched`.
class FakeStream final : public Stream {
public:
    int executed = 0, launched = 0, begins = 0, ends = 0, aborts = 0;
    bool in_capture = false;
    bool fail_end = false;

    struct FakeGraph final : Graph {
        FakeStream* s;
        explicit FakeGraph(FakeStream* stream) : s(stream) {}
        void launch() override { ++s->launched; }
    };

    /// What a forward does on this stream.
    void work() {
        if (!in_capture) ++executed;
    }

    void upload(const TensorView&, const TensorView&) override {}
    void download(const TensorView&, const TensorView&) override {}
    void synchronize() override {}
    std::unique_ptr<Event> make_event() override { return nullptr; }
    void record(Event&) override {}
    void wait(const Event&) override {}
    double elapsed_ms(const Event&, const Event&) override { return 0; }
    void begin_capture() override {
        REQUIRE_FALSE(in_capture);
        in_capture = true;
        ++begins;
    }
    std::unique_ptr<Graph> end_capture() override {
        REQUIRE(in_capture);
        in_capture = false;
        ++ends;
        if (fail_end) throw Error("capture invalidated");
        return std::make_unique<FakeGraph>(this);
    }
    void abort_capture() override {
        if (in_capture) ++aborts;
        in_capture = false;
    }
    bool capturing() const override { return in_capture; }
};

ForwardGraphKey denoise_key(int start_frame) {
    ForwardGraphKey k;
    k.kind = int(ForwardKind::Denoise);
    k.branch = kCondBranch;
    k.frames = 2;
    k.start_frame = start_frame;
    k.history_tokens = int64_t(start_frame) * 880;
    k.register_tokens = 25;
    k.addresses = {0x1000, 0x2000, 256};
    return k;
}

}  // namespace

TEST_CASE("a forward graph key's first use runs eagerly and captures; later uses replay") {
    FakeStream s;
    ForwardGraphs graphs(s, "pos");
    const ForwardGraphKey key = denoise_key(3);
    const auto forward = [&] { s.work(); };
    graphs.run(key, forward);
    CHECK(s.executed == 1);  // the eager run gave this call its result
    CHECK(s.begins == 1);
    CHECK(s.ends == 1);
    CHECK(s.launched == 0);  // the capture itself ran nothing
    CHECK(graphs.has_graph(key));
    for (int i = 0; i < 7; ++i) graphs.run(key, forward);
    CHECK(s.executed == 1);
    CHECK(s.launched == 7);
    CHECK(s.begins == 1);
    const ForwardGraphStats st = graphs.stats();
    CHECK(st.enabled);
    CHECK(st.captured == 1);
    CHECK(st.failed == 0);
    CHECK(st.replays == 7);
    CHECK(st.eager == 1);
    CHECK(st.capture_ms >= 0);
}

TEST_CASE("a failed capture falls back to eager execution for that key only, without failing the call") {
    FakeStream s;
    ForwardGraphs graphs(s, "neg");
    int attempts = 0;
    const ForwardGraphKey bad = denoise_key(1), good = denoise_key(5);
    // the forward throws while capturing (an upload inside the capture, say); eagerly it works
    const auto throwing = [&] {
        ++attempts;
        if (s.capturing()) throw Error("upload inside a graph capture");
        s.work();
    };
    CHECK_NOTHROW(graphs.run(bad, throwing));
    CHECK(s.executed == 1);
    CHECK(s.aborts == 1);
    CHECK_FALSE(s.capturing());
    CHECK_FALSE(graphs.has_graph(bad));
    graphs.run(bad, throwing);  // no second capture attempt: eager
    CHECK(attempts == 3);
    CHECK(s.executed == 2);
    CHECK(s.begins == 1);
    // an invalidated capture (end_capture throws) is dropped the same way
    s.fail_end = true;
    graphs.run(good, [&] { s.work(); });
    CHECK(s.executed == 3);
    CHECK_FALSE(graphs.has_graph(good));
    CHECK_FALSE(s.capturing());
    const ForwardGraphStats st = graphs.stats();
    CHECK(st.captured == 0);
    CHECK(st.failed == 2);
    CHECK(st.eager == 3);
    CHECK(contains(st.first_failure, "upload inside a graph capture"));
    CHECK(contains(st.first_failure, "denoise.pos 2 frames at 1"));
}

TEST_CASE("an exception of the eager run propagates and captures nothing") {
    FakeStream s;
    ForwardGraphs graphs(s, "pos");
    const ForwardGraphKey key = denoise_key(3);
    CHECK(contains(error_of([&] { graphs.run(key, [] { throw Error("bad timestep"); }); }), "bad timestep"));
    CHECK(s.begins == 0);
    CHECK_FALSE(graphs.has_graph(key));
    graphs.run(key, [&] { s.work(); });  // the key is still new: eager, then captured
    CHECK(s.executed == 1);
    CHECK(graphs.has_graph(key));
}

TEST_CASE("forward graph keys differ in every field that a captured forward bakes in") {
    const ForwardGraphKey base = denoise_key(3);
    std::vector<ForwardGraphKey> variants(10, base);
    variants[0].kind = int(ForwardKind::Commit);
    variants[1].branch = kUncondBranch;
    variants[2].frames = 1;
    variants[3].start_frame = 5;
    variants[4].history_tokens += 16;
    variants[5].register_tokens = 0;
    variants[6].committing = true;
    variants[7].numerics = int(Numerics::Fast);
    variants[8].settings = {1};
    variants[9].addresses.back() += 256;  // the arena's next offset
    FakeStream s;
    ForwardGraphs graphs(s, "pos");
    graphs.run(base, [&] { s.work(); });
    for (const ForwardGraphKey& v : variants) {
        CHECK(v != base);
        CHECK_FALSE(graphs.has_graph(v));
    }
    for (const ForwardGraphKey& v : variants) graphs.run(v, [&] { s.work(); });
    CHECK(graphs.stats().captured == 11);
    graphs.clear();
    CHECK_FALSE(graphs.has_graph(base));
}

TEST_CASE("graph stats of two runners add up") {
    ForwardGraphStats a, b;
    a.enabled = true;
    a.captured = 3;
    a.replays = 10;
    a.capture_ms = 1.5;
    b.captured = 2;
    b.failed = 1;
    b.eager = 4;
    b.capture_ms = 2.0;
    b.first_failure = "x";
    a += b;
    CHECK(a.enabled);
    CHECK(a.captured == 5);
    CHECK(a.failed == 1);
    CHECK(a.replays == 10);
    CHECK(a.eager == 4);
    CHECK(a.capture_ms == doctest::Approx(3.5));
    CHECK(a.first_failure == "x");
}

TEST_CASE("the CPU backend never uses graphs") {
    auto be = make_cpu_backend();
    CHECK_FALSE(graphs_supported(*be));
}

TEST_CASE("DZR_CUDA_GRAPHS only turns graphs off, and a bad value is an error naming the variable") {
    CHECK(graphs_env_override(true, nullptr));
    CHECK_FALSE(graphs_env_override(false, nullptr));
    for (const char* off : {"0", "false", "off"}) CHECK_FALSE(graphs_env_override(true, off));
    for (const char* on : {"1", "true", "on"}) {
        CHECK(graphs_env_override(true, on));
        CHECK_FALSE(graphs_env_override(false, on));
    }
    const std::string msg = error_of([] { graphs_env_override(true, "yes please"); });
    CHECK(contains(msg, "DZR_CUDA_GRAPHS=yes please"));
    CHECK(contains(msg, "expected 0, 1"));
}

TEST_CASE("the cuda_graphs run setting defaults to on, reads true or false, and rejects anything else") {
    const auto tiny = test::source_dir() / "configs/tiny.yaml";
    CHECK(config::load_run_config(tiny).cuda_graphs);
    CHECK_FALSE(config::load_run_config(tiny, {config::parse_override("cuda_graphs=false")}).cuda_graphs);
    CHECK(config::load_run_config(tiny, {config::parse_override("cuda_graphs=true")}).cuda_graphs);
    const std::string msg =
        error_of([&] { config::load_run_config(tiny, {config::parse_override("cuda_graphs=sometimes")}); });
    CHECK(contains(msg, "cuda_graphs"));
    CHECK(contains(msg, "true or false"));
    // serialized with the other run settings
    const auto j = config::run_config_json(config::load_run_config(tiny, {config::parse_override("cuda_graphs=false")}));
    CHECK(j["cuda_graphs"] == false);
}
