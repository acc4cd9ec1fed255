// What an embodiment changes downstream: per-key normalization modes and their inverses, relative keys,
// the grid and single-view canvases, episodes named by the embodiment's keys, and the command line
// (episode synth/inspect, ckpt make/inspect) with its errors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <tuple>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "config/embodiment.h"
#include "core/error.h"
#include "io/episode.h"
#include "io/npy.h"
#include "io/synth_episode.h"
#include "policy/normalization.h"
#include "policy/postprocess.h"
#include "policy/preprocess.h"
#include "rollout/episode_layout.h"
#include "support/test_support.h"

using namespace dzr;
namespace fs = std::filesystem;

namespace {

using test::contains;

/// DROID's synthetic episode of `frames` frames.
io::SynthOptions droid_synth(int64_t frames) {
    io::SynthOptions so;
    so.frames = frames;
    return so;
}

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}

ArraySpec key(const std::string& name, NormMode mode, std::vector<float> a, std::vector<float> b) {
    ArraySpec k;
    k.key = name;
    k.dim = int(a.size());
    k.norm = mode;
    if (mode == NormMode::MeanStd) {
        k.stats.mean = a;
        k.stats.std = b;
    } else {
        k.stats.min = a;
        k.stats.max = b;
    }
    k.stats.q01 = a;
    k.stats.q99 = b;
    return k;
}

/// uint8 frames [T, H, W, 3] of a hashed pattern (distinct per camera and frame).
std::vector<uint8_t> frames(int T, int h, int w, int salt) {
    std::vector<uint8_t> f(size_t(T) * h * w * 3);
    for (size_t i = 0; i < f.size(); ++i) f[i] = uint8_t(((i + size_t(salt) * 7919) * 2654435761u) >> 24);
    return f;
}

struct Cli {
    std::string bin;
    Cli() {
        const char* b = std::getenv("DZR_BIN");
        if (b && fs::exists(b)) bin = b;
    }
    /// Runs dzr with `args`; returns (exit code, stdout, stderr).
    std::tuple<int, std::string, std::string> run(const std::string& args, const test::TempDir& dir) const {
        const fs::path out = dir / "out.txt", err = dir / "err.txt";
        const std::string cmd = bin + " " + args + " > " + out.string() + " 2> " + err.string();
        const int rc = std::system(cmd.c_str());
        auto slurp = [](const fs::path& p) {
            std::ifstream in(p);
            return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        };
        return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, slurp(out), slurp(err)};
    }
};

}  // namespace

TEST_CASE("state keys are normalized by their own modes, as the reference's Normalizer.forward") {
    const ArraySpec ms = key("a", NormMode::MeanStd, {1.f, 2.f}, {2.f, 0.f});
    std::vector<double> out(2);
    normalize_key(std::vector<double>{5.0, 7.0}, ms, out, "state.a");
    CHECK(out == std::vector<double>{2.0, 7.0});  // std 0: passed through, no clamp

    const ArraySpec mm = key("b", NormMode::MinMax, {0.f, 3.f}, {4.f, 3.f});
    normalize_key(std::vector<double>{1.0, 9.0}, mm, out, "state.b");
    CHECK(out == std::vector<double>{-0.5, 0.0});  // min == max: 0
    normalize_key(std::vector<double>{10.0, 9.0}, mm, out, "state.b");
    CHECK(out[0] == 1.0);  // clamped

    const ArraySpec sc = key("c", NormMode::Scale, {-4.f, 0.f}, {2.f, 0.f});
    normalize_key(std::vector<double>{2.0, 5.0}, sc, out, "state.c");
    CHECK(out == std::vector<double>{0.5, 0.0});  // / max(|min|, |max|); 0 where that is 0

    const ArraySpec bi = key("d", NormMode::Binary, {0.f, 0.f}, {1.f, 1.f});
    normalize_key(std::vector<double>{0.5, 0.51}, bi, out, "state.d");
    CHECK(out == std::vector<double>{0.0, 1.0});

    const ArraySpec none = key("e", NormMode::None, {0.f, 0.f}, {1.f, 1.f});
    normalize_key(std::vector<double>{7.0, -7.0}, none, out, "state.e");
    CHECK(out == std::vector<double>{7.0, -7.0});

    CHECK(contains(error_of([&] { normalize_key(std::vector<double>{1.0}, ms, out, "state.a"); }), "state.a"));
}

TEST_CASE("a yam state is normalized key by key and padded; its relative actions add the state back") {
    const ModelConfig model;
    const Embodiment base = builtin_embodiment("yam");
    Embodiment e = parse_experiment_config(experiment_conf_yaml(base, model), "conf").at("yam");
    bind_metadata(e, parse_embodiment_metadata(synthetic_metadata_json(base), "md").at("yam"), "md");
    REQUIRE(e.state_dim() == 14);
    std::vector<double> raw(14);
    for (size_t i = 0; i < raw.size(); ++i) raw[i] = 0.1 * double(i) - 0.4;
    const std::vector<double> s = prepare_state(raw, e, 64);
    REQUIRE(s.size() == 64);
    for (const auto& k : e.state)
        for (int i = 0; i < k.dim; ++i) {
            std::vector<double> one(1);
            KeyStatistics st;
            st.q01 = {k.stats.q01[size_t(i)]};
            st.q99 = {k.stats.q99[size_t(i)]};
            q99_normalize(std::vector<double>{raw[size_t(k.offset + i)]}, st, one, k.key);
            CHECK(s[size_t(k.offset + i)] == one[0]);
        }
    for (size_t i = 14; i < 64; ++i) CHECK(s[i] == 0.0);
    CHECK(contains(error_of([&] { prepare_state(std::vector<double>(8, 0.0), e, 64); }),
                   "embodiment yam has 14 state values"));

    // Actions: [24, 32] normalized -> [24, 14]; every yam key is relative.
    std::vector<float> pred(24 * 32, 0.25f);
    for (int t = 0; t < 24; ++t) pred[size_t(t) * 32 + 31] = 1e6f;  // past the 14 dims: dropped
    const std::vector<float> a = postprocess_actions(pred, 24, 32, raw, e);
    REQUIRE(a.size() == 24 * 14);
    for (const auto& k : e.action)
        for (int i = 0; i < k.dim; ++i) {
            const float rel = q99_unnormalize(0.25f, k.stats.q01[size_t(i)], k.stats.q99[size_t(i)]);
            const ArraySpec* st = e.find_state(k.key);
            CHECK(a[size_t(5 * 14 + k.offset + i)] == float(double(rel) + raw[size_t(st->offset + i)]));
        }
}

TEST_CASE("agibot actions: joints relative, the base velocity absolute, min_max inverted") {
    const ModelConfig model;
    Embodiment e = builtin_embodiment("agibot");
    bind_metadata(e, parse_embodiment_metadata(synthetic_metadata_json(e), "md").at("agibot"), "md");
    ArraySpec& vel = e.action.back();
    REQUIRE(vel.key == "robot_velocity");
    vel.norm = NormMode::MinMax;
    std::vector<double> state(size_t(e.state_dim()), 0.5);
    std::vector<float> pred(24 * 32, -0.5f);
    const std::vector<float> a = postprocess_actions(pred, 24, 32, state, e);
    REQUIRE(a.size() == 24 * 22);
    const float want_vel = (-0.5f + 1.0f) / 2.0f * (vel.stats.max[0] - vel.stats.min[0]) + vel.stats.min[0];
    CHECK(a[20] == want_vel);  // not + 0.5
    const ArraySpec& arm = e.action[0];
    CHECK(a[0] == float(double(q99_unnormalize(-0.5f, arm.stats.q01[0], arm.stats.q99[0])) + 0.5));
}

TEST_CASE("the grid canvas puts views 0, 1, 2 top-left, bottom-left, top-right and leaves the rest black") {
    CanvasSpec spec;
    spec.layout = CanvasLayout::Grid;
    spec.cameras = {"top_head", "hand_left", "hand_right"};
    spec.frame_height = 120;
    spec.frame_width = 160;
    spec.view = ViewSize{48, 80};
    const int T = 4;
    std::vector<std::vector<uint8_t>> data;
    std::vector<TensorView> cams;
    for (int c = 0; c < 3; ++c) data.push_back(frames(T, 120, 160, c + 1));
    for (int c = 0; c < 3; ++c) cams.emplace_back(data[size_t(c)].data(), DType::U8, Shape{T, 120, 160, 3});

    // The operation-by-operation form: crop int(120 * 0.95) x int(160 * 0.95) = 114 x 152 at (3, 4).
    for (int t : {0, 3}) {
        std::vector<RgbImage> views;
        for (int c = 0; c < 3; ++c) {
            const RgbView f{data[size_t(c)].data() + size_t(t) * 120 * 160 * 3, 120, 160};
            const RgbImage v = resize_bilinear_aa_u8(f, 3, 4, 114, 152, 48, 80);
            CHECK(preprocess_view(f, spec, "cam").pixels == v.pixels);
            views.push_back(v);
        }
        const RgbImage want = compose_canvas(CanvasLayout::Grid, views);
        REQUIRE(want.height == 96);
        REQUIRE(want.width == 160);
        CHECK(want.at(10, 10, 0) == views[0].at(10, 10, 0));
        CHECK(want.at(48 + 10, 10, 1) == views[1].at(10, 10, 1));
        CHECK(want.at(10, 80 + 10, 2) == views[2].at(10, 10, 2));
        for (int y = 48; y < 96; ++y)
            for (int x = 80; x < 160; ++x) REQUIRE(want.at(y, x, 0) == 0);

        for (int threads : {1, 3}) {
            const ObservationPreprocessor pre(spec, UnitRangeMode::F32, threads);
            ObservationPreprocessor::Scratch canvas(size_t(96) * 160 * 3, uint8_t(0xAB));  // poisoned
            pre.canvas(cams, t, canvas.data());
            CHECK(std::equal(canvas.begin(), canvas.end(), want.pixels.begin()));
        }
    }
    // The model input of a commit clip is the canvases in [-1, 1].
    const ObservationPreprocessor pre(spec, UnitRangeMode::F32, 2);
    const std::vector<int> clip = {0, 0, 0, 1, 1, 2, 2, 3, 3};
    const size_t plane = size_t(96) * 160;
    std::vector<float> ref(3 * plane), out(3 * clip.size() * plane);
    ObservationPreprocessor::Scratch scratch(5 * plane * 3, uint8_t(0x5A));
    pre.run(cams, 3, clip, ref, out, &scratch);
    std::vector<RgbImage> last;
    for (int c = 0; c < 3; ++c)
        last.push_back(preprocess_view(RgbView{data[size_t(c)].data() + size_t(3) * 120 * 160 * 3, 120, 160}, spec, "c"));
    std::vector<float> want(3 * plane);
    const RgbImage canvas = compose_canvas(CanvasLayout::Grid, last);
    canvases_to_model_input(std::span<const RgbImage>(&canvas, 1), want);
    CHECK(ref == want);
    CHECK(ref[3 * plane - 1] == -1.0f);  // bottom-right corner: black

    // Two views: the top-right quadrant is black as well.
    spec.cameras = {"a", "b"};
    const ObservationPreprocessor two(spec, UnitRangeMode::F32, 1);
    ObservationPreprocessor::Scratch c2(size_t(96) * 160 * 3, uint8_t(0xAB));
    two.canvas(std::span<const TensorView>(cams.data(), 2), 0, c2.data());
    CHECK(c2[(size_t(10) * 160 + 100) * 3] == 0);
    CHECK(contains(error_of([&] { pre.canvas(std::span<const TensorView>(cams.data(), 2), 0, c2.data()); }),
                   "2 cameras given, the embodiment has 3"));
}

TEST_CASE("a single-view canvas is the view itself") {
    CanvasSpec spec;
    spec.layout = CanvasLayout::Single;
    spec.cameras = {"ego"};
    spec.frame_height = 0;  // any size: cropped as it comes
    spec.frame_width = 0;
    spec.view = ViewSize{64, 96};
    const std::vector<uint8_t> f = frames(1, 90, 150, 9);
    const TensorView cam(const_cast<uint8_t*>(f.data()), DType::U8, Shape{1, 90, 150, 3});
    const ObservationPreprocessor pre(spec, UnitRangeMode::F32, 1);
    CHECK(spec.canvas_height() == 64);
    std::vector<uint8_t> canvas(size_t(64) * 96 * 3);
    pre.canvas(std::span<const TensorView>(&cam, 1), 0, canvas.data());
    // int(90 * 0.95) = 85 rows at round(2.5) = 2 (ties to even), int(150 * 0.95) = 142 columns at 4
    const RgbImage want = resize_bilinear_aa_u8(RgbView{f.data(), 90, 150}, 2, 4, 85, 142, 64, 96);
    CHECK(canvas == want.pixels);
}

TEST_CASE("episodes of an embodiment are named by its cameras and state keys, and what is missing is listed") {
    test::TempDir dir;
    const Embodiment agibot = builtin_embodiment("agibot");
    io::SynthOptions so;
    so.layout = rollout::episode_layout(agibot);
    so.frames = 30;
    so.width = 64;
    so.height = 48;
    so.fps = 30;
    const auto files = io::write_synth_episode(dir / "ep", so);
    CHECK(std::count(files.begin(), files.end(), "top_head.npy") == 1);
    CHECK(std::count(files.begin(), files.end(), "waist_position.npy") == 1);
    io::EpisodeOptions eo;
    eo.layout = so.layout;
    const io::Episode ep = io::read_episode(dir / "ep", eo);
    CHECK(ep.cameras.size() == 3);
    CHECK(ep.cameras[1].name == "hand_left");
    CHECK(ep.state_at(4).size() == 20);
    CHECK(ep.action_dim == 22);
    CHECK(ep.actions.size() == 30 * 22);
    CHECK(ep.fps == 30.0);
    CHECK(io::check_episode_layout(dir / "ep", so.layout).empty());
    // The state key of the next frame is the action (velocities are extra dims).
    const auto next = ep.state_at(5);
    for (size_t d = 0; d < 20; ++d) CHECK(ep.actions[size_t(4 * 22) + d] == next[d]);
    const io::SynthEpisode again = io::make_synth_episode(so);
    CHECK(again.state[0] == ep.state_array("left_arm_joint_position").values);

    // A missing state key is an error naming it and the embodiment (DROID would fill zeros).
    fs::remove(dir / "ep" / "head_position.npy");
    std::string msg = error_of([&] { io::read_episode(dir / "ep", eo); });
    CHECK(contains(msg, "missing state file head_position.npy of embodiment agibot"));
    // A state array of the wrong width.
    io::write_npy_f64(dir / "ep" / "head_position.npy", {30, 3}, std::vector<double>(90, 0.0));
    msg = error_of([&] { io::read_episode(dir / "ep", eo); });
    CHECK(contains(msg, "head_position.npy: expected shape [T, 2]"));
    // check_episode_layout lists every problem, from headers only.
    fs::remove(dir / "ep" / "hand_right.npy");
    io::write_npy_f64(dir / "ep" / "actions.npy", {30, 8}, std::vector<double>(240, 0.0));
    const auto problems = io::check_episode_layout(dir / "ep", so.layout);
    REQUIRE(problems.size() == 3);
    CHECK(contains(problems[0], "missing camera file hand_right of embodiment agibot"));
    CHECK(contains(problems[1], "state.head_position of embodiment agibot is 2 wide"));
    CHECK(contains(problems[2], "the action of embodiment agibot is 22 wide"));

    // A DROID episode read as yam: every yam camera and state key is missing.
    io::write_synth_episode(dir / "droid", droid_synth(30));
    const auto yam = io::check_episode_layout(dir / "droid", rollout::episode_layout(builtin_embodiment("yam")));
    CHECK(yam.size() == 3 + 4 + 1);  // 3 cameras, 4 state files, actions.npy of 8 instead of 14
}

TEST_CASE("the command line makes and checks episodes and checkpoints of an embodiment") {
    const Cli cli;
    if (cli.bin.empty()) {
        MESSAGE("DZR_BIN not built; skipping the command-line checks");
        return;
    }
    test::TempDir dir;
    const std::string tiny = (test::source_dir() / "configs/tiny.yaml").string();
    auto [rc, out, err] = cli.run("episode synth --embodiment yam --frames 30 --width 64 --height 48 --frames-format npy "
                                  "--out " + (dir / "yam").string(), dir);
    REQUIRE(rc == 0);
    CHECK(contains(out, "wrote synthetic yam episode"));
    CHECK(fs::exists(dir / "yam" / "right_camera-images-rgb.npy"));
    CHECK(fs::exists(dir / "yam" / "left_gripper_pos.npy"));

    std::tie(rc, out, err) = cli.run("episode inspect --embodiment yam " + (dir / "yam").string(), dir);
    CHECK(rc == 0);
    CHECK(contains(out, "embodiment yam"));
    // The same episode checked as agibot: everything it lacks, one line each.
    std::tie(rc, out, err) = cli.run("episode inspect --embodiment agibot " + (dir / "yam").string(), dir);
    CHECK(rc == 1);
    CHECK(contains(err, "missing camera file top_head of embodiment agibot"));
    CHECK(contains(err, "missing state file waist_position.npy of embodiment agibot"));
    CHECK(std::count(err.begin(), err.end(), '\n') == 3 + 6 + 1);
    std::tie(rc, out, err) = cli.run("episode inspect --embodiment franka " + (dir / "yam").string(), dir);
    CHECK(rc == 1);
    CHECK(contains(err, "unknown embodiment 'franka'"));

    // A random checkpoint of an embodiment, and what inspect and validate say of it.
    const std::string ck = (dir / "ck").string();
    std::tie(rc, out, err) = cli.run("ckpt make --config " + tiny + " --embodiment agibot --out " + ck, dir);
    REQUIRE(rc == 0);
    CHECK(fs::exists(dir / "ck/experiment_cfg/conf.yaml"));
    std::tie(rc, out, err) = cli.run("ckpt inspect " + ck, dir);
    CHECK(rc == 0);
    CHECK(contains(out, "agibot (projector index 26; "));
    CHECK(contains(out, "action (22 dims of 32, horizon 24)"));
    CHECK(contains(out, "fits this checkpoint's geometry"));
    std::tie(rc, out, err) = cli.run("ckpt validate " + ck, dir);
    CHECK(rc == 0);
    std::tie(rc, out, err) = cli.run("ckpt validate " + ck + " --embodiment oxe_droid", dir);
    CHECK(rc == 1);
    CHECK(contains(err, "unknown embodiment 'oxe_droid'"));
    std::tie(rc, out, err) = cli.run("ckpt make --config " + tiny + " --embodiment franka --out " +
                                         (dir / "bad").string(), dir);
    CHECK(rc == 1);
    CHECK(contains(err, "unknown embodiment 'franka'"));
    CHECK_FALSE(fs::exists(dir / "bad"));
    // Episodes checked against the checkpoint's own embodiment.
    std::tie(rc, out, err) = cli.run("episode inspect --ckpt " + ck + " " + (dir / "yam").string(), dir);
    CHECK(rc == 1);
    CHECK(contains(err, "of embodiment agibot"));
}
