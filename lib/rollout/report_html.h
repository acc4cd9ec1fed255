#pragma once
/// The HTML report of a rollout output directory: report.html (the run, and a sortable, paginated
/// table of every episode) and report/<episode>.html (action plots, MSE and phase timing per call,
/// the predicted and observed videos side by side). Pages are self-contained: styles, scripts and
/// plots (SVG) are inline; videos and frame strips are linked files of the output directory.
///
/// It reads only what a rollout wrote into the directory (summary.json, each episode's done.json,
/// manifest.json, timing.json, metrics.json, actions.npy, gt_actions.npy and videos), so it runs on any
/// finished or partial output: an episode with missing or damaged files is listed as "incomplete"
/// with the reason. docs/FORMATS.md describes the pages.
#include <cstdint>
#include <filesystem>
#include <string>

namespace dzr::rollout {

struct ReportOptions {
    /// Rows per page of the summary table (the page script paginates; every row is in the file).
    int page_size = 50;
    /// Shown as the report's date; empty: now (ISO 8601 UTC).
    std::string generated_at;
};

struct ReportInfo {
    std::filesystem::path path;  ///< <out_dir>/report.html
    int64_t episodes = 0;
    int64_t incomplete = 0;      ///< episodes listed as incomplete
    int64_t failed = 0;
};

/// Writes report.html and report/ into `out_dir` (atomically, file by file). Throws dzr::Error when
/// `out_dir` is not a dzr rollout output (no summary.json and no episode directory in it).
ReportInfo write_report(const std::filesystem::path& out_dir, const ReportOptions& options = {});

}  // namespace dzr::rollout
