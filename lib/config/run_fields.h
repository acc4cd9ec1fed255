#pragma once
/// One table of the run settings of a RunConfig (sampling, kv, rollout, embodiment), as model_fields.h is for the
/// geometry: the YAML reader walks it for the `sampling:` and `rollout:` sections, and run_config_json() walks it
/// and the model table to record exactly what a run used (manifest.json).
#include <nlohmann/json.hpp>

#include <string_view>

#include "config/model_fields.h"
#include "config/run_config.h"

namespace dzr::config {

struct RunField {
    std::string_view section;  // "sampling", "kv", "rollout", "" (top level)
    std::string_view name;     // "num_inference_steps"
};

/// Calls f(const RunField&, field&) for every field of a `sampling:` section (SamplingConfig, const or not).
template <class S, class F>
void for_each_sampling_field(S& s, F&& f) {
    f(RunField{"sampling", "num_inference_steps"}, s.num_inference_steps);
    f(RunField{"sampling", "sigma_shift"}, s.sigma_shift);
    f(RunField{"sampling", "cfg_scale"}, s.cfg_scale);
    f(RunField{"sampling", "num_dit_steps"}, s.num_dit_steps);
    f(RunField{"sampling", "dit_step_mask"}, s.dit_step_mask);
    f(RunField{"sampling", "dynamic_schedule"}, s.dynamic_schedule);
    f(RunField{"sampling", "seed"}, s.seed);
}

/// The same for a `kv:` section (KvConfig; its parser is parse_kv_config, kv_config.h).
template <class K, class F>
void for_each_kv_field(K& k, F&& f) {
    f(RunField{"kv", "window_frames"}, k.window_frames);
    f(RunField{"kv", "sink_frames"}, k.sink_frames);
    f(RunField{"kv", "frames_per_block"}, k.frames_per_block);
    f(RunField{"kv", "memory_budget"}, k.memory_budget);
    f(RunField{"kv", "reset_at_boundary"}, k.reset_at_boundary);
    f(RunField{"kv", "dtype"}, k.dtype);
}

/// The same for a `rollout:` section (RolloutConfig).
template <class R, class F>
void for_each_rollout_field(R& r, F&& f) {
    f(RunField{"rollout", "stride"}, r.stride);
    f(RunField{"rollout", "offsets"}, r.offsets);
    f(RunField{"rollout", "max_chunks"}, r.max_chunks);
    f(RunField{"rollout", "start_frame"}, r.start_frame);
}

/// Every run setting of a RunConfig (const or not): the three sections, then the top-level `embodiment` and
/// `precision`, `gpu_memory_budget`, `cuda_graphs`, `batch_cfg`, `offload_layers`. Field types: int, float, bool, uint64_t, std::string, std::vector<int>,
/// std::vector<bool>, KvBudget, Precision.
template <class C, class F>
void for_each_run_field(C& c, F&& f) {
    for_each_sampling_field(c.sampling, f);
    for_each_kv_field(c.kv, f);
    for_each_rollout_field(c.rollout, f);
    f(RunField{"", "embodiment"}, c.embodiment);
    f(RunField{"", "precision"}, c.precision);
    f(RunField{"", "gpu_memory_budget"}, c.gpu_memory_budget);
    f(RunField{"", "cuda_graphs"}, c.cuda_graphs);
    f(RunField{"", "batch_cfg"}, c.batch_cfg);
    f(RunField{"", "offload_layers"}, c.offload_layers);
}

/// The whole configuration as nested JSON ({"model": {"dit": {...}, ...}, "sampling": {...}, "kv": {...},
/// "rollout": {...}, "embodiment": ...}), walking both field tables.
nlohmann::ordered_json run_config_json(const RunConfig& r);

}  // namespace dzr::config
