#pragma once
/// The comparison flags shared by `dzr compare` and `dzr rollout --baseline` (one spelling for both).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>

#include "rollout/compare.h"

namespace dzr::app {

struct CompareArgs {
    double atol = 0, rtol = 0, metric_tol = 0;
    std::string time_tol;  // empty: timing not compared
    bool allow_settings = false;
    std::string json, junit;

    rollout::CompareOptions options() const {
        rollout::CompareOptions o;
        o.atol = atol;
        o.rtol = rtol;
        o.metric_tol = metric_tol;
        if (!time_tol.empty()) o.time_tol = rollout::parse_fraction(time_tol, "--time-tol");
        o.allow_settings = allow_settings;
        return o;
    }
};

inline void add_compare_options(CLI::App* cmd, CompareArgs& a, const std::string& when = "") {
    cmd->add_option("--atol", a.atol, "Actions: absolute tolerance, |new - base| <= atol + rtol*|base|" + when)
        ->check(CLI::NonNegativeNumber)->capture_default_str();
    cmd->add_option("--rtol", a.rtol, "Actions: relative tolerance (of the base value)" + when)
        ->check(CLI::NonNegativeNumber)->capture_default_str();
    cmd->add_option("--metric-tol", a.metric_tol, "Metrics: absolute tolerance on each MSE of metrics.json" + when)
        ->check(CLI::NonNegativeNumber)->capture_default_str();
    cmd->add_option("--time-tol", a.time_tol,
                    "Median s/call may grow by this much (10% or 0.1); not compared when absent" + when)
        ->check([](const std::string& text) {
            try {
                rollout::parse_fraction(text, "--time-tol");
                return std::string();
            } catch (const std::exception& e) {
                return std::string(e.what());
            }
        });
    cmd->add_flag("--allow-settings", a.allow_settings,
                  "Different run settings (seed, sampling, numerics) are listed but do not fail" + when);
    cmd->add_option("--json", a.json, "Write the comparison as JSON to FILE" + when);
    cmd->add_option("--junit", a.junit, "Write JUnit XML to FILE (one test case per episode)" + when);
}

/// Compares, prints the text report and writes the files asked for; returns the exit code (0, 1, 2).
/// Exit 2 also when a report cannot be written: CI must not read a missing file as a pass.
inline int run_compare(const std::string& base, const std::string& now, const CompareArgs& a) {
    try {
        const rollout::RunComparison c = rollout::compare_runs(base, now, a.options());
        std::printf("%s", rollout::compare_text(c).c_str());
        std::fflush(stdout);
        rollout::write_compare_reports(c, a.json, a.junit);
        return c.exit_code();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "dzr: error: compare: %s\n", e.what());
        return 2;
    }
}

}  // namespace dzr::app
