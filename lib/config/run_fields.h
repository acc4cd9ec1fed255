#pragma once
/// The registry of the run settings (settings.h) and the typed walk over a RunConfig's fields, as model_fields.h is
/// for the geometry: the YAML reader walks it for the `sampling:` and `rollout:` sections and the top-level keys,
/// run_config_json() walks it and the model table to record exactly what a run used (manifest.json), and
/// settings.cpp reads and sets a setting through it.
#include <nlohmann/json.hpp>

#include <string_view>

#include "config/model_fields.h"
#include "config/run_config.h"
#include "config/settings.h"

namespace dzr::config {

/// One entry per run setting: name, YAML key, flag, environment variable, values, changes the numbers, what.
namespace setting {
// clang-format off
inline constexpr Setting kNumInferenceSteps{"num_inference_steps", "sampling.num_inference_steps", "", "", "1 to 1000", true, "Flow-matching sampler steps per call"};
inline constexpr Setting kSigmaShift{"sigma_shift", "sampling.sigma_shift", "", "", "(0, 100]", true, "Shift of the flow schedule's sigmas"};
inline constexpr Setting kCfgScale{"cfg_scale", "sampling.cfg_scale", "", "", "[0, 100]", true, "Classifier-free guidance scale"};
inline constexpr Setting kNumDitSteps{"num_dit_steps", "sampling.num_dit_steps", "", "", "1 to num_inference_steps (5 to 8: the presets for 16 steps)", true, "Steps that evaluate the DiT"};
inline constexpr Setting kDitStepMask{"dit_step_mask", "sampling.dit_step_mask", "", "", "a list of booleans, one per step (empty: from num_dit_steps)", true, "Which steps evaluate the DiT"};
inline constexpr Setting kDynamicSchedule{"dynamic_schedule", "sampling.dynamic_schedule", "", "", "true or false", true, "on: the dynamic schedule decides while it runs which steps evaluate the DiT"};
inline constexpr Setting kSeed{"seed", "sampling.seed", "", "", "an integer >= 0", true, "The noise seed"};
inline constexpr Setting kWindowFrames{"window_frames", "kv.window_frames", "", "", "an integer", true, "Visible video frames of the KV window (history and current)"};
inline constexpr Setting kSinkFrames{"sink_frames", "kv.sink_frames", "", "", "an integer >= 0", true, "Leading frames sliding eviction never drops"};
inline constexpr Setting kFramesPerBlock{"frames_per_block", "kv.frames_per_block", "", "", "an integer >= 1", true, "Latent frames per KV block"};
inline constexpr Setting kKvMemoryBudget{"kv_memory_budget", "kv.memory_budget", "", "", "auto, a byte size or a percentage of free memory", true, "The KV pool's size"};
inline constexpr Setting kResetAtBoundary{"reset_at_boundary", "kv.reset_at_boundary", "", "", "true or false", true, "on: the window restarts at its boundary; off: sliding eviction"};
inline constexpr Setting kKvDtype{"kv_dtype", "kv.dtype", "--kv-dtype", "", "bf16 or fp8", true, "KV pool and cross caches: bf16 or fp8 (E4M3, a scale per token and head)"};
inline constexpr Setting kKvMode{"kv_mode", "kv.mode", "--kv", "", "paged or dense", true, "KV cache: paged, or dense (the reference path)"};
// NOTE: in fast numerics the lanes' attention reads the current rows in place, another kernel path (docs/MEMORY.md)
inline constexpr Setting kKvInPlace{"kv_in_place", "kv.in_place", "", "", "auto, true or false", true, "Lay the CFG branches' KV blocks out in lanes with room for the current rows (auto: where they apply and fit)"};
inline constexpr Setting kStride{"stride", "rollout.stride", "", "", "1 to 10000000", true, "Frames between calls"};
inline constexpr Setting kOffsets{"offsets", "rollout.offsets", "", "", "a list of increasing integers <= 0", true, "Frames of a call relative to its anchor"};
inline constexpr Setting kMaxChunks{"max_chunks", "rollout.max_chunks", "", "", "an integer >= 0 (0: all)", true, "Calls per episode (0: until the episode ends)"};
inline constexpr Setting kStartFrame{"start_frame", "rollout.start_frame", "", "", "an integer >= 0", true, "The episode's first anchor frame"};
inline constexpr Setting kEmbodiment{"embodiment", "embodiment", "--embodiment", "", "an embodiment tag", true, "The checkpoint's embodiment to run; none: the checkpoint's only one"};
inline constexpr Setting kPrecision{"precision", "precision", "--precision", "", "bf16 or fp8", true, "DiT Linear weights: bf16 or fp8 (E4M3, per-channel scales; quantized at load unless the checkpoint stores them)"};
// NOTE: the budget only refuses runs that do not fit (or streams layers, below); it never changes an output
inline constexpr Setting kGpuMemoryBudget{"gpu_memory_budget", "gpu_memory_budget", "--gpu-memory-budget", "", "a size (44GiB, 48GB, 32000MiB); empty: none", false, "Fit the run's memory plan (`dzr plan`) to this much device memory (44GiB, 48GB, 32000MiB), giving up the in-place KV lanes, then streaming DiT layers from host memory (offload_layers auto), and refuse it, before anything is loaded, when nothing fits"};
// NOTE: graph replay is bit-identical to op-by-op execution (tests/cuda/test_graphs.cpp)
inline constexpr Setting kCudaGraphs{"cuda_graphs", "cuda_graphs", "--no-cuda-graphs", "DZR_CUDA_GRAPHS", "true or false", false, "on: each DiT forward replays the CUDA graph captured for its shape in the warm-up; off: op by op (same actions, slower)"};
inline constexpr Setting kBatchCfg{"batch_cfg", "batch_cfg", "--no-batch-cfg", "", "true or false", true, "on, in fast numerics: the two CFG branches' DiT forwards run as one batched forward; off: one after the other (slower)"};
// NOTE: streamed layers run the same bytes through the same kernels (tests/model/test_layer_stream.cpp)
inline constexpr Setting kOffloadLayers{"offload_layers", "offload_layers", "", "", "auto or a count", false, "DiT layers streamed from host memory as they run (auto: as many as --gpu-memory-budget needs, else none)"};
inline constexpr Setting kNumerics{"numerics", "numerics", "--numerics", "", "fast or reference", true, "fast (fused kernels, f32 sampling; within the gate against the official fp32 run) or reference (the official bf16 run's arithmetic, bit for bit)"};
// NOTE: the pre-pass encodes the same prompts with the same weights (tests/model/test_memory_rollout.cpp)
inline constexpr Setting kTextPrepass{"text_prepass", "text_prepass", "--no-text-prepass", "", "true or false", false, "on: umT5 encodes the run's prompts before the other networks load and is freed; off: it stays resident and encodes each prompt in its call (same actions, more device memory)"};
// clang-format on
}  // namespace setting

/// Calls f(const Setting&, field&) for every run setting of a RunConfig (const or not) and its field, in the
/// manifest's order: the `sampling:`, `kv:` and `rollout:` sections, then the top-level keys. Field types: int, float,
/// bool, uint64_t, std::string, std::vector<int>, std::vector<bool>, KvBudget, Precision, KvMode, KvInPlace, Numerics.
template <class C, class F>
void for_each_run_field(C& c, F&& f) {
    f(setting::kNumInferenceSteps, c.sampling.num_inference_steps);
    f(setting::kSigmaShift, c.sampling.sigma_shift);
    f(setting::kCfgScale, c.sampling.cfg_scale);
    f(setting::kNumDitSteps, c.sampling.num_dit_steps);
    f(setting::kDitStepMask, c.sampling.dit_step_mask);
    f(setting::kDynamicSchedule, c.sampling.dynamic_schedule);
    f(setting::kSeed, c.sampling.seed);
    // the kv: section's parser is parse_kv_config (kv_config.h)
    f(setting::kWindowFrames, c.kv.window_frames);
    f(setting::kSinkFrames, c.kv.sink_frames);
    f(setting::kFramesPerBlock, c.kv.frames_per_block);
    f(setting::kKvMemoryBudget, c.kv.memory_budget);
    f(setting::kResetAtBoundary, c.kv.reset_at_boundary);
    f(setting::kKvDtype, c.kv.dtype);
    f(setting::kKvMode, c.kv.mode);
    f(setting::kKvInPlace, c.kv.in_place);
    f(setting::kStride, c.rollout.stride);
    f(setting::kOffsets, c.rollout.offsets);
    f(setting::kMaxChunks, c.rollout.max_chunks);
    f(setting::kStartFrame, c.rollout.start_frame);
    f(setting::kEmbodiment, c.embodiment);
    f(setting::kPrecision, c.precision);
    f(setting::kGpuMemoryBudget, c.gpu_memory_budget);
    f(setting::kCudaGraphs, c.cuda_graphs);
    f(setting::kBatchCfg, c.batch_cfg);
    f(setting::kOffloadLayers, c.offload_layers);
    f(setting::kNumerics, c.numerics);
    f(setting::kTextPrepass, c.text_prepass);
}

/// The same for the settings of one YAML section ("sampling", "kv", "rollout"; "" for the top level).
template <class C, class F>
void for_each_section_field(C& c, std::string_view section, F&& f) {
    for_each_run_field(c, [&](const Setting& s, auto& value) {
        if (s.section() == section) f(s, value);
    });
}

/// The whole configuration as nested JSON ({"model": {"dit": {...}, ...}, "sampling": {...}, "kv": {...},
/// "rollout": {...}, "embodiment": ...}), walking both field tables.
nlohmann::ordered_json run_config_json(const RunConfig& r);

/// The run settings alone (no "model"), those that can change the numbers when `numbers_only`.
nlohmann::ordered_json run_settings_json(const RunConfig& r, bool numbers_only);

/// Checks a value the type alone does not (gpu_memory_budget, offload_layers); `where` names it in the error.
void check_setting_value(const RunConfig& r, const Setting& s, const std::string& where);

}  // namespace dzr::config
