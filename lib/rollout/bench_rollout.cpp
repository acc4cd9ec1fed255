#include "rollout/bench_rollout.h"

#include <fmt/format.h>

#include <cstdlib>

#include "backend/env_settings.h"
#include "config/run_config.h"
#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "model/inventory.h"
#include "rollout/progress.h"
#include "rollout/reports.h"
#include "rollout/run_memory.h"
#include "rollout/runner.h"
#include "weights/random_weights.h"

namespace dzr::rollout {

namespace {

constexpr const char* kBenchPrompt = "pick up the cup and put it on the plate";

std::vector<double> phase_values(const std::vector<PolicyCallResult>& calls, double PhaseTimes::*field) {
    std::vector<double> v;
    for (const auto& c : calls) v.push_back(c.times.*field);
    return v;
}

struct PhaseField {
    const char* name;
    double PhaseTimes::*field;
};
constexpr PhaseField kPhaseFields[] = {
    {"preprocess", &PhaseTimes::preprocess},   {"text_encoder", &PhaseTimes::text_encoder},
    {"image_encoder", &PhaseTimes::image_encoder}, {"vae_encode", &PhaseTimes::vae_encode},
    {"kv_commit", &PhaseTimes::kv_commit},     {"dit", &PhaseTimes::dit},
    {"scheduler", &PhaseTimes::scheduler},     {"postprocess", &PhaseTimes::postprocess},
    {"total", &PhaseTimes::total},             {"host_prepare", &PhaseTimes::host_prepare},
};

}  // namespace

Embodiment bench_embodiment() {
    Embodiment e = builtin_embodiment("oxe_droid");
    const auto md = parse_embodiment_metadata(synthetic_metadata_json(e), "bench (synthetic metadata)");
    bind_metadata(e, md.at(e.tag), "bench (synthetic metadata)");
    return e;
}

BenchFrames::BenchFrames(int T, int call) {
    const Shape s{T, kFrameHeight, kFrameWidth, 3};
    TensorView views[3];
    for (int c = 0; c < 3; ++c) {
        data[c].resize(size_t(s.numel()));
        for (size_t i = 0; i < data[c].size(); ++i)
            data[c][i] = uint8_t(((i / 3) * 7 + i % 3 * 50 + size_t(call) * 13 + size_t(c) * 29) % 256);
        views[c] = TensorView(data[c].data(), DType::U8, s);
    }
    const double joints[7] = {-0.3, -0.2, -0.1, 0.0, 0.1, 0.2, 0.05 * call};
    obs = droid_observation(views[0], views[1], views[2], joints, 0.5, kBenchPrompt);
}

BenchRolloutResult bench_rollout(const BenchRolloutOptions& o) {
    DZR_CHECK(o.calls >= 1 && o.calls <= 10000, "bench rollout: --calls must be in 1..10000, got {}", o.calls);
    DZR_CHECK(o.devices.size() == 1 || o.devices.size() == 2, "bench rollout: one or two devices, got {}",
              o.devices.size());
    BenchRolloutResult r;
    PolicyOptions po = run_policy_options(o.run);
    po.text_prepass = o.run.text_prepass;
    if (o.run.text_prepass) po.prepass_prompts = {kBenchPrompt, kWarmupPrompt};
    const Embodiment embodiment = bench_embodiment();
    // The plan first: a budget it exceeds refuses the bench before the weights are made.
    if (o.devices.size() == 1) {
        // NOTE: as a rollout does, the budget is fitted with the settings that keep the numbers (fit_memory_budget)
        const uint64_t budget =
            o.run.gpu_memory_budget.empty() ? 0 : config::parse_memory_budget(o.run.gpu_memory_budget, "--gpu-memory-budget");
        const bool offload_auto = !config::parse_offload_layers(o.run.offload_layers, "offload_layers");
        const BudgetFit fit = fit_memory_budget(budget, po.kv.in_place == KvInPlace::Auto, offload_auto,
                                                o.run.model.dit.num_layers, [&](const MemoryChoices& c) {
                                                    PolicyOptions p = po;
                                                    c.apply(p);
                                                    return plan_device_memory(o.run.model, embodiment, p,
                                                                              o.devices[0], o.backend, 0);
                                                });
        for (const std::string& note : fit.notes)
            log()->info("memory plan (--gpu-memory-budget {}): {}", o.run.gpu_memory_budget, note);
        fit.choices.apply(po);
        const MemoryPlan& plan = fit.plan;
        if (budget > 0) check_memory_budget(plan, budget, "--gpu-memory-budget " + o.run.gpu_memory_budget);
        if (plan.options.cuda) r.planned_peak_bytes = int64_t(plan.peak_bytes());
        r.memory_plan = plan.to_json();
    } else {
        DZR_CHECK(o.run.gpu_memory_budget.empty(), "bench rollout: --gpu-memory-budget plans one device, got {}",
                  o.devices.size());
    }
    Timer t;
    const RandomWeightSource weights(expected_weights(o.run.model), o.seed, o.threads);
    r.weights_ms = t.ms();

    t.reset();
    const auto owned = Engine::create(o.run.model, weights, embodiment, o.tokenizer, po, o.devices, o.backend);
    Engine& engine = *owned;
    auto session = engine.open_session();
    r.load_ms = t.ms();
    // the device memory in use now, folded into the peak
    const auto sample_memory = [&] {
        const auto m = engine.device_memory_in_use();
        if (m) r.peak_memory_bytes = std::max(r.peak_memory_bytes.value_or(0), *m);
        return m;
    };
    r.memory_after_load_bytes = sample_memory();
    r.warmup_ms = run_warmup(engine, *session, r.warmup_calls);
    r.warmup_graphs = session->graph_stats();
    r.memory_after_warmup_bytes = sample_memory();
    engine.reset_profiles();
    // NOTE: sampled on a thread of its own (NVML reads every 100 ms); the device work is not touched
    GpuTelemetry telemetry(engine.pci_bus_ids());
    telemetry.start();
    for (int c = 0; c < o.calls; ++c) {
        BenchFrames f(c == 0 ? 1 : 4, c);
        PreparedObservation prepared = engine.prepare(f.obs);
        r.calls.push_back(session->step(prepared));
        engine.recycle(std::move(prepared));
        sample_memory();
    }
    r.gpu_telemetry = telemetry.stop();
    r.graphs = session->graph_stats();
    if (o.backend.profile) r.profile = engine.profile_json(&r.profile_table);
    r.devices = engine.devices();
    r.backend = engine.backend().name();
    r.numerics = numerics_name(engine.backend().numerics());
    r.engine = engine.describe();
    r.environment = env_values_set(/*numbers_only=*/false);
    return r;
}

nlohmann::ordered_json BenchRolloutResult::to_json() const {
    nlohmann::ordered_json j;
    j["devices"] = devices;
    j["backend"] = backend;
    j["numerics"] = numerics;
    j["engine"] = engine;
    nlohmann::ordered_json env = nlohmann::ordered_json::object();
    for (const auto& [name, value] : environment) env[name] = value;
    j["environment"] = env;
    j["random_weights_ms"] = weights_ms;
    j["load_ms"] = load_ms;
    j["warmup"] = {{"calls", warmup_calls}, {"ms", warmup_ms}};
    j["peak_gpu_memory_bytes"] = peak_memory_bytes ? nlohmann::ordered_json(*peak_memory_bytes) : nullptr;
    j["planned_peak_gpu_memory_bytes"] = planned_peak_bytes ? nlohmann::ordered_json(*planned_peak_bytes) : nullptr;
    const auto opt_json = [](const std::optional<int64_t>& v) { return v ? nlohmann::ordered_json(*v) : nullptr; };
    j["gpu_memory_after_load_bytes"] = opt_json(memory_after_load_bytes);
    j["gpu_memory_after_warmup_bytes"] = opt_json(memory_after_warmup_bytes);
    j["memory_plan"] = memory_plan;
    nlohmann::ordered_json gpus = nlohmann::ordered_json::array();
    for (const GpuTelemetrySummary& g : gpu_telemetry) gpus.push_back(g.to_json(int64_t(calls.size())));
    j["gpu_telemetry"] = gpus;
    j["cuda_graphs"] = {{"used", graphs.enabled && graphs.captured > 0},
                        {"enabled", graphs.enabled},
                        {"captured", graphs.captured},
                        {"failed", graphs.failed},
                        {"capture_ms", graphs.capture_ms},
                        {"captured_in_warmup", warmup_graphs.captured},
                        {"capture_ms_in_warmup", warmup_graphs.capture_ms},
                        {"replays_timed", graphs.replays - warmup_graphs.replays},
                        {"eager_forwards_timed", graphs.eager - warmup_graphs.eager},
                        {"first_failure", graphs.first_failure}};
    // Steady calls: every call but the first (a prefill) and the window resets (every 4th).
    std::vector<PolicyCallResult> steady, resets;
    for (const auto& c : calls) (c.reset ? resets : steady).push_back(c);
    const auto stats = [](const std::vector<double>& v) { return stats_json(compute_stats(v)); };
    using Set = std::pair<const char*, const std::vector<PolicyCallResult>*>;
    for (const auto& [name, set] : {Set{"all", &calls}, Set{"steady", &steady}, Set{"reset", &resets}}) {
        nlohmann::ordered_json phases;
        for (const PhaseField& f : kPhaseFields) phases[f.name] = stats(phase_values(*set, f.field));
        j[name] = phases;
    }
    nlohmann::ordered_json per_call = nlohmann::ordered_json::array();
    for (const auto& c : calls) {
        nlohmann::ordered_json e{{"call", c.call_index}, {"reset", c.reset}, {"start_frame", c.start_frame},
                                 {"dit_evaluations", c.dit_evaluations}};
        for (const PhaseField& f : kPhaseFields) e[f.name] = c.times.*(f.field);
        per_call.push_back(e);
    }
    j["calls"] = per_call;
    return j;
}

std::string BenchRolloutResult::table() const {
    std::vector<PolicyCallResult> steady, resets;
    for (const auto& c : calls) (c.reset ? resets : steady).push_back(c);
    std::vector<std::vector<std::string>> rows;
    for (const PhaseField& f : kPhaseFields) {
        const TimingStats a = compute_stats(phase_values(calls, f.field));
        const TimingStats s = compute_stats(phase_values(steady, f.field));
        const TimingStats rs = compute_stats(phase_values(resets, f.field));
        rows.push_back({f.name, fmt::format("{:.2f}", a.median), fmt::format("{:.2f}", a.p90),
                        steady.empty() ? "-" : fmt::format("{:.2f}", s.median),
                        steady.empty() ? "-" : fmt::format("{:.2f}", s.p90),
                        resets.empty() ? "-" : fmt::format("{:.2f}", rs.median)});
    }
    std::string out = fmt::format(
        "bench rollout on {} ({} numerics): random weights {:.1f} s, load {:.1f} s, warm-up {} calls {:.1f} s, "
        "peak device memory {} (planned {})\n",
        devices, numerics, weights_ms / 1e3, load_ms / 1e3, warmup_calls, warmup_ms / 1e3,
        peak_memory_bytes ? fmt::format("{:.2f} GiB", double(*peak_memory_bytes) / double(1ull << 30)) : "-",
        planned_peak_bytes ? fmt::format("{:.2f} GiB", double(*planned_peak_bytes) / double(1ull << 30)) : "-");
    if (!environment.empty()) {
        std::string set;
        for (const auto& [name, value] : environment) set += fmt::format("{}{}={}", set.empty() ? "" : " ", name, value);
        out += "environment: " + set + "\n";
    }
    if (graphs.enabled)
        out += fmt::format("cuda graphs: {} captured ({} failed) in {:.1f} ms; timed calls: {} forwards replayed, {} "
                           "op by op\n",
                           graphs.captured, graphs.failed, graphs.capture_ms, graphs.replays - warmup_graphs.replays,
                           graphs.eager - warmup_graphs.eager);
    else
        out += "cuda graphs: off (every forward op by op)\n";
    out += fmt::format("{} timed calls: {} steady, {} window resets\n", calls.size(), steady.size(), resets.size());
    for (const GpuTelemetrySummary& g : gpu_telemetry)
        out += fmt::format("gpu {} during the timed calls: {}\n", g.device, g.line(int64_t(calls.size())));
    out += format_table({"phase (ms)", "all median", "all p90", "steady median", "steady p90", "reset median"}, rows);
    return out;
}

}  // namespace dzr::rollout
