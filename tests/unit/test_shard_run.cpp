// A rank's part of a sharded run without the model: the plan shared by the ranks of one launch, the split
// of only the unfinished episodes on --resume, the rank's record and log, and the summary merged once, by
// the rank that finds every episode finished or failed.
#include <doctest/doctest.h>

#include <filesystem>
#include <set>
#include <string>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/episode_source.h"
#include "io/result_writer.h"
#include "io/synth_episode.h"
#include "rollout/run_plan.h"
#include "rollout/shard_run.h"
#include "support/json_file.h"
#include "support/test_support.h"

using namespace dzr;
using namespace dzr::rollout;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kFrames[] = {24, 48, 72, 24, 48};

/// Five small episodes (2, 3, 4, 2 and 3 calls) and an output directory.
struct Run {
    test::TempDir dir;
    std::vector<fs::path> dirs;
    std::vector<io::EpisodeRef> refs;
    std::vector<std::string> names;
    FrameSchedule schedule;

    Run() {
        for (size_t i = 0; i < std::size(kFrames); ++i) {
            io::SynthOptions so;
            so.frames = kFrames[i];
            so.width = 16;
            so.height = 16;
            names.push_back("ep_" + std::to_string(i));
            dirs.push_back(dir / ("eps/" + names.back()));
            io::write_synth_episode(dirs.back(), so);
        }
        refs = io::list_episode_refs(dir / "eps", {}, {}, {});
    }
    fs::path out() const { return dir / "out"; }

    std::unique_ptr<ShardRun> rank(int k, int n, const std::string& run_id, bool resume = false) const {
        ShardInfo s;
        s.source = run_id.empty() ? ShardSource::Explicit : ShardSource::Slurm;
        s.rank = k;
        s.world_size = n;
        s.run_id = run_id;
        return std::make_unique<ShardRun>(s, out(), refs, names, schedule, io::EpisodeOptions{}, resume, "cpu");
    }
    /// Makes episode `i` look finished (done marker) or failed (failure record).
    void finish(size_t i, bool ok = true) const {
        if (ok) {
            io::ResultWriter(out() / names[i]).mark_done(Json{{"num_frames", kFrames[i]}, {"num_calls", 2}});
        } else {
            io::ResultWriter::mark_failed(out() / names[i], Json{{"error", "bad input"}});
        }
    }
};

std::set<size_t> all_assigned(const RunPlan& p) {
    std::set<size_t> s;
    for (const auto& r : p.assignment) s.insert(r.begin(), r.end());
    return s;
}

}  // namespace

TEST_CASE("the ranks of one launch run the plan the first one wrote, each its own episodes") {
    Run run;
    const auto r0 = run.rank(0, 2, "slurm-7.0");
    const RunPlan& p = r0->plan();
    CHECK(p.episodes[2].frames == 72);
    CHECK(p.episodes[2].calls == 4);
    CHECK(all_assigned(p).size() == 5);
    CHECK(r0->episodes() == p.assignment[0]);
    CHECK(fs::exists(run.out() / "ranks/rank-0.json"));
    CHECK(fs::exists(run.out() / "logs/rank-0.log"));
    CHECK(r0->progress_prefix() == "rank 0/2  ");

    // The second rank takes what plan.json says, even a split it would not have made itself.
    RunPlan swapped = p;
    std::swap(swapped.assignment[0], swapped.assignment[1]);
    write_run_plan(run.out(), swapped);
    const auto r1 = run.rank(1, 2, "slurm-7.0");
    CHECK(r1->episodes() == p.assignment[0]);
    // Another launch (or another world size) plans again.
    const auto other = run.rank(1, 2, "slurm-8.0");
    CHECK(other->episodes() == p.assignment[1]);
    CHECK(read_run_plan(run.out())->run_id == "slurm-8.0");
}

TEST_CASE("the ranks of one --out must run the same settings: another fingerprint is refused naming it") {
    const Run run;
    const Json fp = {{"seed", 1140}, {"numerics", {{"backend", "cpu"}}}};
    Json other = fp;
    other["seed"] = 7;
    const auto r0 = run.rank(0, 2, "job-1");
    const auto r1 = run.rank(1, 2, "job-1");
    r0->check_run_fingerprint(fp, false);
    r1->check_run_fingerprint(fp, false);  // the same settings: fine
    CHECK(test::contains(test::error_of([&] { r1->check_run_fingerprint(other, false); }), "seed: 1140 (recorded) vs 7 (this run)"));
    // --force does not let a rank of the same launch differ
    CHECK(test::contains(test::error_of([&] { r1->check_run_fingerprint(other, true); }), "ranks of this launch"));
    // another launch into the same --out: refused, unless --force replaces that run
    const auto later = run.rank(0, 2, "job-2");
    CHECK(test::contains(test::error_of([&] { later->check_run_fingerprint(other, false); }), "--force replaces that run"));
    later->check_run_fingerprint(other, true);
    later->check_run_fingerprint(other, false);
    // an unsharded run checks nothing (its lock keeps it alone)
    const ShardRun single(ShardInfo{}, run.out(), run.refs, run.names, run.schedule, io::EpisodeOptions{}, false, "cpu");
    single.check_run_fingerprint(fp, false);
}

TEST_CASE("with --resume a launch splits only the unfinished episodes; --shard by hand splits every one") {
    Run run;
    run.finish(1);
    run.finish(2);
    const auto shared = run.rank(0, 2, "openmpi-5-ab", true);
    CHECK(all_assigned(shared->plan()) == std::set<size_t>{0, 3, 4});
    CHECK(shared->plan().resume);
    const auto by_hand = run.rank(0, 2, "", true);
    CHECK(all_assigned(by_hand->plan()).size() == 5);
}

TEST_CASE("a rank with nothing left to run says so without loading, only under --resume") {
    Run run;
    const auto r = run.rank(1, 2, "slurm-9.0", true);
    CHECK_FALSE(r->nothing_to_run(true).has_value());
    for (size_t e : r->episodes()) run.finish(e);
    const auto done = r->nothing_to_run(true);
    REQUIRE(done.has_value());
    CHECK(done->size() == r->episodes().size());
    for (const auto& e : *done) CHECK(e.status == "skipped");
    CHECK_FALSE(r->nothing_to_run(false).has_value());
    // More ranks than episodes: the empty ones have nothing to run either way.
    const auto idle = run.rank(6, 7, "slurm-10.0");
    CHECK(idle->episodes().empty());
    CHECK(idle->nothing_to_run(false).has_value());
}

TEST_CASE("the rank that finds every episode finished or failed merges the summary, once per state") {
    Run run;
    const auto r0 = run.rank(0, 2, "slurm-11.0");
    const auto r1 = run.rank(1, 2, "slurm-11.0");
    for (size_t e : r0->episodes()) run.finish(e);
    const ShardOutcome first = r0->finish({}, false, {});
    CHECK_FALSE(first.merged);
    CHECK(first.unfinished == int64_t(r1->episodes().size()));
    CHECK_FALSE(fs::exists(run.out() / "summary.json"));
    CHECK(test::read_json(run.out() / "ranks/rank-0.json")["status"] == "finished");

    const size_t failing = r1->episodes().front();
    for (size_t e : r1->episodes()) run.finish(e, e != failing);
    const ShardOutcome last = r1->finish({}, false, {});
    CHECK(last.merged);
    CHECK(last.failed == 1);
    CHECK(last.unfinished == 0);
    const auto summary = test::read_json(run.out() / "summary.json");
    CHECK(summary["totals"]["episodes"] == 5);
    CHECK(summary["totals"]["ok"] == 4);
    CHECK(summary["totals"]["failed"] == 1);
    CHECK(test::read_json(run.out() / "ranks/merged.json")["by"] == "rank 1/2");

    // A rank ending at the same moment finds the same state and leaves the summary alone.
    const auto t = fs::last_write_time(run.out() / "summary.json");
    CHECK_FALSE(r0->finish({}, false, {}).merged);
    CHECK(fs::last_write_time(run.out() / "summary.json") == t);
    // The failed episode rerun and finished: a new state, merged again.
    io::ResultWriter::clear_failed(run.out() / run.names[failing]);
    run.finish(failing);
    const ShardOutcome again = r1->finish({}, false, {});
    CHECK(again.merged);
    CHECK(again.failed == 0);
}

TEST_CASE("an unsharded run runs every episode and writes its plan and summary at the end only") {
    Run run;
    const ShardRun single(ShardInfo{}, run.out(), run.refs, run.names, run.schedule, io::EpisodeOptions{}, false, "cpu");
    CHECK(single.episodes().size() == 5);
    CHECK(single.progress_prefix().empty());
    CHECK_FALSE(fs::exists(run.out()));
}
