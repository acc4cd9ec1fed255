#include "rollout/summarize.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "core/json_text.h"
#include "io/atomic_file.h"
#include "io/png.h"
#include "io/result_writer.h"
#include "rollout/run_plan.h"

namespace dzr::rollout {

namespace fs = std::filesystem;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

/// Subdirectories of an output directory that are not episodes.
bool is_reserved_dir(const std::string& name) { return name == "ranks" || name == "logs" || name == "report"; }

Json read_json_file(const fs::path& path) {
    try {
        return parse_json_strict<Json>(io::read_file(path), path.string());
    } catch (const Json::exception& ex) {
        DZR_THROW("{}: invalid JSON: {}", path.string(), ex.what());
    }
}

bool has_file(const fs::path& path) {
    std::error_code ec;
    return fs::is_regular_file(path, ec);
}

/// The per-dimension MSE plot: pooled over compared steps (as summary.json's totals pool them) and the
/// median over episodes.
std::optional<io::PlotSpec> mse_plot(std::span<const EpisodeSummary> episodes) {
    size_t dims = 0;
    for (const auto& e : episodes)
        if (e.metrics && e.metrics->compared_steps > 0) dims = std::max(dims, e.metrics->per_dim.size());
    if (dims == 0) return std::nullopt;
    std::vector<double> sum(dims, 0.0), weight(dims, 0.0);
    std::vector<std::vector<double>> values(dims);
    int64_t count = 0;
    for (const auto& e : episodes) {
        if (!e.metrics || e.metrics->compared_steps <= 0) continue;
        ++count;
        for (size_t d = 0; d < e.metrics->per_dim.size(); ++d) {
            const double v = e.metrics->per_dim[d];
            if (!std::isfinite(v)) continue;
            sum[d] += v * double(e.metrics->compared_steps);
            weight[d] += double(e.metrics->compared_steps);
            values[d].push_back(v);
        }
    }
    io::PlotSeries pooled, median;
    pooled.label = "pooled over compared steps";
    pooled.color = io::kPlotBlue;
    pooled.markers = true;
    median.label = "median over episodes";
    median.color = io::kPlotOrange;
    median.markers = true;
    for (size_t d = 0; d < dims; ++d) {
        pooled.x.push_back(double(d));
        pooled.y.push_back(weight[d] > 0 ? sum[d] / weight[d] : kNaN);
        median.x.push_back(double(d));
        std::sort(values[d].begin(), values[d].end());
        median.y.push_back(values[d].empty() ? kNaN : percentile(values[d], 0.5));
    }
    io::PlotSpec spec;
    spec.title = fmt::format("action MSE per dimension, {} episode{}", count, count == 1 ? "" : "s");
    spec.x_label = "action dimension";
    spec.y_label = "MSE";
    spec.series = {pooled, median};
    return spec;
}

/// The histogram of seconds per call as a stepped outline.
std::optional<io::PlotSpec> call_seconds_plot(std::span<const EpisodeSummary> episodes) {
    std::vector<double> s;
    for (const auto& e : episodes)
        for (double ms : e.call_ms) s.push_back(ms / 1e3);
    if (s.empty()) return std::nullopt;
    std::sort(s.begin(), s.end());
    const TimingStats stats = compute_stats(s);
    double lo = s.front(), hi = s.back();
    if (hi - lo < 1e-9 * std::max(1.0, std::abs(hi))) {
        const double pad = std::max(0.05 * std::abs(hi), 1e-3);
        lo -= pad;
        hi += pad;
    }
    const int bins = std::clamp(int(std::ceil(std::sqrt(double(s.size())))), 5, 40);
    const double width = (hi - lo) / bins;
    std::vector<int64_t> counts(size_t(bins), 0);
    for (double v : s) counts[size_t(std::clamp(int((v - lo) / width), 0, bins - 1))]++;
    io::PlotSeries hist;
    hist.label = "calls";
    hist.color = io::kPlotBlue;
    hist.x.push_back(lo);
    hist.y.push_back(0);
    for (int b = 0; b < bins; ++b) {
        hist.x.push_back(lo + b * width);
        hist.y.push_back(double(counts[size_t(b)]));
        hist.x.push_back(lo + (b + 1) * width);
        hist.y.push_back(double(counts[size_t(b)]));
    }
    hist.x.push_back(hi);
    hist.y.push_back(0);
    io::PlotSpec spec;
    spec.title = fmt::format("s/call over {} timed calls: median {:.3g} s, p90 {:.3g} s", stats.count, stats.median,
                             stats.p90);
    spec.x_label = "seconds per call";
    spec.y_label = "calls";
    spec.series = {hist};
    return spec;
}

}  // namespace

EpisodeSummary episode_from_outputs(const fs::path& dir, const std::string& name, bool check_files) {
    EpisodeSummary e;
    e.name = name;
    try {
        if (io::ResultWriter::is_done(dir)) {
            e = summary_from_outputs(dir, name);
            e.status = "ok";
            // NOTE: as the report judges it: a file the done marker lists and that is gone leaves it incomplete
            std::vector<std::string> missing;
            const Json done = read_json_file(dir / std::string(io::kDoneMarker));
            if (check_files && done.contains("files") && done["files"].is_array())
                for (const auto& f : done["files"])
                    if (f.is_string() && !has_file(dir / f.get<std::string>())) missing.push_back(f.get<std::string>());
            if (!missing.empty()) {
                e.status = "incomplete";
                e.error = fmt::format("missing: {}", fmt::join(missing, ", "));
            }
            return e;
        }
        if (has_file(dir / std::string(io::kFailedMarker))) {
            const Json j = read_json_file(dir / std::string(io::kFailedMarker));
            e.status = "failed";
            e.error = j.contains("error") && j["error"].is_string() ? j["error"].get<std::string>() : "(no message)";
            return e;
        }
        if (has_file(dir / "manifest.json")) {
            const Json m = read_json_file(dir / "manifest.json");
            if (m.contains("interrupted")) {
                e.status = "interrupted";
                e.num_calls = m["interrupted"].value("calls_done", int64_t(0));
                read_call_timings(dir, e);
                return e;
            }
        }
    } catch (const Error& err) {
        EpisodeSummary bad;
        bad.name = name;
        bad.status = "incomplete";
        bad.error = err.what();
        return bad;
    } catch (const Json::exception& ex) {
        EpisodeSummary bad;
        bad.name = name;
        bad.status = "incomplete";
        bad.error = fmt::format("{}: {}", dir.string(), ex.what());
        return bad;
    }
    std::error_code ec;
    e.status = "incomplete";
    e.error = fs::is_directory(dir, ec) ? "no done marker (the run stopped during this episode)" : "not run";
    return e;
}

std::vector<std::string> run_episode_names(const fs::path& out_dir) {
    std::error_code ec;
    DZR_CHECK(fs::is_directory(out_dir, ec), "{}: no such output directory", out_dir.string());
    std::vector<std::string> names;
    if (const auto plan = read_run_plan(out_dir)) {
        for (const auto& e : plan->episodes) names.push_back(e.name);
        return names;
    }
    for (const auto& entry : fs::directory_iterator(out_dir, ec)) {
        if (!entry.is_directory()) continue;
        const std::string name = entry.path().filename().string();
        if (is_reserved_dir(name)) continue;
        for (std::string_view marker : {io::kDoneMarker, io::kFailedMarker, std::string_view("manifest.json")})
            if (has_file(entry.path() / marker)) {
                names.push_back(name);
                break;
            }
    }
    std::sort(names.begin(), names.end());
    DZR_CHECK(!names.empty(), "{}: not a dzr rollout output (no {} and no episode directory holding {}, {} or "
              "manifest.json)", out_dir.string(), kPlanFile, io::kDoneMarker, io::kFailedMarker);
    return names;
}

OutputSummary summarize_outputs(const fs::path& out_dir, const SummarizeOptions& options) {
    OutputSummary s;
    for (const auto& name : run_episode_names(out_dir)) {
        s.episodes.push_back(episode_from_outputs(out_dir / name, name));
        const std::string& status = s.episodes.back().status;
        s.ok += status == "ok";
        s.failed += status == "failed";
        s.interrupted += status == "interrupted";
        s.incomplete += status == "incomplete";
    }
    write_summary(out_dir, s.episodes);
    s.files = {"summary.json", "summary.csv"};
    for (auto& f : write_summary_plots(out_dir, s.episodes, options.plot_png)) s.files.push_back(std::move(f));
    return s;
}

std::vector<std::string> write_summary_plots(const fs::path& out_dir, std::span<const EpisodeSummary> episodes,
                                             const PlotPng& plot_png) {
    std::vector<std::string> written;
    if (!plot_png) return written;
    if (const auto spec = mse_plot(episodes)) {
        io::write_png(out_dir / "summary_mse_per_dim.png", plot_png(*spec));
        written.emplace_back("summary_mse_per_dim.png");
    }
    if (const auto spec = call_seconds_plot(episodes)) {
        io::write_png(out_dir / "summary_call_seconds.png", plot_png(*spec));
        written.emplace_back("summary_call_seconds.png");
    }
    return written;
}

}  // namespace dzr::rollout
