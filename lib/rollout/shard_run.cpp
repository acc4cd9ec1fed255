#include "rollout/shard_run.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <numeric>

#include <fmt/format.h>
#include <spdlog/sinks/basic_file_sink.h>

#include "core/error.h"
#include "core/json_text.h"
#include "core/log.h"
#include "io/atomic_file.h"
#include "io/result_writer.h"
#include "rollout/fingerprint.h"
#include "rollout/partition.h"

namespace dzr::rollout {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kRanksDir = "ranks";
constexpr std::string_view kLogsDir = "logs";
constexpr std::string_view kMergedFile = "merged.json";
// NOTE: the pattern of core/log.cpp's logger, put back when the rank's log closes.
constexpr std::string_view kDefaultPattern = "[%H:%M:%S.%e] [%^%l%$] %v";

/// An exclusive flock on a file for the life of the object (blocking). On a file system without locks
/// (an NFS mount without lockd, say) it holds nothing and says so: callers fall back to what is safe
/// without one.
class FileLock {
public:
    explicit FileLock(const fs::path& path) {
        fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
        DZR_CHECK(fd_ >= 0, "cannot open the lock file {}: {}", path.string(), std::strerror(errno));
        int rc;
        do {
            rc = ::flock(fd_, LOCK_EX);
        } while (rc != 0 && errno == EINTR);
        if (rc != 0) {
            log()->warn("cannot lock {}: {} (the file system has no locks?)", path.string(), std::strerror(errno));
            ::close(fd_);
            fd_ = -1;
        }
    }
    ~FileLock() {
        if (fd_ >= 0) ::close(fd_);
    }
    FileLock(const FileLock&) = delete;
    FileLock& operator=(const FileLock&) = delete;
    bool held() const { return fd_ >= 0; }

private:
    int fd_ = -1;
};

/// FNV-1a, 64 bits: a stamp of the run's state, not a security hash.
uint64_t fnv1a(std::string_view s) {
    uint64_t h = 14695981039346656037ull;
    for (char c : s) {
        h ^= uint8_t(c);
        h *= 1099511628211ull;
    }
    return h;
}

bool has_file(const fs::path& p) {
    std::error_code ec;
    return fs::is_regular_file(p, ec);
}

/// Where the run stands: how many of its episodes are neither done nor failed, and a stamp that changes
/// whenever an episode's marker does.
struct RunState {
    int64_t unfinished = 0;
    std::string stamp;
};

RunState run_state(const fs::path& out_dir, const RunPlan& plan) {
    RunState st;
    std::string text;
    for (const auto& e : plan.episodes) {
        const fs::path dir = out_dir / e.name;
        std::string_view state = "-";
        fs::path marker;
        if (has_file(dir / std::string(io::kDoneMarker))) {
            state = "done";
            marker = dir / std::string(io::kDoneMarker);
        } else if (has_file(dir / std::string(io::kFailedMarker))) {
            state = "failed";
            marker = dir / std::string(io::kFailedMarker);
        } else {
            ++st.unfinished;
        }
        std::error_code ec;
        const auto t = marker.empty() ? fs::file_time_type{} : fs::last_write_time(marker, ec);
        text += fmt::format("{}\t{}\t{}\n", e.name, state, int64_t(t.time_since_epoch().count()));
    }
    st.stamp = fmt::format("{:016x}", fnv1a(text));
    return st;
}

std::string now_utc() { return iso8601_utc(std::chrono::system_clock::now()); }

}  // namespace

void record_failure(const fs::path& dir, const EpisodeSummary& e, const ShardInfo& shard) {
    try {
        nlohmann::ordered_json j = {{"episode", e.name}, {"error", e.error}, {"time", now_utc()}, {"host", host_name()}};
        if (shard.sharded()) j["shard"] = shard.to_json();
        io::ResultWriter::mark_failed(dir, j);
    } catch (const Error& err) {
        log()->warn("episode {}: the failure record was not written: {}", e.name, err.what());
    }
}

/// The rank's log file, added to the dzr logger while the rank runs; the logger's lines name the rank.
struct ShardRun::RankLog {
    std::shared_ptr<spdlog::sinks::basic_file_sink_mt> sink;

    RankLog(const fs::path& path, const std::string& label) {
        try {
            sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(path.string(), false);
        } catch (const spdlog::spdlog_ex& ex) {
            DZR_THROW("cannot open the rank log {}: {}", path.string(), ex.what());
        }
        log()->set_pattern(fmt::format("[%H:%M:%S.%e] [{}] [%^%l%$] %v", label));
        sink->set_pattern(fmt::format("[%Y-%m-%d %H:%M:%S.%e] [{}] [%l] %v", label));
        log()->sinks().push_back(sink);
    }
    ~RankLog() {
        auto& sinks = log()->sinks();
        sinks.erase(std::remove(sinks.begin(), sinks.end(), sink), sinks.end());
        log()->set_pattern(std::string(kDefaultPattern));
    }
};

ShardRun::ShardRun(const ShardInfo& shard, const fs::path& out_dir, const std::vector<io::EpisodeRef>& refs,
                   const std::vector<std::string>& names, const FrameSchedule& schedule,
                   const io::EpisodeOptions& episode_options, bool resume, const std::string& device)
    : shard_(shard), out_dir_(out_dir), device_(device), started_(now_utc()) {
    DZR_ASSERT(refs.size() == names.size());
    plan_.world_size = shard_.world_size;
    plan_.launcher = std::string(shard_source_name(shard_.source));
    plan_.run_id = shard_.run_id;
    plan_.resume = resume;
    plan_.created = started_;
    for (size_t i = 0; i < refs.size(); ++i) plan_.episodes.push_back({names[i], refs[i].location(), {}, {}});
    if (!shard_.sharded()) {
        plan_.assignment = {std::vector<size_t>(refs.size())};
        std::iota(plan_.assignment[0].begin(), plan_.assignment[0].end(), size_t(0));
        mine_ = plan_.assignment[0];
        return;
    }
    std::error_code ec;
    fs::create_directories(out_dir_ / kRanksDir, ec);
    fs::create_directories(out_dir_ / kLogsDir, ec);
    DZR_CHECK(!ec, "cannot create {}: {}", (out_dir_ / kRanksDir).string(), ec.message());
    log_ = std::make_unique<RankLog>(out_dir_ / kLogsDir / fmt::format("rank-{}.log", shard_.rank), shard_.label());
    log()->info("{} on host {} (pid {}), device {}", shard_.describe(), host_name(), ::getpid(), device_);
    plan_sharded(refs, schedule, episode_options, resume);
    mine_ = plan_.assignment[size_t(shard_.rank)];

    const auto loads = [&] {
        std::vector<EpisodeWork> work;
        for (const auto& e : plan_.episodes) work.push_back({e.dir, e.calls.value_or(0)});
        return rank_loads(work, plan_.assignment);
    }();
    std::string list;
    for (size_t k = 0; k < mine_.size(); ++k) {
        const auto& e = plan_.episodes[mine_[k]];
        if (k == 8) {
            list += fmt::format(", ... ({} more)", mine_.size() - k);
            break;
        }
        list += fmt::format("{}{} ({} calls)", k ? ", " : "", e.name,
                            e.calls ? std::to_string(*e.calls) : std::string("?"));
    }
    log()->info("{} of {} episodes, {} calls{}{}", mine_.size(), plan_.episodes.size(), loads[size_t(shard_.rank)],
                mine_.empty() ? "" : ": ", list);
    if (shard_.rank == 0) {
        std::string per_rank;
        for (size_t r = 0; r < loads.size(); ++r)
            per_rank += fmt::format("{}{}", r ? " " : "", loads[r]);
        log()->info("plan: {} episodes over {} ranks; calls per rank: {} ({})", plan_.episodes.size(),
                    plan_.world_size, per_rank, (out_dir_ / kPlanFile).string());
    }
    assigned_ = {{"calls", loads[size_t(shard_.rank)]}, {"episodes", Json::array()}};
    for (size_t e : mine_)
        assigned_["episodes"].push_back(
            {{"name", plan_.episodes[e].name}, {"dir", plan_.episodes[e].dir},
             {"calls", plan_.episodes[e].calls ? Json(*plan_.episodes[e].calls) : Json(nullptr)}});
    write_rank_file({{"status", "running"}});
}

ShardRun::~ShardRun() = default;

void ShardRun::check_run_fingerprint(const Json& fingerprint, bool force) const {
    if (!shard_.sharded()) return;
    const fs::path file = out_dir_ / kRanksDir / "fingerprint.json";
    FileLock lock(out_dir_ / kRanksDir / ".plan.lock");
    if (io::input_file_present(file)) {
        Json recorded;
        try {
            recorded = parse_json_strict<Json>(io::read_file(file), file.string());
        } catch (const Json::exception& ex) {
            DZR_THROW("{}: invalid JSON: {}", file.string(), ex.what());
        }
        DZR_CHECK(recorded.is_object() && recorded.contains("fingerprint"), "{}: no \"fingerprint\"", file.string());
        const bool same_launch = recorded.value("run_id", std::string()) == shard_.run_id && !shard_.run_id.empty();
        const auto diffs = fingerprint_differences(recorded["fingerprint"], fingerprint);
        if (!diffs.empty() && (same_launch || !force)) {
            std::string msg = fmt::format("{} runs other settings than the {} recorded in {} (ranks of one --out must "
                                          "agree{}):", shard_.label(),
                                          same_launch ? "ranks of this launch" : "run", file.string(),
                                          same_launch ? "" : "; --force replaces that run");
            for (const auto& d : diffs) msg += "\n    " + d;
            throw Error(msg);
        }
        if (diffs.empty() && same_launch) return;
    }
    io::write_file_atomic(file, dump_json(Json{{"run_id", shard_.run_id}, {"fingerprint", fingerprint}}) + "\n");
}

void ShardRun::plan_sharded(const std::vector<io::EpisodeRef>& refs, const FrameSchedule& schedule,
                            const io::EpisodeOptions& episode_options, bool resume) {
    // NOTE: the ranks of one launch must agree on the plan; the lock makes the first one write it and the
    // others read it. Without a launcher id (or without locks) each rank computes it from the inputs
    // alone, which every rank does the same way.
    FileLock lock(out_dir_ / kRanksDir / ".plan.lock");
    const bool shared = lock.held() && !shard_.run_id.empty();
    if (shared) {
        std::optional<RunPlan> existing;
        try {
            existing = read_run_plan(out_dir_);
        } catch (const Error& err) {
            log()->warn("{} (a new plan replaces it)", err.what());
        }
        if (existing && existing->run_id == shard_.run_id && existing->world_size == shard_.world_size &&
            existing->resume == resume && existing->same_episodes(plan_)) {
            plan_ = *existing;
            log()->info("plan of this run ({}) read from {}", shard_.run_id, (out_dir_ / kPlanFile).string());
            return;
        }
    }
    std::vector<EpisodeWork> work;
    for (size_t i = 0; i < refs.size(); ++i) {
        auto& e = plan_.episodes[i];
        try {
            e.frames = refs[i].source->count_frames(refs[i], episode_options);
        } catch (const Error& err) {
            // NOTE: the episode fails when its rank reads it, with this message; here it only weighs nothing.
            log()->warn("episode {}: frame count unknown: {}", e.name, err.what());
        }
        if (e.frames) e.calls = schedule.num_calls(*e.frames);
        work.push_back({e.dir, e.calls.value_or(0)});
    }
    // With --resume, a shared plan splits only the episodes still to do; without one, the rank cannot
    // know what the others saw, so every episode is split (the finished ones are skipped where they land).
    std::vector<size_t> todo;
    for (size_t i = 0; i < refs.size(); ++i)
        if (!(shared && resume && io::ResultWriter::is_done(out_dir_ / plan_.episodes[i].name))) todo.push_back(i);
    std::vector<EpisodeWork> todo_work;
    for (size_t i : todo) todo_work.push_back(work[i]);
    plan_.assignment.clear();
    for (auto& ranks : partition_by_calls(todo_work, shard_.world_size)) {
        std::vector<size_t> global;
        for (size_t k : ranks) global.push_back(todo[k]);
        plan_.assignment.push_back(std::move(global));
    }
    if (todo.size() < refs.size())
        log()->info("--resume: {} of {} episodes finished before this run; the {} others are split", refs.size() - todo.size(),
                    refs.size(), todo.size());
    write_run_plan(out_dir_, plan_);
}

void ShardRun::write_plan_first() const {
    if (!shard_.sharded()) write_run_plan(out_dir_, plan_);
}

std::string ShardRun::progress_prefix() const { return shard_.sharded() ? shard_.label() + "  " : std::string(); }

std::optional<std::vector<EpisodeSummary>> ShardRun::nothing_to_run(bool resume) const {
    std::vector<EpisodeSummary> done;
    for (size_t e : mine_) {
        const fs::path dir = out_dir_ / plan_.episodes[e].name;
        if (!resume || !io::ResultWriter::is_done(dir)) return std::nullopt;
        done.push_back(summary_from_outputs(dir, plan_.episodes[e].name));
    }
    if (shard_.sharded())
        log()->info("{}", mine_.empty() ? "no episodes to run" : "every episode was finished before (--resume)");
    return done;
}

void ShardRun::note(const EpisodeSummary& e) const {
    if (!shard_.sharded()) return;
    if (e.status == "ok") {
        const TimingStats t = compute_stats(e.call_ms);
        log()->info("episode {}: ok, {} calls, median {:.1f} ms/call{}", e.name, e.num_calls, t.median,
                    e.metrics ? fmt::format(", mse {:.6g}", e.metrics->overall_mse) : "");
    } else if (e.status != "failed") {
        // NOTE: failures are logged where they happen, with the error.
        log()->info("episode {}: {}", e.name, e.status);
    }
}

void ShardRun::write_rank_file(const nlohmann::ordered_json& extra) const {
    nlohmann::ordered_json j = shard_.to_json();
    j["host"] = host_name();
    j["pid"] = ::getpid();
    j["device"] = device_;
    j["started"] = started_;
    j["assigned"] = assigned_;
    for (const auto& [k, v] : extra.items()) j[k] = v;
    io::write_file_atomic(out_dir_ / kRanksDir / fmt::format("rank-{}.json", shard_.rank), dump_json(j) + "\n");
}

ShardOutcome ShardRun::finish(std::span<const EpisodeSummary> episodes, bool interrupted, const PlotPng& plot_png) {
    ShardOutcome out;
    out.run_episodes = int64_t(plan_.episodes.size());
    if (!shard_.sharded()) {
        std::error_code ec;
        fs::create_directories(out_dir_, ec);
        write_run_plan(out_dir_, plan_);
        if (!episodes.empty()) {
            write_summary(out_dir_, episodes);
            write_summary_plots(out_dir_, episodes, plot_png);
        }
        out.merged = true;
        for (const auto& e : episodes) {
            out.failed += e.status == "failed";
            out.unfinished += e.status != "ok" && e.status != "skipped" && e.status != "failed";
        }
        return out;
    }
    write_rank_file({{"status", interrupted ? "interrupted" : "finished"}, {"ended", now_utc()},
                     {"summary", summary_json(episodes)}});
    out.rank_file = out_dir_ / kRanksDir / fmt::format("rank-{}.json", shard_.rank);
    const ShardOutcome merged = merge_if_complete(plot_png);
    out.merged = merged.merged;
    out.unfinished = merged.unfinished;
    out.failed = merged.failed;
    return out;
}

ShardOutcome ShardRun::merge_if_complete(const PlotPng& plot_png) {
    ShardOutcome out;
    out.run_episodes = int64_t(plan_.episodes.size());
    FileLock lock(out_dir_ / kRanksDir / ".summary.lock");
    const RunState state = run_state(out_dir_, plan_);
    out.unfinished = state.unfinished;
    if (state.unfinished > 0) {
        log()->info("done; {} of {} episodes of the run are not finished yet (running on other ranks, or lost: "
                    "rerun with --resume); the last rank to finish merges the summary", state.unfinished,
                    plan_.episodes.size());
        return out;
    }
    const fs::path merged_file = out_dir_ / kRanksDir / kMergedFile;
    if (lock.held() && has_file(merged_file)) {
        try {
            const auto j = parse_json_strict<Json>(io::read_file(merged_file), merged_file.string());
            if (j.value("stamp", std::string()) == state.stamp) {
                log()->info("done; the summary of this state was merged by {}", j.value("by", std::string("another rank")));
                return out;
            }
        } catch (const Json::exception&) {
            // A damaged record only means merging again.
        }
    }
    const OutputSummary s = summarize_outputs(out_dir_, SummarizeOptions{plot_png});
    io::write_file_atomic(merged_file, nlohmann::ordered_json{{"stamp", state.stamp}, {"by", shard_.label()},
                                                              {"time", now_utc()}, {"episodes", s.episodes.size()},
                                                              {"ok", s.ok}, {"failed", s.failed}}
                                               .dump(2) + "\n");
    out.merged = true;
    out.failed = s.failed;
    log()->info("finished last: merged summary of {} episodes ({} ok, {} failed) -> {}", s.episodes.size(), s.ok,
                s.failed, (out_dir_ / "summary.json").string());
    return out;
}

}  // namespace dzr::rollout
