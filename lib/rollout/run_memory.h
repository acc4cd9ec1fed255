#pragma once
/// The memory side of a rollout: the engine options it loads with (the text pre-pass over the run's prompts), and
/// its memory plan (policy/memory_plan.h), made while the run is validated so that a --gpu-memory-budget the plan
/// exceeds refuses the run before anything is loaded or written.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "config/embodiment.h"
#include "policy/engine.h"
#include "policy/memory_plan.h"
#include "rollout/reports.h"
#include "rollout/rollout_options.h"

namespace dzr::rollout {

/// The prompt of the warm-up's synthetic calls (the text pre-pass encodes it with the episodes' prompts).
inline constexpr const char* kWarmupPrompt = "warm up";

/// The options Engine::load gets for a rollout of `opt` whose episodes carry `prompts` (the pre-pass's list;
/// the warm-up's prompt is added when the run warms up).
EngineOptions rollout_engine_options(const RolloutOptions& opt, std::vector<std::string> prompts);

/// The plan of an engine with `options` on `device`, planned with a backend of that device made with `backend`
/// (so a GPU's convolution scratch is in it); `video_latent_frames` > 0 adds the video decode.
MemoryPlan plan_device_memory(const ModelConfig& model, const Embodiment& embodiment, const PolicyOptions& options,
                              const Device& device, BackendOptions backend, int64_t video_latent_frames);

/// The plan of a one-device rollout of `model` and `embodiment` with `engine` options, planned with a backend
/// of the run's device (so a GPU's convolution scratch is in it); `video_latent_frames` > 0 adds the video
/// decode (--save-video). Throws for two devices (a plan covers one).
MemoryPlan plan_rollout_memory(const ModelConfig& model, const Embodiment& embodiment, const EngineOptions& engine,
                               int64_t video_latent_frames);

/// The figures of `plan` a timing report carries.
/// For a run over `budget`: the settings that change the numbers and would fit it (fp8 KV cache, fp8 DiT weights,
/// both), each with its planned peak, as one sentence for the refusal; empty when none would.
std::string budget_alternatives(const ModelConfig& model, const Embodiment& embodiment, const EngineOptions& eo,
                                int64_t video_latent_frames, uint64_t budget);

PlannedMemory memory_plan_summary(const MemoryPlan& plan);

/// The plan of `eo` (plan_rollout_memory) fitted to `budget` (`what` names it: "GPU memory budget 44GiB
/// (44.00 GiB)") by the settings that keep the numbers (fit_memory_budget: kv.in_place auto gives up the lanes,
/// offload_layers auto streams DiT layers), each choice logged. Throws, naming the FP8 settings that would fit,
/// when nothing does.
BudgetFit plan_within_budget(const ModelConfig& model, const Embodiment& embodiment, const EngineOptions& eo,
                             int64_t video_latent_frames, uint64_t budget, const std::string& what);

/// The budget of a run (--gpu-memory-budget or the config's gpu_memory_budget) in bytes; nullopt without one.
std::optional<uint64_t> rollout_memory_budget(const RolloutOptions& opt);

}  // namespace dzr::rollout
