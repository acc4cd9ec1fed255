#pragma once
/// `dzr summarize OUT`: one summary of a rollout output directory, built from the files each episode
/// left in it (done.json, failed.json, metrics.json, timing.json, manifest.json), whichever process or
/// rank wrote them: summary.json and summary.csv (the format of an unsharded run's summary) and the
/// aggregate plots summary_mse_per_dim.png and summary_call_seconds.png. The last rank of a sharded run
/// calls it; it can be rerun at any time, on a finished or a partial output.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "io/image.h"
#include "io/plots.h"
#include "rollout/reports.h"

namespace dzr::rollout {

/// Draws a plot as a raster image (apps pass the PNG renderer of their build).
using PlotPng = std::function<io::Image(const io::PlotSpec&)>;

struct SummarizeOptions {
    /// Draws the aggregate plots; empty: none.
    PlotPng plot_png;
};

/// What an output directory holds, episode by episode.
struct OutputSummary {
    std::vector<EpisodeSummary> episodes;  ///< in the run's order
    int64_t ok = 0, failed = 0, interrupted = 0, incomplete = 0;
    std::vector<std::string> files;  ///< written, relative to the output directory

    bool complete() const { return ok + failed == int64_t(episodes.size()); }
};

/// An episode's entry from its output directory: "ok" (done.json; metrics and timings from its files),
/// "failed" (failed.json: the error), "interrupted" (an interrupted run's manifest: the calls done), or
/// "incomplete" (no outputs, or outputs without a done marker: a run that was killed; `error` says
/// which). Damaged files make the entry incomplete with the reason; nothing here throws on them. With `check_files`,
/// a done episode one of whose listed files is gone is incomplete ("missing: actions.npy"), as the report judges it;
/// `dzr compare` reads trimmed baselines (actions, metrics and the marker) without it.
EpisodeSummary episode_from_outputs(const std::filesystem::path& dir, const std::string& name, bool check_files = true);

/// The episodes of the run in `out_dir`: OUT/plan.json's list, else every subdirectory holding a done
/// marker, a failure record or a manifest, by name. Throws dzr::Error when there are none.
std::vector<std::string> run_episode_names(const std::filesystem::path& out_dir);

/// Reads every episode's outputs and writes summary.json, summary.csv and (with a renderer) the plots.
OutputSummary summarize_outputs(const std::filesystem::path& out_dir, const SummarizeOptions& options = {});

/// summary_mse_per_dim.png (per action dimension: the MSE pooled over every compared step of every
/// episode, and the median over episodes) and summary_call_seconds.png (the histogram of s/call over
/// every timed call); each only when there is something to draw. Returns the names written.
std::vector<std::string> write_summary_plots(const std::filesystem::path& out_dir,
                                             std::span<const EpisodeSummary> episodes, const PlotPng& plot_png);

}  // namespace dzr::rollout
