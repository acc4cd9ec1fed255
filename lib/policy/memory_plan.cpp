#include "policy/memory_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <memory>
#include <set>
#include <tuple>

#include "backend/measuring_backend.h"
#include "config/run_config.h"
#include "core/error.h"
#include "kv/kv_sizing.h"
#include "model/inventory.h"
#include "model/layer_stream.h"
#include "model/umt5.h"
#include "weights/fp8_weights.h"
#include "weights/keys.h"

namespace dzr {

namespace {

using Json = nlohmann::ordered_json;

/// What a plan for a GPU this machine lacks assumes the device does (a Hopper GPU, as the CUDA backend reports it).
Capabilities assumed_cuda_capabilities() {
    Capabilities c;
    c.resize_bicubic = true;
    c.paged_kv = true;
    c.device_events = true;
    c.graphs = true;
    c.fp8 = true;
    c.compute_capability = 90;
    c.conv_channels_last = true;
    return c;
}

/// Shape-only weights that record which keys the networks load (a network may load a subset of the checkpoint's
/// inventory: CLIP runs 31 of its 32 stored blocks).
class RecordingWeights final : public WeightSource {
public:
    explicit RecordingWeights(std::unique_ptr<WeightSource> inner) : inner_(std::move(inner)) {}
    std::optional<TensorView> find(const std::string& key) const override {
        auto t = inner_->find(key);
        if (t) found_.insert(key);
        return t;
    }
    std::vector<std::string> keys() const override { return inner_->keys(); }
    std::string location(const std::string& key) const override { return inner_->location(key); }
    bool loaded(const std::string& key) const { return found_.count(key) > 0; }

private:
    std::unique_ptr<WeightSource> inner_;
    mutable std::set<std::string> found_;
};

/// One component's weights in the plan.
struct ComponentWeights {
    uint64_t bytes = 0;       // at the plan's precision
    uint64_t at_compute = 0;  // every weight in the compute dtype (what a measuring backend allocates)
    uint64_t params = 0;
    uint64_t fp8_params = 0;
    uint64_t fp8_scales = 0;      // output channels with a scale
    uint64_t stored_params = 0;   // the checkpoint's, loaded or not
};

std::string weights_detail(const ComponentWeights& w, DType compute) {
    std::string s = w.fp8_params == 0
                        ? fmt::format("{} parameters in {}", config::format_count(w.params), dtype_name(compute))
                        : fmt::format("{} parameters: {} in fp8 with {} float32 scales, {} in {}",
                                      config::format_count(w.params), config::format_count(w.fp8_params),
                                      config::format_count(w.fp8_scales),
                                      config::format_count(w.params - w.fp8_params), dtype_name(compute));
    if (w.stored_params != w.params)
        s += fmt::format(" (the checkpoint stores {}; the rest is never loaded)", config::format_count(w.stored_params));
    return s;
}

/// "bf16", "fp8" (E4M3), "f32".
std::string kv_dtype_name(DType t) { return t == DType::F8_E4M3 ? "fp8" : std::string(dtype_name(t)); }

/// a - b for measured totals that must contain b.
uint64_t remainder(uint64_t a, uint64_t b, std::string_view what) {
    DZR_CHECK(a >= b, "memory plan: {}: the measuring engine allocated {} bytes, fewer than the {} bytes planned for "
                      "its parts (the plan's parts and the engine disagree)",
              what, a, b);
    return a - b;
}

}  // namespace

std::string_view precision_name(WeightPrecision p) { return p == WeightPrecision::Fp8 ? "fp8" : "bf16"; }

WeightPrecision parse_weight_precision(std::string_view text, std::string_view what) {
    if (text == "bf16") return WeightPrecision::Bf16;
    if (text == "fp8") return WeightPrecision::Fp8;
    DZR_THROW("{}: expected bf16 or fp8, got '{}'", what, text);
}

DType parse_kv_dtype(std::string_view text, std::string_view what) {
    if (text == "bf16") return DType::BF16;
    if (text == "fp8") return DType::F8_E4M3;
    DZR_THROW("{}: expected bf16 or fp8, got '{}'", what, text);
}

bool fp8_weight(const ExpectedWeight& w) {
    // NOTE: the one table of which Linears are FP8 (weights/fp8_weights.h), as WeightLoader::require_linear reads it
    return w.linear && fp8_by_default(w.key);
}

uint64_t weight_bytes(const ExpectedWeight& w, WeightPrecision precision, DType compute_dtype) {
    const uint64_t n = uint64_t(w.shape.numel());
    if (precision == WeightPrecision::Fp8 && fp8_weight(w))
        return n * dtype_size(DType::F8_E4M3) + uint64_t(w.shape[0]) * kFp8ScaleBytes;
    return n * dtype_size(compute_dtype);
}

uint64_t kv_scale_bytes(const KvGeometry& g, int total_block_ids, int block_tokens) {
    if (!g.fp8_pool) return 0;
    return uint64_t(total_block_ids) * uint64_t(block_tokens) * uint64_t(g.num_layers) * 2 *
           uint64_t(g.num_kv_heads) * kFp8ScaleBytes;
}

std::string gib(uint64_t bytes) { return fmt::format("{:.2f} GiB", double(bytes) / double(uint64_t(1) << 30)); }

uint64_t MemoryPlan::part_bytes(std::string_view key) const {
    for (const auto& p : parts)
        if (p.key == key) return p.bytes;
    return 0;
}

const MemoryPhase& MemoryPlan::peak() const {
    DZR_CHECK(!phases.empty(), "memory plan: no phases");
    const MemoryPhase* best = &phases[0];
    for (const auto& ph : phases)
        if (ph.bytes > best->bytes) best = &ph;
    return *best;
}

namespace {

/// The engine's calls run on a measuring backend: its workspace, allocations and a session's buffers, and umT5's
/// allocations alone (what the text pre-pass loads, and frees).
struct MeasuredEngine {
    EngineFootprint footprint;
    uint64_t t5_allocated = 0;
};

MeasuredEngine measure_engine(const ModelConfig& model, const Embodiment& embodiment, const PolicyOptions& measured,
                              MeasuringBackend& measuring, RecordingWeights& shapes, const MemoryPlanOptions& po,
                              Backend* planner, const std::optional<Capabilities>& assumed) {
    MeasuredEngine m;
    m.footprint = Engine::measure(model, embodiment, {}, measured, {&measuring}, &shapes);
    MeasuringBackend alone(po.compute_dtype, planner, assumed, po.numerics);
    WeightLoader loader(shapes, alone);
    const Umt5Encoder encoder(loader, model.t5);
    m.t5_allocated = alone.allocated_bytes();
    return m;
}

/// The inventory's weights the networks load, per component, at the plan's precision.
std::array<ComponentWeights, kNumComponents> plan_weights(const ModelConfig& model, const RecordingWeights& shapes,
                                                          const MemoryPlanOptions& po) {
    const DType dt = po.compute_dtype;
    std::array<ComponentWeights, kNumComponents> weights{};
    for (const ExpectedWeight& w : expected_weights(model)) {
        ComponentWeights& c = weights[size_t(w.component)];
        const uint64_t n = uint64_t(w.shape.numel());
        c.stored_params += n;
        if (!shapes.loaded(w.key)) continue;
        c.bytes += weight_bytes(w, po.precision, dt);
        c.at_compute += n * dtype_size(dt);
        c.params += n;
        if (po.precision == WeightPrecision::Fp8 && fp8_weight(w)) {
            c.fp8_params += n;
            c.fp8_scales += uint64_t(w.shape[0]);
        }
    }
    return weights;
}

/// The DiT layers streamed from host memory (offload_layers): one layer's bytes at the plan's precision, and the
/// device slots they take turns in, laid out as LayerStream lays them (each tensor at a 256-byte boundary; an FP8
/// weight's scale a tensor of its own).
struct PlannedOffload {
    int layers = 0;
    uint64_t layer_bytes = 0, slot_bytes = 0;
};

PlannedOffload plan_offload(const ModelConfig& model, const PolicyOptions& options, const MemoryPlanOptions& po) {
    PlannedOffload p;
    p.layers = int(streamed_layers(model.dit.num_layers, options.offload_layers).size());
    if (p.layers == 0) return p;
    const auto aligned = [](uint64_t n) { return (n + 255) / 256 * 256; };
    const std::string block = keys::dit_block(0);
    uint64_t slot = 0;
    for (const ExpectedWeight& w : expected_weights(model)) {
        if (w.key.compare(0, block.size(), block) != 0) continue;
        const uint64_t n = uint64_t(w.shape.numel());
        p.layer_bytes += weight_bytes(w, po.precision, po.compute_dtype);
        if (po.precision == WeightPrecision::Fp8 && fp8_weight(w))
            slot += aligned(n * dtype_size(DType::F8_E4M3)) + aligned(uint64_t(w.shape[0]) * kFp8ScaleBytes);
        else
            slot += aligned(n * dtype_size(po.compute_dtype));
    }
    p.slot_bytes = uint64_t(std::min(LayerStream::kSlots, p.layers)) * slot;
    return p;
}

/// The KV cache: paged, the engine's pool at the plan's KV dtype (and the measuring engine's, in its compute dtype);
/// dense, the session's own caches (in its measured buffers).
struct PlannedKv {
    bool paged = false, fp8 = false, lanes = false;
    KvMemoryPlan kv;
    uint64_t scales = 0, measured = 0;
};

PlannedKv plan_kv(const ModelConfig& model, const PolicyOptions& options, const PolicyOptions& measured,
                  const MemoryPlanOptions& po, const Backend& measuring) {
    const DType dt = po.compute_dtype;
    PlannedKv p;
    p.paged = options.kv.mode == KvMode::Paged;
    p.fp8 = po.kv_dtype == DType::F8_E4M3;
    if (!p.paged) {
        DZR_CHECK(po.kv_dtype == dt, "memory plan: an fp8 KV cache needs the paged cache (--kv paged)");
        return p;
    }
    // NOTE: the engine's geometry: the compute dtype, and with an fp8 KV cache E4M3 pool and cross-cache rows with
    // an f32 scale per token and head (the scratch keeps the compute dtype)
    // NOTE: kv.in_place lanes as the engine decides them on this device and numerics (Engine: a GPU in fast
    // numerics; auto's free-memory check happens at the load, so the plan counts the lanes it would keep)
    const bool lanes_pay = kv_lanes_pay(measuring);
    KvGeometry g = KvGeometry::from_model(model, dt, 2);
    g.fp8_pool = g.fp8_cross = p.fp8;
    g.sessions = options.max_sessions;
    options.kv.validate(g);
    g.lanes = resolve_kv_lanes(options.kv, g, lanes_pay);
    p.lanes = g.lanes;
    p.kv = plan_kv_memory(g, options.kv, resolve_kv_budget(g, options.kv, 0));
    p.scales = kv_scale_bytes(g, p.kv.total_block_ids(), p.kv.limits.block_tokens);
    // NOTE: the measuring engine's pool is in its compute dtype
    KvGeometry gm = KvGeometry::from_model(model, dt, 2);
    gm.sessions = measured.max_sessions;
    gm.lanes = resolve_kv_lanes(measured.kv, gm, lanes_pay);
    p.measured = plan_kv_memory(gm, measured.kv, resolve_kv_budget(gm, measured.kv, 0)).total_bytes;
    return p;
}

void add_part(MemoryPlan& plan, std::string key, std::string name, uint64_t bytes, std::string detail) {
    plan.parts.push_back({std::move(key), std::move(name), bytes, std::move(detail)});
}

/// The networks' weights and the tables beside them (what the measuring engine allocated besides weights and KV).
void add_weight_parts(MemoryPlan& plan, const std::array<ComponentWeights, kNumComponents>& weights,
                      const MeasuredEngine& m, const PlannedKv& kv, const PlannedOffload& offload, DType dt) {
    const ComponentWeights& t5 = weights[size_t(Component::TextEncoder)];
    const ComponentWeights& clip = weights[size_t(Component::ImageEncoder)];
    const ComponentWeights& vae = weights[size_t(Component::Vae)];
    const ComponentWeights& dit = weights[size_t(Component::Dit)];
    const uint64_t engine_bytes = m.footprint.engine_bytes.at(0);
    const uint64_t t5_tables = remainder(m.t5_allocated, t5.at_compute, "umT5");
    const uint64_t tables = remainder(engine_bytes, m.t5_allocated + clip.at_compute + vae.at_compute + dit.at_compute +
                                                        kv.measured,
                                      "the engine");
    add_part(plan, "weights.umt5", "umT5 weights", t5.bytes, weights_detail(t5, dt));
    add_part(plan, "weights.clip", "CLIP weights", clip.bytes, weights_detail(clip, dt));
    add_part(plan, "weights.vae", "VAE weights", vae.bytes, weights_detail(vae, dt));
    if (offload.layers == 0) {
        add_part(plan, "weights.dit", "DiT weights", dit.bytes, weights_detail(dit, dt));
    } else {
        const uint64_t host = uint64_t(offload.layers) * offload.layer_bytes;
        add_part(plan, "weights.dit", "DiT weights", dit.bytes - host,
                 fmt::format("{}; less {} layers ({}) kept in host memory (offload_layers)", weights_detail(dit, dt),
                             offload.layers, gib(host)));
        add_part(plan, "weights.dit_slots", "DiT layer slots", offload.slot_bytes,
                 fmt::format("the {} streamed layers take turns in {} device buffers of a layer each",
                             offload.layers, std::min(LayerStream::kSlots, offload.layers)));
    }
    add_part(plan, "tables.umt5", "umT5 tables", t5_tables, "umT5's relative-position bucket one-hot");
    add_part(plan, "tables.networks", "network tables", tables,
             "CLIP, VAE and DiT tables besides their weights (RoPE, timestep embeddings, resize matrices; in fast "
             "numerics the VAE encoder's channels-last convolution weights)");
}

/// The paged KV cache's pool, scratch, cross-attention caches and fp8 scales.
void add_kv_parts(MemoryPlan& plan, const PlannedKv& p, const MemoryPlanOptions& po, DType dt) {
    if (!p.paged) return;
    const KvMemoryPlan& kv = p.kv;
    add_part(plan, "kv.pool", "KV pool", kv.pool_bytes - p.scales,
             fmt::format("{} blocks of {} tokens + the null block, {} each, {}{}", kv.num_blocks, kv.limits.block_tokens,
                         format_bytes(kv.block_bytes), kv_dtype_name(po.kv_dtype),
                         !p.lanes ? std::string()
                         : kv.limits.mirrored()
                             ? fmt::format("; kv.in_place lanes: {} blocks per branch and {} reserved for the current "
                                           "rows (--set kv.in_place=false: {} fewer)",
                                           kv.limits.lane_blocks, kv.limits.lane_ids - 2 * kv.limits.lane_blocks,
                                           kv.limits.lane_ids - 2 * kv.limits.max_blocks_per_branch)
                             : fmt::format("; a kv.in_place lane of {} blocks ({} without it)", kv.limits.lane_blocks,
                                           kv.limits.max_blocks_per_branch)));
    add_part(plan, "kv.scratch", "KV scratch", kv.scratch_bytes, "the current rows of one layer, K and V, per branch");
    add_part(plan, "kv.cross", "cross-attention caches", kv.cross_bytes,
             fmt::format("K and V of every layer: the text per branch, the image shared, {}{}",
                         p.fp8 ? "fp8 with a float32 scale per token and head" : kv_dtype_name(dt),
                         kv.sessions > 1 ? fmt::format("; for each of {} sessions", kv.sessions) : std::string()));
    if (p.scales > 0)
        add_part(plan, "kv.scales", "KV scales", p.scales,
                 "the fp8 pool's float32 per token and head, K and V, per layer");
}

/// What a running engine holds besides networks and KV: the session's buffers, the pre-pass output, the workspace
/// (with FP8 activations), the decoded video, the CUDA context.
void add_runtime_parts(MemoryPlan& plan, const ModelConfig& model, const PolicyOptions& options,
                       const MemoryPlanOptions& po, const MeasuredEngine& m, const PlannedKv& kv, Backend* planner,
                       Numerics measured_numerics) {
    const DType dt = po.compute_dtype;
    // NOTE: every open session has buffers of its own; the workspace is shared (their calls run one at a time)
    const uint64_t one_session = m.footprint.session_bytes.at(0);
    const int sessions = options.max_sessions;
    const std::string what = kv.paged ? "inputs, samples, velocities, sampler history (measured)"
                                      : "inputs, samples, sampler history, the dense KV caches and cross K/V (measured)";
    add_part(plan, "session", sessions > 1 ? "sessions' buffers" : "session buffers", uint64_t(sessions) * one_session,
             sessions > 1 ? fmt::format("{} sessions x {}: {}", sessions, config::format_count(one_session), what)
                          : what);
    if (options.text_prepass)
        add_part(plan, "text.prepass_output", "pre-pass output",
                 uint64_t(model.t5.text_len) * uint64_t(model.t5.dim) * dtype_size(dt),
                 "umT5's output buffer during the pre-pass");
    add_part(plan, "workspace", "workspace", m.footprint.workspace_bytes.at(0),
             planner ? fmt::format("activations and the ops' scratch, planned on {}", planner->device().str())
                     : "activations and the ops' scratch (without a convolution library's own scratch: no GPU here)");
    if (po.precision == WeightPrecision::Fp8) {
        // an FP8 Linear quantizes its input per token into the workspace while it runs: [tokens, in] codes and a
        // float32 scale per token, at most the denoising forward's tokens times the widest input (the FFN's); a
        // batched forward of both CFG branches (fast numerics, BranchRunner::forward_pair) holds both branches' rows
        const int64_t branches = options.batch_cfg && measured_numerics == Numerics::Fast ? 2 : 1;
        const int64_t tokens = branches * (int64_t(model.dit.num_frame_per_block) * model.dit.frame_seqlen +
                                           model.dit.num_action_per_block + model.dit.num_state_per_block);
        const int64_t in = std::max<int64_t>(model.dit.dim, model.dit.ffn_dim);
        add_part(plan, "workspace.fp8", "FP8 activations", uint64_t(tokens) * uint64_t(in) + uint64_t(tokens) * 4,
                 fmt::format("{} tokens x {} E4M3 codes and a float32 scale per token", tokens, in));
    }
    if (po.video_latent_frames > 0) {
        const int64_t k = po.video_latent_frames, lh = model.canvas_height / 8, lw = model.canvas_width / 8;
        // NOTE: decode_video's latents [z, K, h, w] and video [3, 1 + 4 (K - 1), H, W] (WanVae::video_shape)
        const uint64_t latent = uint64_t(model.vae.z_dim) * uint64_t(k * lh * lw);
        const uint64_t video = uint64_t(3) * uint64_t(1 + 4 * (k - 1)) * uint64_t(model.canvas_height) *
                               uint64_t(model.canvas_width);
        add_part(plan, "video.decode", "video decode buffers", (latent + video) * dtype_size(dt),
                 fmt::format("{} latent frames and {} decoded frames", k, 1 + 4 * (k - 1)));
    }
    if (po.cuda)
        add_part(plan, "cuda.context", "CUDA context allowance", kCudaContextBytes, "context, library modules, rounding");
}

/// The phases and the parts resident in each: the text pre-pass (umT5 alone), the load, the rollout calls, the
/// video decode.
void add_phases(MemoryPlan& plan, const PolicyOptions& options, const MemoryPlanOptions& po) {
    const auto phase = [&](std::string key, std::string name, std::vector<std::string> keys) {
        MemoryPhase ph{std::move(key), std::move(name), {}, 0};
        for (auto& k : keys) {
            bool found = false;
            for (const auto& p : plan.parts)
                if (p.key == k) {
                    ph.bytes += p.bytes;
                    found = true;
                }
            if (found) ph.parts.push_back(std::move(k));
        }
        plan.phases.push_back(std::move(ph));
    };
    const std::vector<std::string> base = {"cuda.context", "workspace", "workspace.fp8"};
    std::vector<std::string> loaded = base;
    if (!options.text_prepass) loaded.insert(loaded.end(), {"weights.umt5", "tables.umt5"});
    loaded.insert(loaded.end(), {"weights.clip", "weights.vae", "weights.dit", "weights.dit_slots", "tables.networks", "kv.pool",
                                 "kv.scratch", "kv.cross", "kv.scales"});
    if (options.text_prepass) {
        std::vector<std::string> t = base;
        t.insert(t.end(), {"weights.umt5", "tables.umt5", "text.prepass_output"});
        phase("text_prepass", "text pre-pass (umT5 alone)", t);
    }
    phase("load", "load (networks and KV cache)", loaded);
    std::vector<std::string> rollout = loaded;
    rollout.push_back("session");
    phase("rollout",
          options.max_sessions > 1 ? fmt::format("warm-up and calls of {} sessions", options.max_sessions)
                                   : std::string("warm-up and rollout calls"),
          rollout);
    if (po.video_latent_frames > 0) {
        rollout.push_back("video.decode");
        phase("video_decode", "video decode (--save-video)", rollout);
    }
}

}  // namespace

MemoryPlan plan_memory(const ModelConfig& model, const Embodiment& embodiment, const PolicyOptions& options,
                       const MemoryPlanOptions& po, Backend* planner) {
    DZR_CHECK(po.kv_dtype == DType::BF16 || po.kv_dtype == DType::F8_E4M3 || po.kv_dtype == DType::F32,
              "memory plan: the KV cache is bf16 or fp8, got {}", dtype_name(po.kv_dtype));
    MemoryPlan plan;
    plan.options = po;
    plan.text_prepass = options.text_prepass;
    plan.sessions = options.max_sessions;
    plan.planner = planner ? planner->device().str() : "offline (a CUDA GPU assumed)";
    if (planner)
        if (const std::optional<int64_t> free = planner->context().memory_free()) plan.device_free_bytes = uint64_t(*free);
    plan.numerics = planner ? planner->numerics() : po.numerics;
    const std::optional<Capabilities> assumed =
        planner ? std::nullopt : std::optional<Capabilities>(assumed_cuda_capabilities());

    MeasuringBackend measuring(po.compute_dtype, planner, assumed, po.numerics);
    RecordingWeights shapes(make_shape_only_weights(model));
    // NOTE: measured at the compute dtype (bf16 Linears, a compute-dtype KV pool); the plan sizes the FP8 weights and
    // KV itself, and the FP8 Linears' quantized activations as a part of their own
    PolicyOptions measured = options;
    measured.precision = Precision::Bf16;
    measured.kv.dtype = Precision::Bf16;
    const MeasuredEngine m = measure_engine(model, embodiment, measured, measuring, shapes, po, planner, assumed);
    const auto weights = plan_weights(model, shapes, po);
    const PlannedKv kv = plan_kv(model, options, measured, po, measuring);
    const PlannedOffload offload = plan_offload(model, options, po);
    plan.offload_layers = offload.layers;
    plan.host_pinned_bytes = uint64_t(offload.layers) * offload.layer_bytes;

    add_weight_parts(plan, weights, m, kv, offload, po.compute_dtype);
    add_kv_parts(plan, kv, po, po.compute_dtype);
    add_runtime_parts(plan, model, options, po, m, kv, planner, measuring.numerics());
    add_phases(plan, options, po);
    return plan;
}

std::string MemoryPlan::table(uint64_t budget_bytes) const {
    std::string s;
    size_t width = 5;
    for (const auto& p : parts) width = std::max(width, p.name.size());
    for (const auto& ph : phases) width = std::max(width, ph.name.size());
    const auto row = [&](std::string_view name, uint64_t bytes, std::string_view detail) {
        s += fmt::format("  {:<{}}  {:>18}  {:>11}  {}\n", name, width, config::format_count(bytes), gib(bytes), detail);
    };
    s += fmt::format("  {:<{}}  {:>18}  {:>11}\n", "part", width, "bytes", "GiB");
    for (const auto& p : parts) row(p.name, p.bytes, p.detail);
    s += "\n";
    s += fmt::format("  {:<{}}  {:>18}  {:>11}\n", "phase", width, "peak bytes", "GiB");
    const MemoryPhase& top = peak();
    for (const auto& ph : phases) row(ph.name, ph.bytes, &ph == &top ? "<- peak" : "");
    if (budget_bytes > 0) {
        const uint64_t need = top.bytes;
        s += "\n";
        if (need <= budget_bytes)
            s += fmt::format("  budget {} ({} bytes): fits, {} to spare\n", gib(budget_bytes),
                             config::format_count(budget_bytes), gib(budget_bytes - need));
        else
            s += fmt::format("  budget {} ({} bytes): does NOT fit, {} ({} bytes) short\n", gib(budget_bytes),
                             config::format_count(budget_bytes), gib(need - budget_bytes),
                             config::format_count(need - budget_bytes));
    }
    return s;
}

Json MemoryPlan::to_json() const {
    Json j;
    j["planner"] = planner;
    j["precision"] = std::string(precision_name(options.precision));
    j["kv_dtype"] = kv_dtype_name(options.kv_dtype);
    j["compute_dtype"] = std::string(dtype_name(options.compute_dtype));
    j["text_prepass"] = text_prepass;
    j["numerics"] = numerics_name(numerics);
    if (sessions > 1) j["sessions"] = sessions;  // NOTE: absent for one session: the plan of a run as it always was
    if (offload_layers > 0) j["offload"] = {{"layers", offload_layers}, {"host_pinned_bytes", host_pinned_bytes}};
    Json ps = Json::array();
    for (const auto& p : parts) ps.push_back({{"key", p.key}, {"name", p.name}, {"bytes", p.bytes}, {"detail", p.detail}});
    j["parts"] = ps;
    Json phs = Json::array();
    for (const auto& ph : phases) phs.push_back({{"key", ph.key}, {"name", ph.name}, {"bytes", ph.bytes}, {"parts", ph.parts}});
    j["phases"] = phs;
    j["peak"] = {{"phase", peak().key}, {"bytes", peak().bytes}};
    return j;
}

void MemoryChoices::apply(PolicyOptions& options) const {
    if (kv_lanes_off) options.kv.in_place = KvInPlace::Off;
    if (offload_layers > 0) options.offload_layers = offload_layers;
}

void MemoryChoices::apply(config::RunConfig& run) const {
    if (kv_lanes_off) run.kv.in_place = KvInPlace::Off;
    if (offload_layers > 0) run.offload_layers = std::to_string(offload_layers);
}

BudgetFit fit_memory_budget(uint64_t budget, bool lanes_auto, bool offload_auto, int num_layers,
                            const std::function<MemoryPlan(const MemoryChoices&)>& plan_with) {
    BudgetFit fit{plan_with({}), {}, {}};
    if (budget == 0 || fit.plan.peak_bytes() <= budget) return fit;
    if (lanes_auto) {
        MemoryPlan without = plan_with({true, 0});
        // NOTE: the lanes are a speed-up, not a need: given up first, before any layer is streamed
        if (without.peak_bytes() < fit.plan.peak_bytes() && (without.peak_bytes() <= budget || offload_auto)) {
            fit.notes.push_back(fmt::format("kv.in_place auto: {} with the in-place lanes, {} without; a run under this "
                                            "budget gives them up",
                                            gib(fit.plan.peak_bytes()), gib(without.peak_bytes())));
            fit.plan = std::move(without);
            fit.choices.kv_lanes_off = true;
        }
    }
    if (fit.plan.peak_bytes() <= budget || !offload_auto || num_layers <= LayerStream::kSlots) return fit;
    // NOTE: past the slots every streamed layer saves one layer's bytes: two plans give the count, a third checks it
    const bool lanes_off = fit.choices.kv_lanes_off;
    const int first = LayerStream::kSlots + 1;
    const MemoryPlan a = plan_with({lanes_off, first - 1}), b = plan_with({lanes_off, first});
    const uint64_t per_layer = a.peak_bytes() > b.peak_bytes() ? a.peak_bytes() - b.peak_bytes() : 0;
    if (per_layer == 0) return fit;
    int n = first;
    if (b.peak_bytes() > budget) n += int((b.peak_bytes() - budget + per_layer - 1) / per_layer);
    for (; n <= num_layers; ++n) {
        MemoryPlan streamed = plan_with({lanes_off, n});
        if (streamed.peak_bytes() > budget) continue;
        fit.notes.push_back(fmt::format("offload_layers auto: {} of the DiT's {} layers kept in host memory ({} "
                                        "pinned) and streamed in as they run: {} instead of {}",
                                        n, num_layers, gib(streamed.host_pinned_bytes), gib(streamed.peak_bytes()),
                                        gib(fit.plan.peak_bytes())));
        fit.plan = std::move(streamed);
        fit.choices.offload_layers = n;
        break;
    }
    return fit;
}

std::string fp8_settings_that_fit(const std::function<std::optional<uint64_t>(bool fp8_kv, bool fp8_weights)>& peak,
                                  uint64_t budget) {
    std::string singles, both;
    for (const auto& [flags, fp8_kv, fp8_weights] : {std::tuple{"--kv-dtype fp8", true, false},
                                                     std::tuple{"--precision fp8", false, true},
                                                     std::tuple{"--precision fp8 --kv-dtype fp8", true, true}}) {
        const std::optional<uint64_t> p = peak(fp8_kv, fp8_weights);
        if (!p || *p > budget) continue;
        std::string& list = fp8_kv && fp8_weights ? both : singles;
        list += fmt::format("{}{} ({})", list.empty() ? "" : ", ", flags, gib(*p));
    }
    return singles.empty() ? both : singles;
}

void check_memory_budget(const MemoryPlan& plan, uint64_t budget_bytes, std::string_view what) {
    const MemoryPhase& top = plan.peak();
    if (top.bytes <= budget_bytes) return;
    std::vector<const MemoryPart*> parts;
    for (const auto& k : top.parts)
        for (const auto& p : plan.parts)
            if (p.key == k) parts.push_back(&p);
    std::stable_sort(parts.begin(), parts.end(), [](const MemoryPart* a, const MemoryPart* b) { return a->bytes > b->bytes; });
    std::string list;
    for (const MemoryPart* p : parts) list += fmt::format("\n    {:<24} {:>10}", p->name, gib(p->bytes));
    DZR_THROW("{}: the run does not fit: its {} phase needs {} ({} bytes), {} ({} bytes) more than the budget of {} "
              "({} bytes); nothing was loaded. The phase holds:{}\n(`dzr plan` shows the whole plan)",
              what, top.name, gib(top.bytes), config::format_count(top.bytes), gib(top.bytes - budget_bytes),
              config::format_count(top.bytes - budget_bytes), gib(budget_bytes), config::format_count(budget_bytes),
              list);
}

}  // namespace dzr
