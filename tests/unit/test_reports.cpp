#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/version.h"
#include "io/atomic_file.h"
#include "io/npy.h"
#include "io/plots.h"
#include "io/result_writer.h"
#include "io/video_reader.h"
#include "rollout/progress.h"
#include "rollout/reports.h"
#include "support/test_support.h"

using namespace dzr;
using namespace dzr::rollout;
using json = nlohmann::ordered_json;
namespace fs = std::filesystem;

namespace {

std::string slurp(const fs::path& p) { return io::read_file(p); }

bool has_temp_files(const fs::path& dir) {
    for (const auto& e : fs::directory_iterator(dir))
        if (e.path().filename().string().find(io::kTempMarker) != std::string::npos) return true;
    return false;
}

/// Ground truth [5, 8] with distinct values, and predictions for calls anchored at 0 and 2 (horizon
/// 3) that equal it except: call 0 is off by +1 in dim 0 at every step; call 1 is off by -2 in dim 7
/// at step 0.
struct Fixture {
    std::vector<double> gt;
    io::ActionChunks pred;
    Fixture() {
        for (int r = 0; r < 5; ++r)
            for (int d = 0; d < 8; ++d) gt.push_back(r * 10 + d * 0.5);
        pred.horizon = 3;
        pred.dims = 8;
        for (int64_t anchor : {0, 2}) {
            std::vector<float> chunk;
            for (int s = 0; s < 3; ++s)
                for (int d = 0; d < 8; ++d) {
                    double v = gt[size_t((anchor + s) * 8 + d)];
                    if (anchor == 0 && d == 0) v += 1;
                    if (anchor == 2 && d == 7 && s == 0) v -= 2;
                    chunk.push_back(float(v));
                }
            pred.append(anchor, chunk);
        }
    }
};

std::string read_stream(std::FILE* f) {
    std::fflush(f);
    std::rewind(f);
    std::string s;
    char buf[256];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) s.append(buf, n);
    return s;
}

}  // namespace

TEST_CASE("timing statistics use linearly interpolated percentiles") {
    const std::vector<double> v = {7, 1, 3, 2, 10, 4, 6, 5, 9, 8};
    const TimingStats s = compute_stats(v);
    CHECK(s.count == 10);
    CHECK(s.mean == doctest::Approx(5.5));
    CHECK(s.median == doctest::Approx(5.5));
    CHECK(s.p90 == doctest::Approx(9.1));  // h = 0.9 * 9 = 8.1 -> 9 + 0.1 * (10 - 9)
    CHECK(s.min == 1);
    CHECK(s.max == 10);
    const std::vector<double> two = {10, 20};
    CHECK(percentile(two, 0.9) == doctest::Approx(19));
    const std::vector<double> one = {3};
    CHECK(compute_stats(one).p90 == 3);
    CHECK(compute_stats({}).count == 0);
}

TEST_CASE("timing report lists every call and summarizes only the timed ones") {
    TimingReport r;
    r.device = "cpu";
    r.checkpoint_load_ms = 1500;
    r.warmup_calls = 1;
    r.warmup_ms = 900;
    for (int i = 0; i < 4; ++i) {
        CallTiming c;
        c.call = i;
        c.anchor = i == 0 ? 0 : 23 + 24 * (i - 1);
        c.frames = {c.anchor};
        c.timed = i != 3;
        c.total_ms = 100.0 * (i + 1);
        c.phase(Phase::Dit) = 80.0 * (i + 1);
        c.phase(Phase::Postprocess) = 1;
        c.host_prepare_ms = 2.0 * (i + 1);  // overlapped host work: reported, not in total_ms
        r.calls.push_back(c);
    }
    const json j = r.to_json();
    CHECK(j["checkpoint_load_ms"] == 1500.0);
    CHECK(j["warmup"]["calls"] == 1);
    CHECK(j["peak_gpu_memory_bytes"].is_null());
    CHECK(j["phases"].size() == 8);
    CHECK(j["phases"][5] == "dit");
    REQUIRE(j["calls"].size() == 4);
    CHECK(j["calls"][3]["timed"] == false);
    CHECK(j["calls"][2]["phases_ms"]["dit"] == 240.0);
    CHECK(j["calls"][1]["anchor"] == 23);
    CHECK(j["summary"]["timed_calls"] == 3);
    CHECK(j["summary"]["total_ms"]["max"] == 300.0);
    CHECK(j["summary"]["total_ms"]["median"] == 200.0);
    CHECK(j["summary"]["phases_ms"]["dit"]["mean"] == doctest::Approx(160.0));
    CHECK(j["calls"][2]["host_prepare_ms"] == 6.0);
    CHECK(j["summary"]["host_prepare_ms"]["max"] == 6.0);  // call 3 (8 ms) is not timed
    CHECK(j["summary"]["host_prepare_ms"]["median"] == 4.0);
    r.peak_gpu_memory_bytes = int64_t(1) << 35;
    CHECK(r.to_json()["peak_gpu_memory_bytes"] == (int64_t(1) << 35));
    CHECK(j["gpu_telemetry"].is_array());
    CHECK(j["gpu_telemetry"].empty());
    r.gpu_telemetry.push_back({{"device", "00000000:3B:00.0"}, {"energy_j_per_call", 780.5}});
    CHECK(r.to_json()["gpu_telemetry"][0]["energy_j_per_call"] == 780.5);
}

TEST_CASE("metrics match hand-computed MSE overall, per key, per dimension, step and call") {
    Fixture f;
    const Metrics m = compute_metrics(f.pred, f.gt, 5);
    CHECK(m.compared_steps == 6);
    CHECK(m.skipped_steps == 0);
    // squared errors: dim 0 -> 1 at the 3 steps of call 0; dim 7 -> 4 at step 0 of call 1.
    CHECK(m.overall_mse == doctest::Approx(7.0 / 48));
    REQUIRE(m.per_dim.size() == 8);
    CHECK(m.per_dim[0] == doctest::Approx(3.0 / 6));
    CHECK(m.per_dim[3] == 0.0);
    CHECK(m.per_dim[7] == doctest::Approx(4.0 / 6));
    REQUIRE(m.per_key.size() == 2);
    CHECK(m.per_key[0].first == "joint_position");
    CHECK(m.per_key[0].second == doctest::Approx(3.0 / 42));
    CHECK(m.per_key[1].first == "gripper_position");
    CHECK(m.per_key[1].second == doctest::Approx(4.0 / 6));
    REQUIRE(m.per_step.size() == 3);
    CHECK(m.per_step[0] == doctest::Approx(5.0 / 16));
    CHECK(m.per_step[1] == doctest::Approx(1.0 / 16));
    REQUIRE(m.per_call.size() == 2);
    CHECK(m.per_call[0] == doctest::Approx(3.0 / 24));
    CHECK(m.per_call[1] == doctest::Approx(4.0 / 24));
}

TEST_CASE("metrics alignment: a ground-truth offset shifts rows and steps past the end are skipped") {
    Fixture f;
    MetricsOptions opt;
    opt.gt_offset = 1;  // step s of anchor a vs row a + 1 + s
    const Metrics m = compute_metrics(f.pred, f.gt, 5, opt);
    CHECK(m.compared_steps == 5);  // call 1 would need row 5
    CHECK(m.skipped_steps == 1);
    // Rows differ by 10 per frame, so every compared value of dims other than the perturbed ones
    // is off by -10: naive sum over the compared (call, step) pairs.
    double sum = 0;
    int n = 0;
    for (int c = 0; c < 2; ++c)
        for (int s = 0; s < 3; ++s) {
            const int row = (c == 0 ? 0 : 2) + 1 + s;
            if (row >= 5) continue;
            for (int d = 0; d < 8; ++d) {
                const double e = f.pred.at(c, s, d) - f.gt[size_t(row * 8 + d)];
                sum += e * e;
                ++n;
            }
        }
    CHECK(m.overall_mse == doctest::Approx(sum / n));

    opt = {};
    opt.steps = 1;  // open_loop_yam.py: first step only
    const Metrics first = compute_metrics(f.pred, f.gt, 5, opt);
    CHECK(first.compared_steps == 2);
    CHECK(first.overall_mse == doctest::Approx((1.0 + 4.0) / 16));
    CHECK(first.per_step.size() == 1);

    opt = {};
    opt.gt_offset = 100;
    const Metrics none = compute_metrics(f.pred, f.gt, 5, opt);
    CHECK(none.compared_steps == 0);
    CHECK(std::isnan(none.overall_mse));
    CHECK(none.to_json()["overall_mse"].is_null());
    CHECK(none.mse_csv().rfind("overall_mse,nan\n", 0) == 0);
    opt = {};
    opt.steps = 0;
    CHECK_THROWS_AS(compute_metrics(f.pred, f.gt, 5, opt), Error);
    // Near INT64_MAX the row arithmetic overflowed (UBSan) and gave MSE "nan": bounded now.
    opt = {};
    opt.gt_offset = INT64_MAX - 5;
    CHECK_THROWS_WITH_AS(compute_metrics(f.pred, f.gt, 5, opt), doctest::Contains("must be in [-1000000, 1000000]"),
                         Error);
    CHECK_THROWS_AS(compute_metrics(f.pred, f.gt, 4), Error);  // 40 values are not 4 rows of 8
}

TEST_CASE("mse.csv follows open_loop_yam.py's line format and metrics.json reads back") {
    Fixture f;
    const Metrics m = compute_metrics(f.pred, f.gt, 5);
    const std::string csv = m.mse_csv();
    CHECK(csv.rfind(fmt::format("overall_mse,{}\naction.joint_position,{}\naction.gripper_position,{}\ndim_0,0.5\n",
                                7.0 / 48, 3.0 / 42, 4.0 / 6),
                    0) == 0);
    CHECK(csv.find("dim_7,") != std::string::npos);
    int lines = 0;
    for (char c : csv) lines += c == '\n';
    CHECK(lines == 1 + 2 + 8);

    const Metrics back = Metrics::from_json(json::parse(m.to_json().dump()), "metrics.json");
    CHECK(back.overall_mse == doctest::Approx(m.overall_mse));
    CHECK(back.per_key == m.per_key);
    CHECK(back.compared_steps == 6);
    CHECK_THROWS_WITH_AS(Metrics::from_json(json{{"overall_mse", 1}}, "x/metrics.json"),
                         doctest::Contains("x/metrics.json: not a metrics report"), Error);
}

TEST_CASE("actions csv has one row per call and step with the frame it stands for") {
    Fixture f;
    const std::string csv = io::actions_csv(f.pred);
    CHECK(csv.rfind("call,step,frame,joint_0,joint_1,joint_2,joint_3,joint_4,joint_5,joint_6,gripper\n", 0) == 0);
    // call 1 (anchor 2), step 2 -> frame 4; values = gt row 4: 40, 40.5, ..., 43.5
    CHECK(csv.find("\n1,2,4,40,40.5,41,41.5,42,42.5,43,43.5\n") != std::string::npos);
    CHECK(csv.find("\n0,0,0,1,0.5,1,") != std::string::npos);  // dim 0 off by one
    int lines = 0;
    for (char c : csv) lines += c == '\n';
    CHECK(lines == 1 + 2 * 3);
    io::ActionChunks bad;
    CHECK_THROWS_AS(bad.append(0, std::vector<float>(5)), Error);
}

TEST_CASE("result writer writes every file atomically and the done marker last") {
    test::TempDir dir;
    Fixture f;
    io::ResultWriter w(dir / "out" / "ep");
    CHECK_FALSE(io::ResultWriter::is_done(w.dir()));
    w.write_actions(f.pred);
    const io::NpyArray a = io::read_npy(w.dir() / "actions.npy");
    CHECK(a.dtype() == io::NpyDType::F4);
    CHECK(a.shape() == std::vector<int64_t>{2, 3, 8});
    CHECK(a.to_f32() == f.pred.values);
    const bool png_plots = io::video_io_available();  // PNG plots are drawn by OpenCV
    write_metrics(w, f.pred, f.gt, 5, {}, png_plots ? io::PlotRasterizer(io::render_plot_png) : io::PlotRasterizer());
    w.write_json("timing.json", TimingReport{}.to_json());
    w.mark_done({{"episode", "ep"}});
    CHECK(io::ResultWriter::is_done(w.dir()));
    const json done = json::parse(slurp(w.dir() / "done.json"));
    CHECK(done["episode"] == "ep");
    const std::vector<std::string> files = done["files"];
    CHECK(files.front() == "actions.npy");
    CHECK(files.back() == "timing.json");
    for (const auto& name : files) CHECK(fs::exists(w.dir() / name));
    for (int d = 0; d < 8; ++d) CHECK(fs::exists(w.dir() / fmt::format("action_dim_{}.png", d)) == png_plots);
    CHECK(fs::exists(w.dir() / "all_action_dims.png") == png_plots);
    const io::NpyArray gt = io::read_npy(w.dir() / std::string(kGtActionsFile));
    CHECK(gt.shape() == std::vector<int64_t>{5, 8});
    CHECK(gt.to_f64() == f.gt);
    CHECK(slurp(w.dir() / "mse.csv").rfind("overall_mse,", 0) == 0);
    CHECK(json::parse(slurp(w.dir() / "metrics.json"))["compared_steps"] == 6);
    CHECK_FALSE(has_temp_files(w.dir()));
    w.clear_done();
    CHECK_FALSE(io::ResultWriter::is_done(w.dir()));

    // A directory that cannot be created is an error naming it.
    io::write_file_atomic(dir / "file", "x");
    CHECK_THROWS_WITH_AS(io::ResultWriter(dir / "file" / "ep"), doctest::Contains("cannot create output directory"),
                         Error);
}

TEST_CASE("summary pools MSE over compared steps and quotes CSV fields") {
    Fixture f;
    EpisodeSummary a{"ep_a", "ok", "", 100, 5, compute_metrics(f.pred, f.gt, 5), {100, 200, 300}, {}, {}, 2000.0, 5};
    Metrics mb;
    mb.overall_mse = 4.0;
    mb.per_key = {{"joint_position", 2.0}, {"gripper_position", 18.0}};
    mb.compared_steps = 2;
    EpisodeSummary b{"ep_b", "ok", "", 30, 2, mb, {400}, {}, {}, 900.0, 2};
    EpisodeSummary c{"ep, c", "failed", "ep_c/wrist_image_left.mp4: truncated, \"frame 7\"", 0, 0, std::nullopt, {}, {}, {}, std::nullopt, 0};
    EpisodeSummary d{"ep_d", "skipped", "", 10, 1, std::nullopt, {}, {}, {}, std::nullopt, 0};
    // a and b ran on a GPU whose energy was read: 2000 J over 5 calls and 900 J over 2
    const std::vector<EpisodeSummary> eps = {a, b, c, d};
    const json j = summary_json(eps);
    CHECK(j["episodes"][0]["gpu_energy_j_per_call"] == doctest::Approx(400.0));
    CHECK(j["episodes"][1]["gpu_energy_j"] == doctest::Approx(900.0));
    CHECK_FALSE(j["episodes"][2].contains("gpu_energy_j"));
    CHECK(j["totals"]["gpu_energy_j"] == doctest::Approx(2900.0));
    CHECK(j["totals"]["gpu_energy_episodes"] == 2);
    CHECK(j["totals"]["gpu_energy_j_per_call"] == doctest::Approx(2900.0 / 7));
    CHECK(j["totals"]["episodes"] == 4);
    CHECK(j["totals"]["ok"] == 2);
    CHECK(j["totals"]["failed"] == 1);
    CHECK(j["totals"]["skipped"] == 1);
    CHECK(j["totals"]["compared_steps"] == 8);
    CHECK(j["totals"]["overall_mse"].get<double>() == doctest::Approx((7.0 / 48 * 6 + 4.0 * 2) / 8));
    CHECK(j["totals"]["per_key_mse"]["gripper_position"].get<double>() == doctest::Approx((4.0 / 6 * 6 + 18 * 2) / 8));
    CHECK(j["totals"]["call_ms"]["max"] == 400.0);
    CHECK(j["totals"]["call_ms"]["median"] == 250.0);
    CHECK(j["episodes"][2]["error"] == c.error);

    const std::string csv = summary_csv(eps);
    CHECK(csv.rfind("episode,status,frames,calls,overall_mse,", 0) == 0);
    CHECK(csv.find(",call_ms_max,gpu_energy_j_per_call,error\n") != std::string::npos);
    CHECK(csv.find("\n\"ep, c\",failed,0,0,,,,,,,,\"ep_c/wrist_image_left.mp4: truncated, \"\"frame 7\"\"\"\n") !=
          std::string::npos);
    CHECK(csv.find("\nep_b,ok,30,2,4,2,18,400.000,400.000,400.000,450.0,\n") != std::string::npos);

    test::TempDir dir;
    write_summary(dir.path(), eps);
    CHECK(json::parse(slurp(dir / "summary.json")) == j);
    CHECK(slurp(dir / "summary.csv") == csv);
}

TEST_CASE("summary of a finished episode reloads its metrics and timed calls for --resume") {
    test::TempDir dir;
    Fixture f;
    io::ResultWriter w(dir / "ep");
    const Metrics m = write_metrics(w, f.pred, f.gt, 5, {});
    TimingReport t;
    for (int i = 0; i < 3; ++i) {
        CallTiming c;
        c.call = i;
        c.total_ms = 10.0 * (i + 1);
        c.phase(Phase::Dit) = 5.0 * (i + 1);
        c.host_prepare_ms = 1.0 + i;
        c.timed = i != 1;
        t.calls.push_back(c);
    }
    w.write_json("timing.json", t.to_json());
    CHECK_THROWS_WITH_AS(summary_from_outputs(w.dir(), "ep"), doctest::Contains("did not finish"), Error);
    w.mark_done({{"num_frames", 5}, {"num_calls", 2}});
    const EpisodeSummary e = summary_from_outputs(w.dir(), "ep");
    CHECK(e.status == "skipped");
    CHECK(e.num_frames == 5);
    CHECK(e.num_calls == 2);
    REQUIRE(e.metrics.has_value());
    CHECK(e.metrics->overall_mse == doctest::Approx(m.overall_mse));
    CHECK(e.call_ms == std::vector<double>{10.0, 30.0});
    CHECK(e.phase_ms[size_t(Phase::Dit)] == std::vector<double>{5.0, 15.0});
    CHECK(e.host_prepare_ms == std::vector<double>{1.0, 3.0});
    CHECK_FALSE(e.gpu_energy_j.has_value());  // no telemetry (a CPU run)
    // two GPUs' energy over the 3 calls: summed; one GPU without an energy reading: no total
    t.gpu_telemetry = json::array({{{"device", "a"}, {"energy_j", 100.0}}, {{"device", "b"}, {"energy_j", 50.0}}});
    w.write_json("timing.json", t.to_json());
    const EpisodeSummary with_energy = summary_from_outputs(w.dir(), "ep");
    REQUIRE(with_energy.gpu_energy_j.has_value());
    CHECK(*with_energy.gpu_energy_j == doctest::Approx(150.0));
    CHECK(with_energy.gpu_energy_calls == 3);
    t.gpu_telemetry[1] = {{"device", "b"}, {"unavailable", "NVML (libnvidia-ml.so.1) not found"}};
    w.write_json("timing.json", t.to_json());
    CHECK_FALSE(summary_from_outputs(w.dir(), "ep").gpu_energy_j.has_value());
    io::write_file_atomic(w.dir() / "timing.json", "{\"calls\": [{\"total_ms\": 1}]}");
    CHECK_THROWS_WITH_AS(summary_from_outputs(w.dir(), "ep"), doctest::Contains("timing.json: not a timing report"),
                         Error);
    io::write_file_atomic(w.dir() / "metrics.json", "{");
    CHECK_THROWS_WITH_AS(summary_from_outputs(w.dir(), "ep"), doctest::Contains("metrics.json: invalid JSON"), Error);
}

TEST_CASE("manifest carries the version, git hash and run settings") {
    RunManifest m;
    m.episode = "ep_000";
    m.checkpoint = "/ckpt";
    m.config = {{"sampler", {{"steps", 16}}}};
    m.overrides = {"sampler.steps=16"};
    m.seed = 1140;
    m.device = "cuda:0";
    m.command_line = {"dzr", "rollout", "--seed", "1140"};
    m.start_time = iso8601_utc(std::chrono::system_clock::time_point{});
    m.extra = {{"frame_schedule", "frame [0]; ..."}};
    const json j = m.to_json();
    CHECK(j["dzr_version"] == dzr::version());
    CHECK(j["git_hash"] == dzr::git_hash());
    CHECK(j["start_time"] == "1970-01-01T00:00:00Z");
    CHECK(j["seed"] == 1140);
    CHECK(j["config"]["sampler"]["steps"] == 16);
    CHECK(j["command_line"][1] == "rollout");
    CHECK(j["frame_schedule"] == "frame [0]; ...");
}

TEST_CASE("progress line redraws in place on a terminal and prints plain lines otherwise") {
    std::FILE* f = std::tmpfile();
    REQUIRE(f);
    {
        ProgressLine plain(f);  // a file is not a terminal
        CHECK_FALSE(plain.is_tty());
        plain.update("call 1/3");
        plain.update("call 2/3");
        plain.finish("done");
    }
    CHECK(read_stream(f) == "call 1/3\ncall 2/3\ndone\n");
    std::fclose(f);

    f = std::tmpfile();
    {
        ProgressLine tty(f, ProgressLine::Mode::Tty);
        tty.update("call 1/3");
        tty.update("call 2/3");
        tty.clear();
        tty.update("call 3/3");
    }  // destroyed with the line open: it ends the line
    CHECK(read_stream(f) == "\rcall 1/3\x1b[K\rcall 2/3\x1b[K\r\x1b[K\rcall 3/3\x1b[K\n");
    std::fclose(f);
}

TEST_CASE("console formatting: bars, durations and tables") {
    CHECK(progress_bar(0, 4, 8) == "[        ]   0%");
    CHECK(progress_bar(2, 4, 8) == "[====>   ]  50%");
    CHECK(progress_bar(4, 4, 8) == "[========] 100%");
    CHECK(format_duration(0.25) == "250 ms");
    CHECK(format_duration(12.34) == "12.3 s");
    CHECK(format_duration(245) == "4m05s");
    CHECK(format_duration(7380) == "2h03m");
    CHECK(format_progress(2, 5, "ep_001", 7, 18, 2.0) ==
          "episode 2/5 ep_001  call 7/18 [=======>            ]  38%  2.00 s/call  eta 22.0 s");
    const std::string t = format_table({"episode", "calls", "mse"}, {{"ep_000", "18", "0.0123"}, {"long_name", "5", "-"}});
    CHECK(t == "episode    calls  mse\n"
               "------------------------\n"
               "ep_000        18  0.0123\n"
               "long_name      5  -\n");
}
