// Sharded `dzr rollout` end to end (tiny config, CPU): `mpirun -np 3` over 7 synthetic episodes writes
// the outputs of a single-process run bit for bit and one merged summary equal to its summary (timings
// aside); a rank killed mid-episode (SIGKILL) is completed by `--resume` with a different number of ranks,
// then by hand-started `--shard K/N` ranks that find nothing left to do. Needs Open MPI's mpirun
// (scripts/setup.sh installs openmpi-bin); without it the test reports skipped.
#include <doctest/doctest.h>

#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "config/run_config.h"
#include "io/atomic_file.h"
#include "io/result_writer.h"
#include "io/synth_episode.h"
#include "model/inventory.h"
#include "support/child_process.h"
#include "support/json_file.h"
#include "support/test_support.h"
#include "weights/random_checkpoint.h"

using namespace dzr;
namespace fs = std::filesystem;
using test::read_json;

namespace {

/// Calls of the 7 episodes (24 frames: the first call and one chunk; 48: one more).
constexpr int64_t kFrames[] = {24, 48, 24, 48, 24, 24, 48};
constexpr size_t kEpisodes = std::size(kFrames);

/// What every run shares: the binary, mpirun, the checkpoint, the episodes and the single-process
/// reference outputs, made once for the file.
struct Fixture {
    test::TempDir dir;
    std::string bin;
    std::string mpirun;
    std::vector<std::string> names;
    bool ok = false;
    std::string why_not;

    Fixture() {
        const char* b = std::getenv("DZR_BIN");
        if (!b || !fs::exists(b)) {
            why_not = "DZR_BIN is not built (run through ctest after building dzr_cli)";
            return;
        }
        bin = b;
        mpirun = test::find_in_path("mpirun").string();
        if (mpirun.empty()) {
            why_not = "mpirun is not installed (scripts/setup.sh installs openmpi-bin)";
            return;
        }
        // NOTE: one BLAS thread per process: three ranks share two cores here, and every run (the
        // reference included) computes with the same settings.
        setenv("OPENBLAS_NUM_THREADS", "1", 1);
        const auto cfg = config::load_run_config(test::source_dir() / "configs/tiny.yaml");
        MakeOptions mo;
        mo.dtype = DType::F32;
        mo.tokenizer = test::data_dir() / "tokenizer/spiece.model";
        write_random_checkpoint(cfg.model, mo, dir / "ckpt");
        for (size_t i = 0; i < kEpisodes; ++i) {
            io::SynthOptions so;
            so.frames = kFrames[i];
            so.seed = i;
            so.width = 160;
            so.height = 90;
            names.push_back("ep_" + std::to_string(i));
            io::write_synth_episode(dir / ("eps/" + names.back()), so);
        }
        test::Child single(rollout_args("single"));
        const int code = single.wait_exit_code();
        INFO("stderr:\n" << single.err());
        REQUIRE(code == 0);
        ok = true;
    }

    std::vector<std::string> rollout_args(const std::string& out, std::vector<std::string> extra = {}) const {
        std::vector<std::string> a = {bin,      "rollout",   (dir / "eps").string(),          "--ckpt",
                                      (dir / "ckpt").string(), "--out", (dir / out).string(), "--config",
                                      (test::source_dir() / "configs/tiny.yaml").string(), "--no-warmup", "--no-plots"};
        a.insert(a.end(), extra.begin(), extra.end());
        return a;
    }

    std::vector<std::string> mpirun_args(int ranks, const std::string& out, std::vector<std::string> extra = {}) const {
        std::vector<std::string> a = {mpirun, "-np", std::to_string(ranks), "--oversubscribe", "-x", "OPENBLAS_NUM_THREADS"};
        if (geteuid() == 0) a.push_back("--allow-run-as-root");
        for (auto& s : rollout_args(out, std::move(extra))) a.push_back(std::move(s));
        return a;
    }
};

Fixture& fixture() {
    static Fixture f;
    return f;
}

/// Skips (ctest: exit 77) when this machine cannot run the test.
void require_fixture() {
    if (!fixture().ok) {
        MESSAGE("skipped: " << fixture().why_not);
        std::exit(test::kSkipExitCode);
    }
}

/// summary.json without its timings (call_ms, everywhere).
nlohmann::json without_timings(nlohmann::json j) {
    for (auto& e : j["episodes"]) e.erase("call_ms");
    j["totals"].erase("call_ms");
    return j;
}

/// summary.csv without the three call_ms columns.
std::string csv_without_timings(const std::string& csv) {
    std::string out, line;
    for (char c : csv + (csv.empty() || csv.back() == '\n' ? "" : "\n")) {
        if (c != '\n') {
            line += c;
            continue;
        }
        std::vector<std::string> cells;
        std::string cell;
        for (char d : line + ",") {
            if (d == ',') {
                cells.push_back(cell);
                cell.clear();
            } else {
                cell += d;
            }
        }
        for (size_t k = 0; k < cells.size(); ++k)
            if (k < 7 || k > 9) out += cells[k] + ",";
        out += "\n";
        line.clear();
    }
    return out;
}

/// Every episode's files that do not hold timings, byte for byte, and the summary apart from timings.
void check_same_as_single(const fs::path& out) {
    const Fixture& f = fixture();
    for (const auto& name : f.names) {
        for (const char* file : {"actions.npy", "actions.csv", "metrics.json", "mse.csv", "done.json"}) {
            const fs::path a = f.dir / "single" / name / file, b = out / name / file;
            REQUIRE_MESSAGE(fs::exists(b), b.string());
            CHECK_MESSAGE(io::read_file(a) == io::read_file(b), b.string());
        }
        CHECK_FALSE(fs::exists(out / name / std::string(io::kFailedMarker)));
    }
    const auto single = read_json(f.dir / "single/summary.json");
    const auto merged = read_json(out / "summary.json");
    CHECK(merged["totals"]["ok"] == kEpisodes);
    CHECK(without_timings(merged) == without_timings(single));
    CHECK(csv_without_timings(io::read_file(out / "summary.csv")) ==
          csv_without_timings(io::read_file(f.dir / "single/summary.csv")));
}

std::map<std::string, fs::file_time_type> done_times(const fs::path& out) {
    std::map<std::string, fs::file_time_type> t;
    for (const auto& name : fixture().names)
        if (io::ResultWriter::is_done(out / name)) t[name] = fs::last_write_time(out / name / std::string(io::kDoneMarker));
    return t;
}

}  // namespace

TEST_CASE("three ranks under mpirun write the single-process outputs bit for bit and one merged summary") {
    require_fixture();
    const Fixture& f = fixture();
    test::Child run(f.mpirun_args(3, "mpi3"));
    const int code = run.wait_exit_code();
    INFO("mpirun stderr:\n" << run.err());
    REQUIRE(code == 0);
    const fs::path out = f.dir / "mpi3";
    check_same_as_single(out);

    // The plan: every episode on exactly one rank, as each rank's record and manifests say.
    const auto plan = read_json(out / "plan.json");
    CHECK(plan["world_size"] == 3);
    CHECK(plan["launcher"] == "open mpi");
    CHECK(plan["episodes"][1]["calls"] == 3);
    std::set<std::string> seen;
    int merged_by = -1;
    for (int r = 0; r < 3; ++r) {
        const auto rank = read_json(out / ("ranks/rank-" + std::to_string(r) + ".json"));
        CHECK(rank["status"] == "finished");
        CHECK(rank["world_size"] == 3);
        CHECK(rank["assigned"]["episodes"].size() == plan["ranks"][size_t(r)]["episodes"].size());
        for (const auto& e : rank["assigned"]["episodes"]) {
            const std::string name = e["name"];
            CHECK(seen.insert(name).second);
            CHECK(read_json(out / name / "manifest.json")["shard"]["rank"] == r);
        }
        const std::string log = io::read_file(out / ("logs/rank-" + std::to_string(r) + ".log"));
        CHECK(log.find("[rank " + std::to_string(r) + "/3]") != std::string::npos);
        if (log.find("merged summary") != std::string::npos) merged_by = r;
        // Progress lines on stderr name the rank.
        CHECK(run.err().find("rank " + std::to_string(r) + "/3  episode 1/") != std::string::npos);
    }
    CHECK(seen.size() == kEpisodes);
    // 17 calls over 3 ranks, longest first onto the least loaded: 3+2+2, 3+2 and 3+2.
    std::vector<int64_t> loads;
    for (const auto& r : plan["ranks"]) loads.push_back(r["calls"].get<int64_t>());
    CHECK(loads == std::vector<int64_t>{7, 5, 5});
    REQUIRE(merged_by >= 0);
    CHECK(read_json(out / "ranks/merged.json")["by"] == "rank " + std::to_string(merged_by) + "/3");
}

TEST_CASE("a rank killed mid-episode is completed by --resume with another number of ranks and launcher") {
    require_fixture();
    const Fixture& f = fixture();
    const fs::path out = f.dir / "killed";
    {
        test::Child run(f.mpirun_args(3, "killed"));
        // Rank 1's first progress line: its first call is done and its second is running.
        const bool started = run.read_until("rank 1/3  episode 1/");
        const size_t at = run.err().find("rank 1/3  episode 1/");
        const bool mid_episode = started && run.read_until("\n", at);
        INFO("mpirun stderr:\n" << run.err());
        REQUIRE(mid_episode);
        const pid_t rank1 = read_json(out / "ranks/rank-1.json")["pid"].get<pid_t>();
        REQUIRE(kill(rank1, SIGKILL) == 0);
        CHECK(run.wait_exit_code() != 0);
    }
    // No merge: rank 1's episode has no done marker.
    CHECK_FALSE(fs::exists(out / "summary.json"));
    CHECK(read_json(out / "ranks/rank-1.json")["status"] == "running");
    const auto before = done_times(out);
    CHECK(before.size() < kEpisodes);

    // Two ranks, launched by mpirun: only the missing episodes are split, and the finished ones are kept.
    {
        test::Child run(f.mpirun_args(2, "killed", {"--resume"}));
        const int code = run.wait_exit_code();
        INFO("mpirun stderr:\n" << run.err());
        REQUIRE(code == 0);
    }
    check_same_as_single(out);
    const auto plan = read_json(out / "plan.json");
    CHECK(plan["world_size"] == 2);
    CHECK(plan["resume"] == true);
    size_t assigned = 0;
    for (const auto& r : plan["ranks"]) {
        for (const auto& e : r["episodes"]) CHECK(before.count(plan["episodes"][e.get<size_t>()]["name"]) == 0);
        assigned += r["episodes"].size();
    }
    CHECK(assigned == kEpisodes - before.size());
    for (const auto& [name, t] : before) CHECK_MESSAGE(fs::last_write_time(out / name / "done.json") == t, name);

    // Two more ranks started by hand find nothing to do: no checkpoint load, and the summary of this state
    // is not merged again.
    const auto summary_time = fs::last_write_time(out / "summary.json");
    test::Child a(f.rollout_args("killed", {"--resume", "--shard", "0/2"}));
    test::Child b(f.rollout_args("killed", {"--resume", "--shard", "1/2"}));
    const int code_a = a.wait_exit_code(), code_b = b.wait_exit_code();
    INFO("shard 0 stderr:\n" << a.err() << "\nshard 1 stderr:\n" << b.err());
    CHECK(code_a == 0);
    CHECK(code_b == 0);
    CHECK(a.err().find("every episode was finished before") != std::string::npos);
    CHECK(a.err().find("  checkpoint  ") == std::string::npos);  // the start summary follows the load
    CHECK(fs::last_write_time(out / "summary.json") == summary_time);
    CHECK(read_json(out / "plan.json")["launcher"] == "--shard");
}
