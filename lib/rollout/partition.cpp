#include "rollout/partition.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"

namespace dzr::rollout {

std::vector<std::vector<size_t>> partition_by_calls(std::span<const EpisodeWork> episodes, int ranks) {
    DZR_CHECK(ranks >= 1, "cannot split episodes over {} ranks", ranks);
    std::vector<size_t> order(episodes.size());
    std::iota(order.begin(), order.end(), size_t(0));
    const auto by_path = [&](size_t a, size_t b) {
        // NOTE: the index breaks ties between equal paths, so the order is total and the result the same
        // with any sort implementation.
        if (episodes[a].path != episodes[b].path) return episodes[a].path < episodes[b].path;
        return a < b;
    };
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
        if (episodes[a].calls != episodes[b].calls) return episodes[a].calls > episodes[b].calls;
        return by_path(a, b);
    });
    std::vector<std::vector<size_t>> assignment(static_cast<size_t>(ranks));
    std::vector<int64_t> load(static_cast<size_t>(ranks), 0);
    for (size_t e : order) {
        size_t best = 0;
        for (size_t r = 1; r < size_t(ranks); ++r) {
            const bool lighter = load[r] < load[best];
            const bool fewer = load[r] == load[best] && assignment[r].size() < assignment[best].size();
            if (lighter || fewer) best = r;
        }
        assignment[best].push_back(e);
        load[best] += std::max<int64_t>(episodes[e].calls, 0);
    }
    for (auto& a : assignment) std::sort(a.begin(), a.end(), by_path);
    return assignment;
}

std::vector<int64_t> rank_loads(std::span<const EpisodeWork> episodes,
                                const std::vector<std::vector<size_t>>& assignment) {
    std::vector<int64_t> loads;
    for (const auto& a : assignment) {
        int64_t sum = 0;
        for (size_t e : a) sum += std::max<int64_t>(episodes[e].calls, 0);
        loads.push_back(sum);
    }
    return loads;
}

}  // namespace dzr::rollout
