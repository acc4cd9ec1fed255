// `dzr report OUT`: write report.html (and report/) for a rollout output directory.
#include <cstdio>

#include "apps/dzr/command.h"
#include "rollout/report_html.h"

namespace dzr::app {
namespace {

struct ReportArgs {
    std::string out;
    int page_size = 50;
};

int run(const ReportArgs& a) {
    rollout::ReportOptions o;
    o.page_size = a.page_size;
    const rollout::ReportInfo info = rollout::write_report(a.out, o);
    std::printf("report: %s (%lld episodes", info.path.string().c_str(), (long long)info.episodes);
    if (info.failed > 0) std::printf(", %lld failed", (long long)info.failed);
    if (info.incomplete > 0) std::printf(", %lld incomplete", (long long)info.incomplete);
    std::printf(")\n");
    return 0;
}

CommandRegistrar reg([](CLI::App& app, std::function<int()>& run_fn) {
    auto args = std::make_shared<ReportArgs>();
    auto* cmd = app.add_subcommand("report", "Write report.html for a rollout output directory (finished or not)");
    cmd->add_option("out", args->out, "The directory `dzr rollout --out` wrote")->required();
    cmd->add_option("--page-size", args->page_size, "Episodes per page of the summary table")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    cmd->callback([args, &run_fn] { run_fn = [args] { return run(*args); }; });
});

}  // namespace
}  // namespace dzr::app
