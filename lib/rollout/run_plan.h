#pragma once
/// OUT/plan.json: the episodes of a rollout and, for a sharded run, which rank runs which. Every run
/// writes it; `dzr summarize` reads its episode list, and the ranks of one sharded launch share it (the
/// first rank to start writes it under a file lock, the others read it), so that a resumed run splits
/// only the episodes still to do and every rank agrees on the split. docs/FORMATS.md lists the fields.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace dzr::rollout {

inline constexpr std::string_view kPlanFile = "plan.json";

struct PlannedEpisode {
    std::string name;               ///< the output subdirectory
    std::string dir;                ///< the episode directory as given
    std::optional<int64_t> frames;  ///< from the file headers (sharded runs; null when unknown)
    std::optional<int64_t> calls;   ///< policy calls on the run's schedule (sharded runs)
};

struct RunPlan {
    std::string run_id;     ///< the launch that wrote it (empty: no launcher id)
    int world_size = 1;
    std::string launcher;   ///< shard_source_name()
    std::string created;    ///< ISO 8601 UTC
    bool resume = false;
    std::vector<PlannedEpisode> episodes;  ///< every episode of the run, in the run's order
    /// For each rank, the indices into `episodes` it runs, in order. With --resume and a launcher id, the
    /// episodes finished before the run are in no rank's list.
    std::vector<std::vector<size_t>> assignment;

    /// True when `other` lists the same episodes (names and directories) in the same order.
    bool same_episodes(const RunPlan& other) const;
    nlohmann::ordered_json to_json() const;
    /// Reads what to_json() wrote; throws dzr::Error naming `source`.
    static RunPlan from_json(const nlohmann::ordered_json& j, const std::string& source);
};

/// OUT/plan.json, or nullopt when there is none; throws dzr::Error when it is damaged.
std::optional<RunPlan> read_run_plan(const std::filesystem::path& out_dir);
/// Writes OUT/plan.json atomically.
void write_run_plan(const std::filesystem::path& out_dir, const RunPlan& plan);

}  // namespace dzr::rollout
