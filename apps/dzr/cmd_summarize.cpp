// `dzr summarize OUT`: one summary of a rollout output directory from every episode's own files, whichever
// process or rank wrote them (the last rank of a sharded run does the same at its end).
#include <cstdio>

#include "apps/dzr/command.h"
#include "core/error.h"
#include "io/plots.h"
#include "io/video_reader.h"
#include "rollout/report_html.h"
#include "rollout/progress.h"
#include "rollout/summarize.h"

namespace dzr::app {
namespace {

struct SummarizeArgs {
    std::string out;
    bool no_plots = false;
    bool no_report = false;
};

int run(const SummarizeArgs& a) {
    rollout::SummarizeOptions opt;
    if (!a.no_plots && io::video_io_available()) opt.plot_png = io::render_plot_png;
    const rollout::OutputSummary s = rollout::summarize_outputs(a.out, opt);
    if (!a.no_report) {
        // NOTE: the report reads the merged summary; one that cannot be written does not fail the merge
        try {
            const auto report = rollout::write_report(a.out);
            (void)report;
            std::printf("report: %s\n", (std::filesystem::path(a.out) / "report.html").string().c_str());
        } catch (const Error& err) {
            std::fprintf(stderr, "dzr: warning: report not written: %s\n", err.what());
        }
    }

    std::vector<std::vector<std::string>> rows;
    for (const auto& ep : s.episodes) {
        const auto t = rollout::compute_stats(ep.call_ms);
        rows.push_back({ep.name, ep.status, std::to_string(ep.num_calls),
                        ep.call_ms.empty() ? "-" : fmt::format("{:.1f}", t.median),
                        ep.metrics ? fmt::format("{:.6g}", ep.metrics->overall_mse) : "-",
                        ep.error.empty() ? "" : ep.error.substr(0, 80)});
    }
    std::printf("%s", rollout::format_table({"episode", "status", "calls", "median ms", "mse", "error"}, rows).c_str());
    std::printf("%zu episodes: %lld ok, %lld failed, %lld interrupted, %lld incomplete\n", s.episodes.size(),
                (long long)s.ok, (long long)s.failed, (long long)s.interrupted, (long long)s.incomplete);
    for (const auto& f : s.files) std::printf("wrote %s\n", (std::filesystem::path(a.out) / f).string().c_str());
    if (!s.complete())
        std::fprintf(stderr, "dzr: %lld episode(s) not finished: `dzr rollout ... --resume` with the same episodes "
                     "and --out completes them\n", (long long)(s.interrupted + s.incomplete));
    return s.failed == 0 && s.complete() ? 0 : 1;
}

CommandRegistrar reg([](CLI::App& app, std::function<int()>& run_fn) {
    auto args = std::make_shared<SummarizeArgs>();
    auto* cmd = app.add_subcommand("summarize",
                                   "Merge every episode's results in a rollout output directory into summary.json, "
                                   "summary.csv and the aggregate plots (exit 1 when an episode failed or is missing)");
    cmd->add_option("out", args->out, "The --out directory of a rollout (sharded or not)")->required();
    cmd->add_flag("--no-plots", args->no_plots, "Do not draw summary_mse_per_dim.png and summary_call_seconds.png");
    cmd->add_flag("--no-report", args->no_report, "Do not write report.html (`dzr report OUT` writes it later)");
    cmd->callback([args, &run_fn] { run_fn = [args] { return run(*args); }; });
});

}  // namespace
}  // namespace dzr::app
