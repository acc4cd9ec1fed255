#pragma once
/// `dzr compare BASE NEW`: two rollout output directories, episode by episode and call by call, for CI
/// regressions (docs/CI.md). It reads the files the rollout wrote (actions.npy, metrics.json, timing.json,
/// done.json with the run fingerprint) through the readers `dzr summarize` uses, and judges:
///
///   actions    every value: |new - base| <= atol + rtol * |base| (numpy's isclose, base as the reference);
///              NaN equals NaN only
///   metrics    overall_mse, per_key_mse and per_dim_mse: |new - base| <= metric_tol
///   timing     (when asked) the median call time: new <= base * (1 + time_tol)
///   settings   the fingerprints' run settings, seed and numerics must agree (unless allowed); the checkpoint,
///              dzr version, tokenizer and the CPU's BLAS kernels are what a regression run changes: listed
///   episodes   each side's episodes must be finished ("ok") and the same set on both sides
///
/// The verdict: 0 all within tolerance, 1 a difference or a missing/unfinished episode, 2 the runs cannot be
/// compared (not rollout outputs, unreadable or damaged files, different action widths).
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "rollout/fingerprint.h"

namespace dzr::rollout {

struct CompareOptions {
    double atol = 0;                 ///< absolute tolerance on every action value
    double rtol = 0;                 ///< relative tolerance (of the base value)
    double metric_tol = 0;           ///< absolute tolerance on each MSE of metrics.json
    std::optional<double> time_tol;  ///< median s/call may grow by this fraction; nullopt: not compared
    bool allow_settings = false;     ///< differing run settings are listed but do not fail the comparison
    size_t max_calls_listed = 5;     ///< drifting calls named per episode in the text report
};

enum class Verdict { Pass, Fail, Error };
const char* verdict_name(Verdict v);

/// One action value: where it is and how far apart the two runs are.
struct ValueDiff {
    int64_t call = 0, step = 0, dim = 0;
    double base = 0, now = 0;
    double abs = 0, rel = 0;  ///< rel = abs / |base| (infinite when base is 0 and they differ)
};

struct CallDrift {
    int64_t call = 0;
    int64_t out_of_tolerance = 0;  ///< values of the call beyond the tolerance
    ValueDiff worst;               ///< the value furthest beyond its tolerance
    double max_abs = 0, max_rel = 0;
};

struct ScalarDiff {
    std::string name;  ///< "overall_mse", "per_key_mse.joint_position", "per_dim_mse[3]", "median_call_ms"
    std::optional<double> base, now;
    bool ok = true;
};

struct EpisodeComparison {
    std::string name;
    Verdict verdict = Verdict::Pass;
    std::string base_status, new_status;  ///< summarize's status, or "absent"
    int64_t calls = 0, values = 0, out_of_tolerance = 0;
    double max_abs = 0, max_rel = 0;
    std::optional<ValueDiff> worst;
    std::vector<CallDrift> drifting_calls;  ///< every call with a value beyond tolerance, by call
    std::vector<ScalarDiff> metrics;
    std::optional<ScalarDiff> timing;
    std::vector<FieldDifference> input_differences;  ///< the fingerprints' episode part (frames, prompt)
    std::vector<std::string> problems;               ///< one line per reason it did not pass
};

struct RunComparison {
    std::filesystem::path base, now;
    CompareOptions options;
    std::vector<FieldDifference> settings;     ///< run settings, seed, numerics: must agree
    std::vector<FieldDifference> environment;  ///< checkpoint, dzr version, tokenizer, BLAS kernels: listed
    std::vector<EpisodeComparison> episodes;   ///< base's order, then episodes only NEW has
    std::vector<std::string> errors;           ///< why the runs cannot be compared at all

    Verdict verdict() const;
    /// 0 pass, 1 fail, 2 cannot be compared.
    int exit_code() const;
};

/// Compares two rollout output directories. Problems with the inputs are recorded in the result (errors,
/// per-episode problems), never thrown.
RunComparison compare_runs(const std::filesystem::path& base, const std::filesystem::path& now,
                           const CompareOptions& options);

/// The text report: a table of every episode, then the drifting calls, the setting differences and the verdict.
std::string compare_text(const RunComparison& c);
nlohmann::ordered_json compare_json(const RunComparison& c);
/// JUnit XML: one test case per episode, and one for the run's settings.
std::string compare_junit(const RunComparison& c);

/// Writes the JSON and JUnit reports (atomically) where paths are given; empty paths are skipped.
void write_compare_reports(const RunComparison& c, const std::filesystem::path& json_file,
                           const std::filesystem::path& junit_file);

/// A tolerance given as a fraction ("0.1") or a percentage ("10%"); throws dzr::Error naming `flag`.
double parse_fraction(const std::string& text, const std::string& flag);

}  // namespace dzr::rollout
