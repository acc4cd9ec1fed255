// dzr: run NVIDIA DreamZero offline. Subcommands register themselves (command.h).
#include <cstdio>
#include <exception>

#include "apps/dzr/command.h"
#include "backend/blas_kernels.h"
#include "core/error.h"
#include "core/log.h"
#include "core/version.h"

namespace dzr::app {

std::vector<CommandSetup>& command_registry() {
    static std::vector<CommandSetup> registry;
    return registry;
}

std::vector<std::string>& command_line() {
    static std::vector<std::string> args;
    return args;
}

/// "dzr rollout" when the error came from a subcommand's options, else "dzr".
std::string help_target(const CLI::App& app) {
    std::string name = "dzr";
    const CLI::App* at = &app;
    while (true) {
        const auto subs = at->get_subcommands();
        if (subs.empty()) break;
        at = subs.front();
        name += " " + at->get_name();
    }
    return name;
}

}  // namespace dzr::app

int main(int argc, char** argv) {
    dzr::use_best_blas_kernels(argv);  // may start dzr again with OpenBLAS's AVX kernels (blas_kernels.h)
    for (int i = 0; i < argc; ++i) dzr::app::command_line().emplace_back(argv[i]);
    CLI::App app{"dzr: offline DreamZero world-action-model rollouts (C++/CUDA)", "dzr"};
    app.require_subcommand(1);
    app.set_version_flag("--version", std::string("dzr ") + dzr::version() + " (" + dzr::git_hash() + ")");
    std::string log_level = "info";
    app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off")->capture_default_str();

    std::function<int()> run;
    for (auto& setup : dzr::app::command_registry()) setup(app, run);

    try {
        app.parse(argc, argv);
    } catch (const CLI::Success& e) {  // --help, --help-all, --version
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        // NOTE: every usage error in the one format of the others (CLI11's own exit codes run to 100+)
        std::fprintf(stderr, "dzr: error: %s (see %s --help)\n", e.what(), dzr::app::help_target(app).c_str());
        return 2;
    }
    try {
        dzr::set_log_level(log_level);
        if (!run) {
            std::fprintf(stderr, "dzr: error: no action selected (see dzr --help)\n");
            return 2;
        }
        return run();
    } catch (const dzr::Interrupted& e) {
        std::fprintf(stderr, "dzr: interrupted: %s\n", e.what());
        return 130;
    } catch (const dzr::Error& e) {
        std::fprintf(stderr, "dzr: error: %s\n", e.what());
        return 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "dzr: error: %s\n", e.what());
        return 1;
    }
}
