#pragma once
/// What `dzr rollout` was asked to do (the command line, the run config and the environment, resolved): the input
/// of the orchestrator (runner.h) and of the steps below it (validate.h, fingerprint.h, run_memory.h).
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "config/run_config.h"
#include "core/tensor.h"
#include "io/episode_source.h"
#include "io/plots.h"
#include "io/video_reader.h"
#include "policy/engine.h"
#include "rollout/launcher.h"
#include "rollout/reports.h"

namespace dzr::rollout {

struct RolloutOptions {
    std::filesystem::path checkpoint;
    /// As given: LeRobot dataset roots, episode dirs, parent dirs or list files (io::list_episode_refs).
    std::vector<std::filesystem::path> episodes;
    /// --episodes / --split: which episodes of the datasets among `episodes` run.
    io::DatasetSelection dataset_selection;
    std::filesystem::path out_dir;
    /// The run settings (config/settings.h): the config file, its --set overrides and the command line's flags
    /// (numerics, kv.mode, precision, embodiment, text_prepass, ...), resolved.
    config::RunConfig run;
    bool have_config_model = false;               ///< run.model came from a --config file: check it
    std::vector<std::string> overrides;           ///< as given, for the manifest
    /// One device, or two: the second runs the unconditional CFG branch (`--device cpu,cpu`, `cuda:0,cuda:1`).
    std::vector<Device> devices{Device::cpu()};
    std::string tokenizer;                        ///< empty: from the checkpoint
    bool warmup = true;
    bool resume = false;
    /// Run into an output directory that holds another run's finished episodes, replacing those it reruns (without
    /// it such a run is refused: --resume finishes a run, a new run wants a new directory).
    bool force = false;
    /// Run the valid episodes and record the invalid ones in the summary (status "invalid") instead of refusing
    /// the whole run.
    bool skip_invalid = false;
    /// Validate everything (options, episodes, checkpoint headers and statistics, tokenizer, output directory)
    /// and stop: no weights loaded, nothing written.
    bool dry_run = false;
    bool allow_truncate = false;
    std::optional<std::string> prompt;
    MetricsOptions metrics;
    /// Draws the per-dimension PNG plots (apps pass io::render_plot_png in builds with OpenCV); empty:
    /// none (the HTML report draws them as SVG either way).
    io::PlotRasterizer plot_png;
    bool quiet = false;
    bool check_finite = false;
    std::filesystem::path noise_video, noise_action;  ///< inject noise from .npy (parity runs)
    std::vector<std::string> command_line;
    /// This process's part of a sharded run (detect_shard()); unsharded by default.
    ShardInfo shard;
    io::VideoOpener open_video;                   ///< decodes .mp4 (apps pass io::open_video)
    /// Opens LeRobot datasets (apps pass dataset::open_lerobot in builds with Arrow and FFmpeg); empty: none.
    io::DatasetOpener open_dataset;
    /// --save-video: decode each episode's predicted video and write it with the observed canvases.
    bool save_video = false;
    /// Encodes the videos in a format browsers play (apps pass io::browser_video_encoder() when the
    /// build has one); without one they are written as uint8 .npy [T, H, W, 3] instead.
    std::optional<io::VideoEncoder> video_encoder;
    /// Writes report.html (and report/) in out_dir at the end (rollout/report_html.h).
    bool report = true;
    /// --profile: every backend op of the episodes' calls timed (backend/profiler.h; the warm-up's are dropped); the
    /// JSON goes to this file and the table to stderr at the end. Slows every call down.
    std::filesystem::path profile;
    /// --profile-graphs: with `profile`, the ops untimed so that the forwards replay their CUDA graphs (the profile
    /// counts each region's kernels, host launches and idle gaps only).
    bool profile_graphs = false;
};

}  // namespace dzr::rollout
