#include "rollout/launcher.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "io/atomic_file.h"

namespace dzr::rollout {

namespace fs = std::filesystem;

namespace {

/// A non-negative decimal integer, the whole string (no sign, no spaces).
std::optional<int> parse_count(std::string_view s) {
    if (s.empty() || s.size() > 9) return std::nullopt;
    int v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || end != s.data() + s.size() || v < 0) return std::nullopt;
    return v;
}

/// The integer value of `name`, or nullopt when unset; a malformed value throws.
std::optional<int> env_int(const EnvLookup& env, const std::string& name) {
    const auto v = env(name);
    if (!v) return std::nullopt;
    const auto n = parse_count(*v);
    DZR_CHECK(n.has_value(), "environment variable {}='{}': expected a non-negative integer", name, *v);
    return n;
}

int require_env_int(const EnvLookup& env, const std::string& name, const std::string& because) {
    const auto n = env_int(env, name);
    DZR_CHECK(n.has_value(), "environment variable {} is not set, but {} is", name, because);
    return *n;
}

std::optional<int> local_rank_from(const EnvLookup& env) {
    if (auto l = env_int(env, "OMPI_COMM_WORLD_LOCAL_RANK")) return l;
    return env_int(env, "SLURM_LOCALID");
}

std::optional<ShardInfo> from_open_mpi(const EnvLookup& env) {
    const auto rank = env_int(env, "OMPI_COMM_WORLD_RANK");
    if (!rank) return std::nullopt;
    ShardInfo s;
    s.source = ShardSource::OpenMpi;
    s.rank = *rank;
    s.world_size = require_env_int(env, "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK");
    DZR_CHECK(s.world_size >= 1 && s.rank < s.world_size,
              "environment variables OMPI_COMM_WORLD_RANK={} and OMPI_COMM_WORLD_SIZE={}: the rank must be below "
              "the size", s.rank, s.world_size);
    s.local_rank = env_int(env, "OMPI_COMM_WORLD_LOCAL_RANK");
    // NOTE: Open MPI 4 puts the job id in OMPI_MCA_ess_base_jobid, derived from mpirun's host and pid (which
    // a fresh container repeats), and a random key per launch in OMPI_MCA_orte_precondition_transports;
    // PMIx launchers name the job's namespace.
    if (auto id = env("OMPI_MCA_ess_base_jobid")) {
        s.run_id = "openmpi-" + *id;
        if (auto key = env("OMPI_MCA_orte_precondition_transports")) s.run_id += "-" + *key;
    } else if (auto ns = env("PMIX_NAMESPACE")) {
        s.run_id = "pmix-" + *ns;
    }
    return s;
}

/// A job array task's index among the array's tasks (0-based) and the number of tasks.
std::pair<int, int> slurm_array_position(const EnvLookup& env) {
    const int id = require_env_int(env, "SLURM_ARRAY_TASK_ID", "a job array task id");
    const auto count = env_int(env, "SLURM_ARRAY_TASK_COUNT");
    const int min = env_int(env, "SLURM_ARRAY_TASK_MIN").value_or(0);
    const int step = env_int(env, "SLURM_ARRAY_TASK_STEP").value_or(1);
    DZR_CHECK(step >= 1, "environment variable SLURM_ARRAY_TASK_STEP={}: expected a positive step", step);
    const auto max = env_int(env, "SLURM_ARRAY_TASK_MAX");
    DZR_CHECK(count || max, "environment variables SLURM_ARRAY_TASK_COUNT and SLURM_ARRAY_TASK_MAX are not set, but "
              "SLURM_ARRAY_TASK_ID is (dzr needs the size of the job array)");
    DZR_CHECK(id >= min && (id - min) % step == 0,
              "environment variable SLURM_ARRAY_TASK_ID={} is not in the job array starting at "
              "SLURM_ARRAY_TASK_MIN={} with step {}", id, min, step);
    const int index = (id - min) / step;
    const int span_count = max ? (*max - min) / step + 1 : *count;
    DZR_CHECK(!max || *max >= min, "environment variables SLURM_ARRAY_TASK_MIN={} and SLURM_ARRAY_TASK_MAX={}: "
              "the maximum is below the minimum", min, *max);
    // NOTE: a sparse array (--array=1,4,9) has fewer tasks than its range spans: the task ids cannot be
    // turned into ranks without the whole list, which Slurm does not pass.
    DZR_CHECK(!count || *count == span_count,
              "environment variable SLURM_ARRAY_TASK_COUNT={}, but ids {} to {} in steps of {} span {} tasks: a "
              "sparse job array cannot be sharded; submit a range (--array=0-{})", *count, min, max.value_or(min),
              step, span_count, *count - 1);
    DZR_CHECK(index < span_count, "environment variable SLURM_ARRAY_TASK_ID={} is beyond the array's {} tasks", id,
              span_count);
    return {index, span_count};
}

std::optional<ShardInfo> from_slurm(const EnvLookup& env) {
    const bool array = env("SLURM_ARRAY_TASK_ID").has_value();
    // NOTE: only a task of a job step (srun) is one of several; a batch script runs once however many
    // tasks the job has, and Slurm leaves SLURM_NTASKS (the job's) and SLURM_PROCID=0 in its environment.
    const bool step_task = env("SLURM_PROCID").has_value() && env("SLURM_STEP_ID").has_value();
    if (!array && !step_task) return std::nullopt;
    ShardInfo s;
    int tasks = 1, task = 0;
    if (step_task) {
        task = *env_int(env, "SLURM_PROCID");
        const bool step_count = env("SLURM_STEP_NUM_TASKS").has_value();
        tasks = step_count ? require_env_int(env, "SLURM_STEP_NUM_TASKS", "SLURM_PROCID")
                           : require_env_int(env, "SLURM_NTASKS", "SLURM_PROCID");
        DZR_CHECK(tasks >= 1 && task < tasks, "environment variables SLURM_PROCID={} and {}={}: the task must be below "
                  "the task count", task, step_count ? "SLURM_STEP_NUM_TASKS" : "SLURM_NTASKS", tasks);
        s.local_rank = env_int(env, "SLURM_LOCALID");
    }
    int index = 0, count = 1;
    if (array) std::tie(index, count) = slurm_array_position(env);
    s.source = array ? ShardSource::SlurmArray : ShardSource::Slurm;
    s.rank = index * tasks + task;
    s.world_size = count * tasks;
    // NOTE: no restart count in the id: a requeued array task must find the plan its siblings use.
    const auto job = array ? env("SLURM_ARRAY_JOB_ID") : env("SLURM_JOB_ID");
    if (job) {
        s.run_id = "slurm-" + *job;
        if (auto step = env("SLURM_STEP_ID"); step && !array) s.run_id += "." + *step;
    }
    return s;
}

std::string file_name_safe(std::string s) {
    for (char& c : s)
        if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') c = '_';
    return s;
}

}  // namespace

std::string host_name() {
    char buf[256] = {};
    if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
    return buf;
}

std::string_view shard_source_name(ShardSource source) {
    switch (source) {
        case ShardSource::None: return "none";
        case ShardSource::Explicit: return "--shard";
        case ShardSource::OpenMpi: return "open mpi";
        case ShardSource::Slurm: return "slurm";
        case ShardSource::SlurmArray: return "slurm job array";
    }
    return "?";
}

std::string ShardInfo::label() const { return fmt::format("rank {}/{}", rank, world_size); }

std::string ShardInfo::describe() const {
    std::string s = fmt::format("{} ({}", label(), shard_source_name(source));
    if (local_rank) s += fmt::format(", local rank {}", *local_rank);
    if (!run_id.empty()) s += ", run " + run_id;
    return s + ")";
}

nlohmann::ordered_json ShardInfo::to_json() const {
    nlohmann::ordered_json j;
    j["rank"] = rank;
    j["world_size"] = world_size;
    j["launcher"] = shard_source_name(source);
    j["local_rank"] = local_rank ? nlohmann::ordered_json(*local_rank) : nlohmann::ordered_json(nullptr);
    j["run_id"] = run_id;
    return j;
}

EnvLookup process_environment() {
    return [](const std::string& name) -> std::optional<std::string> {
        const char* v = std::getenv(name.c_str());
        if (!v) return std::nullopt;
        return std::string(v);
    };
}

ShardInfo parse_shard_spec(std::string_view spec) {
    const auto slash = spec.find('/');
    const auto k = slash == std::string_view::npos ? std::nullopt : parse_count(spec.substr(0, slash));
    const auto n = slash == std::string_view::npos ? std::nullopt : parse_count(spec.substr(slash + 1));
    DZR_CHECK(k && n && *n >= 1 && *k < *n,
              "--shard '{}': expected K/N, the shard K (0 <= K < N) of N (e.g. --shard 2/8)", spec);
    ShardInfo s;
    s.source = ShardSource::Explicit;
    s.rank = *k;
    s.world_size = *n;
    return s;
}

ShardInfo detect_shard(const EnvLookup& env, const std::optional<std::string>& shard_spec) {
    if (shard_spec) {
        ShardInfo s = parse_shard_spec(*shard_spec);
        s.local_rank = local_rank_from(env);
        return s;
    }
    std::optional<ShardInfo> s = from_open_mpi(env);
    if (!s) s = from_slurm(env);
    if (!s || s->world_size == 1) return ShardInfo{};
    return *s;
}

Device rank_device(const Device& requested, bool index_given, const ShardInfo& shard, int visible_gpus,
                   const EnvLookup& env, bool allow_shared) {
    if (!requested.is_cuda() || index_given || !shard.sharded() || visible_gpus <= 0) return requested;
    const int local = shard.local_rank.value_or(0);
    if (local < visible_gpus) return Device::cuda(local);
    if (allow_shared) return Device::cuda(local % visible_gpus);
    const auto visible = env("CUDA_VISIBLE_DEVICES");
    // NOTE: a launcher that binds one GPU per task (srun --gpus-per-task=1) shows each task a single
    // device; whether it is the task's own is for the GPU lock to find out.
    if (visible_gpus == 1 && visible) return Device::cuda(0);
    DZR_THROW("{} is local rank {} on host {}, but only {} GPU{} visible{}: two ranks would share a GPU. Start at "
              "most {} task{} per node (srun --ntasks-per-node={} --gpus-per-task=1; mpirun --map-by ppr:{}:node), "
              "or pass --allow-shared-gpu", shard.label(), local, host_name(), visible_gpus,
              visible_gpus == 1 ? " is" : "s are", visible ? fmt::format(" (CUDA_VISIBLE_DEVICES={})", *visible) : "",
              visible_gpus, visible_gpus == 1 ? "" : "s", visible_gpus, visible_gpus);
}

std::string physical_gpu_id(int index, const EnvLookup& env) {
    if (const auto visible = env("CUDA_VISIBLE_DEVICES"); visible && !visible->empty()) {
        std::vector<std::string> entries;
        size_t pos = 0;
        while (pos <= visible->size()) {
            const size_t end = std::min(visible->find(',', pos), visible->size());
            entries.push_back(visible->substr(pos, end - pos));
            pos = end + 1;
        }
        if (index >= 0 && size_t(index) < entries.size() && !entries[size_t(index)].empty())
            return file_name_safe(entries[size_t(index)]);
    }
    return std::to_string(index);
}

GpuLock::GpuLock(const Device& device, const ShardInfo& shard, const EnvLookup& env, const fs::path& dir) {
    DZR_ASSERT(device.is_cuda());
    const std::string gpu = physical_gpu_id(device.index, env);
    path_ = dir / fmt::format("dzr-gpu-{}.lock", gpu);
    // NOTE: another user's lock file may not be writable; a read-only descriptor locks as well.
    bool writable = true;
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd_ < 0 && errno == EACCES) {
        writable = false;
        fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    }
    DZR_CHECK(fd_ >= 0, "cannot open the GPU lock file {}: {}", path_.string(), std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
        const int err = errno;
        std::string holder;
        try {
            holder = io::read_file(path_);
        } catch (const Error&) {
        }
        while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
        ::close(fd_);
        fd_ = -1;
        DZR_CHECK(err != EWOULDBLOCK,
                  "{}: GPU {} ({}) is already used by another dzr process{}; run one task per GPU, or pass "
                  "--allow-shared-gpu to share it", shard.label(), device.str(), gpu == std::to_string(device.index)
                      ? "device index " + gpu : "CUDA_VISIBLE_DEVICES entry " + gpu,
                  holder.empty() ? "" : " (" + holder + ")");
        DZR_THROW("cannot lock the GPU lock file {}: {}", path_.string(), std::strerror(err));
    }
    if (writable) {
        const std::string who = fmt::format("pid {} on {}, {}", ::getpid(), host_name(), shard.describe());
        if (::ftruncate(fd_, 0) == 0) {
            [[maybe_unused]] const ssize_t n = ::pwrite(fd_, who.data(), who.size(), 0);
        }
    }
}

GpuLock::~GpuLock() {
    if (fd_ >= 0) ::close(fd_);
}

GpuLock::GpuLock(GpuLock&& other) noexcept : fd_(other.fd_), path_(std::move(other.path_)) { other.fd_ = -1; }

GpuLock& GpuLock::operator=(GpuLock&& other) noexcept {
    if (this != &other) {
        if (fd_ >= 0) ::close(fd_);
        fd_ = other.fd_;
        path_ = std::move(other.path_);
        other.fd_ = -1;
    }
    return *this;
}

}  // namespace dzr::rollout
