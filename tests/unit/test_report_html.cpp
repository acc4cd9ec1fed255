// The HTML report (rollout/report_html.h) and the SVG plots it is drawn with (io/svg.h): an output
// directory made by hand with finished, failed, interrupted and damaged episodes; a directory that is
// not a dzr output; `dzr report` on both.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/npy.h"
#include "io/png.h"
#include "io/result_writer.h"
#include "io/svg.h"
#include "rollout/report_html.h"
#include "rollout/reports.h"
#include "support/test_support.h"

using namespace dzr;
using namespace dzr::rollout;
namespace fs = std::filesystem;

namespace {

size_t count(const std::string& text, const std::string& what) {
    size_t n = 0;
    for (size_t p = text.find(what); p != std::string::npos; p = text.find(what, p + what.size())) ++n;
    return n;
}

/// Two calls of 3 steps x 8 dims against 6 ground-truth rows.
struct Chunks {
    io::ActionChunks pred;
    std::vector<double> gt;
    Chunks() {
        pred.horizon = 3;
        pred.dims = 8;
        for (int r = 0; r < 6; ++r)
            for (int d = 0; d < 8; ++d) gt.push_back(std::sin(r + d));
        for (int64_t anchor : {0, 3}) {
            std::vector<float> chunk;
            for (int s = 0; s < 3; ++s)
                for (int d = 0; d < 8; ++d) chunk.push_back(float(gt[size_t((anchor + s) * 8 + d)] + 0.1 * d));
            pred.append(anchor, chunk);
        }
    }
};

TimingReport timing_of(const io::ActionChunks& pred) {
    TimingReport t;
    t.device = "cpu";
    for (int64_t c = 0; c < pred.num_calls(); ++c) {
        CallTiming ct;
        ct.call = c;
        ct.anchor = pred.anchors[size_t(c)];
        ct.total_ms = 100.0 * double(c + 1);
        ct.phase(Phase::Dit) = 60.0 * double(c + 1);
        ct.phase(Phase::VaeEncode) = 30.0;
        t.calls.push_back(ct);
    }
    return t;
}

/// Writes an episode as the runner does; `done` false leaves it interrupted.
void write_episode(const fs::path& dir, const Chunks& c, bool done) {
    io::ResultWriter w(dir);
    w.write_actions(c.pred);
    w.write_json("timing.json", timing_of(c.pred).to_json());
    RunManifest m;
    m.episode = "/data/" + dir.filename().string();
    m.checkpoint = "/ckpt/tiny";
    m.device = "cpu";
    m.extra = Json{{"prompt", "put the <block> in the bowl"}};
    if (!done) m.extra["interrupted"] = {{"calls_done", 2}, {"calls_scheduled", 5}};
    w.write_json("manifest.json", m.to_json());
    if (!done) return;
    write_metrics(w, c.pred, c.gt, 6);
    w.mark_done(Json{{"num_frames", 6}, {"num_calls", 2}});
}

/// summary.json as the runner writes it for the listed episodes.
void write_summary_of(const fs::path& out, const std::vector<std::pair<std::string, std::string>>& status) {
    std::vector<EpisodeSummary> eps;
    for (const auto& [name, s] : status) {
        EpisodeSummary e;
        e.name = name;
        e.status = s;
        if (s == "failed") e.error = name + "/wrist_image_left.mp4: truncated";
        eps.push_back(e);
    }
    write_summary(out, eps);
}

int run_shell(const std::string& cmd) {
    const int status = std::system(cmd.c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

TEST_CASE("svg line plots draw every series in its colour and break lines at NaN") {
    io::PlotSpec spec;
    spec.title = "dim <0> & co";
    spec.series = {io::PlotSeries{"gt", io::kPlotDark, {0, 1, 2, 3}, {0, 1, 0, 1}, 2, false, "ground truth"},
                   io::PlotSeries{"pred", io::kPlotOrange, {0, 1, NAN, 3, 4}, {0.5, 0.5, NAN, 0.5, 0.5}, 1.5, true, ""}};
    const std::string svg = io::plot_svg(spec);
    CHECK(svg.rfind("<svg ", 0) == 0);
    CHECK(svg.rfind("</svg>") == svg.size() - 6);
    CHECK(count(svg, "<polyline") == 3);  // one for gt, two for the broken pred
    CHECK(count(svg, "stroke=\"#282828\"") == 2);  // the series and its legend line
    CHECK(count(svg, "stroke=\"#ff7f0e\"") == 2);
    CHECK(count(svg, "<rect x=") >= 4 + 1);  // 4 markers, the frame
    CHECK(svg.find("dim &lt;0&gt; &amp; co") != std::string::npos);
    CHECK(svg.find("<title>ground truth</title>") != std::string::npos);

    io::StackedBarSpec bars{"phases", "call", "ms", {0, 1, 2}, {}, 640, 300};
    bars.stacks = {{"dit", io::kPlotBlue, {10, 20, NAN}}, {"vae", io::kPlotOrange, {5, 0, 7}}};
    const std::string b = io::stacked_bars_svg(bars);
    CHECK(count(b, "<g class=\"bar\">") == 3);
    CHECK(count(b, "fill=\"#1f77b4\"/>") == 2);  // no segment for NaN
    CHECK(count(b, "fill=\"#ff7f0e\"/>") == 2);  // none for 0
    bars.stacks[0].values.pop_back();
    CHECK_THROWS_AS(io::stacked_bars_svg(bars), Error);
}

TEST_CASE("the report lists finished, failed, interrupted and damaged episodes and draws each page") {
    test::TempDir dir;
    const fs::path out = dir / "run";
    const Chunks c;
    write_episode(out / "ep_ok", c, true);
    write_episode(out / "ep_cut", c, false);
    write_episode(out / "ep_bad", c, true);
    io::write_file_atomic(out / "ep_bad" / "metrics.json", "{not json");
    write_episode(out / "a&b <c>", c, true);
    {  // ep_ok ran on a GPU whose telemetry was read; ep_cut on one without NVML
        TimingReport t = timing_of(c.pred);
        t.gpu_telemetry.push_back({{"device", "00000000:3B:00.0"},
                                   {"sm_clock_mhz", {{"median", 1680.0}, {"limit", 1980.0}}},
                                   {"power_w", {{"median", 691.0}, {"limit", 700.0}}},
                                   {"power_capped_fraction", 1.0},
                                   {"energy_j_per_call", 1043.0}});
        io::write_file_atomic(out / "ep_ok" / "timing.json", t.to_json().dump());
        TimingReport u = timing_of(c.pred);
        u.gpu_telemetry.push_back({{"device", "00000000:3B:00.0"}, {"unavailable", "NVML <missing>"}});
        io::write_file_atomic(out / "ep_cut" / "timing.json", u.to_json().dump());
    }
    // --save-video without an encoder: .npy frames, shown as a frame strip.
    std::vector<uint8_t> frames(size_t(3 * 8 * 12 * 3));
    for (size_t i = 0; i < frames.size(); ++i) frames[i] = uint8_t(i * 5);
    for (const char* name : {"predicted_video.npy", "observed_video.npy"})
        io::write_npy(out / "ep_ok" / name, io::NpyDType::U1, {3, 8, 12, 3}, frames.data());
    // ep_gone is in the summary as finished but its directory is missing; ep_fail failed.
    write_summary_of(out, {{"ep_ok", "ok"}, {"ep_fail", "failed"}, {"ep_gone", "ok"}, {"ep_cut", "interrupted"}});

    const ReportInfo info = write_report(out, ReportOptions{50, "2026-01-02T03:04:05Z"});
    CHECK(info.path == out / "report.html");
    CHECK(info.episodes == 6);  // summary's 4, then ep_bad and "a&b <c>" found in the directory
    CHECK(info.failed == 1);
    CHECK(info.incomplete == 3);  // ep_cut, ep_bad, ep_gone

    const std::string html = io::read_file(info.path);
    CHECK(html.rfind("<!doctype html>", 0) == 0);
    CHECK(html.find("http://") == html.find("http://www.w3.org/2000/svg"));  // no other network reference
    CHECK(html.find("https://") == std::string::npos);
    CHECK(count(html, "<tr><td data-v=") == 6);
    CHECK(html.find("<a href=\"report/ep_ok.html\">ep_ok</a>") != std::string::npos);
    CHECK(html.find("<a href=\"report/a%26b%20%3Cc%3E.html\">a&amp;b &lt;c&gt;</a>") != std::string::npos);
    CHECK(html.find("interrupted after 2 of 5 calls") != std::string::npos);
    CHECK(html.find("metrics.json: invalid JSON") != std::string::npos);
    CHECK(html.find("no output directory") != std::string::npos);
    CHECK(html.find("ep_fail/wrist_image_left.mp4: truncated") != std::string::npos);
    CHECK(html.find("MSE dim 7") != std::string::npos);
    CHECK(html.find("2026-01-02T03:04:05Z") != std::string::npos);
    CHECK(html.find("/ckpt/tiny") != std::string::npos);

    // ep_ok: 8 action plots, MSE per call and per step, phase bars and call totals; the frame strip.
    const std::string ep = io::read_file(out / "report/ep_ok.html");
    CHECK(count(ep, "class=\"plot\"") == 8 + 2 + 2);
    CHECK(ep.find("put the &lt;block&gt; in the bowl") != std::string::npos);
    CHECK(ep.find("<video") == std::string::npos);
    CHECK(ep.find("<tr><th>GPU 00000000:3B:00.0</th><td>SM clock median 1680 MHz (max 1980), power median 691 W of "
                  "700 W, power-capped in 100% of the samples, 1043 J per call</td></tr>") != std::string::npos);
    CHECK(ep.find("src=\"ep_ok_frames.png\"") != std::string::npos);
    const io::Image strip = io::read_png(out / "report/ep_ok_frames.png");
    CHECK(strip.width() == 3 * 12 + 4 * 4);  // 3 frames a row, 4-pixel gaps
    CHECK(strip.height() == 2 * 8 + 3 * 4);
    CHECK(strip.at(4, 4) == io::Rgb{frames[0], frames[1], frames[2]});
    // The interrupted episode still shows its actions and timing, without ground truth.
    const std::string cut = io::read_file(out / "report/ep_cut.html");
    CHECK(count(cut, "class=\"plot\"") == 8 + 2);
    CHECK(cut.find("no ground truth") != std::string::npos);
    CHECK(cut.find("not measured: NVML &lt;missing&gt;") != std::string::npos);
    for (const auto& e : fs::recursive_directory_iterator(out))
        CHECK(e.path().filename().string().find(io::kTempMarker) == std::string::npos);

    // `dzr report` prints the path and the counts.
    if (const char* bin = std::getenv("DZR_BIN")) {
        const std::string log = (dir / "log.txt").string();
        CHECK(run_shell(fmt::format("'{}' report '{}' >'{}' 2>&1", bin, out.string(), log)) == 0);
        CHECK(io::read_file(log).find("6 episodes, 1 failed, 3 incomplete") != std::string::npos);
    }
}

TEST_CASE("a report of a directory that is not a dzr output is one clear error and writes nothing") {
    test::TempDir dir;
    fs::create_directories(dir / "empty/some_dir");
    io::write_file_atomic(dir / "empty/notes.txt", "x");
    CHECK_THROWS_WITH_AS(write_report(dir / "empty"), doctest::Contains("is not a dzr rollout output"), Error);
    CHECK_FALSE(fs::exists(dir / "empty/report.html"));
    CHECK_FALSE(fs::exists(dir / "empty/report"));
    CHECK_THROWS_WITH_AS(write_report(dir / "missing"), doctest::Contains("no such directory"), Error);
    if (const char* bin = std::getenv("DZR_BIN")) {
        const std::string log = (dir / "log.txt").string();
        CHECK(run_shell(fmt::format("'{}' report '{}' >'{}' 2>&1", bin, (dir / "empty").string(), log)) == 1);
        const std::string text = io::read_file(log);
        CHECK(text.rfind("dzr: error: ", 0) == 0);
        CHECK(count(text, "\n") == 1);
    }
}
