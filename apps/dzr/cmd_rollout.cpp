// `dzr rollout`: replay recorded episodes through a warm-up and the chunked rollout; write actions,
// timing reports, open-loop metrics and plots.
#include <algorithm>
#include <array>
#include <csignal>
#include <cstdio>

#include "apps/dzr/command.h"
#include "apps/dzr/compare_args.h"
#include "apps/dzr/datasets.h"
#include "apps/dzr/run_flags.h"
#include "backend/backend.h"
#include "config/run_config.h"
#include "core/error.h"
#include "core/log.h"
#include "io/plots.h"
#include "io/video_reader.h"
#include "rollout/progress.h"
#include "rollout/runner.h"

namespace dzr::app {
namespace {

struct RolloutArgs {
    std::vector<std::string> episodes;
    std::string select;  // --episodes: a dataset's episode_index ranges
    std::string split;
    std::string ckpt;
    std::string out;
    std::string config;
    std::vector<std::string> sets;
    RunFlags run_flags;  // --numerics, --kv, --precision, ... (config/settings.h)
    std::string device = "cpu";
    std::string profile;
    bool profile_graphs = false;
    std::string tokenizer;
    bool no_warmup = false;
    bool resume = false;
    bool force = false;
    bool skip_invalid = false;
    bool dry_run = false;
    bool allow_truncate = false;
    std::string prompt;
    int64_t metric_offset = 0;
    int64_t metric_steps = -1;
    bool no_plots = false;
    bool no_report = false;
    bool quiet = false;
    bool check_finite = false;
    std::string noise_video, noise_action;
    bool save_video = false;
    std::string shard;
    bool allow_shared_gpu = false;
    std::string baseline;  // compare the finished run with this output directory (`dzr compare`)
    CompareArgs compare;
};

/// The baseline is read, never written: a run into it would compare the run with itself.
void check_baseline(const RolloutArgs& a) {
    if (a.baseline.empty()) return;
    std::error_code ec;
    DZR_CHECK(std::filesystem::is_directory(a.baseline, ec), "--baseline {}: no such directory", a.baseline);
    const auto base = std::filesystem::weakly_canonical(a.baseline, ec);
    const auto out = std::filesystem::weakly_canonical(a.out, ec);
    const auto [end, _] = std::mismatch(base.begin(), base.end(), out.begin(), out.end());
    DZR_CHECK(end != base.end(), "--out {} lies in --baseline {}: the baseline is read, never written", a.out,
              a.baseline);
}

/// The rollout's exit code, or the comparison's when the run finished and the comparison did not pass.
int with_baseline(const RolloutArgs& a, int code, bool merged) {
    if (a.baseline.empty() || code == 130 || !merged) return code;
    std::printf("== compare with --baseline %s ==\n", a.baseline.c_str());
    const int cmp = run_compare(a.baseline, a.out, a.compare);
    return cmp != 0 ? cmp : code;
}

extern "C" void on_stop_signal(int sig) {
    // The first Ctrl-C (or SIGTERM: Slurm's time limit, mpirun aborting the job) asks the runner to stop
    // after the current call; a second one kills as usual.
    rollout::interrupt_flag().store(true);
    std::signal(sig, SIG_DFL);
}

/// The run's phases over its timed calls. A phase's statistics cover the calls that ran it, and the call totals
/// come in two groups: a window's first call (a reset: the KV window restarts, CLIP encodes the new reference frame,
/// nothing is committed) and the steady calls (the VAE encodes the newest frames and the DiT commits them).
void print_phase_table(const std::vector<rollout::EpisodeSummary>& episodes) {
    std::array<std::vector<double>, rollout::kNumPhases> phases;
    std::vector<double> prepare, resets, steady;
    size_t calls = 0;
    const size_t clip = size_t(rollout::Phase::ImageEncoder);
    for (const auto& ep : episodes) {
        calls += ep.call_ms.size();
        for (size_t p = 0; p < phases.size(); ++p)
            for (double ms : ep.phase_ms[p])
                if (ms > 0) phases[p].push_back(ms);
        prepare.insert(prepare.end(), ep.host_prepare_ms.begin(), ep.host_prepare_ms.end());
        for (size_t k = 0; k < ep.call_ms.size(); ++k)
            (k < ep.phase_ms[clip].size() && ep.phase_ms[clip][k] > 0 ? resets : steady).push_back(ep.call_ms[k]);
    }
    if (calls == 0) return;
    std::vector<std::vector<std::string>> rows;
    const auto add = [&](std::string name, const std::vector<double>& v) {
        if (v.empty()) return;
        const auto s = rollout::compute_stats(v);
        rows.push_back({std::move(name), fmt::format("{}/{}", v.size(), calls), fmt::format("{:.2f}", s.median),
                        fmt::format("{:.2f}", s.p90), fmt::format("{:.2f}", s.max)});
    };
    for (size_t p = 0; p < phases.size(); ++p) add(std::string(rollout::kPhaseNames[p]), phases[p]);
    add("call total: window resets", resets);
    add("call total: steady calls", steady);
    add("host prepare (overlapped)", prepare);
    std::printf("%s", rollout::format_table({"phase", "calls", "median ms", "p90 ms", "max ms"}, rows).c_str());
    std::printf("(each row over the timed calls that ran it: a window reset encodes its reference frame with CLIP and "
                "commits nothing; a steady call VAE-encodes and commits the newest frames; the prompts were encoded "
                "before the first call unless --no-text-prepass)\n");
}

int run(const RolloutArgs& a, const std::vector<std::string>& argv) {
    rollout::RolloutOptions o;
    o.checkpoint = a.ckpt;
    for (const auto& e : a.episodes) o.episodes.emplace_back(e);
    o.dataset_selection = {a.select, a.split};
    o.open_dataset = dataset_opener();
    o.out_dir = a.out;
    std::vector<config::Override> overrides;
    for (const auto& s : a.sets) overrides.push_back(config::parse_override(s));
    if (!a.config.empty()) {
        o.run = config::load_run_config(a.config, overrides);
        o.have_config_model = true;
    } else {
        DZR_CHECK(overrides.empty(), "--set needs --config (the settings it overrides come from a config file)");
    }
    a.run_flags.apply(o.run);
    o.overrides = a.sets;
    const rollout::EnvLookup env = rollout::process_environment();
    o.shard = rollout::detect_shard(env, a.shard.empty() ? std::nullopt : std::optional<std::string>(a.shard));
    o.devices = parse_device_list(a.device);
    rollout::GpuLock gpu_lock;
    if (o.devices.size() == 1) {
        // NOTE: `cuda` without an index lets a sharded rank take its local rank's GPU; `cuda:N` is kept as given.
        const Device requested = o.devices[0];
        o.devices[0] = rollout::rank_device(requested, a.device != "cuda", o.shard,
                                            requested.is_cuda() ? cuda_device_count() : 0, env, a.allow_shared_gpu);
        if (o.shard.sharded() && o.devices[0].is_cuda() && !a.allow_shared_gpu)
            gpu_lock = rollout::GpuLock(o.devices[0], o.shard, env);
    } else {
        DZR_CHECK(!o.shard.sharded(), "--device {}: a sharded run takes one device per rank (cuda picks the rank's GPU)",
                  a.device);
    }
    o.profile = a.profile;
    DZR_CHECK(!a.profile_graphs || !a.profile.empty(), "--profile-graphs needs --profile FILE");
    o.profile_graphs = a.profile_graphs;
    o.tokenizer = a.tokenizer;
    o.warmup = !a.no_warmup;
    o.resume = a.resume;
    o.force = a.force;
    o.skip_invalid = a.skip_invalid;
    o.dry_run = a.dry_run;
    o.allow_truncate = a.allow_truncate;
    if (!a.prompt.empty()) o.prompt = a.prompt;
    o.metrics.gt_offset = a.metric_offset;
    o.metrics.steps = a.metric_steps;
    if (!a.no_plots && io::video_io_available()) o.plot_png = io::render_plot_png;
    o.quiet = a.quiet;
    o.check_finite = a.check_finite;
    o.noise_video = a.noise_video;
    o.noise_action = a.noise_action;
    o.command_line = argv;
    o.open_video = io::open_video;
    o.save_video = a.save_video;
    if (a.save_video) o.video_encoder = io::browser_video_encoder();
    o.report = !a.no_report;

    std::signal(SIGINT, on_stop_signal);
    std::signal(SIGTERM, on_stop_signal);
    check_baseline(a);
    rollout::RolloutResult r = rollout::run_rollout(o);

    if (a.dry_run) {
        std::vector<std::vector<std::string>> rows;
        int invalid = 0;
        for (const auto& ep : r.episodes) {
            invalid += ep.status == "invalid";
            rows.push_back({ep.name, ep.status, ep.status == "invalid" ? "-" : std::to_string(ep.num_frames), ep.error});
        }
        std::printf("%s", rollout::format_table({"episode", "status", "frames", "problem"}, rows).c_str());
        std::printf("dry run: %zu episode%s checked (%d invalid); checkpoint headers, statistics, tokenizer and %s "
                    "checked; no weights loaded, nothing written\n",
                    r.episodes.size(), r.episodes.size() == 1 ? "" : "s", invalid, a.out.c_str());
        return 0;
    }

    // Final table on stdout: per-episode timing and the output paths.
    std::vector<std::vector<std::string>> rows;
    for (const auto& ep : r.episodes) {
        const auto s = rollout::compute_stats(ep.call_ms);
        rows.push_back({ep.name, ep.status, std::to_string(ep.num_calls), ep.call_ms.empty() ? "-" : fmt::format("{:.1f}", s.median),
                        ep.call_ms.empty() ? "-" : fmt::format("{:.1f}", s.p90),
                        ep.metrics ? fmt::format("{:.6g}", ep.metrics->overall_mse) : "-",
                        ep.status == "invalid" ? std::string("-") : (std::filesystem::path(a.out) / ep.name).string()});
    }
    std::printf("%s", rollout::format_table({"episode", "status", "calls", "median ms", "p90 ms", "mse", "output"}, rows).c_str());

    print_phase_table(r.episodes);
    if (o.report && r.shard.merged)
        std::printf("report: %s\n", (std::filesystem::path(a.out) / "report.html").string().c_str());
    for (const auto& ep : r.episodes) {
        if (ep.status == "failed") std::fprintf(stderr, "dzr: error: episode %s: %s\n", ep.name.c_str(), ep.error.c_str());
        if (ep.status == "invalid")
            std::fprintf(stderr, "dzr: warning: episode %s was not run (--skip-invalid): %s\n", ep.name.c_str(),
                         ep.error.c_str());
    }
    if (!o.shard.sharded()) {
        std::printf("summary: %s\n", (std::filesystem::path(a.out) / "summary.json").string().c_str());
        if (r.interrupted) return 130;
        return with_baseline(a, r.failed > 0 ? 1 : 0, true);
    }
    std::printf("%s: %s\n", o.shard.label().c_str(), r.shard.rank_file.string().c_str());
    if (r.shard.merged)
        std::printf("summary: %s (merged: %lld episodes, %lld failed)\n",
                    (std::filesystem::path(a.out) / "summary.json").string().c_str(),
                    (long long)r.shard.run_episodes, (long long)r.shard.failed);
    if (r.interrupted) return 130;
    // NOTE: mpirun aborts every rank when one exits non-zero, so a rank whose episodes failed still exits
    // 0; the rank that merges the summary reports the run's failures.
    return with_baseline(a, r.shard.merged && r.shard.failed > 0 ? 1 : 0, r.shard.merged);
}

CommandRegistrar reg([](CLI::App& app, std::function<int()>& run_fn) {
    auto args = std::make_shared<RolloutArgs>();
    auto* cmd = app.add_subcommand("rollout", "Replay recorded episodes through the DreamZero policy");
    cmd->add_option("inputs", args->episodes,
                    "LeRobot dataset roots (v2.0, v2.1, v3.0), episode directories, parent directories or list files")
        ->required();
    cmd->add_option("--episodes", args->select, "Of a LeRobot dataset, only these episode indices: 0-99,120");
    cmd->add_option("--split", args->split, "Of a LeRobot dataset, only the episodes of this split of meta/info.json");
    cmd->add_option("--ckpt", args->ckpt, "Checkpoint directory")->required();
    cmd->add_option("--out", args->out, "Output directory (one subdirectory per episode)")->required();
    cmd->add_option("--config", args->config, "Run config (configs/*.yaml): sampling, kv and rollout settings");
    cmd->add_option("--set", args->sets,
                    "Override a key of the --config file (needs --config): --set sampling.cfg_scale=3.5");
    args->run_flags.add(cmd, {"embodiment"});
    cmd->add_option("--device", args->device,
                    "cpu, cuda or cuda:N (cuda on a sharded run: the GPU of the rank's local rank); two devices "
                    "(cpu,cpu or cuda:0,cuda:1) run the unconditional CFG branch on the second")
        ->capture_default_str();
    args->run_flags.add(cmd, {"numerics", "kv.mode"});
    cmd->add_option("--profile", args->profile,
                    "profile the episodes' calls: every backend op timed with events, grouped by phase, forward and op "
                    "shape (CUPTI kernel counts on CUDA where built in); JSON to this file, a table on stderr; slows "
                    "every call down");
    cmd->add_flag("--profile-graphs", args->profile_graphs,
                  "with --profile: leave the ops untimed so the forwards replay their CUDA graphs; the profile then "
                  "counts each region's kernels, host launches and idle gaps (CUPTI)");
    args->run_flags.add(cmd, {"precision", "kv.dtype"});
    cmd->add_option("--tokenizer", args->tokenizer, "umT5 spiece.model (or a directory holding it)");
    cmd->add_flag("--no-warmup", args->no_warmup, "Skip the warm-up (timings then include first-call costs)");
    cmd->add_flag("--resume", args->resume,
                  "Skip episodes whose outputs are complete and were produced by the same run (checkpoint, config, "
                  "seed, numerics, dzr version); refuse when a finished episode came from another run");
    cmd->add_flag("--force", args->force,
                  "Run into an --out that holds an earlier run's episodes, replacing those this run has (without it, "
                  "such a run is refused; --resume finishes a run)");
    cmd->add_flag("--skip-invalid", args->skip_invalid,
                  "Run the valid episodes and record the invalid ones in the summary, instead of refusing the run");
    cmd->add_flag("--dry-run", args->dry_run,
                  "Validate options, episodes, the output directory, the checkpoint's headers and statistics and the "
                  "tokenizer; load no weights and write nothing");
    cmd->add_flag("--allow-truncate", args->allow_truncate, "Cut cameras and arrays of different lengths to the shortest");
    cmd->add_option("--prompt", args->prompt, "Replace every episode's prompt");
    cmd->add_option("--metric-offset", args->metric_offset, "Ground-truth row of step s of a call at anchor a: a + offset + s")
        ->capture_default_str()
        ->check(CLI::Range(-rollout::kMaxMetricOffset, rollout::kMaxMetricOffset));
    cmd->add_option("--metric-steps", args->metric_steps,
                    "Steps per chunk compared with ground truth (-1: all, else 1 to the action horizon)")
        ->capture_default_str();
    cmd->add_flag("--no-plots", args->no_plots, "Do not draw the per-dimension PNG plots");
    cmd->add_flag("--no-report", args->no_report, "Do not write report.html at the end (`dzr report OUT` writes it later)");
    cmd->add_flag("--quiet", args->quiet, "No start summary and no progress line");
    cmd->add_flag("--check-finite", args->check_finite, "Check every stage for NaN/Inf (slow; names the stage)");
    cmd->add_flag("--save-video", args->save_video,
                  "Decode the predicted video with the VAE decoder and write it next to the observed canvases "
                  "(predicted_video / observed_video: WebM or H.264 MP4, whichever this build encodes; .npy "
                  "on builds without OpenCV)");
    cmd->add_option("--shard", args->shard,
                    "Run shard K of N (K/N, 0 <= K < N) of the episodes; without it the rank comes from Slurm "
                    "(SLURM_PROCID/NTASKS, job arrays) or Open MPI (OMPI_COMM_WORLD_RANK/SIZE), when present");
    cmd->add_flag("--allow-shared-gpu", args->allow_shared_gpu,
                  "Let several ranks of a sharded run use one GPU (each loads its own copy of the model)");
    args->run_flags.add(cmd, {"gpu_memory_budget", "text_prepass", "cuda_graphs", "batch_cfg"});
    cmd->add_option("--baseline", args->baseline,
                    "After the run, compare it with this rollout output (`dzr compare BASELINE OUT`; exit 1 on a "
                    "difference, 2 when not comparable; docs/CI.md)");
    add_compare_options(cmd, args->compare, " (with --baseline)");
    cmd->add_option("--noise-video", args->noise_video, "Initial video noise from .npy (parity runs)");
    cmd->add_option("--noise-action", args->noise_action, "Initial action noise from .npy (parity runs)");
    cmd->callback([args, &run_fn] { run_fn = [args] { return run(*args, command_line()); }; });
});

}  // namespace
}  // namespace dzr::app
