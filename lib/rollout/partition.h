#pragma once
/// The deterministic split of a run's episodes over its ranks: balanced by the number of policy calls
/// (what a rank's time is made of), the same on every rank and every machine for the same inputs.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace dzr::rollout {

/// One episode as the partition sees it.
struct EpisodeWork {
    std::string path;   ///< the episode directory as given (the sort key)
    int64_t calls = 0;  ///< policy calls the episode needs (0 when unknown: it is placed like a short one)
};

/// Longest-processing-time-first: the episodes are taken by calls, most first (ties by path), each onto
/// the rank with the fewest calls so far (ties: the rank with fewer episodes, then the lower rank).
/// Returns, for each of `ranks` ranks, the indices into `episodes` it runs, in path order. Every index
/// appears exactly once. Throws dzr::Error when `ranks` < 1.
std::vector<std::vector<size_t>> partition_by_calls(std::span<const EpisodeWork> episodes, int ranks);

/// The calls of each rank under `assignment`.
std::vector<int64_t> rank_loads(std::span<const EpisodeWork> episodes,
                                const std::vector<std::vector<size_t>>& assignment);

}  // namespace dzr::rollout
