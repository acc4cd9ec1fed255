// `dzr compare BASE NEW`: two rollout outputs, episode by episode and call by call, for CI regressions.
#include "apps/dzr/command.h"
#include "apps/dzr/compare_args.h"

namespace dzr::app {
namespace {

struct Args {
    std::string base, now;
    CompareArgs compare;
};

CommandRegistrar reg([](CLI::App& app, std::function<int()>& run_fn) {
    auto args = std::make_shared<Args>();
    auto* cmd = app.add_subcommand(
        "compare", "Compare two rollout output directories (actions call by call, metrics, optionally timing); "
                   "exit 0 within tolerance, 1 not, 2 when they cannot be compared (docs/CI.md)");
    cmd->add_option("base", args->base, "The baseline's --out directory")->required();
    cmd->add_option("new", args->now, "The new run's --out directory")->required();
    add_compare_options(cmd, args->compare);
    cmd->callback([args, &run_fn] { run_fn = [args] { return run_compare(args->base, args->now, args->compare); }; });
});

}  // namespace
}  // namespace dzr::app
