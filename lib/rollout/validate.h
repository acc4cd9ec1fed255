#pragma once
/// Everything a rollout can check before the checkpoint's weights are loaded (minutes with the real 46 GB
/// checkpoint), so that a bad input costs seconds and leaves nothing behind:
///   1. options and their ranges;
///   2. every episode: all files, shapes, values (finite in float32), state, prompt; all problems of all
///      episodes are reported together;
///   3. the output directory: no output may land in or replace an input (io/output_guard.h); it is created,
///      a probe file is written and removed, and its lock is taken (io/run_lock.h);
///   4. the checkpoint's structure and geometry, and the tokenizer (loaded, each prompt tokenized);
///   5. the normalization statistics of the embodiment's keys (q01 < q99, min < max, std > 0) and, against them,
///      the episodes' state (far outside the range: one warning per episode naming the joint and the likely
///      cause);
///   6. the memory plan (run_memory.h) against --gpu-memory-budget (or the config's gpu_memory_budget);
///   7. --resume: the done episodes' fingerprints (fingerprint.h) against this run's.
/// Problems are gathered and thrown as one dzr::Error, in that order. With --skip-invalid the invalid
/// episodes are set aside (the summary records them) and the others run.
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "io/run_lock.h"
#include "policy/memory_plan.h"
#include "rollout/frame_schedule.h"
#include "rollout/reports.h"
#include "rollout/rollout_options.h"

namespace dzr::rollout {

/// The lock file a rollout holds in its output directory.
inline constexpr const char* kRunLockFile = ".dzr-rollout.lock";

/// What validation found about one episode.
struct EpisodeCheck {
    bool valid = false;
    std::string error;                  ///< why it cannot run (when !valid)
    std::vector<std::string> warnings;  ///< from the checks against the checkpoint (the state range)
    int64_t num_frames = 0;
    std::string prompt;
    std::string inputs_sha256;          ///< episode_inputs_sha256 of what was read; empty when the videos were
                                        ///< not decoded (the run hashes the episode when it reads it)
};

/// A run that passed validation.
struct ValidatedRun {
    std::vector<EpisodeCheck> episodes;  ///< one per planned episode
    std::vector<bool> finished;          ///< --resume: done by a run with the same fingerprint (skip it)
    /// --resume: done by a run with the same fingerprint, but a file its done marker lists is gone: the marker is
    /// removed and the episode runs again.
    std::vector<bool> stale;
    /// What fitting the memory plan to the budget (or the GPU's free memory) chose (check_memory).
    MemoryChoices memory_choices;
    Json fingerprint;                    ///< the run's fingerprint, without the episode part
    std::filesystem::path tokenizer;
    std::unique_ptr<io::RunLock> lock;  ///< held until the run ends (none for --dry-run); shared by a sharded run's ranks
    std::unique_ptr<io::RunLock> rank_lock;  ///< a sharded run: this rank's own (its episodes are its alone)
    std::vector<std::string> prompts;   ///< the valid episodes' distinct prompts (the text pre-pass's list)
    /// The run's memory plan (none for two devices without a budget, or when it could not be made).
    std::optional<MemoryPlan> memory_plan;

    /// Not run: invalid (only with --skip-invalid) or finished (--resume).
    bool runnable(size_t e) const { return episodes[e].valid && !finished[e]; }
    /// The fingerprint recorded in episode e's done marker.
    Json episode_fingerprint(size_t e) const;
    /// The same with the hash of the episode as the run read it (validation hashes only what it decoded).
    Json episode_fingerprint(size_t e, const std::string& inputs_sha256) const;
    /// The summary entry of an invalid episode (status "invalid", its error).
    EpisodeSummary invalid_summary(size_t e, const std::string& name) const;
};

/// The option problems (ranges and combinations) of `opt`, one line each; empty when fine.
std::vector<std::string> check_rollout_options(const RolloutOptions& opt);

/// Runs the checks above for the planned episodes (`refs`, output names `names`). Throws dzr::Error listing
/// every problem; logs the warnings.
ValidatedRun validate_run(const RolloutOptions& opt, const Embodiment& embodiment, const std::vector<io::EpisodeRef>& refs,
                          const std::vector<std::string>& names, const FrameSchedule& schedule);

}  // namespace dzr::rollout
