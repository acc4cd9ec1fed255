#pragma once
/// Which part of a sharded rollout this process runs. `dzr rollout` reads its rank, the number of ranks
/// and its rank on the node from the launcher that started it: Open MPI's mpirun
/// (OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK), Slurm tasks (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID) and
/// Slurm job arrays (SLURM_ARRAY_TASK_ID/COUNT/MIN/MAX/STEP), or from an explicit `--shard K/N`, which
/// wins. Each rank then takes the GPU of its local rank and holds a per-GPU lock file, so that two ranks
/// on one GPU are refused. docs/SCALING.md describes the whole scheme.
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/tensor.h"

namespace dzr::rollout {

/// Where a process's shard came from. None: a plain, unsharded run.
enum class ShardSource { None, Explicit, OpenMpi, Slurm, SlurmArray };

/// "none", "--shard", "open mpi", "slurm", "slurm job array".
std::string_view shard_source_name(ShardSource source);

struct ShardInfo {
    ShardSource source = ShardSource::None;
    int rank = 0;
    int world_size = 1;
    /// The rank among the tasks of this node (it picks the GPU); nullopt when the launcher does not say.
    std::optional<int> local_rank;
    /// The same for every rank of one launch and different for the next one (Slurm job, step and
    /// restart count; the mpirun job); empty when nothing says (--shard by hand).
    std::string run_id;

    /// True when this process runs part of a split run (more than one rank, or --shard given).
    bool sharded() const { return source != ShardSource::None; }
    /// "rank 2/8"
    std::string label() const;
    /// "rank 2/8 (slurm, local rank 2, run slurm-1234.0)"
    std::string describe() const;
    nlohmann::ordered_json to_json() const;
};

/// Reads an environment variable (nullopt when unset). Tests pass a map instead of the process's.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

/// The process environment (getenv).
EnvLookup process_environment();

/// Parses `--shard K/N` (integers, 0 <= K < N). Throws dzr::Error saying what is expected.
ShardInfo parse_shard_spec(std::string_view spec);

/// This process's shard: `shard_spec` (--shard K/N) when given, else Open MPI's variables, else Slurm's
/// (a job array's task times the tasks of its step), else an unsharded run. A launcher that reports a
/// single rank is an unsharded run. Open MPI comes before Slurm because mpirun inside a Slurm batch
/// script leaves the script's SLURM_PROCID (0) in every rank's environment. A malformed or inconsistent
/// value throws dzr::Error naming the variable.
ShardInfo detect_shard(const EnvLookup& env, const std::optional<std::string>& shard_spec = std::nullopt);

/// The device of a rank. `--device cuda` without an index (`index_given` false) on a sharded run becomes
/// the local rank's GPU among `visible_gpus`. Throws dzr::Error when the local rank has no GPU of its
/// own (more tasks on the node than visible GPUs) unless `allow_shared`; a single visible GPU under
/// CUDA_VISIBLE_DEVICES may be the task's own (Slurm's --gpus-per-task), and the GPU lock decides.
Device rank_device(const Device& requested, bool index_given, const ShardInfo& shard, int visible_gpus,
                   const EnvLookup& env, bool allow_shared);

/// The name of the physical GPU behind visible device `index`: its CUDA_VISIBLE_DEVICES entry (an index,
/// a GPU-/MIG- UUID) when that is set, else the index; safe as part of a file name.
std::string physical_gpu_id(int index, const EnvLookup& env);

/// This machine's host name ("unknown" when it has none).
std::string host_name();

/// An exclusive lock on one GPU for the life of the process (flock on <dir>/dzr-gpu-<id>.lock, which
/// the kernel drops when the process dies, even by SIGKILL). The lock file names its holder.
class GpuLock {
public:
    GpuLock() = default;
    /// Takes the lock of `device`'s GPU; throws dzr::Error naming the holder when another process has it.
    GpuLock(const Device& device, const ShardInfo& shard, const EnvLookup& env,
            const std::filesystem::path& dir = "/tmp");
    ~GpuLock();
    GpuLock(GpuLock&& other) noexcept;
    GpuLock& operator=(GpuLock&& other) noexcept;
    GpuLock(const GpuLock&) = delete;
    GpuLock& operator=(const GpuLock&) = delete;

    bool held() const { return fd_ >= 0; }
    const std::filesystem::path& path() const { return path_; }

private:
    int fd_ = -1;
    std::filesystem::path path_;
};

}  // namespace dzr::rollout
