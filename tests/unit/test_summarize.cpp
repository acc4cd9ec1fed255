// `dzr summarize`'s library side on output directories made by hand: every episode's status from its own
// files (done, failed, interrupted, incomplete, damaged), the run's episodes from plan.json or a scan, the
// summary in the format of an unsharded run, the aggregate plots; and episode frame counts from headers.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/episode.h"
#include "io/npy.h"
#include "io/plots.h"
#include "io/result_writer.h"
#include "io/synth_episode.h"
#include "rollout/run_plan.h"
#include "rollout/summarize.h"
#include "support/json_file.h"
#include "support/test_support.h"

using namespace dzr;
using namespace dzr::rollout;
namespace fs = std::filesystem;

namespace {

/// A finished episode: metrics over `steps` compared steps and two timed calls of 1 and 3 s.
void write_done_episode(const fs::path& dir, double mse, int64_t steps) {
    io::ResultWriter w(dir);
    Metrics m;
    m.overall_mse = mse;
    m.per_key = {{"joint_position", mse}, {"gripper_position", mse / 2}};
    m.per_dim = std::vector<double>(8, mse);
    m.per_step = {mse};
    m.per_call = {mse, mse};
    m.compared_steps = steps;
    w.write_json("metrics.json", m.to_json());
    TimingReport t;
    t.device = "cpu";
    for (int c = 0; c < 2; ++c) {
        CallTiming ct;
        ct.call = c;
        ct.total_ms = c == 0 ? 1000.0 : 3000.0;
        t.calls.push_back(ct);
    }
    w.write_json("timing.json", t.to_json());
    w.mark_done(Json{{"num_frames", 48}, {"num_calls", 2}});
}

RunPlan plan_of(const std::vector<std::string>& names) {
    RunPlan p;
    p.created = "2026-12-01T00:00:00Z";
    p.launcher = "none";
    std::vector<size_t> all;
    for (const auto& n : names) {
        p.episodes.push_back({n, "eps/" + n, std::nullopt, std::nullopt});
        all.push_back(all.size());
    }
    p.assignment = {all};
    return p;
}

}  // namespace

TEST_CASE("summarize reads every episode's status from its own files and writes one summary") {
    test::TempDir out;
    write_run_plan(out.path(), plan_of({"ep_a", "ep_b", "ep_c", "ep_d", "ep_e"}));
    write_done_episode(out / "ep_a", 2.0, 10);
    write_done_episode(out / "ep_e", 5.0, 30);
    io::ResultWriter::mark_failed(out / "ep_b", Json{{"error", "ep_b/wrist_image_left.npy: no such file"}});
    {
        io::ResultWriter w(out / "ep_c");
        w.write_json("manifest.json", Json{{"episode", "eps/ep_c"}, {"interrupted", {{"calls_done", 1}, {"calls_scheduled", 3}}}});
    }
    // ep_d: never run.

    int plots = 0;
    SummarizeOptions opt;
    opt.plot_png = [&](const io::PlotSpec& spec) {
        ++plots;
        CHECK_FALSE(spec.series.empty());
        return io::Image(64, 32);
    };
    const OutputSummary s = summarize_outputs(out.path(), opt);
    REQUIRE(s.episodes.size() == 5);
    CHECK(s.episodes[0].status == "ok");
    CHECK(s.episodes[1].status == "failed");
    CHECK(s.episodes[1].error.find("wrist_image_left") != std::string::npos);
    CHECK(s.episodes[2].status == "interrupted");
    CHECK(s.episodes[2].num_calls == 1);
    CHECK(s.episodes[3].status == "incomplete");
    CHECK(s.episodes[3].error == "not run");
    CHECK(s.ok == 2);
    CHECK(s.failed == 1);
    CHECK(s.interrupted == 1);
    CHECK(s.incomplete == 1);
    CHECK_FALSE(s.complete());
    CHECK(plots == 2);
    CHECK(fs::exists(out / "summary_mse_per_dim.png"));
    CHECK(fs::exists(out / "summary_call_seconds.png"));

    const auto j = test::read_json(out / "summary.json");
    CHECK(j["episodes"].size() == 5);
    CHECK(j["totals"]["ok"] == 2);
    CHECK(j["totals"]["failed"] == 1);
    CHECK(j["totals"]["incomplete"] == 1);
    // Pooled over compared steps: (2 * 10 + 5 * 30) / 40.
    CHECK(j["totals"]["overall_mse"].get<double>() == doctest::Approx(4.25));
    CHECK(j["totals"]["call_ms"]["count"] == 4);
    CHECK(j["episodes"][0]["num_frames"] == 48);
    const std::string csv = io::read_file(out / "summary.csv");
    CHECK(csv.find("ep_b,failed") != std::string::npos);
    CHECK(csv.find("ep_d,incomplete") != std::string::npos);
}

TEST_CASE("an episode with damaged files is incomplete with the reason, and the summary is still written") {
    test::TempDir out;
    write_done_episode(out / "ep_a", 1.0, 4);
    io::write_file_atomic(out / "ep_a/metrics.json", "{ not json");
    io::ResultWriter(out / "ep_b").write_json("timing.json", Json::object());  // outputs, no done marker
    io::write_file_atomic(out / "ep_b/manifest.json", "{}");
    const OutputSummary s = summarize_outputs(out.path());
    REQUIRE(s.episodes.size() == 2);
    CHECK(s.episodes[0].status == "incomplete");
    CHECK(s.episodes[0].error.find("metrics.json") != std::string::npos);
    CHECK(s.episodes[1].status == "incomplete");
    CHECK(s.episodes[1].error.find("no done marker") != std::string::npos);
    CHECK(fs::exists(out / "summary.json"));
    CHECK_FALSE(fs::exists(out / "summary_mse_per_dim.png"));  // no renderer given
}

TEST_CASE("a done episode whose listed files are gone is incomplete, as the report says; compare reads trimmed dirs") {
    test::TempDir out;
    write_done_episode(out / "ep_a", 1.0, 4);
    fs::remove(out / "ep_a/timing.json");
    CHECK(episode_from_outputs(out / "ep_a", "ep_a").status == "incomplete");
    CHECK(episode_from_outputs(out / "ep_a", "ep_a").error == "missing: timing.json");
    // a baseline kept for dzr compare holds fewer files than its marker lists
    CHECK(episode_from_outputs(out / "ep_a", "ep_a", false).status == "ok");
}

TEST_CASE("without plan.json the episodes are the output's episode directories, and elsewhere there are none") {
    test::TempDir out;
    write_done_episode(out / "z_last", 1.0, 4);
    write_done_episode(out / "a_first", 1.0, 4);
    io::ResultWriter::mark_failed(out / "m_mid", Json{{"error", "bad"}});
    fs::create_directories(out / "ranks");
    io::write_file_atomic(out / "ranks/manifest.json", "{}");  // not an episode
    fs::create_directories(out / "empty_dir");
    CHECK(run_episode_names(out.path()) == std::vector<std::string>{"a_first", "m_mid", "z_last"});

    test::TempDir other;
    try {
        summarize_outputs(other.path());
        FAIL("no error");
    } catch (const Error& e) {
        CHECK(std::string(e.what()).find("not a dzr rollout output") != std::string::npos);
    }
    CHECK_FALSE(fs::exists(other / "summary.json"));
    CHECK_THROWS_AS(summarize_outputs(other / "missing"), Error);
}

TEST_CASE("an episode name in plan.json that is not a plain directory name is refused, not used as a path") {
    test::TempDir out;
    for (const char* bad : {"../elsewhere", "a/b", "..", ""}) {
        write_run_plan(out.path(), plan_of({"ep_a", bad}));
        CHECK_THROWS_WITH_AS(run_episode_names(out.path()), doctest::Contains("is not a plain directory name"),
                             Error);
    }
}

TEST_CASE("an episode's frame count comes from the file headers: the shortest camera or per-frame array") {
    test::TempDir dir;
    io::SynthOptions so;
    so.frames = 30;
    so.width = 32;
    so.height = 24;
    io::write_synth_episode(dir / "ep", so);
    io::EpisodeOptions opt;
    CHECK(io::count_episode_frames(dir / "ep", opt) == 30);
    std::vector<double> rows(25 * 8, 0.0);
    io::write_npy_f64(dir / "ep/actions.npy", {25, 8}, rows);
    CHECK(io::count_episode_frames(dir / "ep", opt) == 25);
    CHECK(io::read_npy_header(dir / "ep/actions.npy").shape == std::vector<int64_t>{25, 8});

    fs::remove(dir / "ep/wrist_image_left.npy");
    try {
        io::count_episode_frames(dir / "ep", opt);
        FAIL("no error");
    } catch (const Error& e) {
        CHECK(std::string(e.what()).find("wrist_image_left") != std::string::npos);
    }
    io::write_file_atomic(dir / "ep/wrist_image_left.npy", "not an npy file");
    CHECK_THROWS_AS(io::count_episode_frames(dir / "ep", opt), Error);
}
