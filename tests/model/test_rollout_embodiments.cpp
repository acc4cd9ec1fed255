// `dzr rollout` of the AgiBot and YAM samples on tiny random checkpoints of those embodiments (CPU): the
// embodiment comes from the checkpoint's experiment_cfg, the outputs have its action width and key names;
// and bad input (a missing state key, a wrong width, statistics without a key, an unknown embodiment) is
// refused with one message naming the key and the embodiment, before any weights are loaded.
#include <doctest/doctest.h>

#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "config/embodiment.h"
#include "config/run_config.h"
#include "core/error.h"
#include "io/npy.h"
#include "io/plots.h"
#include "io/synth_episode.h"
#include "io/video_reader.h"
#include "model/inventory.h"
#include "rollout/episode_layout.h"
#include "rollout/runner.h"
#include "support/json_file.h"
#include "support/test_support.h"
#include "weights/random_checkpoint.h"

using namespace dzr;
namespace fs = std::filesystem;
using test::read_json;

namespace {

using test::contains;

/// The sample episode of `tag` (samples/<tag>/episode_000); where this build cannot decode mp4 the same
/// episode is regenerated with .npy frames (scripts/make_samples.sh's settings).
fs::path sample_episode(const test::TempDir& dir, const std::string& tag) {
    if (io::video_io_available()) return test::source_dir() / "samples" / tag / "episode_000";
    const fs::path ep = dir / "samples" / tag / "episode_000";
    if (!fs::exists(ep)) {
        io::SynthOptions so;
        so.layout = rollout::episode_layout(builtin_embodiment(tag));
        so.frames = 48;
        so.seed = tag == "agibot" ? 0 : 1;
        so.width = 640;
        so.height = 480;
        so.fps = 30;
        io::write_synth_episode(ep, so);
    }
    return ep;
}

config::RunConfig tiny() { return config::load_run_config(test::source_dir() / "configs/tiny.yaml"); }

/// A tiny random checkpoint of `tag`, as `dzr ckpt make --config configs/tiny.yaml --embodiment TAG` writes it;
/// `edit` may change its metadata.json first.
fs::path make_checkpoint(const test::TempDir& dir, const std::string& tag,
                         const std::function<void(nlohmann::json&)>& edit = {}) {
    const fs::path out = dir / ("ckpt_" + tag + (edit ? "_edited" : ""));
    const Embodiment e = builtin_embodiment(tag);
    MakeOptions mo;
    mo.dtype = DType::F32;
    mo.tokenizer = test::data_dir() / "tokenizer/spiece.model";
    mo.conf_yaml = experiment_conf_yaml(e, tiny().model);
    nlohmann::json md = nlohmann::json::parse(synthetic_metadata_json(e));
    if (edit) edit(md);
    mo.metadata_json = md.dump(2);
    write_random_checkpoint(tiny().model, mo, out);
    return out;
}

rollout::RolloutOptions options(const fs::path& episode, const fs::path& ckpt, const fs::path& out) {
    rollout::RolloutOptions o;
    o.checkpoint = ckpt;
    o.episodes = {episode};
    o.out_dir = out;
    o.run = tiny();
    o.run.rollout.max_chunks = 2;  // 3 calls
    o.run.numerics = Numerics::Reference;
    o.have_config_model = true;
    o.devices = {Device::cpu()};
    o.quiet = true;
    o.open_video = io::open_video;
    if (io::video_io_available()) o.plot_png = io::render_plot_png;
    return o;
}

std::string first_line(const fs::path& p) {
    std::ifstream in(p);
    std::string line;
    std::getline(in, line);
    return line;
}

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}

/// DROID's synthetic episode of `frames` frames.
io::SynthOptions droid_synth(int64_t frames) {
    io::SynthOptions so;
    so.frames = frames;
    return so;
}

}  // namespace

TEST_CASE("rollouts of the agibot and yam samples run on tiny checkpoints of those embodiments") {
    test::TempDir dir;
    struct Case {
        std::string tag;
        int dims;
        std::string first_column;
        std::string some_key;
        bool warmup;
    };
    for (const Case& c : {Case{"agibot", 22, "left_arm_joint_position_0", "robot_velocity", true},
                          Case{"yam", 14, "left_joint_pos_0", "right_gripper_pos", false}}) {
        CAPTURE(c.tag);
        const fs::path ckpt = make_checkpoint(dir, c.tag);
        auto opt = options(sample_episode(dir, c.tag), ckpt, dir / ("out_" + c.tag));
        opt.warmup = c.warmup;
        const rollout::RolloutResult r = rollout::run_rollout(opt);
        REQUIRE(r.failed == 0);
        const fs::path ep = dir / ("out_" + c.tag) / "episode_000";
        const io::NpyArray actions = io::read_npy(ep / "actions.npy");
        REQUIRE(actions.shape() == std::vector<int64_t>{3, 24, c.dims});
        for (float v : actions.to_f32()) REQUIRE(std::isfinite(v));
        CHECK(first_line(ep / "actions.csv").rfind("call,step,frame," + c.first_column + ",", 0) == 0);
        const auto metrics = read_json(ep / "metrics.json");
        CHECK(metrics["per_key_mse"].contains(c.some_key));
        CHECK(metrics["per_dim_mse"].size() == size_t(c.dims));
        CHECK(fs::exists(ep / ("action_dim_" + std::to_string(c.dims - 1) + ".png")) == io::video_io_available());
        const auto manifest = read_json(ep / "manifest.json");
        CHECK(manifest["config"]["embodiment"] == c.tag);
        CHECK(contains(manifest["embodiment_source"].get<std::string>(), "conf.yaml"));
        if (c.warmup) CHECK(read_json(ep / "timing.json")["warmup"]["calls"].get<int>() == 6);
    }
}

TEST_CASE("bad embodiment input is refused with a message naming the key and the embodiment") {
    test::TempDir dir;
    const fs::path ckpt = make_checkpoint(dir, "agibot");
    const fs::path sample = sample_episode(dir, "agibot");

    // A missing state key and a state array of the wrong width: the episode fails before any compute.
    fs::create_directories(dir / "eps");
    fs::copy(sample, dir / "eps/missing", fs::copy_options::recursive);
    fs::remove(dir / "eps/missing/head_position.npy");
    fs::copy(sample, dir / "eps/wide", fs::copy_options::recursive);
    io::write_npy_f64(dir / "eps/wide/left_arm_joint_position.npy", {48, 6}, std::vector<double>(48 * 6, 0.0));
    auto opt = options(dir / "eps", ckpt, dir / "out");
    // Every problem of every episode at once, before the weights are loaded; nothing written.
    const std::string all = error_of([&] { rollout::run_rollout(opt); });
    CHECK(contains(all, "missing state file head_position.npy of embodiment agibot"));
    CHECK(contains(all, "state.left_arm_joint_position of embodiment agibot is 7 wide"));
    CHECK_FALSE(fs::exists(dir / "out/missing"));
    CHECK_FALSE(fs::exists(dir / "out/summary.json"));
    // --skip-invalid: both set aside, named in the summary.
    opt.skip_invalid = true;
    opt.out_dir = dir / "out_skip";
    CHECK(contains(error_of([&] { rollout::run_rollout(opt); }), "none of the 2 episodes is valid"));
    CHECK_FALSE(fs::exists(dir / "out_skip/missing/actions.npy"));

    // A DROID episode given to an agibot checkpoint: every camera and key it lacks.
    io::write_synth_episode(dir / "droid/ep", droid_synth(48));
    auto droid = options(dir / "droid/ep", ckpt, dir / "out_droid");
    CHECK(contains(error_of([&] { rollout::run_rollout(droid); }), "missing camera file top_head of embodiment agibot"));

    // An embodiment the checkpoint does not carry.
    auto other = options(sample, ckpt, dir / "out_other");
    other.run.embodiment = "yam";
    CHECK(contains(error_of([&] { rollout::run_rollout(other); }), "unknown embodiment 'yam'"));
    CHECK_FALSE(fs::exists(dir / "out_other"));

    // Statistics that lack a key the embodiment normalizes.
    const fs::path no_stats = make_checkpoint(dir, "agibot", [](nlohmann::json& md) {
        md["agibot"]["statistics"]["action"].erase("robot_velocity");
    });
    const std::string msg = error_of([&] { rollout::run_rollout(options(sample, no_stats, dir / "out_stats")); });
    CHECK(contains(msg, "embodiment agibot has no statistics for action.robot_velocity"));
    CHECK_FALSE(fs::exists(dir / "out_stats"));
}
