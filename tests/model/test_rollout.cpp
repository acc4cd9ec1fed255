// `dzr rollout` end to end on the built-in sample with the tiny config (CPU): every output file with
// the right shapes, determinism across runs, --resume, and bad input rejected with no output.
#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "config/run_config.h"
#include "core/error.h"
#include "io/npy.h"
#include "io/plots.h"
#include "io/synth_episode.h"
#include "io/video_reader.h"
#include "model/inventory.h"
#include "rollout/runner.h"
#include "support/json_file.h"
#include "support/micro_geometry.h"
#include "support/test_support.h"
#include "weights/random_checkpoint.h"

using namespace dzr;
namespace fs = std::filesystem;
using test::read_json;

namespace {

/// The built-in sample episode; where this build cannot decode mp4 (no OpenCV) the same episode is
/// regenerated with .npy frames (samples/README.md), as the GPU machine does.
fs::path sample_episode(const test::TempDir& dir) {
    if (io::video_io_available()) return test::source_dir() / "samples/episode_000";
    const fs::path ep = dir / "samples/episode_000";
    if (!fs::exists(ep)) io::write_synth_episode(ep, io::SynthOptions{});
    return ep;
}

/// `geometry`: overrides of the tiny config's model (support/micro_geometry.h), as the checkpoint was made with.
rollout::RolloutOptions tiny_options(const fs::path& episode, const fs::path& ckpt, const fs::path& out,
                                     const std::vector<config::Override>& geometry = {}) {
    rollout::RolloutOptions o;
    o.checkpoint = ckpt;
    o.episodes = {episode};
    o.out_dir = out;
    o.run = config::load_run_config(test::source_dir() / "configs/tiny.yaml", geometry);
    o.run.rollout.max_chunks = 2;  // 3 calls keep the test short; the 7-call cycle is test_policy's
    o.run.numerics = Numerics::Reference;
    o.have_config_model = true;
    o.devices = {Device::cpu()};
    o.quiet = true;
    o.open_video = io::open_video;
    if (io::video_io_available()) o.plot_png = io::render_plot_png;
    return o;
}

}  // namespace

TEST_CASE("rollout of the sample episode writes every output with the right shapes, deterministically") {
    test::TempDir dir;
    const auto cfg = config::load_run_config(test::source_dir() / "configs/tiny.yaml");
    MakeOptions mo;
    mo.dtype = DType::F32;
    mo.tokenizer = test::data_dir() / "tokenizer/spiece.model";
    write_random_checkpoint(cfg.model, mo, dir / "ckpt");

    auto opt = tiny_options(sample_episode(dir), dir / "ckpt", dir / "out1");
    const rollout::RolloutResult r = rollout::run_rollout(opt);
    REQUIRE(r.failed == 0);
    REQUIRE(r.episodes.size() == 1);
    const fs::path ep = dir / "out1/episode_000";
    for (const char* f : {"actions.npy", "actions.csv", "timing.json", "manifest.json", "metrics.json", "mse.csv",
                          "gt_actions.npy", "done.json"})
        CHECK_MESSAGE(fs::exists(ep / f), f);
    for (const char* f : {"action_dim_0.png", "all_action_dims.png"}) CHECK(fs::exists(ep / f) == io::video_io_available());
    CHECK(fs::exists(dir / "out1/summary.json"));
    CHECK(fs::exists(dir / "out1/summary.csv"));
    CHECK(fs::exists(dir / "out1/report.html"));
    CHECK(fs::exists(dir / "out1/report/episode_000.html"));

    const io::NpyArray actions = io::read_npy(ep / "actions.npy");
    REQUIRE(actions.shape() == std::vector<int64_t>{3, 24, 8});
    for (float v : actions.to_f32()) REQUIRE(std::isfinite(v));

    const auto timing = read_json(ep / "timing.json");
    CHECK(timing["calls"].size() == 3);
    CHECK(timing["warmup"]["calls"].get<int>() == 6);
    CHECK(timing["gpu_telemetry"].is_array());
    CHECK(timing["gpu_telemetry"].empty());  // the CPU: no GPU sampled
    const auto manifest = read_json(ep / "manifest.json");
    CHECK(manifest["seed"].get<uint64_t>() == 1140);
    CHECK(manifest.contains("git_hash"));

    // Same inputs and seed: bit-identical actions.
    auto opt2 = tiny_options(sample_episode(dir), dir / "ckpt", dir / "out2");
    opt2.warmup = false;
    rollout::run_rollout(opt2);
    const io::NpyArray again = io::read_npy(dir / "out2/episode_000/actions.npy");
    CHECK(again.to_f32() == actions.to_f32());

    // --resume skips the finished episode and leaves its files alone.
    const auto mtime = fs::last_write_time(dir / "out2/episode_000/actions.npy");
    opt2.resume = true;
    const auto r3 = rollout::run_rollout(opt2);
    REQUIRE(r3.episodes.size() == 1);
    CHECK(r3.episodes[0].status == "skipped");
    CHECK(fs::last_write_time(dir / "out2/episode_000/actions.npy") == mtime);
}

TEST_CASE("a rollout of an episode with a missing camera is refused before the load, naming it, and writes nothing") {
    test::TempDir dir;
    fs::copy(sample_episode(dir), dir / "ep", fs::copy_options::recursive);
    for (const char* ext : {".mp4", ".npy"}) fs::remove(dir / "ep" / (std::string("wrist_image_left") + ext));
    const auto cfg = config::load_run_config(test::source_dir() / "configs/tiny.yaml");
    MakeOptions mo;
    mo.tokenizer = test::data_dir() / "tokenizer/spiece.model";
    write_random_checkpoint(cfg.model, mo, dir / "ckpt");
    auto opt = tiny_options(dir / "ep", dir / "ckpt", dir / "out");
    opt.episodes = {dir / "ep"};
    opt.warmup = false;
    std::string error;
    try {
        rollout::run_rollout(opt);
    } catch (const Error& e) {
        error = e.what();
    }
    CHECK(error.find("before loading the checkpoint's weights; nothing was run") != std::string::npos);
    CHECK(error.find("wrist_image_left") != std::string::npos);
    CHECK_FALSE(fs::exists(dir / "out"));
    // --skip-invalid records it in the summary instead (and there is nothing else to run).
    opt.skip_invalid = true;
    error.clear();
    try {
        rollout::run_rollout(opt);
    } catch (const Error& e) {
        error = e.what();
    }
    CHECK(error.find("none of the 1 episodes is valid") != std::string::npos);
    CHECK_FALSE(fs::exists(dir / "out/ep/done.json"));
}

TEST_CASE("a profiled rollout writes the op profile of its episode calls and the same actions as an unprofiled one") {
    // NOTE: three rollouts, two with a warm-up: on the micro geometry (what is checked does not depend on it; 38 s
    // of the tiny one on the 2-core CI machine); DZR_LONG_TESTS=1 runs the tiny geometry
    const std::vector<config::Override> geometry = test::ci_geometry();
    test::TempDir dir;
    const auto cfg = config::load_run_config(test::source_dir() / "configs/tiny.yaml", geometry);
    MakeOptions mo;
    mo.dtype = DType::F32;
    mo.tokenizer = test::data_dir() / "tokenizer/spiece.model";
    write_random_checkpoint(cfg.model, mo, dir / "ckpt");

    auto plain = tiny_options(sample_episode(dir), dir / "ckpt", dir / "plain", geometry);
    plain.report = false;
    plain.warmup = false;  // the reference actions (a warm-up changes none); the profiled runs keep theirs to drop
    REQUIRE(rollout::run_rollout(plain).failed == 0);
    auto profiled = tiny_options(sample_episode(dir), dir / "ckpt", dir / "profiled", geometry);
    profiled.report = false;
    profiled.profile = dir / "profile.json";
    REQUIRE(rollout::run_rollout(profiled).failed == 0);

    // profiling only observes: the actions are the same bits
    CHECK(io::read_npy(dir / "profiled/episode_000/actions.npy").to_f32() ==
          io::read_npy(dir / "plain/episode_000/actions.npy").to_f32());

    const auto timing = read_json(dir / "profiled/episode_000/timing.json");
    int64_t evaluations = 0;
    for (const auto& c : timing["calls"]) evaluations += c["dit_evaluations"].get<int64_t>();
    REQUIRE(evaluations > 0);
    const auto profile = read_json(dir / "profile.json");
    REQUIRE(profile.contains("cpu"));
    const auto& p = profile["cpu"];
    // the warm-up's calls are dropped: the episode's 3 calls, one conditional denoising forward per evaluation
    CHECK(p["calls_profiled"].get<int64_t>() == 3);
    const auto& totals = p["totals"];
    REQUIRE(totals.contains("denoise.denoise.pos"));
    CHECK(totals["denoise.denoise.pos"]["entries"].get<int64_t>() == evaluations);
    CHECK(totals["denoise.denoise.neg"]["entries"].get<int64_t>() == evaluations);
    CHECK(totals["denoise.denoise.pos"]["per_entry"]["ops"].get<double>() > 10.0);
    bool gemm = false;
    for (const auto& op : totals["denoise.denoise.pos"]["ops_by_time"])
        gemm = gemm || op["op"].get<std::string>().rfind("gemm", 0) == 0;
    CHECK(gemm);

    // --profile-graphs: the regions without op times (on a GPU the forwards then replay their graphs)
    auto graphs = tiny_options(sample_episode(dir), dir / "ckpt", dir / "graphs", geometry);
    graphs.report = false;
    graphs.profile = dir / "profile-graphs.json";
    graphs.profile_graphs = true;
    REQUIRE(rollout::run_rollout(graphs).failed == 0);
    CHECK(io::read_npy(dir / "graphs/episode_000/actions.npy").to_f32() ==
          io::read_npy(dir / "plain/episode_000/actions.npy").to_f32());
    const auto graphs_profile = read_json(dir / "profile-graphs.json");
    const auto& g = graphs_profile["cpu"];
    CHECK(g["ops_timed"] == false);
    CHECK(g["totals"]["denoise.denoise.pos"]["entries"].get<int64_t>() == evaluations);
    CHECK(g["totals"]["denoise.denoise.pos"]["ops"].get<int64_t>() == 0);
}
