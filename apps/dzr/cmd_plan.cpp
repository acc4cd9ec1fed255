// `dzr plan`: the device-memory plan of a run (policy/memory_plan.h), without a GPU and without loading anything.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "apps/dzr/command.h"
#include "apps/dzr/run_flags.h"
#include "backend/backend.h"
#include "config/embodiment.h"
#include "config/run_config.h"
#include "core/error.h"
#include "policy/memory_plan.h"
#include "weights/checkpoint.h"

namespace dzr::app {
namespace {

struct PlanArgs {
    std::string config;
    std::string checkpoint;
    std::vector<std::string> sets;
    RunFlags run_flags;  // --embodiment, --precision, --numerics, ... (config/settings.h), as `dzr rollout`
    std::string device;
    int max_sessions = 1;
    bool json = false;
};

/// The embodiment a plan runs: the checkpoint's, else the built-in of the run's tag (--embodiment, else the config's;
/// DROID by default) with the smooth statistics `dzr ckpt make` writes (the plan reads none of them).
Embodiment plan_embodiment(const PlanArgs& a, const config::RunConfig& run, const ModelConfig& model) {
    const std::string& tag = run.embodiment;
    if (!a.checkpoint.empty()) return select_embodiment(load_checkpoint_embodiments(a.checkpoint), tag, model);
    Embodiment e = builtin_embodiment(tag.empty() ? "oxe_droid" : tag);
    const std::string source = "dzr plan (synthetic metadata)";
    bind_metadata(e, parse_embodiment_metadata(synthetic_metadata_json(e), source).at(e.tag), source);
    check_embodiment(e, model);
    return e;
}

int run(const PlanArgs& a) {
    DZR_CHECK(!a.config.empty() || !a.checkpoint.empty(),
              "dzr plan needs --config CFG (a geometry and run settings) or --checkpoint DIR (its config.json)");
    std::vector<config::Override> overrides;
    for (const auto& s : a.sets) overrides.push_back(config::parse_override(s));
    config::RunConfig run;
    if (!a.config.empty()) {
        run = config::load_run_config(a.config, overrides);
    } else {
        DZR_CHECK(overrides.empty(), "--set needs --config (the settings it overrides come from a config file)");
    }
    a.run_flags.apply(run);
    // NOTE: a checkpoint's geometry is its config.json's (no weight is read)
    const ModelConfig model = a.checkpoint.empty() ? run.model : Checkpoint(a.checkpoint).model_config();
    const Embodiment embodiment = plan_embodiment(a, run, model);

    MemoryPlanOptions po;
    po.precision = parse_weight_precision(precision_name(run.precision), "--precision");
    po.kv_dtype = parse_kv_dtype(precision_name(run.kv.dtype), "--kv-dtype");
    const uint64_t budget = run.gpu_memory_budget.empty()
                                ? 0
                                : config::parse_memory_budget(run.gpu_memory_budget, "gpu_memory_budget");
    DZR_CHECK(a.max_sessions >= 1, "--max-sessions must be at least 1, got {}", a.max_sessions);
    PolicyOptions options = run_policy_options(run);
    options.text_prepass = run.text_prepass;
    options.max_sessions = a.max_sessions;
    const std::optional<int> offload = config::parse_offload_layers(run.offload_layers, "offload_layers");
    po.numerics = run.numerics;

    // Offline by default; --device plans with that device's backend (a GPU's convolution scratch included).
    std::unique_ptr<Backend> planner;
    if (!a.device.empty()) {
        const Device device = parse_device(a.device);
        BackendOptions bo;
        bo.workspace_bytes = size_t(1) << 20;
        bo.numerics = po.numerics;
        planner = make_backend(device, bo);
        po.compute_dtype = planner->compute_dtype();
        po.cuda = device.is_cuda();
        if (!device.is_cuda()) {
            DZR_CHECK(po.precision == WeightPrecision::Bf16 && po.kv_dtype == DType::BF16,
                      "--device cpu plans the CPU backend's f32 engine; --precision and --kv-dtype fp8 are for GPUs");
            po.kv_dtype = po.compute_dtype;
        }
    }
    // NOTE: as a rollout does: under a budget, kv.in_place auto and offload_layers auto choose what fits
    BudgetFit fit = fit_memory_budget(budget, options.kv.in_place == KvInPlace::Auto, !offload.has_value(),
                                      model.dit.num_layers, [&](const MemoryChoices& c) {
                                          PolicyOptions o = options;
                                          c.apply(o);
                                          return plan_memory(model, embodiment, o, po, planner.get());
                                      });
    const MemoryPlan& plan = fit.plan;
    const bool fits = budget == 0 || plan.peak_bytes() <= budget;
    if (a.json) {
        nlohmann::ordered_json j;
        j["config"] = a.config.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(a.config);
        j["checkpoint"] = a.checkpoint.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(a.checkpoint);
        j["embodiment"] = embodiment.tag;
        const nlohmann::ordered_json pj = plan.to_json();
        for (auto it = pj.begin(); it != pj.end(); ++it) j[it.key()] = it.value();
        j["kv_in_place_given_up"] = fit.choices.kv_lanes_off;
        j["offload_layers_chosen"] = fit.choices.offload_layers;
        if (budget > 0)
            j["budget"] = {{"bytes", budget},
                           {"fits", fits},
                           {"spare_bytes", fits ? budget - plan.peak_bytes() : 0},
                           {"shortfall_bytes", fits ? 0 : plan.peak_bytes() - budget}};
        else
            j["budget"] = nullptr;
        std::printf("%s\n", j.dump(2).c_str());
    } else {
        std::printf("dzr plan: %s, embodiment %s; planned %s; %s numerics; %s weights (DiT), %s KV cache, text "
                    "pre-pass %s%s\n",
                    !a.checkpoint.empty() ? a.checkpoint.c_str() : a.config.c_str(), embodiment.tag.c_str(),
                    plan.planner.c_str(), numerics_name(plan.numerics), std::string(precision_name(po.precision)).c_str(),
                    po.kv_dtype == DType::F8_E4M3 ? "fp8" : std::string(dtype_name(po.kv_dtype)).c_str(),
                    plan.text_prepass ? "on" : "off",
                    plan.sessions > 1 ? fmt::format("; {} sessions at once", plan.sessions).c_str() : "");
        std::printf("%s", plan.table(budget).c_str());
        for (const std::string& note : fit.notes) std::printf("%s\n", note.c_str());
    }
    if (!fits) {
        std::fprintf(stderr, "dzr: error: the plan's peak (%s) exceeds the budget %s by %s\n",
                     gib(plan.peak_bytes()).c_str(), run.gpu_memory_budget.c_str(), gib(plan.peak_bytes() - budget).c_str());
        const std::string fitting = fp8_settings_that_fit(
            [&](bool fp8_kv, bool fp8_weights) -> std::optional<uint64_t> {
                if (!po.cuda && planner) return std::nullopt;  // the CPU backend has no fp8
                MemoryPlanOptions alt_po = po;
                PolicyOptions alt = options;
                if (fp8_kv) alt_po.kv_dtype = DType::F8_E4M3, alt.kv.dtype = Precision::Fp8;
                if (fp8_weights) alt_po.precision = WeightPrecision::Fp8, alt.precision = Precision::Fp8;
                if (alt_po.kv_dtype == po.kv_dtype && alt_po.precision == po.precision) return std::nullopt;
                if (alt.kv.in_place == KvInPlace::Auto) alt.kv.in_place = KvInPlace::Off;
                return plan_memory(model, embodiment, alt, alt_po, planner.get()).peak_bytes();
            },
            budget);
        if (!fitting.empty())
            std::fprintf(stderr, "dzr: these fit, changing the numbers (docs/PARITY.md, FP8): %s\n", fitting.c_str());
        return 1;
    }
    return 0;
}

CommandRegistrar reg([](CLI::App& app, std::function<int()>& run_fn) {
    auto args = std::make_shared<PlanArgs>();
    auto* cmd = app.add_subcommand(
        "plan", "The device-memory plan of a run: every part's bytes and each phase's peak, without a GPU");
    cmd->add_option("--config", args->config, "Run config (configs/*.yaml): the geometry, kv and sampling settings");
    cmd->add_option("--checkpoint", args->checkpoint,
                    "Take the geometry from a checkpoint's config.json and its embodiment (no weight is read)");
    cmd->add_option("--set", args->sets, "Override a key of the --config file: --set kv.window_frames=5");
    // NOTE: without a checkpoint, the embodiment defaults to the built-in oxe_droid (plan_embodiment); a plan that
    // does not fit the budget exits 1
    args->run_flags.add(cmd, {"embodiment", "precision", "kv.dtype", "gpu_memory_budget"});
    cmd->add_option("--device", args->device,
                    "Plan with this device's backend (cuda:N: the GPU sizes its convolutions' scratch; cpu: the f32 "
                    "CPU engine); default: offline, for a CUDA GPU");
    args->run_flags.add(cmd, {"kv.mode", "text_prepass"});
    cmd->add_option("--max-sessions", args->max_sessions,
                    "Sessions open at once (`dzr serve --max-sessions`, which plans with --no-text-prepass): each "
                    "with its KV blocks, cross-attention caches and buffers")
        ->capture_default_str();
    args->run_flags.add(cmd, {"numerics"});
    cmd->add_flag("--json", args->json, "Machine-readable output");
    cmd->callback([args, &run_fn] { run_fn = [args] { return run(*args); }; });
});

}  // namespace
}  // namespace dzr::app
