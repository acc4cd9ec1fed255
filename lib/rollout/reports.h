#pragma once
/// Rollout reports: per-call timing (timing.json), the run manifest (manifest.json), action metrics
/// against ground truth (metrics.json, mse.csv, gt_actions.npy, plots) and the summary over many episodes
/// (summary.json, summary.csv). docs/FORMATS.md documents every field.
#include <array>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/plots.h"
#include "io/result_writer.h"

namespace dzr::rollout {

/// JSON that keeps fields in the order they were written (reports read top-down).
using Json = nlohmann::ordered_json;

// ---- timing ----

/// The phases of one policy call, in pipeline order.
enum class Phase : int { Preprocess, TextEncoder, ImageEncoder, VaeEncode, KvCommit, Dit, Scheduler, Postprocess };
inline constexpr int kNumPhases = 8;
inline constexpr std::array<std::string_view, kNumPhases> kPhaseNames = {
    "preprocess", "text_encoder", "image_encoder", "vae_encode", "kv_commit", "dit", "scheduler", "postprocess"};

struct CallTiming {
    int64_t call = 0;
    int64_t anchor = 0;
    std::vector<int64_t> frames;
    /// Counted in the summary (the runner sets false for calls it does not want in the statistics).
    bool timed = true;
    double total_ms = 0;
    std::array<double, kNumPhases> phase_ms{};
    /// DreamZeroPolicy::prepare()'s host time; the runner prefetches it during the previous call, so
    /// it is not part of total_ms.
    double host_prepare_ms = 0;
    /// DiT evaluations of the denoising loop (per CFG branch): what the step plan ran in this call.
    int dit_evaluations = 0;

    double& phase(Phase p) { return phase_ms[size_t(p)]; }
};

/// Order statistics of a set of durations. Percentiles interpolate linearly between the two
/// nearest ranks (numpy's default): p(q) = v[floor(h)] + (h - floor(h)) (v[floor(h)+1] - v[floor(h)]),
/// h = q (n - 1) over the sorted values.
struct TimingStats {
    int64_t count = 0;
    double mean = 0, median = 0, p90 = 0, min = 0, max = 0;
};

TimingStats compute_stats(std::span<const double> values);
/// Milliseconds rounded to microseconds: the timers resolve no finer, and 15 digits of noise help nobody.
double ms_us(double ms);
/// {"count", "mean", "median", "p90", "min", "max"} in milliseconds rounded to microseconds.
Json stats_json(const TimingStats& s);
double percentile(std::span<const double> sorted, double q);

/// --save-video: the episode's predicted video, decoded once after the last call (not in any call's
/// total).
struct VideoTiming {
    int64_t latent_frames = 0;  ///< K: the calls' video predictions joined along time
    int64_t frames = 0;         ///< 1 + 4 (K - 1) decoded frames
    double fps = 0;
    double decode_ms = 0;       ///< upload, VAE decode, download and the uint8 conversion
    double write_ms = 0;        ///< the observed canvases and both files
};

/// The memory plan's figures (policy/memory_plan.h) a timing report carries next to the measured peak.
struct PlannedMemory {
    bool cuda = false;       ///< planned for a CUDA device (on the CPU: the engine's host memory)
    int64_t peak_bytes = 0;  ///< the plan's peak over its phases
    std::string peak_phase;  ///< "rollout", "text_prepass", ...
    Json phases = Json::object();  ///< phase key -> planned bytes
};

struct TimingReport {
    std::string device;
    double checkpoint_load_ms = 0;
    int64_t warmup_calls = 0;
    double warmup_ms = 0;
    std::optional<int64_t> peak_gpu_memory_bytes;  // null when not measured (CPU)
    std::optional<PlannedMemory> memory_plan;      // null when the run made no plan
    std::optional<VideoTiming> video;              // null without --save-video
    /// Each GPU's telemetry over the episode's calls (backend/gpu_telemetry.h: SM clock, power, limit reasons, energy
    /// and energy per call); empty on the CPU.
    Json gpu_telemetry = Json::array();
    std::vector<CallTiming> calls;

    /// Statistics of total_ms over the timed calls.
    TimingStats total_stats() const;
    Json to_json() const;
};

// ---- run manifest ----

struct RunManifest {
    std::string episode;
    std::string checkpoint;
    Json config = Json::object();  // the resolved configuration, overrides applied
    std::vector<std::string> overrides;                // as given on the command line
    uint64_t seed = 0;
    std::string device;
    std::vector<std::string> command_line;
    std::string start_time;  // ISO 8601 UTC
    Json extra = Json::object();

    /// Adds dzr_version and git_hash (DZR_VERSION, DZR_GIT_HASH) to the fields above.
    Json to_json() const;
};

/// "2025-11-29T17:05:03Z".
std::string iso8601_utc(std::chrono::system_clock::time_point t);

// ---- action metrics ----

/// A named slice of the action vector.
struct ActionKey {
    std::string_view name;
    int begin = 0;
    int end = 0;
};
/// DROID: 7 absolute joint positions, then the gripper position.
inline constexpr std::array<ActionKey, 2> kDroidActionKeys = {{{"joint_position", 0, 7}, {"gripper_position", 7, 8}}};

/// The bound of --metric-offset (frames): far beyond any episode, and small enough that the row arithmetic
/// cannot overflow.
inline constexpr int64_t kMaxMetricOffset = 1'000'000;

struct MetricsOptions {
    /// Predicted step s of the call anchored at frame a is compared with ground-truth row
    /// a + gt_offset + s. 0 follows the training data (action rows a .. a+23 go with the state at
    /// a) and open_loop_yam.py (first step vs the action at the observation's index).
    int64_t gt_offset = 0;
    /// Compare only the first `steps` steps of every chunk; -1 = the whole horizon.
    /// (open_loop_yam.py compares 1.)
    int64_t steps = -1;
};

struct Metrics {
    MetricsOptions options;
    double overall_mse = 0;
    std::vector<std::pair<std::string, double>> per_key;
    std::vector<double> per_dim;
    std::vector<double> per_step;  // by step within the chunk (NaN where nothing was compared)
    std::vector<double> per_call;  // by call (NaN where nothing was compared)
    int64_t compared_steps = 0;    // (call, step) pairs with a ground-truth row
    int64_t skipped_steps = 0;     // pairs whose row falls outside the episode

    Json to_json() const;
    /// Reads what to_json() wrote (for --resume summaries); throws dzr::Error naming `source`.
    static Metrics from_json(const Json& j, const std::string& source);
    /// open_loop_yam.py's mse.txt lines: overall_mse,<v> / action.<key>,<v> / dim_<d>,<v>.
    std::string mse_csv() const;
};

/// Compares predicted chunks with ground-truth actions `gt` ([gt_rows, dims] row-major).
/// Values are NaN when no step has a ground-truth row.
Metrics compute_metrics(const io::ActionChunks& pred, std::span<const double> gt, int64_t gt_rows,
                        const MetricsOptions& options = {},
                        std::span<const ActionKey> keys = kDroidActionKeys);

/// The per-dimension action plots: the ground truth over all frames (`gt_rows` rows; none when 0) and
/// each call's chunk as its own segment in its own colour, placed at the frames it is compared with
/// (`metrics`' alignment; every step at its anchor when null). Titles carry the MSE per dimension and name the
/// dimension's key when `keys` cover the dims.
std::vector<io::PlotSpec> action_plot_specs(const io::ActionChunks& pred, std::span<const double> gt, int64_t gt_rows,
                                            const Metrics* metrics, std::span<const ActionKey> keys = kDroidActionKeys);

/// action_dim_<d>.png for every dimension and all_action_dims.png (the grid of them), drawn by `png`.
void write_action_plots(io::ResultWriter& out, const io::ActionChunks& pred, std::span<const double> gt,
                        int64_t gt_rows, const Metrics& metrics, const io::PlotRasterizer& png,
                        std::span<const ActionKey> keys = kDroidActionKeys);

/// The ground-truth actions next to the predictions (float64 [gt_rows, dims]), for reports.
inline constexpr std::string_view kGtActionsFile = "gt_actions.npy";

/// metrics.json, mse.csv, gt_actions.npy and (when `png` is set) the PNG plots for one episode;
/// returns the metrics.
Metrics write_metrics(io::ResultWriter& out, const io::ActionChunks& pred, std::span<const double> gt,
                      int64_t gt_rows, const MetricsOptions& options = {}, const io::PlotRasterizer& png = {},
                      std::span<const ActionKey> keys = kDroidActionKeys);

// ---- summary over episodes ----

struct EpisodeSummary {
    std::string name;
    /// "ok", "failed", "skipped" (finished by an earlier run), "interrupted" (Ctrl-C), "incomplete" (a merged
    /// summary's episode that has no done marker: never run, or its run was killed) or "invalid" (set aside by
    /// --skip-invalid)
    std::string status;
    std::string error;   // the error message when failed
    int64_t num_frames = 0;
    int64_t num_calls = 0;
    std::optional<Metrics> metrics;
    std::vector<double> call_ms;  // total_ms of the timed calls
    std::array<std::vector<double>, kNumPhases> phase_ms;  // per phase, over the timed calls
    std::vector<double> host_prepare_ms;                   // prepare()'s host time, over the timed calls
    /// The GPUs' energy over the episode's calls (timing.json's gpu_telemetry, summed over GPUs) and the calls it
    /// covers (every call of the episode, timed or not); nullopt where not measured (CPU, no NVML).
    std::optional<double> gpu_energy_j;
    int64_t gpu_energy_calls = 0;
};

/// The summary of an episode finished by an earlier run (for --resume): status "skipped",
/// num_frames and num_calls from done.json (when the runner put them there), metrics from
/// metrics.json (when present) and call_ms from timing.json's timed calls (when present).
EpisodeSummary summary_from_outputs(const std::filesystem::path& dir, const std::string& name);
/// Adds the timed calls of `dir`/timing.json (when present) to `e`: call_ms, phase_ms, host_prepare_ms, and the GPU
/// energy (set_gpu_energy).
void read_call_timings(const std::filesystem::path& dir, EpisodeSummary& e);
/// e.gpu_energy_j and gpu_energy_calls from a timing report's gpu_telemetry array: the sum of its entries' energy_j
/// (none when any GPU lacks one), over `calls` calls.
void set_gpu_energy(const Json& telemetry, int64_t calls, EpisodeSummary& e);

Json summary_json(std::span<const EpisodeSummary> episodes);
std::string summary_csv(std::span<const EpisodeSummary> episodes);
/// summary.json and summary.csv in `out_dir`, atomically.
void write_summary(const std::filesystem::path& out_dir, std::span<const EpisodeSummary> episodes);

}  // namespace dzr::rollout
