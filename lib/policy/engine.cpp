#include "policy/engine.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>

#include "backend/env_settings.h"
#include "backend/profiler.h"
#include "backend/measuring_backend.h"
#include "backend/packing.h"
#include "config/model_fields.h"
#include "core/error.h"
#include "core/log.h"
#include "model/causal_dit.h"
#include "model/clip_vision.h"
#include "model/inventory.h"
#include "model/umt5.h"
#include "model/wan_vae.h"
#include "policy/branch_runner.h"
#include "policy/finite_check.h"
#include "policy/step_plan.h"
#include "policy/text_prepass.h"
#include "sampling/step_schedule.h"
#include "weights/fp8_weights.h"

namespace dzr {

namespace {

/// kv.in_place auto keeps the lanes only where one session with them leaves this much device memory free (the offline
/// workspace is 1.4-1.8 GiB at DROID, docs/MEMORY.md).
constexpr size_t kLaneHeadroomBytes = size_t(4) << 30;

class ShapeOnlyWeights final : public WeightSource {
public:
    ShapeOnlyWeights(const ModelConfig& model, const WeightSource* like) {
        for (const auto& w : expected_weights(model)) {
            const auto stored = like && w.linear ? like->find(w.key) : std::nullopt;
            if (stored && stored->dtype == DType::F8_E4M3) {
                views_.emplace(w.key, MeasuringBackend::shape_only(w.shape, DType::F8_E4M3).view());
                views_.emplace(fp8_scale_key(w.key), MeasuringBackend::shape_only(Shape{w.shape[0]}, DType::F32).view());
                continue;
            }
            views_.emplace(w.key, MeasuringBackend::shape_only(w.shape, DType::BF16).view());
        }
    }
    std::optional<TensorView> find(const std::string& key) const override {
        auto it = views_.find(key);
        if (it == views_.end()) return std::nullopt;
        return it->second;
    }
    std::vector<std::string> keys() const override {
        std::vector<std::string> out;
        out.reserve(views_.size());
        for (const auto& [k, v] : views_) out.push_back(k);
        return out;
    }
    std::string location(const std::string&) const override { return "inventory"; }

private:
    std::map<std::string, TensorView> views_;
};

/// --save-video needs the VAE decoder: a checkpoint whose config says it has none may still hold the
/// weights; otherwise the error names the missing keys.
void require_decoder(ModelConfig& model, const Checkpoint& ckpt, const std::filesystem::path& path) {
    if (model.vae.has_decoder) return;
    ModelConfig with = model;
    with.vae.has_decoder = true;
    std::vector<std::string> missing;
    for (const auto& w : expected_weights(with))
        if (w.key.find("vae.model.decoder.") != std::string::npos && !ckpt.find(w.key)) missing.push_back(w.key);
    if (missing.empty()) {
        model.vae.has_decoder = true;
        return;
    }
    std::string list;
    for (size_t i = 0; i < std::min<size_t>(3, missing.size()); ++i) list += (i ? ", " : "") + missing[i];
    DZR_THROW("--save-video: checkpoint {} has no VAE decoder ({} decoder tensors missing: {}{}); write one with "
              "model.vae.has_decoder: true (`dzr ckpt make`) or convert the full checkpoint",
              path.string(), missing.size(), list, missing.size() > 3 ? ", ..." : "");
}

void log_bulk_load(const BulkLoadStats& stats, const Backend& be) {
    if (stats.tensors > 0) log()->info("weights onto {}: {}", be.device().str(), stats.summary());
}

}  // namespace

std::unique_ptr<WeightSource> make_shape_only_weights(const ModelConfig& model, const WeightSource* like) {
    return std::make_unique<ShapeOnlyWeights>(model, like);
}

void check_fp8_support(const Placement& placement, Precision weights, Precision kv) {
    if (weights != Precision::Fp8 && kv != Precision::Fp8) return;
    const std::string what = weights == Precision::Fp8 && kv == Precision::Fp8 ? "precision fp8 and kv.dtype fp8"
                             : weights == Precision::Fp8                       ? "precision fp8"
                                                                               : "kv.dtype fp8";
    for (const Backend* b : placement.backends) {
        const Capabilities c = b->capabilities();
        DZR_CHECK(c.fp8,
                  "{} needs FP8 (E4M3) support, which {} ({}) lacks: compute capability {}.{}, FP8 needs 8.9 or later "
                  "(Ada, Hopper, Blackwell); run with precision bf16 and kv.dtype bf16",
                  what, b->device().str(), b->name(), c.compute_capability / 10, c.compute_capability % 10);
    }
}

// ---- Engine ------------------------------------------------------------------------------------

PolicyOptions run_policy_options(const config::RunConfig& run) {
    PolicyOptions po;
    po.sampling = run.sampling;
    po.kv = run.kv;
    po.precision = run.precision;
    po.cuda_graphs = run.cuda_graphs;
    po.batch_cfg = run.batch_cfg;
    // NOTE: auto streams nothing unless a budget's memory plan chose a count (rollout validation writes it here)
    po.offload_layers = config::parse_offload_layers(run.offload_layers, "offload_layers").value_or(0);
    return po;
}

PolicyOptions EngineOptions::policy_options() const {
    PolicyOptions po = run_policy_options(run);
    po.check_finite = check_finite;
    po.video_decode = video_decode;
    po.noise = noise;
    po.text_prepass = text_prepass;
    po.prepass_prompts = prepass_prompts;
    po.bulk_load = bulk_load;
    po.max_sessions = max_sessions;
    return po;
}

std::unique_ptr<Engine> Engine::load(const EngineOptions& o) {
    DZR_CHECK(o.devices.size() == 1 || o.devices.size() == 2,
              "--device takes one device or two (the second runs the unconditional CFG branch), got {}",
              o.devices.size());
    if (o.devices.size() == 2)
        DZR_CHECK(o.devices[0] != o.devices[1] || o.devices[0].is_cpu(),
                  "--device {},{}: the two CFG branches need two distinct GPUs", o.devices[0].str(),
                  o.devices[1].str());
    auto ckpt = std::make_unique<Checkpoint>(o.checkpoint);
    ModelConfig model = ckpt->model_config();
    if (o.video_decode) require_decoder(model, *ckpt, o.checkpoint);
    if (o.check_config_model) {
        const auto diffs = config::diff_model_configs(o.run.model, model);
        if (!diffs.empty()) {
            std::string msg = fmt::format("checkpoint {} does not have the geometry of {} ({} difference{}):",
                                          o.checkpoint.string(), o.run.source.string(), diffs.size(),
                                          diffs.size() == 1 ? "" : "s");
            for (const auto& d : diffs) msg += "\n  " + d;
            DZR_THROW("{}", msg);
        }
    }
    const WeightCheckReport check = check_weights(*ckpt, expected_weights(model));
    DZR_CHECK(check.ok(), "{}", check.message("checkpoint " + o.checkpoint.string()));
    const std::string& tag = o.run.embodiment;  // empty: the checkpoint's only one
    const Embodiment embodiment = select_embodiment(load_checkpoint_embodiments(o.checkpoint), tag, model);
    std::filesystem::path tokenizer;
    if (!o.tokenizer.empty()) {
        tokenizer = resolve_tokenizer_path(o.tokenizer);
    } else {
        DZR_CHECK(ckpt->tokenizer_path().has_value(),
                  "checkpoint {} has no umT5 tokenizer (spiece.model); give one with --tokenizer",
                  o.checkpoint.string());
        tokenizer = *ckpt->tokenizer_path();
    }

    auto engine = create(model, *ckpt, embodiment, tokenizer, o.policy_options(), o.devices, o.backend);
    engine->checkpoint_ = std::move(ckpt);
    return engine;
}

std::unique_ptr<Engine> Engine::create(const ModelConfig& model, const WeightSource& weights,
                                       const Embodiment& embodiment, const std::filesystem::path& tokenizer,
                                       const PolicyOptions& options, const std::vector<Device>& devices,
                                       const BackendOptions& backend) {
    std::vector<std::unique_ptr<Backend>> owned;
    Placement placement;
    for (const Device& d : devices) {
        owned.push_back(make_backend(d, backend));
        placement.backends.push_back(owned.back().get());
    }
    auto engine = std::make_unique<Engine>(model, weights, embodiment, tokenizer, options, placement);
    engine->owned_backends_ = std::move(owned);
    return engine;
}

Engine::Engine(const ModelConfig& model, const WeightSource& weights, const Embodiment& embodiment,
               const std::filesystem::path& tokenizer, const PolicyOptions& options, const Placement& placement)
    : model_(model), options_(options), embodiment_(embodiment), placement_(placement) {
    DZR_CHECK(!placement_.backends.empty() && placement_.backends.size() <= 2,
              "engine: a placement has one or two backends, got {}", placement_.backends.size());
    Backend& be = placement_.primary();
    for (Backend* b : placement_.backends)
        DZR_CHECK(b->compute_dtype() == be.compute_dtype(),
                  "engine: the backends compute in different dtypes ({} and {})", be.name(), b->name());
    measuring_ = be.capabilities().measuring;
    options_.share_first_self_attention =
        env_switch_off("DZR_SHARE_LAYER0", options_.share_first_self_attention,
                       env_value("DZR_SHARE_LAYER0").value_or("").c_str());
    // NOTE: the VAE decoder serves decode_video() only: without video_decode its weights (0.14 GiB at DROID size)
    // stay in the checkpoint
    if (!options_.video_decode) model_.vae.has_decoder = false;
    check_fp8_support(placement_, options_.precision, options_.kv.dtype);
    DZR_CHECK(options_.kv.dtype != Precision::Fp8 || options_.kv.mode == KvMode::Paged,
              "kv.dtype fp8 needs the paged KV cache (--kv paged); the dense cache is the bf16 reference path");
    const DitConfig& d = model_.dit;
    const int lh = model_.canvas_height / 8, lw = model_.canvas_width / 8;
    DZR_CHECK(d.num_frame_per_block == 2, "model: num_frame_per_block {} is not supported (DreamZero uses 2)",
              d.num_frame_per_block);
    DZR_CHECK(model_.clip.num_tokens() > 0, "model: CLIP produces no tokens");
    check_embodiment(embodiment_, model_);
    DZR_CHECK(options_.max_sessions >= 1, "engine: max_sessions must be at least 1, got {}", options_.max_sessions);

    // Plan the workspace first (on measuring backends running the same calls), so that the real loading below
    // can already use it.
    if (!measuring_) plan_workspace(tokenizer, weights);

    preprocessor_ = std::make_unique<ObservationPreprocessor>(canvas_spec(embodiment_, model_), options_.unit_range);
    tokenizer_path_ = tokenizer;
    // NOTE: a measuring engine (workspace and memory planning) may have none: its calls carry placeholder tokens
    DZR_CHECK(!tokenizer.empty() || measuring_, "engine: no tokenizer given");
    if (!tokenizer.empty()) {
        tokenizer_ = std::make_unique<Umt5Tokenizer>(tokenizer);
        DZR_CHECK(tokenizer_->vocab_size() <= model_.t5.vocab,
                  "tokenizer {} has {} pieces but the text encoder's vocabulary is {}: wrong tokenizer for this "
                  "checkpoint",
                  tokenizer_->model_path().string(), tokenizer_->vocab_size(), model_.t5.vocab);
    }

    WeightLoader loader(weights, be);
    loader.set_precision(options_.precision);
    if (options_.bulk_load) loader.defer(*options_.bulk_load);
    if (options_.text_prepass) {
        // NOTE: umT5 alone on the device, freed before the other networks load (policy/text_prepass.h); with
        // deferred loading its weights are read (loader.finish()) inside encode, before it runs
        DZR_CHECK(tokenizer_ != nullptr, "engine: the text pre-pass needs a tokenizer");
        text_embeddings_ = std::make_unique<TextEmbeddings>(
            TextEmbeddings::encode(loader, model_, embodiment_, *tokenizer_, options_.prepass_prompts));
    }
    {
        // NOTE: the resident networks' weights and tables packed into one slab (backend/packing.h): no per-tensor
        // rounding to whole pages (0.4 GiB of the FP8 DiT's). Not the pre-pass's umT5: its output outlives it.
        PackedAllocations packed(be);
        if (!options_.text_prepass) text_encoder_ = std::make_unique<Umt5Encoder>(loader, model_.t5);
        image_encoder_ = std::make_unique<ClipVision>(loader, model_.clip, model_.canvas_height, model_.canvas_width);
        vae_ = std::make_unique<WanVae>(loader, model_.vae);
        dits_.push_back(std::make_unique<CausalDit>(d, lh, lw, loader, options_.offload_layers));
    }
    log_bulk_load(loader.finish(), be);
    if (const LayerStream& ls = dits_[0]->layer_stream(); ls.count() > 0)
        log()->info("dit: {} of {} layers streamed from host memory ({} pinned; {} of device slots)", ls.count(),
                    d.num_layers, format_bytes(ls.host_bytes()), format_bytes(ls.slot_bytes()));
    for (size_t i = 1; i < placement_.backends.size(); ++i) {
        // NOTE: a second device holds only the DiT (its branch's forwards); the encoders run once, on the primary
        WeightLoader remote(weights, *placement_.backends[i]);
        remote.set_precision(options_.precision);
        if (options_.bulk_load) remote.defer(*options_.bulk_load);
        {
            PackedAllocations packed(*placement_.backends[i]);
            dits_.push_back(std::make_unique<CausalDit>(d, lh, lw, remote, options_.offload_layers));
        }
        log_bulk_load(remote.finish(), *placement_.backends[i]);
    }
    if (placement_.backends.size() > 1) communicator_ = make_host_communicator();

    schedule_ = std::make_unique<StepSchedule>(make_step_schedule(options_.sampling));
    noise_ = options_.noise ? options_.noise : std::make_shared<SeededNoise>(options_.sampling.seed);

    if (options_.kv.mode == KvMode::Paged) {
        // One pool per device, holding the branches placed there.
        for (size_t i = 0; i < placement_.backends.size(); ++i) {
            int branches = 0;
            for (int b = 0; b < 2; ++b) branches += placement_.device_of(b) == int(i) ? 1 : 0;
            Backend& dev = *placement_.backends[i];
            KvGeometry geometry = KvGeometry::from_model(model_, dev.compute_dtype(), branches);
            geometry.fp8_pool = geometry.fp8_cross = options_.kv.dtype == Precision::Fp8;
            geometry.sessions = options_.max_sessions;
            options_.kv.validate(geometry);
            geometry.lanes = resolve_kv_lanes(options_.kv, geometry, kv_lanes_pay(dev));
            if (geometry.lanes && options_.kv.in_place == KvInPlace::Auto) {
                // NOTE: auto keeps the lanes' room only where the device holds it with headroom for the workspace
                const auto free = dev.context().memory_free();
                const size_t session = kv_session_bytes(geometry, options_.kv);
                if (free && size_t(*free) < session + kLaneHeadroomBytes) {
                    log()->info("kv cache: no in-place lanes (kv.in_place auto): one session with them needs {} + {} "
                                "headroom, {} free",
                                format_bytes(session), format_bytes(kLaneHeadroomBytes), format_bytes(size_t(*free)));
                    geometry.lanes = false;
                }
            }
            const size_t budget = resolve_kv_budget(geometry, options_.kv, options_.free_device_bytes);
            if (geometry.lanes && !measuring_)
                log()->info("kv cache: in-place lanes of {} blocks per branch on {} (kv.in_place {}){}",
                            kv_limits(geometry, options_.kv).lane_blocks, dev.device().str(),
                            kv_in_place_name(options_.kv.in_place),
                            kv_lanes_pay(dev) ? ": the attention reads [history | current] where it lies"
                                              : " (this backend's attention reads them through the block table)");
            kv_managers_.push_back(std::make_unique<KvCacheManager>(geometry, options_.kv, budget, &dev));
        }
    } else {
        options_.kv.validate(KvGeometry::from_model(model_, be.compute_dtype(), 2));
    }
    if (!measuring_) log()->debug("engine: {}", describe());
}

Engine::~Engine() = default;

bool kv_lanes_pay(const Backend& be) {
    return be.context().capabilities().compute_capability > 0 && be.numerics() == Numerics::Fast;
}

namespace {

/// A call's prepared observation for a measuring engine: inputs of the right sizes (a measuring upload reads
/// nothing) and a placeholder prompt (EOS only), so no tokenizer or preprocessing is needed.
PreparedObservation measuring_observation(const ModelConfig& model, const Embodiment& embodiment, int frames) {
    PreparedObservation p;
    p.frames = frames;
    const size_t frame_values = size_t(3) * size_t(model.canvas_height) * size_t(model.canvas_width);
    p.reference_input.resize(frame_values);
    if (frames > 1) p.clip_input.resize(frame_values * 9);
    p.state.assign(size_t(embodiment.state_dim()), 0.0);
    for (TokenizedText* t : {&p.tokens.positive, &p.tokens.negative}) {
        t->ids.assign(size_t(model.t5.text_len), Umt5Tokenizer::kPadId);
        t->ids[0] = Umt5Tokenizer::kEosId;
        t->attention_mask.assign(size_t(model.t5.text_len), 0);
        t->attention_mask[0] = 1;
        t->length = 1;
    }
    return p;
}

}  // namespace

EngineFootprint Engine::measure(const ModelConfig& model, const Embodiment& embodiment,
                                const std::filesystem::path& tokenizer, const PolicyOptions& options,
                                const std::vector<MeasuringBackend*>& backends, const WeightSource* shapes) {
    Placement shadow_placement;
    for (MeasuringBackend* b : backends) shadow_placement.backends.push_back(b);
    const auto allocated = [&] {
        std::vector<size_t> bytes;
        for (const MeasuringBackend* b : backends) bytes.push_back(b->allocated_bytes());
        return bytes;
    };
    const auto since = [](const std::vector<size_t>& now, const std::vector<size_t>& before) {
        std::vector<size_t> d(now.size());
        for (size_t i = 0; i < now.size(); ++i) d[i] = now[i] - before[i];
        return d;
    };
    std::unique_ptr<WeightSource> own_shapes;
    if (!shapes) {
        own_shapes = make_shape_only_weights(model);
        shapes = own_shapes.get();
    }
    PolicyOptions o = options;
    o.check_finite = false;
    o.noise = std::make_shared<SeededNoise>(0);
    // NOTE: the shadow keeps umT5 resident: its forward's workspace is what the pre-pass needs too
    o.text_prepass = false;
    o.prepass_prompts.clear();
    EngineFootprint f;
    const std::vector<size_t> start = allocated();
    Engine shadow(model, *shapes, embodiment, tokenizer, o, shadow_placement);
    const std::vector<size_t> loaded = allocated();
    f.engine_bytes = since(loaded, start);
    {
        Session session(shadow);
        // A first call (prefill, CLIP, the 33-frame conditioning) and a commit call walk every shape.
        for (int T : {1, 4}) session.step(measuring_observation(model, embodiment, T));
        f.session_bytes = since(allocated(), loaded);
    }
    if (options.video_decode) {
        DZR_CHECK(model.vae.has_decoder, "policy: video decoding needs the VAE decoder (model.vae.has_decoder)");
        // NOTE: the chunked decode's workspace does not depend on the number of latent frames.
        MeasuringBackend& mb = *backends[0];
        const int lh = model.canvas_height / 8, lw = model.canvas_width / 8;
        const Tensor latent = mb.alloc(Shape{model.vae.z_dim, 3, lh, lw}, mb.compute_dtype());
        const Tensor video = mb.alloc(shadow.vae_->video_shape(latent.shape()), mb.compute_dtype());
        ArenaScope scope(mb.workspace());
        shadow.vae_->decode(latent, video);
    }
    for (MeasuringBackend* b : backends) f.workspace_bytes.push_back(b->workspace().high_water() + kWorkspaceMargin);
    return f;
}

void Engine::plan_workspace(const std::filesystem::path& tokenizer, const WeightSource& weights) {
    // NOTE: each measuring backend asks the backend that will run the calls for its ops' own workspace (a cuDNN
    // convolution's engine as PyTorch picks it, whatever its workspace), so the workspaces hold what they take
    std::vector<std::unique_ptr<MeasuringBackend>> measuring;
    std::vector<MeasuringBackend*> views;
    for (Backend* b : placement_.backends) {
        measuring.push_back(std::make_unique<MeasuringBackend>(b->compute_dtype(), b));
        views.push_back(measuring.back().get());
    }
    // NOTE: shapes like the real weights (an FP8 checkpoint's stored dtypes), so the plan sees the same Linears
    const auto shapes = make_shape_only_weights(model_, &weights);
    workspace_bytes_ = measure(model_, embodiment_, tokenizer, options_, views, shapes.get()).workspace_bytes;
    for (size_t i = 0; i < placement_.backends.size(); ++i)
        placement_.backends[i]->reserve_workspace(workspace_bytes_[i]);
}

std::unique_ptr<Session> Engine::open_session() { return std::make_unique<Session>(*this); }

size_t Engine::kv_bytes() const {
    if (!kv_managers_.empty()) {
        size_t total = 0;
        for (const auto& m : kv_managers_) total += m->plan().total_bytes;
        return total;
    }
    const KvGeometry g = KvGeometry::from_model(model_, backend().compute_dtype(), 2);
    const int64_t rows =
        int64_t(options_.kv.sink_frames + options_.kv.window_frames + g.chunk_frames) * g.tokens_per_frame;
    return size_t(2) * size_t(rows) * g.token_bytes();
}

std::optional<int64_t> Engine::device_memory_in_use() const {
    std::optional<int64_t> most;
    for (const Backend* b : placement_.backends)
        if (const auto m = b->device_memory_in_use()) most = std::max(most.value_or(0), *m);
    return most;
}

std::vector<std::string> Engine::pci_bus_ids() const {
    std::vector<std::string> out;
    for (const Backend* b : placement_.backends) {
        std::string id = b->context().pci_bus_id();
        if (!id.empty() && std::find(out.begin(), out.end(), id) == out.end()) out.push_back(std::move(id));
    }
    return out;
}

std::string Engine::devices() const {
    std::string out;
    for (const Backend* b : placement_.backends) {
        if (!out.empty()) out += ',';
        out += b->device().str();
    }
    return out;
}

bool Engine::kv_pools_whole() const {
    for (const auto& m : kv_managers_)
        if (m->pool().num_free() != m->pool().num_blocks()) return false;
    return true;
}

void Engine::reset_profiles() {
    for (Backend* b : placement_.backends)
        if (Profiler* p = b->profiler()) p->reset();
}

nlohmann::ordered_json Engine::profile_json(std::string* table) const {
    nlohmann::ordered_json j = nlohmann::ordered_json::object();
    for (size_t i = 0; i < placement_.backends.size(); ++i)
        if (Profiler* p = placement_.backends[i]->profiler()) {
            std::string key = placement_.backends[i]->device().str();
            if (i > 0) key += fmt::format("#{}", i);
            j[key] = p->to_json();
            if (table) *table += p->table();
        }
    return j;
}

std::string Engine::describe() const {
    size_t workspace = 0;
    for (size_t w : workspace_bytes_) workspace += w;
    const std::string text = text_embeddings_ ? fmt::format(" (pre-pass: {} texts)", text_embeddings_->size()) : "";
    // NOTE: what Session::forward_both decides per call, for the run's header (a parity log shows which path ran)
    const bool batched = options_.batch_cfg && placement_.backends.size() == 1 && backend().numerics() == Numerics::Fast;
    const char* batching = !batched                     ? "one at a time "
                           : options_.trace_dit_layers ? "batched (one at a time in a call tracing DiT layers) "
                                                       : "batched ";
    const std::string sessions =
        options_.max_sessions > 1 ? fmt::format(" ({} sessions)", options_.max_sessions) : std::string();
    return fmt::format("DiT {}x{} ({} heads, {} weights), umT5 {}x{}{}, CLIP {}x{}, VAE base {}, canvas {}x{}, {} {} KV "
                       "{:.2f} GiB{}, workspace {:.2f} GiB, steps {} ({}), cfg {}, {} numerics, branches {}on {}, noise: {}",
                       model_.dit.num_layers, model_.dit.dim, model_.dit.num_heads, precision_name(options_.precision),
                       model_.t5.num_layers, model_.t5.dim, text, model_.clip.use_layers, model_.clip.width,
                       model_.vae.base_dim, model_.canvas_height, model_.canvas_width,
                       options_.kv.mode == KvMode::Paged ? "paged" : "dense", precision_name(options_.kv.dtype),
                       double(kv_bytes()) / double(1ull << 30), sessions, double(workspace) / double(1ull << 30),
                       options_.sampling.num_inference_steps, schedule_->describe(), options_.sampling.cfg_scale,
                       numerics_name(backend().numerics()), batching, devices(), noise_->describe());
}

PreparedObservation Engine::prepare(const Observation& obs) const {
    // NOTE: on a bf16 backend the inputs are rounded to bf16 here, on the caller's (prefetch) thread, in
    // the same pass that builds them: step() then uploads without converting.
    DZR_CHECK(tokenizer_ != nullptr, "engine: prepare() on an engine built without a tokenizer");
    PreparedObservation reuse;
    {
        std::lock_guard<std::mutex> lock(spare_mu_);
        if (!spare_.empty()) {
            reuse = std::move(spare_.back());
            spare_.pop_back();
        }
    }
    return prepare_observation(obs, model_, embodiment_, *preprocessor_, *tokenizer_,
                               backend().compute_dtype() == DType::BF16, &reuse);
}

void Engine::recycle(PreparedObservation&& used) const {
    // NOTE: two sets cover a prefetching caller (one being prepared while one steps); more would only hold
    // memory.
    std::lock_guard<std::mutex> lock(spare_mu_);
    if (spare_.size() < 2) spare_.push_back(std::move(used));
}

Tensor Engine::decode_video(const TensorView& latents) {
    Backend& be = backend();
    DZR_CHECK(model_.vae.has_decoder, "decode_video: the checkpoint's VAE was loaded without its decoder");
    DZR_CHECK(options_.video_decode || measuring_,
              "decode_video: the engine was built without PolicyOptions::video_decode (no workspace for it)");
    DZR_CHECK(latents.device.is_cpu() && latents.dtype == DType::F32 && latents.rank() == 4 &&
                  latents.dim(0) == model_.vae.z_dim && latents.dim(1) >= 1 &&
                  latents.dim(2) == model_.canvas_height / 8 && latents.dim(3) == model_.canvas_width / 8 &&
                  latents.is_contiguous(),
              "decode_video: latents must be host f32 [{}, K, {}, {}], got {}", model_.vae.z_dim,
              model_.canvas_height / 8, model_.canvas_width / 8, latents.str());
    // NOTE: a NaN would become a black frame in the uint8 video (the cast below clips it to 0), so both ends are
    // checked (docs/RELIABILITY.md)
    if (!measuring_)
        check_finite_host("the predicted video", "the denoised latents", latents.ptr<const float>(),
                          size_t(latents.numel()));
    const DType dt = be.compute_dtype();
    const Tensor latent = be.alloc(latents.shape, dt);
    const Tensor video = be.alloc(vae_->video_shape(latents.shape), dt);  // [3, T, H, W]
    be.upload(latents, latent);
    {
        ArenaScope scope(be.workspace());
        vae_->decode(latent, video);
    }
    Tensor host = Tensor::host(video.shape(), DType::F32);
    be.download(video, host);
    if (!measuring_)
        check_finite_host("the VAE decoder", "the decoded video", host.ptr<const float>(), size_t(host.numel()));
    const Shape vs = video.shape();
    const int64_t T = vs[1], H = vs[2], W = vs[3], plane = H * W;
    Tensor frames = Tensor::host(Shape{T, H, W, 3}, DType::U8);
    const float* src = host.ptr<float>();
    uint8_t* dst = frames.ptr<uint8_t>();
    // [3, T, H, W] -> [T, H, W, 3]; ((x + 1) * 127.5).clip(0, 255).astype(uint8) in float32.
    for (int64_t t = 0; t < T; ++t)
        for (int64_t p = 0; p < plane; ++p)
            for (int64_t c = 0; c < 3; ++c) {
                const float v = (src[(c * T + t) * plane + p] + 1.0f) * 127.5f;
                dst[(t * plane + p) * 3 + c] = uint8_t(v > 0.0f ? std::min(v, 255.0f) : 0.0f);  // NaN -> 0
            }
    return frames;
}

}  // namespace dzr
