#include "rollout/run_memory.h"

#include <fmt/format.h>

#include "backend/options.h"
#include "config/run_config.h"
#include "core/error.h"
#include "core/log.h"

namespace dzr::rollout {

EngineOptions rollout_engine_options(const RolloutOptions& opt, std::vector<std::string> prompts) {
    EngineOptions eo;
    eo.checkpoint = opt.checkpoint;
    eo.run = opt.run;
    eo.check_config_model = opt.have_config_model;
    eo.devices = opt.devices;
    eo.backend = apply_env_overrides({});
    eo.backend.numerics = opt.run.numerics;
    eo.backend.profile = !opt.profile.empty();
    eo.backend.profile_ops = !opt.profile_graphs;
    eo.tokenizer = opt.tokenizer;
    eo.check_finite = opt.check_finite;
    eo.video_decode = opt.save_video;
    eo.text_prepass = opt.run.text_prepass;
    if (opt.run.text_prepass) {
        if (opt.warmup) prompts.emplace_back(kWarmupPrompt);
        eo.prepass_prompts = std::move(prompts);
    }
    return eo;
}

MemoryPlan plan_device_memory(const ModelConfig& model, const Embodiment& embodiment, const PolicyOptions& options,
                              const Device& device, BackendOptions backend, int64_t video_latent_frames) {
    // NOTE: the planner only answers for its ops' workspace; it needs none of its own
    backend.workspace_bytes = size_t(1) << 20;
    backend.profile = false;
    const std::unique_ptr<Backend> planner = make_backend(device, backend);
    MemoryPlanOptions po;
    po.compute_dtype = planner->compute_dtype();
    po.kv_dtype = options.kv.dtype == Precision::Fp8 ? DType::F8_E4M3 : planner->compute_dtype();
    po.precision = options.precision == Precision::Fp8 ? WeightPrecision::Fp8 : WeightPrecision::Bf16;
    po.cuda = device.is_cuda();
    po.video_latent_frames = video_latent_frames;
    return plan_memory(model, embodiment, options, po, planner.get());
}

MemoryPlan plan_rollout_memory(const ModelConfig& model, const Embodiment& embodiment, const EngineOptions& eo,
                               int64_t video_latent_frames) {
    DZR_CHECK(eo.devices.size() == 1,
              "the memory plan covers one device; this run places the CFG branches on {} devices", eo.devices.size());
    return plan_device_memory(model, embodiment, eo.policy_options(), eo.devices[0], eo.backend, video_latent_frames);
}

std::string budget_alternatives(const ModelConfig& model, const Embodiment& embodiment, const EngineOptions& eo,
                                int64_t video_latent_frames, uint64_t budget) {
    if (eo.devices.size() != 1 || !eo.devices[0].is_cuda()) return {};  // fp8 runs on GPUs only
    const std::string fits = fp8_settings_that_fit(
        [&](bool fp8_kv, bool fp8_weights) -> std::optional<uint64_t> {
            EngineOptions alt = eo;
            if (fp8_kv) alt.run.kv.dtype = Precision::Fp8;
            if (fp8_weights) alt.run.precision = Precision::Fp8;
            if (alt.run.kv.dtype == eo.run.kv.dtype && alt.run.precision == eo.run.precision) return std::nullopt;
            if (alt.run.kv.in_place == KvInPlace::Auto) alt.run.kv.in_place = KvInPlace::Off;
            try {
                return plan_rollout_memory(model, embodiment, alt, video_latent_frames).peak_bytes();
            } catch (const Error&) {
                return std::nullopt;  // not plannable here
            }
        },
        budget);
    return fits.empty() ? std::string()
                        : fmt::format("\nThese fit, changing the numbers (docs/PARITY.md, FP8): {}", fits);
}

PlannedMemory memory_plan_summary(const MemoryPlan& plan) {
    PlannedMemory m;
    m.cuda = plan.options.cuda;
    m.peak_bytes = int64_t(plan.peak_bytes());
    m.peak_phase = plan.peak().key;
    for (const MemoryPhase& ph : plan.phases) m.phases[ph.key] = ph.bytes;
    return m;
}

BudgetFit plan_within_budget(const ModelConfig& model, const Embodiment& embodiment, const EngineOptions& eo,
                             int64_t video_latent_frames, uint64_t budget, const std::string& what) {
    // NOTE: the settings that keep the numbers fit the run to its budget, so the user need not know which to flip
    const bool offload_auto = !config::parse_offload_layers(eo.run.offload_layers, "offload_layers");
    BudgetFit fit = fit_memory_budget(budget, eo.run.kv.in_place == KvInPlace::Auto, offload_auto,
                                      model.dit.num_layers, [&](const MemoryChoices& c) {
                                          EngineOptions o = eo;
                                          c.apply(o.run);
                                          return plan_rollout_memory(model, embodiment, o, video_latent_frames);
                                      });
    for (const std::string& note : fit.notes) log()->info("memory plan ({}): {}", what, note);
    if (fit.plan.peak_bytes() <= budget) return fit;
    const std::string hint = budget_alternatives(model, embodiment, eo, video_latent_frames, budget);
    try {
        check_memory_budget(fit.plan, budget, what);
    } catch (const Error& e) {
        throw Error(e.what() + hint);
    }
    return fit;
}

std::optional<uint64_t> rollout_memory_budget(const RolloutOptions& opt) {
    if (opt.run.gpu_memory_budget.empty()) return std::nullopt;
    return config::parse_memory_budget(opt.run.gpu_memory_budget, "gpu_memory_budget");
}

}  // namespace dzr::rollout
