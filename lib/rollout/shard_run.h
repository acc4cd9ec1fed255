#pragma once
/// This process's part of a rollout, and what it leaves for the other ranks and for `dzr summarize`:
///  - OUT/plan.json: the run's episodes and which rank runs which (run_plan.h). The ranks of one launch
///    share it: the first to start writes it under a file lock, the others read it. With --resume and a
///    launcher id, only the episodes still to do are split, so a run that lost one rank is resumed by all.
///  - OUT/ranks/rank-K.json: the rank's assignment when it starts, its episodes' outcomes when it ends;
///    OUT/logs/rank-K.log: its log (appended to across restarts).
///  - OUT/summary.json, summary.csv and the aggregate plots, written by the rank that finds, when it
///    ends, every episode of the run done or failed (the last one to finish); a run that lost a rank
///    writes none, and `dzr rollout --resume` (any number of ranks, any launcher) or `dzr summarize`
///    writes it later.
/// An unsharded run goes through the same steps as a single rank that writes its own summary.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io/episode_source.h"
#include "rollout/frame_schedule.h"
#include "rollout/launcher.h"
#include "rollout/reports.h"
#include "rollout/run_plan.h"
#include "rollout/summarize.h"

namespace dzr::rollout {

/// What a rank found and did when it ended.
struct ShardOutcome {
    bool merged = false;       ///< this process wrote OUT/summary.json
    int64_t run_episodes = 0;  ///< episodes of the whole run
    int64_t unfinished = 0;    ///< of them, neither done nor failed when this rank ended
    int64_t failed = 0;        ///< of them, failed (known when merged)
    std::filesystem::path rank_file;  ///< OUT/ranks/rank-K.json (sharded runs)
};

/// Writes `dir`/failed.json for an episode that could not be run: its error, the time, the rank and host.
/// A record that cannot be written is logged, never thrown: the run goes on with the next episode.
void record_failure(const std::filesystem::path& dir, const EpisodeSummary& episode, const ShardInfo& shard);

class ShardRun {
public:
    /// Plans the run (or reads the plan of this launch), writes the rank's record and opens its log.
    /// `refs` and `names` are the whole run's episodes; `episode_options` serve to count their frames.
    ShardRun(const ShardInfo& shard, const std::filesystem::path& out_dir, const std::vector<io::EpisodeRef>& refs,
             const std::vector<std::string>& names, const FrameSchedule& schedule,
             const io::EpisodeOptions& episode_options, bool resume, const std::string& device);
    ~ShardRun();
    ShardRun(const ShardRun&) = delete;
    ShardRun& operator=(const ShardRun&) = delete;

    const ShardInfo& shard() const { return shard_; }
    const RunPlan& plan() const { return plan_; }
    /// The indices (into the run's episodes) this process runs, in order.
    const std::vector<size_t>& episodes() const { return mine_; }
    /// "rank 1/3  " to start progress lines with; empty when unsharded.
    std::string progress_prefix() const;
    /// A sharded run: every rank runs the same settings. The first rank of a launch records the run fingerprint (the
    /// settings, checkpoint and numerics: fingerprint.h) in ranks/fingerprint.json; a rank of the same launch with
    /// another one, or of another launch without --force, is refused naming the differences, before any episode
    /// is written. Nothing for an unsharded run (its lock keeps it alone).
    void check_run_fingerprint(const Json& fingerprint, bool force) const;

    /// An unsharded run's plan.json, written before its first episode (a sharded run writes it when it plans), so
    /// that `dzr summarize` lists the planned episodes a killed run never reached.
    void write_plan_first() const;

    /// With --resume, when every episode of this process is already done (or it has none): their
    /// summaries (status "skipped"), so that the caller need not load the checkpoint. Else nullopt.
    std::optional<std::vector<EpisodeSummary>> nothing_to_run(bool resume) const;

    /// Records an episode's outcome in the rank log (sharded runs).
    void note(const EpisodeSummary& episode) const;

    /// Writes what the process leaves at the end (see above): an unsharded run's plan, summary and plots;
    /// a rank's final record, then the merged summary when the run is complete.
    ShardOutcome finish(std::span<const EpisodeSummary> episodes, bool interrupted, const PlotPng& plot_png);

private:
    void plan_sharded(const std::vector<io::EpisodeRef>& refs, const FrameSchedule& schedule,
                      const io::EpisodeOptions& episode_options, bool resume);
    void write_rank_file(const nlohmann::ordered_json& extra) const;
    ShardOutcome merge_if_complete(const PlotPng& plot_png);

    ShardInfo shard_;
    std::filesystem::path out_dir_;
    std::string device_;
    std::string started_;
    RunPlan plan_;
    std::vector<size_t> mine_;
    nlohmann::ordered_json assigned_;  ///< the rank's episodes and calls, for its record
    struct RankLog;
    std::unique_ptr<RankLog> log_;
};

}  // namespace dzr::rollout
