#pragma once
/// `dzr bench rollout`: a full-size rollout benchmark in one command on a GPU box. Random weights are generated on
/// the host at the config's geometry (weights/random_weights.h: no 46 GB file), the engine loads them onto the
/// devices, runs the warm-up, then `calls` timed calls on synthetic frames (the window cycle: a reset every 4th
/// call), and reports per-phase median/p90, the calls' median/p90 and the peak device memory.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/gpu_telemetry.h"
#include "backend/options.h"
#include "config/run_config.h"
#include "policy/engine.h"
#include "policy/forward_graphs.h"
#include "policy/observation.h"

namespace dzr::rollout {

struct BenchRolloutOptions {
    /// The geometry (run.model) and the run settings: numerics (backend.numerics is set from it), kv.mode,
    /// text_prepass (the bench's prompt and the warm-up's), gpu_memory_budget (refuse before loading when the plan
    /// exceeds it), ...
    config::RunConfig run;
    std::vector<Device> devices{Device::cuda(0)};
    /// backend.profile: the timed calls' op profile (backend/profiler.h) goes to BenchRolloutResult::profile.
    BackendOptions backend;
    std::filesystem::path tokenizer;  ///< any umT5 spiece.model (the bench tokenizes a fixed prompt)
    int calls = 21;                   ///< timed calls after the warm-up
    uint64_t seed = 0;
    int threads = 0;                  ///< random-weight generation threads (0: all)
};

struct BenchRolloutResult {
    std::string devices, backend, numerics, engine;
    /// The DZR_* backend settings of the process environment that were set (apply_env_overrides' variables and
    /// DZR_CUDA_GRAPHS), name -> value: what the command line alone does not say about the run.
    std::vector<std::pair<std::string, std::string>> environment;
    double weights_ms = 0, load_ms = 0, warmup_ms = 0;
    int warmup_calls = 0;
    std::optional<int64_t> peak_memory_bytes;
    /// Device memory in use (cudaMemGetInfo) after the load and after the warm-up: which phase exceeds its plan.
    std::optional<int64_t> memory_after_load_bytes, memory_after_warmup_bytes;
    /// The memory plan (one device; policy/memory_plan.h): its peak and its JSON.
    std::optional<int64_t> planned_peak_bytes;
    nlohmann::ordered_json memory_plan;
    std::vector<PolicyCallResult> calls;  ///< the timed calls (actions and phase times)
    /// With backend.profile: per device, the profiler's JSON and table over the timed calls.
    nlohmann::ordered_json profile;
    std::string profile_table;
    /// The session's CUDA graphs after the timed calls (enabled = false: every forward ran op by op).
    ForwardGraphStats graphs;
    /// The same right after the warm-up (what it captured and how long capturing took).
    ForwardGraphStats warmup_graphs;
    /// Each GPU's clocks, power, temperature, limit reasons and energy over the timed calls (NVML; one entry per GPU,
    /// none on CPU): a sustained rollout runs at the power cap, so a time is read with the clock it ran at.
    std::vector<GpuTelemetrySummary> gpu_telemetry;

    nlohmann::ordered_json to_json() const;
    /// The table of phases (median, p90, max) and of the calls, for stderr/stdout.
    std::string table() const;
};

/// DROID's built-in description with the smooth statistics `dzr ckpt make` writes (synthetic_metadata_json): the
/// bench's embodiment.
Embodiment bench_embodiment();

/// The bench's synthetic DROID observation of one call: three cameras' frames [T, 180, 320, 3] and the state, both
/// different per call, and a fixed prompt (the CUDA graph tests feed the same calls).
struct BenchFrames {
    std::vector<uint8_t> data[3];
    Observation obs;
    BenchFrames(int T, int call);
};

BenchRolloutResult bench_rollout(const BenchRolloutOptions& options);

}  // namespace dzr::rollout
