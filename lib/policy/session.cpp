// Session: one rollout on an Engine (engine.h). step() runs its stages in order: the reset rules, the inputs, the
// context (text and image cross K/V), the prefill or the commit, the denoising loop and the post-processing.
#include <array>
#include <atomic>
#include <cmath>
#include <functional>

#include "backend/profiler.h"
#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "model/causal_dit.h"
#include "model/clip_vision.h"
#include "model/umt5.h"
#include "model/wan_vae.h"
#include "policy/branch_runner.h"
#include "policy/engine.h"
#include "policy/finite_check.h"
#include "policy/normalization.h"
#include "policy/postprocess.h"
#include "policy/text_prepass.h"
#include "sampling/cfg.h"
#include "sampling/denoise_loop.h"
#include "sampling/flow_unipc.h"
#include "sampling/step_schedule.h"

namespace dzr {

/// Persistent device buffers of a call on the primary backend (allocated once per session).
struct Session::Buffers {
    Tensor clip_video;    // [3, 9, H, W] the commit clip
    Tensor ref_frame;     // [3, H, W] the window's reference frame
    Tensor clip_feats;    // [image_tokens, clip width]
    Tensor ys;            // [4 + z, latent frames of num_frames, h, w]
    Tensor clip_latent;   // [z, 3, h, w]
    Tensor text_pos, text_neg;  // [text_len, t5 dim]
    Tensor x, a;          // video sample [z, 2, h, w], action sample [horizon, action_dim]
    Tensor x_in;          // [z, 2, h, w] contiguous input latent of prefill/commit
    Tensor y_in;          // [4 + z, 2, h, w] contiguous conditioning slice
    Tensor v_video, v_action;          // guided video velocity, conditional action velocity
    Tensor v_uncond, a_uncond;         // unconditional outputs
    Tensor v_prev;                     // dynamic schedule: the previous computed video velocity
    Tensor state;                      // [1, max_state_dim]
};

/// The branch runners and the KV sessions they attend through.
struct Session::Runners {
    std::vector<std::unique_ptr<KvSession>> kv;  // paged: one per device
    std::array<std::unique_ptr<BranchRunner>, 2> branch;
    Tensor remote_text, remote_clip;     // two devices: the unconditional branch's text and CLIP features
    std::unique_ptr<FlowUniPC> video_sampler, action_sampler;
    std::unique_ptr<FiniteChecks> finite;  // the always-on check: counted on the device, read once per call
};

/// The phase marks of one call, recorded on the primary backend's stream and read after the actions come back.
struct Session::Events {
    static constexpr int kMaxEvaluations = 64;
    std::unique_ptr<Event> start, preprocess, text, image, vae, commit, denoise, post;
    std::array<std::unique_ptr<Event>, 2 * kMaxEvaluations> dit;
};

namespace {

constexpr int kMaxClipFrames = 9;  // the VAE clip of a commit call: [f0, f0, f0, f1, f1, f2, f2, f3, f3]

/// Computes a context's cross K/V straight into the branch's cache (KvSession::begin_cross_write .. commit_cross):
/// `compute` fills a DitCrossKv whose `kind` views are the cache's own, or, for an FP8 cache, one layer's K and V in
/// the workspace, which the cache quantizes as each layer finishes (KvSession::store_cross_layer).
void project_into(Backend& be, KvSession& kv, int kv_branch, CrossKind kind,
                  const std::function<void(DitCrossKv&, const std::function<void(size_t)>&)>& compute) {
    const std::vector<LayerKv> layers = kv.begin_cross_write(kv_branch, kind);
    const bool text = kind == CrossKind::Text;
    DitCrossKv target;
    target.layers.resize(layers.size());
    const auto set = [&](DitCrossKv::Layer& l, const TensorView& k, const TensorView& v) {
        (text ? l.k_txt : l.k_img) = k;
        (text ? l.v_txt : l.v_img) = v;
    };
    if (layers.empty() || layers[0].k.dtype != DType::F8_E4M3) {
        for (size_t i = 0; i < layers.size(); ++i) set(target.layers[i], layers[i].k, layers[i].v);
        compute(target, {});
    } else {
        ArenaScope scope(be.workspace());
        const TensorView k = be.scratch(layers[0].k.shape), v = be.scratch(layers[0].k.shape);  // [tokens, H, D]
        for (auto& l : target.layers) set(l, k, v);
        compute(target, [&](size_t i) { kv.store_cross_layer(kv_branch, kind, int(i), k, v); });
    }
    kv.commit_cross(kv_branch, kind);
}

/// The dtype of the samplers' state, the velocities and the guidance: the compute dtype in reference numerics (the
/// official bf16 run rounds each of them), f32 in fast numerics.
DType sample_dtype(const Backend& be) {
    return be.numerics() == Numerics::Fast ? DType::F32 : be.compute_dtype();
}

/// The view of `t`'s first elements with `shape` (a prefill's one-frame slice of a two-frame buffer).
TensorView head_view(const Tensor& t, Shape shape) { return TensorView(t.data(), t.dtype(), shape, t.device()); }

/// A forward's DiT options: the finite checks, and kv_only for a committing forward nothing traces (its outputs are
/// never read; fast numerics then stop its last layer after the K/V).
DitForwardOptions dit_options(bool check_finite, ForwardKind kind, bool traced) {
    DitForwardOptions opt;
    opt.check_finite = check_finite;
    opt.kv_only = kind != ForwardKind::Denoise && !traced;
    return opt;
}

}  // namespace

Session::Session(Engine& engine) : engine_(engine) {
    DZR_CHECK(engine_.open_sessions_ < engine_.options_.max_sessions,
              "engine: {} session{} already open, the most this engine holds (max_sessions {}); close one first",
              engine_.open_sessions_, engine_.open_sessions_ == 1 ? " is" : "s are", engine_.options_.max_sessions);
    const ModelConfig& m = engine_.model_;
    const DitConfig& d = m.dit;
    Backend& be = engine_.backend();
    const DType dt = be.compute_dtype();
    const int z = m.vae.z_dim;
    const int lh = m.canvas_height / 8, lw = m.canvas_width / 8;
    const int ys_frames = 1 + (m.num_frames - 1) / 4;
    const int H = m.canvas_height, W = m.canvas_width;
    const int horizon = d.num_action_per_block, A = d.action_dim;

    buf_ = std::make_unique<Buffers>();
    buf_->clip_video = be.alloc(Shape{3, kMaxClipFrames, H, W}, dt);
    buf_->ref_frame = be.alloc(Shape{3, H, W}, dt);
    buf_->clip_feats = be.alloc(Shape{m.clip.num_tokens(), m.clip.width}, dt);
    buf_->ys = be.alloc(Shape{4 + z, ys_frames, lh, lw}, dt);
    buf_->clip_latent = be.alloc(Shape{z, 3, lh, lw}, dt);
    buf_->text_pos = be.alloc(Shape{m.t5.text_len, m.t5.dim}, dt);
    buf_->text_neg = be.alloc(Shape{m.t5.text_len, m.t5.dim}, dt);
    // NOTE: fast numerics keep the samplers' state, the velocities and the guidance in f32 (the reference rounds
    // every one of them to bf16): the DiT reads the samples through its bf16 input copies and writes f32 outputs
    // from its heads' f32 accumulators. That costs nothing measurable and is what holds fast within the gate.
    const DType st = sample_dtype(be);
    buf_->x_in = be.alloc(Shape{z, d.num_frame_per_block, lh, lw}, dt);
    for (Tensor* t : {&buf_->x, &buf_->v_video, &buf_->v_uncond, &buf_->v_prev})
        *t = be.alloc(Shape{z, d.num_frame_per_block, lh, lw}, st);
    buf_->y_in = be.alloc(Shape{4 + z, d.num_frame_per_block, lh, lw}, dt);
    for (Tensor* t : {&buf_->a, &buf_->v_action, &buf_->a_uncond}) *t = be.alloc(Shape{horizon, A}, st);
    buf_->state = be.alloc(Shape{d.num_state_per_block, d.max_state_dim}, dt);

    runners_ = std::make_unique<Runners>();
    FlowUniPCConfig uc;
    uc.num_steps = engine_.options_.sampling.num_inference_steps;
    uc.shift = engine_.options_.sampling.sigma_shift;
    runners_->video_sampler = std::make_unique<FlowUniPC>(be, buf_->x.shape(), st, uc);
    runners_->action_sampler = std::make_unique<FlowUniPC>(be, buf_->a.shape(), st, uc);
    // NOTE: 4 checks per DiT evaluation (at most Events::kMaxEvaluations) and 1 after denoising
    runners_->finite = std::make_unique<FiniteChecks>(be, 4 * Events::kMaxEvaluations + 1);

    const Placement& placement = engine_.placement_;
    const int64_t image_tokens = m.clip.num_tokens();
    for (int b = 0; b < 2; ++b) {
        const int dev = placement.device_of(b);
        runners_->branch[size_t(b)] = std::make_unique<BranchRunner>(
            b, placement.backend_of(b), *engine_.dits_[size_t(dev)], be, engine_.communicator_.get());
        runners_->branch[size_t(b)]->allocate_io(buf_->x.shape(), buf_->y_in.shape(), buf_->a.shape(),
                                                 buf_->state.shape(), dt, st);
    }
    if (engine_.options_.kv.mode == KvMode::Paged) {
        for (const auto& manager : engine_.kv_managers_) runners_->kv.push_back(manager->open_session("policy"));
        for (int b = 0; b < 2; ++b) {
            const int dev = placement.device_of(b);
            // NOTE: the branch's index among the branches placed on its device
            const int kv_branch = dev == placement.device_of(1 - b) ? b : 0;
            Backend& rb = placement.backend_of(b);
            // NOTE: on CUDA the Kernel path (device block table, paged attention) keeps every layer's
            // attend() capture-safe; on the CPU the Gather path is bit-exact with the dense reference.
            runners_->branch[size_t(b)]->use_paged(
                *runners_->kv[size_t(dev)], kv_branch,
                rb.device().is_cuda() ? PagedAttentionPath::Kernel : PagedAttentionPath::Gather);
        }
    } else {
        const KvGeometry geometry = KvGeometry::from_model(m, dt, 2);
        for (int b = 0; b < 2; ++b) {
            BranchRunner& r = *runners_->branch[size_t(b)];
            r.use_dense(geometry, engine_.options_.kv);
            r.cross() = r.dit().make_cross_kv(r.backend(), image_tokens);
        }
    }
    const bool graphs = engine_.options_.cuda_graphs && !engine_.measuring_ && graphs_env_override(true);
    for (auto& r : runners_->branch) r->enable_graphs(graphs);
    if (placement.backends.size() > 1) {
        Backend& rb = placement.backend_of(kUncondBranch);
        runners_->remote_text = rb.alloc(buf_->text_neg.shape(), dt);
        runners_->remote_clip = rb.alloc(buf_->clip_feats.shape(), dt);
    }

    events_ = std::make_unique<Events>();
    Stream& s = be.stream();
    for (auto* e : {&events_->start, &events_->preprocess, &events_->text, &events_->image, &events_->vae,
                    &events_->commit, &events_->denoise, &events_->post})
        *e = s.make_event();
    for (auto& e : events_->dit) e = s.make_event();
    ++engine_.open_sessions_;
}

Session::~Session() {
    runners_.reset();  // closes the KV sessions: every block back to its pool
    --engine_.open_sessions_;
}

TensorView Session::last_video_latent() const { return buf_->x.view(); }

ForwardGraphStats Session::graph_stats() const {
    ForwardGraphStats s;
    for (const auto& r : runners_->branch) s += r->graph_stats();
    return s;
}

Tensor Session::video_prediction() const {
    Backend& be = engine_.backend();
    const int z = engine_.model_.vae.z_dim;
    const Shape xs = buf_->x.shape();  // [z, 2, h, w]
    const int64_t f = xs[1], plane = xs[2] * xs[3];
    // NOTE: step() leaves start_frame_ at 3 exactly when it denoised at start frame 1 (a window's first
    // call), where the reference prepends the reference frame's latent, ys[4:4+z, 0].
    const bool with_reference = start_frame_ == 1 + f;
    Tensor x = Tensor::host(xs, DType::F32);
    be.download(buf_->x, x);
    Tensor out = Tensor::host(Shape{z, f + (with_reference ? 1 : 0), xs[2], xs[3]}, DType::F32);
    Tensor ys;
    if (with_reference) {
        ys = Tensor::host(buf_->ys.shape(), DType::F32);
        be.download(buf_->ys, ys);
    }
    const int64_t ys_frames = buf_->ys.shape()[1];
    float* o = out.ptr<float>();
    for (int c = 0; c < z; ++c) {
        // [z, f, h, w]: channel c's frames are contiguous; the reference latent comes first.
        if (with_reference) {
            const float* src = ys.ptr<float>() + (int64_t(WanVae::kMaskChannels + c) * ys_frames) * plane;
            o = std::copy(src, src + plane, o);
        }
        const float* src = x.ptr<float>() + int64_t(c) * f * plane;
        o = std::copy(src, src + f * plane, o);
    }
    return out;
}

void Session::reset() {
    started_ = false;
    start_frame_ = 0;
    prompt_ids_.clear();
    text_ready_ = false;
    for (auto& kv : runners_->kv) kv->reset({});
    for (auto& r : runners_->branch) r->reset_history();
}

void Session::fail_closed() noexcept {
    // NOTE: both branches' sessions come back whole, whichever device failed
    started_ = false;
    text_ready_ = false;
    try {
        for (auto& kv : runners_->kv) kv->reset({});
        for (auto& r : runners_->branch) r->reset_history();
    } catch (const std::exception& e) {
        log()->error("session: cannot reset after a failed call: {}", e.what());
    }
}

void Session::trace(std::string_view stage, const TensorView& t) {
    // NOTE: the override runs first, so that the trace (the parity dump) shows what is consumed.
    if (override_) override_(stage, call_index_, t);
    if (trace_) trace_(stage, call_index_, t);
}

void Session::check_finite(std::string_view stage, const TensorView& t) {
    if (!engine_.options_.check_finite || engine_.measuring_) return;
    Tensor host = Tensor::host(t.shape, DType::F32);
    engine_.backend().download(t, host);
    const float* p = host.ptr<float>();
    for (int64_t i = 0; i < host.numel(); ++i)
        DZR_CHECK(std::isfinite(p[i]), "call {}: non-finite value in stage {} (element {} of {})", call_index_, stage,
                  i, t.str());
}

void Session::set_trace(PolicyTraceFn trace) {
    trace_ = std::move(trace);
    // the VAE encoder's first chunk, block by block ("vae.conv_in", "vae.block.<i>", "vae.head")
    engine_.vae_->set_trace(trace_ ? encoder_trace("vae.") : WanVae::TraceFn{});
}

void Session::encode_text(const std::vector<int64_t>& ids, int64_t length, const TensorView& out, const char* branch) {
    std::vector<int32_t> ids32(ids.begin(), ids.end());
    engine_.text_encoder_->forward(engine_.backend(), ids32, int(length), out,
                                   encoder_trace(fmt::format("umt5.{}.", branch)));
}

std::function<void(const char*, int, const TensorView&)> Session::encoder_trace(std::string prefix) {
    if (!trace_) return {};
    // "umt5.embed" -> "<prefix>embed", "clip.layer_out" (layer 0) -> "<prefix>layer_out.0"
    return [this, prefix = std::move(prefix)](const char* name, int layer, const TensorView& t) {
        std::string_view n(name);
        if (const size_t dot = n.find('.'); dot != std::string_view::npos) n.remove_prefix(dot + 1);
        trace_(layer < 0 ? prefix + std::string(n) : fmt::format("{}{}.{}", prefix, n, layer), call_index_, t);
    };
}

void Session::populate_text_cross() {
    Backend& be = engine_.backend();
    const Placement& placement = engine_.placement_;
    for (int b = 0; b < 2; ++b) {
        BranchRunner& r = *runners_->branch[size_t(b)];
        TensorView text = b == kCondBranch ? buf_->text_pos.view() : buf_->text_neg.view();
        if (r.remote()) {
            // the umT5 output moves once per prompt; the branch's DiT projects it on its own device
            const TensorView local(runners_->remote_text.data(), text.dtype, text.shape, r.backend().device());
            engine_.communicator_->transfer(be, text, r.backend(), local);
            text = local;
        }
        if (runners_->kv.empty()) {
            r.dit().compute_text_kv(r.backend(), text, r.cross());
            continue;
        }
        // NOTE: projected straight into the branch's cross cache (no staging copy of every layer's K and V)
        const int dev = placement.device_of(b);
        const int kv_branch = dev == placement.device_of(1 - b) ? b : 0;
        KvSession& kv = *runners_->kv[size_t(dev)];
        project_into(r.backend(), kv, kv_branch, CrossKind::Text, [&](DitCrossKv& target, const auto& layer_done) {
            r.dit().compute_text_kv(r.backend(), text, target, layer_done);
        });
        const CrossAttentionCache& c = kv.cross(kv_branch, CrossKind::Text);
        for (size_t i = 0; i < r.cross().layers.size(); ++i) {
            r.cross().layers[i].k_txt = c.k(int(i));
            r.cross().layers[i].v_txt = c.v(int(i));
            r.cross().layers[i].k_txt_scale = c.k_scale(int(i));
            r.cross().layers[i].v_txt_scale = c.v_scale(int(i));
        }
    }
}

void Session::populate_image_cross() {
    Backend& be = engine_.backend();
    const Placement& placement = engine_.placement_;
    if (runners_->kv.empty()) {
        for (auto& r : runners_->branch) {
            TensorView feats = buf_->clip_feats.view();
            if (r->remote()) {
                const TensorView local(runners_->remote_clip.data(), feats.dtype, feats.shape, r->backend().device());
                engine_.communicator_->transfer(be, feats, r->backend(), local);
                feats = local;
            }
            r->dit().compute_image_kv(r->backend(), feats, r->cross());
        }
        return;
    }
    // NOTE: the image context is the same for both branches: it is projected once per device, straight into the
    // device's image cache, which the branches placed there share.
    std::array<bool, 2> projected{false, false};  // per device
    for (int b = 0; b < 2; ++b) {
        BranchRunner& r = *runners_->branch[size_t(b)];
        const int dev = placement.device_of(b);
        const int kv_branch = dev == placement.device_of(1 - b) ? b : 0;
        KvSession& kv = *runners_->kv[size_t(dev)];
        if (!projected[size_t(dev)]) {
            TensorView feats = buf_->clip_feats.view();
            if (r.remote()) {
                const TensorView local(runners_->remote_clip.data(), feats.dtype, feats.shape, r.backend().device());
                engine_.communicator_->transfer(be, feats, r.backend(), local);
                feats = local;
            }
            project_into(r.backend(), kv, kv_branch, CrossKind::Image, [&](DitCrossKv& target, const auto& layer_done) {
                r.dit().compute_image_kv(r.backend(), feats, target, layer_done);
            });
            projected[size_t(dev)] = true;
        }
        const CrossAttentionCache& c = kv.cross(kv_branch, CrossKind::Image);
        for (size_t i = 0; i < r.cross().layers.size(); ++i) {
            r.cross().layers[i].k_img = c.k(int(i));
            r.cross().layers[i].v_img = c.v(int(i));
            r.cross().layers[i].k_img_scale = c.k_scale(int(i));
            r.cross().layers[i].v_img_scale = c.v_scale(int(i));
        }
    }
}

void Session::forward(int branch, ForwardKind kind, const BranchIo& io, int start_frame, int64_t timestep,
                      int64_t action_timestep) {
    DitForwardOptions opt =
        dit_options(engine_.options_.check_finite && !engine_.measuring_, kind, bool(trace_));
    opt.trace = dit_trace(kind, branch);
    BranchRunner& runner = *runners_->branch[size_t(branch)];
    ProfileScope profile(runner.backend(), fmt::format("{}.{}", forward_kind_name(kind), kBranchNames[branch]));
    runner.forward(kind, io, start_frame, timestep, action_timestep, opt);
}

DitTraceFn Session::dit_trace(ForwardKind kind, int branch) {
    if (!trace_) return {};
    const std::string prefix = fmt::format("dit.{}.{}.", forward_kind_name(kind), kBranchNames[branch]);
    return [this, prefix](std::string_view name, int layer, const TensorView& t) {
        trace_(layer < 0 ? prefix + std::string(name) : fmt::format("{}{}.{}", prefix, name, layer), call_index_, t);
    };
}

void Session::forward_both(ForwardKind kind, const BranchIo& cond, const BranchIo& uncond, int start_frame,
                           int64_t timestep, int64_t action_timestep) {
    BranchRunner& a = *runners_->branch[size_t(kCondBranch)];
    BranchRunner& b = *runners_->branch[size_t(kUncondBranch)];
    // NOTE: the DiT's layer intermediates are named per branch: a call that traces them runs the branches one by one
    if (!engine_.options_.batch_cfg || (trace_ && engine_.options_.trace_dit_layers) ||
        !BranchRunner::can_pair(a, b)) {
        forward(kCondBranch, kind, cond, start_frame, timestep, action_timestep);
        forward(kUncondBranch, kind, uncond, start_frame, timestep, action_timestep);
        return;
    }
    DitForwardOptions opt = dit_options(engine_.options_.check_finite && !engine_.measuring_, kind, bool(trace_));
    opt.share_first_self_attention = engine_.options_.share_first_self_attention;
    std::array<DitTraceFn, 2> traces;
    for (int branch : {kCondBranch, kUncondBranch}) traces[size_t(branch)] = dit_trace(kind, branch);
    // the unconditional branch's action velocity is never used: its decoder is skipped (unless a trace records it)
    BranchIo uncond_out = uncond;
    if (!trace_) uncond_out.action_out = {};
    ProfileScope profile(a.backend(), fmt::format("{}.both", forward_kind_name(kind)));
    BranchRunner::forward_pair(a, b, kind, cond, uncond_out, start_frame, timestep, action_timestep, opt, traces);
}

// ---- the stages of a call ----------------------------------------------------------------------

std::string Session::reset_reason(const PreparedObservation& obs) const {
    // The reset rules, in the reference's order (wan_flow_matching_action_tf.py:1031-1044).
    const bool prompt_changed = started_ && obs.tokens.positive.ids != prompt_ids_;
    if (!started_) return "first call";
    if (prompt_changed) return "prompt changed";
    if (obs.frames == 1) return "1-frame call";
    if (start_frame_ >= engine_.model_.dit.local_attn_size()) return "window full";
    return {};
}

void Session::apply_reset(const PreparedObservation& obs) {
    const bool prompt_changed = started_ && obs.tokens.positive.ids != prompt_ids_;
    if (!started_ || prompt_changed) {
        for (auto& kv : runners_->kv) kv->reset({});
        text_ready_ = false;
    } else {
        for (auto& kv : runners_->kv) kv->reset_window();
    }
    for (auto& r : runners_->branch) r->reset_history();
    start_frame_ = 0;
    prompt_ids_ = obs.tokens.positive.ids;
    started_ = true;
}

void Session::upload_inputs(const PreparedObservation& obs, bool reset) {
    Backend& be = engine_.backend();
    const DitConfig& d = engine_.model_.dit;
    // State: q99-normalized, zero-padded, rounded as the reference does (straight to bf16).
    std::vector<double> state = prepare_state(obs.state, engine_.embodiment_, d.max_state_dim);
    std::vector<float> state_f(state.size());
    for (size_t i = 0; i < state.size(); ++i)
        state_f[i] = be.compute_dtype() == DType::BF16 ? round_f64_to_bf16(state[i]) : float(state[i]);
    be.upload(TensorView(state_f.data(), DType::F32, buf_->state.shape()), buf_->state);
    trace("state", buf_->state);

    // The model input: the reference frame on a reset, else the commit clip.
    const auto upload_input = [&](const auto& bf16, const auto& f32, const Tensor& dst, const char* what) {
        DZR_CHECK(!bf16.empty() || !f32.empty(), "policy: the prepared observation of a {}-frame call has no {}",
                  obs.frames, what);
        if (!bf16.empty())
            be.upload(TensorView(const_cast<uint16_t*>(bf16.data()), DType::BF16, dst.shape()), dst);
        else
            be.upload(TensorView(const_cast<float*>(f32.data()), DType::F32, dst.shape()), dst);
        trace("input.video", dst);
    };
    if (reset)
        upload_input(obs.reference_input_bf16, obs.reference_input, buf_->ref_frame, "reference-frame input");
    else
        upload_input(obs.clip_input_bf16, obs.clip_input, buf_->clip_video, "clip input");
}

void Session::encode_context(const PreparedObservation& obs) {
    if (text_ready_) return;
    const PromptTokens& tokens = obs.tokens;
    if (engine_.text_embeddings_) {  // the text pre-pass encoded the run's prompts at load
        engine_.text_embeddings_->fetch(engine_.backend(), tokens, buf_->text_pos, buf_->text_neg);
    } else {
        encode_text(tokens.positive.ids, tokens.positive.length, buf_->text_pos, "pos");
        encode_text(tokens.negative.ids, tokens.negative.length, buf_->text_neg, "neg");
    }
    trace("text.pos", buf_->text_pos);
    trace("text.neg", buf_->text_neg);
    check_finite("text encoder", buf_->text_pos);
    populate_text_cross();
    text_ready_ = true;
}

void Session::start_window(int frames) {
    // ---- window start: CLIP + `ys`, then the prefill of the reference latent -----------------------------
    Backend& be = engine_.backend();
    const ModelConfig& m = engine_.model_;
    {
        ProfileScope profile(be, "image_encoder");
        // NOTE: the reference's frame is channels-last in memory when the call has several frames (a slice
        // of the clip), and PyTorch then runs CLIP's patch convolution as an NHWC one
        engine_.image_encoder_->encode(be, buf_->ref_frame, buf_->clip_feats, encoder_trace("clip."), frames > 1);
    }
    {
        ProfileScope profile(be, "ys_encode");
        // NOTE: the reference encodes ys under torch.autocast(bf16) (f32 norms, one rounding per conv
        // input) and the commit clip with plain bf16 ops (docs/VAE.md, Precision).
        engine_.vae_->encode_conditioning(buf_->ref_frame, m.num_frames, buf_->ys, VaePrecision::Autocast);
    }
    trace("clip", buf_->clip_feats);
    trace("ys", buf_->ys);
    check_finite("image encoder", buf_->clip_feats);
    check_finite("VAE conditioning", buf_->ys);
    populate_image_cross();
    be.stream().record(*events_->image);

    // Contiguous [z, 1, h, w] and [4 + z, 1, h, w] tensors at the start of the input buffers.
    const int z = m.vae.z_dim, lh = m.canvas_height / 8, lw = m.canvas_width / 8;
    BranchIo io;
    io.x = head_view(buf_->x_in, Shape{z, 1, lh, lw});
    io.y = head_view(buf_->y_in, Shape{4 + z, 1, lh, lw});
    be.copy(buf_->ys.view().slice(0, 4, z).slice(1, 0, 1), io.x);
    be.copy(buf_->ys.view().slice(1, 0, 1), io.y);
    io.video_out = head_view(buf_->v_uncond, Shape{z, 1, lh, lw});
    forward_both(ForwardKind::Prefill, io, io, 0, 0, 0);
    start_frame_ = 1;
}

void Session::commit_clip() {
    // ---- commit the two newest observed latent frames ---------------------------------------------------
    Backend& be = engine_.backend();
    const DitConfig& d = engine_.model_.dit;
    {
        ProfileScope profile(be, "vae_encode");
        engine_.vae_->encode(buf_->clip_video, buf_->clip_latent, VaePrecision::Eager);
    }
    trace("vae.clip", buf_->clip_latent);
    check_finite("VAE encode", buf_->clip_latent);
    be.stream().record(*events_->vae);

    const int f = d.num_frame_per_block;
    const int ys_frames = int(buf_->ys.shape()[1]);
    const int y0 = start_frame_ <= ys_frames ? start_frame_ - f : ys_frames - f;
    be.copy(buf_->clip_latent.view().slice(1, 3 - f, f), buf_->x_in);
    be.copy(buf_->ys.view().slice(1, y0, f), buf_->y_in);
    BranchIo io;
    io.x = buf_->x_in;
    io.y = buf_->y_in;
    io.video_out = buf_->v_uncond;
    forward_both(ForwardKind::Commit, io, io, start_frame_ - f, 0, 0);
}

int Session::denoise(PolicyCallResult& result) {
    // ---- denoise the next block -------------------------------------------------------------------------
    Backend& be = engine_.backend();
    const DitConfig& d = engine_.model_.dit;
    const config::SamplingConfig& sampling = engine_.options_.sampling;
    result.start_frame = start_frame_;
    result.kv_tokens = int64_t(start_frame_) * d.frame_seqlen;
    {
        const int f = d.num_frame_per_block;
        const int ys_frames = int(buf_->ys.shape()[1]);
        const int y0 = start_frame_ + f <= ys_frames ? start_frame_ : ys_frames - f;
        be.copy(buf_->ys.view().slice(1, y0, f), buf_->y_in);
    }
    upload_noise(be, *engine_.noise_, NoiseKind::Video, call_index_, buf_->x);
    upload_noise(be, *engine_.noise_, NoiseKind::Action, call_index_, buf_->a);
    trace("noise.video", buf_->x);
    trace("noise.action", buf_->a);

    const DenoiseTensors dt{buf_->x.view(), buf_->a.view(), buf_->v_video.view(), buf_->v_action.view(),
                            sampling.dynamic_schedule ? buf_->v_prev.view() : TensorView{}};
    BranchIo cond{buf_->x, buf_->y_in, buf_->a, buf_->state, buf_->v_video, buf_->v_action};
    BranchIo uncond{buf_->x, buf_->y_in, buf_->a, buf_->state, buf_->v_uncond, buf_->a_uncond};
    int evaluation = 0;
    Stream& stream = be.stream();
    auto evaluate = [&](const DenoiseStep& s) {
        if (trace_ || override_) {  // the samples the DiT sees at this step (parity dumps)
            trace(fmt::format("sample.video.{}", s.index), buf_->x);
            trace(fmt::format("sample.action.{}", s.index), buf_->a);
        }
        DZR_CHECK(evaluation < Events::kMaxEvaluations, "policy: more than {} DiT evaluations in one call",
                  Events::kMaxEvaluations);
        stream.record(*events_->dit[size_t(2 * evaluation)]);
        runners_->finite->check("the video sample (sampler state)", s.index, buf_->x);
        runners_->finite->check("the action sample (sampler state)", s.index, buf_->a);
        forward_both(ForwardKind::Denoise, cond, uncond, start_frame_, s.video_timestep, s.action_timestep);
        trace(fmt::format("velocity.cond.{}", s.index), buf_->v_video);
        trace(fmt::format("velocity.uncond.{}", s.index), buf_->v_uncond);
        trace(fmt::format("velocity.action.{}", s.index), buf_->v_action);
        apply_cfg(be, buf_->v_video, buf_->v_uncond, sampling.cfg_scale, buf_->v_video);
        check_finite(fmt::format("DiT step {}", s.index), buf_->v_video);
        runners_->finite->check("the video velocity (after CFG)", s.index, buf_->v_video);
        runners_->finite->check("the action velocity", s.index, buf_->v_action);
        stream.record(*events_->dit[size_t(2 * evaluation + 1)]);
        ++evaluation;
    };
    const int evaluations = run_denoise_loop(be, *runners_->video_sampler, *runners_->action_sampler,
                                             *engine_.schedule_, dt, evaluate);
    trace("x", buf_->x);
    trace("actions", buf_->a);
    runners_->finite->check("the denoised video latent", -1, buf_->x);
    start_frame_ += d.num_frame_per_block;
    return evaluations;
}

void Session::postprocess(const PreparedObservation& obs, PolicyCallResult& result) {
    // ---- post-process: the only point a call waits for the device ----------------------------------------
    Backend& be = engine_.backend();
    const DitConfig& d = engine_.model_.dit;
    Tensor a_host = Tensor::host(buf_->a.shape(), DType::F32);
    be.download(buf_->a, a_host);
    result.actions_normalized.assign(a_host.ptr<float>(), a_host.ptr<float>() + a_host.numel());
    // NOTE: the device has caught up with the call: the always-on checks are read now, in the order they ran
    runners_->finite->verify();
    if (!engine_.measuring_)
        check_finite_host(fmt::format("call {}, after denoising", call_index_), "the model's normalized actions",
                          result.actions_normalized.data(), result.actions_normalized.size());
    result.actions = postprocess_actions(result.actions_normalized, d.num_action_per_block, d.action_dim,
                                         obs.state, engine_.embodiment_);
    if (!engine_.measuring_)
        check_finite_host(fmt::format("call {}, post-processing", call_index_),
                          "the robot actions (normalization inverse plus the state)", result.actions.data(),
                          result.actions.size());
}

PolicyCallResult Session::step(const PreparedObservation& obs) {
    // NOTE: the sessions of an engine share its workspace arena and KV scratch: their calls must not overlap
    DZR_CHECK(!engine_.stepping_.exchange(true),
              "engine: a call of another session is running; Session::step calls on one engine run one at a time");
    struct Stepping {
        std::atomic<bool>& flag;
        ~Stepping() { flag = false; }
    } stepping{engine_.stepping_};
    Backend& be = engine_.backend();
    Stream& stream = be.stream();
    PolicyCallResult result;
    result.call_index = call_index_;
    result.times.host_prepare = obs.prepare_ms;
    Timer total;
    ArenaScope call_scope(be.workspace());
    try {
        stream.record(*events_->start);
        runners_->finite->begin_call(call_index_);
        result.reset_reason = reset_reason(obs);
        result.reset = !result.reset_reason.empty();
        if (result.reset) apply_reset(obs);
        {
            ProfileScope profile(be, "preprocess");
            upload_inputs(obs, result.reset);
        }
        stream.record(*events_->preprocess);

        {
            ProfileScope profile(be, "text");
            encode_context(obs);
        }
        stream.record(*events_->text);

        if (result.reset) {
            start_window(obs.frames);  // records the image mark between CLIP/ys and the prefill
        } else {
            commit_clip();  // records the VAE mark between the encode and the commit forwards
        }
        stream.record(*events_->commit);

        {
            ProfileScope profile(be, "denoise");
            result.dit_evaluations = denoise(result);
        }
        stream.record(*events_->denoise);

        {
            ProfileScope profile(be, "postprocess");
            postprocess(obs, result);
        }
        stream.record(*events_->post);
    } catch (...) {
        // Fail closed: the next call starts a new session (the KV sessions were aborted by the caches).
        fail_closed();
        ++call_index_;
        throw;
    }
    // The phase times, now that the device has caught up with the actions' download.
    const auto ms = [&](const std::unique_ptr<Event>& a, const std::unique_ptr<Event>& b) {
        return stream.elapsed_ms(*a, *b);
    };
    PhaseTimes& t = result.times;
    t.preprocess = ms(events_->start, events_->preprocess);
    t.text_encoder = ms(events_->preprocess, events_->text);
    if (result.reset) {
        t.image_encoder = ms(events_->text, events_->image);
        t.kv_commit = ms(events_->image, events_->commit);
    } else {
        t.vae_encode = ms(events_->text, events_->vae);
        t.kv_commit = ms(events_->vae, events_->commit);
    }
    for (int i = 0; i < result.dit_evaluations; ++i) t.dit += ms(events_->dit[size_t(2 * i)], events_->dit[size_t(2 * i + 1)]);
    t.scheduler = ms(events_->commit, events_->denoise) - t.dit;
    t.postprocess = ms(events_->denoise, events_->post);
    t.total = total.ms();
    for (Backend* b : engine_.placement_.backends)
        if (Profiler* p = b->profiler()) p->end_call();
    ++call_index_;
    return result;
}

}  // namespace dzr
