// The launcher environment of a sharded rollout: --shard K/N, Open MPI's and Slurm's variables (tasks and
// job arrays), malformed values named in the error, the rank's GPU and the per-GPU lock.
#include <doctest/doctest.h>

#include <map>
#include <string>

#include "core/error.h"
#include "rollout/launcher.h"
#include "support/test_support.h"

using namespace dzr;
using namespace dzr::rollout;
namespace fs = std::filesystem;

namespace {

using test::error_of;
using test::contains;

EnvLookup env_of(std::map<std::string, std::string> vars) {
    return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
        const auto it = vars.find(name);
        if (it == vars.end()) return std::nullopt;
        return it->second;
    };
}

}  // namespace

TEST_CASE("--shard K/N parses shard K of N and rejects anything else with the expected form") {
    const ShardInfo s = parse_shard_spec("2/8");
    CHECK(s.source == ShardSource::Explicit);
    CHECK(s.rank == 2);
    CHECK(s.world_size == 8);
    CHECK(s.sharded());
    CHECK(parse_shard_spec("0/1").world_size == 1);
    for (const char* bad : {"", "8/8", "3/2", "-1/3", "a/3", "1/0", "1/", "/3", "1/3/4", " 1/3", "1/3 ", "1:3", "+1/3",
                            "1/99999999999"}) {
        const std::string msg = error_of([&] { parse_shard_spec(bad); });
        CHECK_MESSAGE(contains(msg, "--shard"), bad);
        CHECK_MESSAGE(contains(msg, "K/N"), bad);
    }
}

TEST_CASE("without a launcher, or with a launcher of one rank, the run is not sharded") {
    CHECK_FALSE(detect_shard(env_of({})).sharded());
    CHECK_FALSE(detect_shard(env_of({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"}})).sharded());
    CHECK_FALSE(detect_shard(env_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_STEP_ID", "0"}})).sharded());
    // A batch script with a multi-task allocation runs once: it is not task 0 of 4.
    CHECK_FALSE(detect_shard(env_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_JOB_ID", "9"}})).sharded());
}

TEST_CASE("Open MPI's variables give the rank, the size, the local rank and the job") {
    const ShardInfo s = detect_shard(env_of({{"OMPI_COMM_WORLD_RANK", "1"},
                                             {"OMPI_COMM_WORLD_SIZE", "3"},
                                             {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                             {"OMPI_MCA_ess_base_jobid", "639107073"},
                                             {"OMPI_MCA_orte_precondition_transports", "1d1b-5738"}}));
    CHECK(s.source == ShardSource::OpenMpi);
    CHECK(s.rank == 1);
    CHECK(s.world_size == 3);
    CHECK(s.local_rank == 1);
    CHECK(s.run_id == "openmpi-639107073-1d1b-5738");
    CHECK(s.label() == "rank 1/3");
    CHECK(contains(s.describe(), "open mpi"));
}

TEST_CASE("malformed or inconsistent Open MPI variables are errors naming the variable") {
    CHECK(contains(error_of([] { detect_shard(env_of({{"OMPI_COMM_WORLD_RANK", "x"}, {"OMPI_COMM_WORLD_SIZE", "3"}})); }),
                   "OMPI_COMM_WORLD_RANK='x'"));
    CHECK(contains(error_of([] { detect_shard(env_of({{"OMPI_COMM_WORLD_RANK", "1"}})); }), "OMPI_COMM_WORLD_SIZE"));
    CHECK(contains(error_of([] { detect_shard(env_of({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "3"}})); }),
                   "below"));
    CHECK(contains(error_of([] {
                       detect_shard(env_of({{"OMPI_COMM_WORLD_RANK", "0"},
                                            {"OMPI_COMM_WORLD_SIZE", "2"},
                                            {"OMPI_COMM_WORLD_LOCAL_RANK", "-1"}}));
                   }),
                   "OMPI_COMM_WORLD_LOCAL_RANK='-1'"));
}

TEST_CASE("a Slurm step task is rank SLURM_PROCID of the step's tasks, on its SLURM_LOCALID") {
    const ShardInfo s = detect_shard(env_of({{"SLURM_PROCID", "5"},
                                             {"SLURM_NTASKS", "8"},
                                             {"SLURM_LOCALID", "1"},
                                             {"SLURM_STEP_ID", "0"},
                                             {"SLURM_JOB_ID", "4242"}}));
    CHECK(s.source == ShardSource::Slurm);
    CHECK(s.rank == 5);
    CHECK(s.world_size == 8);
    CHECK(s.local_rank == 1);
    CHECK(s.run_id == "slurm-4242.0");
    // The step's own count wins over the job's.
    const ShardInfo t = detect_shard(env_of({{"SLURM_PROCID", "1"},
                                             {"SLURM_NTASKS", "8"},
                                             {"SLURM_STEP_NUM_TASKS", "2"},
                                             {"SLURM_STEP_ID", "3"}}));
    CHECK(t.world_size == 2);
    CHECK(contains(error_of([] { detect_shard(env_of({{"SLURM_PROCID", "1"}, {"SLURM_STEP_ID", "0"}})); }),
                   "SLURM_NTASKS"));
    CHECK(contains(error_of([] {
                       detect_shard(env_of({{"SLURM_PROCID", "one"}, {"SLURM_NTASKS", "2"}, {"SLURM_STEP_ID", "0"}}));
                   }),
                   "SLURM_PROCID='one'"));
    CHECK(contains(error_of([] {
                       detect_shard(env_of({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2x"}, {"SLURM_STEP_ID", "0"}}));
                   }),
                   "SLURM_NTASKS='2x'"));
    CHECK(contains(error_of([] {
                       detect_shard(env_of({{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "2"}, {"SLURM_STEP_ID", "0"}}));
                   }),
                   "below"));
}

TEST_CASE("a Slurm job array task is ranked by its position in the array, times the tasks of its step") {
    // --array=3-7: task 5 is the third of five.
    const ShardInfo a = detect_shard(env_of({{"SLURM_ARRAY_TASK_ID", "5"},
                                             {"SLURM_ARRAY_TASK_MIN", "3"},
                                             {"SLURM_ARRAY_TASK_MAX", "7"},
                                             {"SLURM_ARRAY_TASK_COUNT", "5"},
                                             {"SLURM_ARRAY_JOB_ID", "100"},
                                             {"SLURM_JOB_ID", "105"}}));
    CHECK(a.source == ShardSource::SlurmArray);
    CHECK(a.rank == 2);
    CHECK(a.world_size == 5);
    CHECK(a.run_id == "slurm-100");  // shared by every task of the array
    // --array=0-8:2 gives ids 0, 2, 4, 6, 8.
    const ShardInfo b = detect_shard(env_of({{"SLURM_ARRAY_TASK_ID", "6"},
                                             {"SLURM_ARRAY_TASK_MIN", "0"},
                                             {"SLURM_ARRAY_TASK_MAX", "8"},
                                             {"SLURM_ARRAY_TASK_STEP", "2"},
                                             {"SLURM_ARRAY_TASK_COUNT", "5"}}));
    CHECK(b.rank == 3);
    CHECK(b.world_size == 5);
    // Array task 1 of 3, each running a step of 2 tasks: ranks 2 and 3 of 6.
    const ShardInfo c = detect_shard(env_of({{"SLURM_ARRAY_TASK_ID", "1"},
                                             {"SLURM_ARRAY_TASK_MIN", "0"},
                                             {"SLURM_ARRAY_TASK_COUNT", "3"},
                                             {"SLURM_PROCID", "1"},
                                             {"SLURM_NTASKS", "2"},
                                             {"SLURM_LOCALID", "1"},
                                             {"SLURM_STEP_ID", "0"}}));
    CHECK(c.rank == 3);
    CHECK(c.world_size == 6);
    CHECK(c.local_rank == 1);
}

TEST_CASE("malformed, sparse or inconsistent job array variables are errors naming the variable") {
    CHECK(contains(error_of([] {
                       detect_shard(env_of({{"SLURM_ARRAY_TASK_ID", "1"}, {"SLURM_ARRAY_TASK_COUNT", "three"}}));
                   }),
                   "SLURM_ARRAY_TASK_COUNT='three'"));
    CHECK(contains(error_of([] { detect_shard(env_of({{"SLURM_ARRAY_TASK_ID", "1"}})); }), "SLURM_ARRAY_TASK_COUNT"));
    // --array=1,4,9: three tasks over a range of nine ids.
    CHECK(contains(error_of([] {
                       detect_shard(env_of({{"SLURM_ARRAY_TASK_ID", "4"},
                                            {"SLURM_ARRAY_TASK_MIN", "1"},
                                            {"SLURM_ARRAY_TASK_MAX", "9"},
                                            {"SLURM_ARRAY_TASK_COUNT", "3"}}));
                   }),
                   "sparse"));
    CHECK(contains(error_of([] {
                       detect_shard(env_of({{"SLURM_ARRAY_TASK_ID", "2"},
                                            {"SLURM_ARRAY_TASK_MIN", "3"},
                                            {"SLURM_ARRAY_TASK_COUNT", "2"}}));
                   }),
                   "SLURM_ARRAY_TASK_ID=2"));
    CHECK(contains(error_of([] {
                       detect_shard(env_of({{"SLURM_ARRAY_TASK_ID", "5"}, {"SLURM_ARRAY_TASK_COUNT", "3"}}));
                   }),
                   "SLURM_ARRAY_TASK_ID=5"));
}

TEST_CASE("mpirun inside a Slurm batch script is ranked by Open MPI, and --shard overrides every launcher") {
    const auto env = env_of({{"OMPI_COMM_WORLD_RANK", "2"},
                             {"OMPI_COMM_WORLD_SIZE", "4"},
                             {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                             {"SLURM_PROCID", "0"},
                             {"SLURM_NTASKS", "4"},
                             {"SLURM_STEP_ID", "0"}});
    const ShardInfo m = detect_shard(env);
    CHECK(m.source == ShardSource::OpenMpi);
    CHECK(m.rank == 2);
    const ShardInfo x = detect_shard(env, std::string("1/2"));
    CHECK(x.source == ShardSource::Explicit);
    CHECK(x.rank == 1);
    CHECK(x.world_size == 2);
    CHECK(x.local_rank == 2);  // the node placement still comes from the launcher
    CHECK(x.run_id.empty());
}

TEST_CASE("a rank takes its local rank's GPU, and two ranks on one GPU are refused unless allowed") {
    const ShardInfo unsharded;
    ShardInfo s = parse_shard_spec("1/4");
    s.local_rank = 1;
    const auto no_env = env_of({});
    CHECK(rank_device(Device::cpu(), false, s, 4, no_env, false) == Device::cpu());
    CHECK(rank_device(Device::cuda(3), true, s, 4, no_env, false) == Device::cuda(3));  // cuda:3 as given
    CHECK(rank_device(Device::cuda(0), false, unsharded, 4, no_env, false) == Device::cuda(0));
    CHECK(rank_device(Device::cuda(0), false, s, 4, no_env, false) == Device::cuda(1));
    s.local_rank = 2;
    const std::string msg = error_of([&] { rank_device(Device::cuda(0), false, s, 2, no_env, false); });
    CHECK(contains(msg, "local rank 2"));
    CHECK(contains(msg, "only 2 GPUs are visible"));
    CHECK(contains(msg, "--allow-shared-gpu"));
    CHECK(rank_device(Device::cuda(0), false, s, 2, no_env, true) == Device::cuda(0));
    // One GPU per task (srun --gpus-per-task=1): each task sees its own device 0.
    CHECK(rank_device(Device::cuda(0), false, s, 1, env_of({{"CUDA_VISIBLE_DEVICES", "3"}}), false) == Device::cuda(0));
}

TEST_CASE("the GPU behind a device index is its CUDA_VISIBLE_DEVICES entry, made safe for a file name") {
    CHECK(physical_gpu_id(1, env_of({})) == "1");
    const auto env = env_of({{"CUDA_VISIBLE_DEVICES", "2,GPU-ab/c d"}});
    CHECK(physical_gpu_id(0, env) == "2");
    CHECK(physical_gpu_id(1, env) == "GPU-ab_c_d");
    CHECK(physical_gpu_id(5, env) == "5");
}

TEST_CASE("a second dzr process on a locked GPU is refused with the holder's name until the lock is released") {
    test::TempDir dir;
    ShardInfo s = parse_shard_spec("0/2");
    const auto env = env_of({{"CUDA_VISIBLE_DEVICES", "4,5"}});
    {
        GpuLock first(Device::cuda(1), s, env, dir.path());
        CHECK(first.held());
        CHECK(first.path().filename() == "dzr-gpu-5.lock");
        s.rank = 1;
        const std::string msg = error_of([&] { GpuLock second(Device::cuda(1), s, env, dir.path()); });
        CHECK(contains(msg, "rank 1/2"));
        CHECK(contains(msg, "already used by another dzr process"));
        CHECK(contains(msg, "rank 0/2"));  // the holder, from the lock file
        CHECK(contains(msg, "--allow-shared-gpu"));
        // Another GPU is free.
        CHECK_NOTHROW(GpuLock(Device::cuda(0), s, env, dir.path()));
    }
    CHECK_NOTHROW(GpuLock(Device::cuda(1), s, env, dir.path()));
}
