// The split of a run's episodes over its ranks: every episode once, longest first onto the least-loaded
// rank, ties by path, the same whatever order the episodes come in; and OUT/plan.json round trips.
#include <doctest/doctest.h>

#include <algorithm>
#include <random>
#include <set>

#include "core/error.h"
#include "io/atomic_file.h"
#include "rollout/partition.h"
#include "rollout/run_plan.h"
#include "support/test_support.h"

using namespace dzr;
using namespace dzr::rollout;

namespace {

std::vector<std::string> names_of(const std::vector<EpisodeWork>& eps, const std::vector<size_t>& idx) {
    std::vector<std::string> n;
    for (size_t i : idx) n.push_back(eps[i].path);
    return n;
}

}  // namespace

TEST_CASE("episodes go longest first onto the least-loaded rank and each rank runs its own in path order") {
    const std::vector<EpisodeWork> eps = {{"e/a", 3}, {"e/b", 5}, {"e/c", 3}, {"e/d", 4}, {"e/e", 3}};
    const auto p = partition_by_calls(eps, 2);
    REQUIRE(p.size() == 2);
    // b(5) -> 0; d(4) -> 1; a(3) -> 1 (4 < 5); c(3) -> 0 (5 < 7); e(3) -> 1 (7 < 8).
    CHECK(names_of(eps, p[0]) == std::vector<std::string>{"e/b", "e/c"});
    CHECK(names_of(eps, p[1]) == std::vector<std::string>{"e/a", "e/d", "e/e"});
    CHECK(rank_loads(eps, p) == std::vector<int64_t>{8, 10});
}

TEST_CASE("the partition does not depend on the order the episodes are listed in") {
    std::vector<EpisodeWork> eps;
    for (int i = 0; i < 40; ++i) eps.push_back({"ep_" + std::to_string(1000 + i), int64_t((i * 7) % 5 + 1)});
    const auto p = partition_by_calls(eps, 6);
    std::vector<EpisodeWork> shuffled = eps;
    std::mt19937 rng(3);
    std::shuffle(shuffled.begin(), shuffled.end(), rng);
    const auto q = partition_by_calls(shuffled, 6);
    for (size_t r = 0; r < 6; ++r) CHECK(names_of(eps, p[r]) == names_of(shuffled, q[r]));
}

TEST_CASE("every episode is assigned once and the loads differ by at most the longest episode") {
    std::mt19937 rng(11);
    for (int trial = 0; trial < 50; ++trial) {
        const int n = int(rng() % 60);
        const int ranks = 1 + int(rng() % 9);
        std::vector<EpisodeWork> eps;
        int64_t longest = 0;
        for (int i = 0; i < n; ++i) {
            eps.push_back({"ep" + std::to_string(rng() % 1000), int64_t(rng() % 30)});
            longest = std::max(longest, eps.back().calls);
        }
        const auto p = partition_by_calls(eps, ranks);
        REQUIRE(p.size() == size_t(ranks));
        std::multiset<size_t> seen;
        for (const auto& r : p) seen.insert(r.begin(), r.end());
        REQUIRE(seen.size() == size_t(n));
        for (int i = 0; i < n; ++i) REQUIRE(seen.count(size_t(i)) == 1);
        const auto loads = rank_loads(eps, p);
        const auto [lo, hi] = std::minmax_element(loads.begin(), loads.end());
        CHECK(*hi - *lo <= longest);
    }
}

TEST_CASE("episodes of unknown length and ranks without episodes are spread by count") {
    const std::vector<EpisodeWork> eps = {{"a", 0}, {"b", 0}, {"c", 0}, {"d", 0}};
    const auto p = partition_by_calls(eps, 3);
    CHECK(p[0].size() == 2);
    CHECK(p[1].size() == 1);
    CHECK(p[2].size() == 1);
    const auto q = partition_by_calls(std::vector<EpisodeWork>{{"a", 4}}, 3);
    CHECK(q[0].size() == 1);
    CHECK(q[1].empty());
    CHECK(q[2].empty());
    CHECK_THROWS_AS(partition_by_calls(eps, 0), Error);
}

TEST_CASE("plan.json round trips, and a damaged one is an error naming the file") {
    test::TempDir dir;
    RunPlan plan;
    plan.run_id = "slurm-12.0";
    plan.world_size = 2;
    plan.launcher = "slurm";
    plan.created = "2026-12-01T00:00:00Z";
    plan.resume = true;
    plan.episodes = {{"a", "eps/a", 24, 2}, {"b", "eps/b", std::nullopt, std::nullopt}, {"c", "eps/c", 48, 3}};
    plan.assignment = {{0, 1}, {2}};
    write_run_plan(dir.path(), plan);
    const auto back = read_run_plan(dir.path());
    REQUIRE(back.has_value());
    CHECK(back->run_id == plan.run_id);
    CHECK(back->world_size == 2);
    CHECK(back->resume);
    CHECK(back->same_episodes(plan));
    CHECK(back->episodes[1].frames == std::nullopt);
    CHECK(back->episodes[2].calls == 3);
    CHECK(back->assignment == plan.assignment);
    CHECK_FALSE(read_run_plan(dir / "elsewhere").has_value());

    io::write_file_atomic(dir / "plan.json", "{\"run_id\": 3}");
    try {
        read_run_plan(dir.path());
        FAIL("no error");
    } catch (const Error& e) {
        CHECK(std::string(e.what()).find("plan.json") != std::string::npos);
    }
    // A rank running an episode the plan does not list.
    auto j = plan.to_json();
    j["ranks"][0]["episodes"].push_back(7);
    io::write_file_atomic(dir / "plan.json", j.dump());
    CHECK_THROWS_AS(read_run_plan(dir.path()), Error);
}
