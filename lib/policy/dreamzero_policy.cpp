#include "policy/dreamzero_policy.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "backend/measuring_backend.h"
#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "kv/dense_self_attention_cache.h"
#include "kv/paged_self_attention_cache.h"
#include "model/causal_dit.h"
#include "model/clip_vision.h"
#include "model/umt5.h"
#include "model/wan_vae.h"
#include "policy/finite_check.h"
#include "policy/normalization.h"
#include "policy/postprocess.h"
#include "policy/step_plan.h"
#include "policy/tokenizer.h"
#include "sampling/cfg.h"
#include "sampling/denoise_loop.h"
#include "sampling/flow_unipc.h"
#include "sampling/step_schedule.h"
#include "weights/inventory.h"

namespace dzr {

namespace {

constexpr int kPos = 0;
constexpr int kNeg = 1;
constexpr const char* kBranchName[2] = {"pos", "neg"};
constexpr int kMaxClipFrames = 9;  // the VAE clip of a commit call: [f0, f0, f0, f1, f1, f2, f2, f3, f3]

class ShapeOnlyWeights final : public WeightSource {
public:
    explicit ShapeOnlyWeights(const ModelConfig& model) {
        for (const auto& w : expected_weights(model)) views_.emplace(w.key, MeasuringBackend::shape_only(w.shape, DType::BF16).view());
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

/// The frames of a commit clip, as indices into the call's T frames (the reference's repeat and
/// prepend, wan_flow_matching_action_tf.py:1080-1100).
std::vector<int> commit_clip_indices(int T, int frames_per_block) {
    std::vector<int> idx;
    if ((T - 1) / 4 == frames_per_block) {  // T = 9: as is
        for (int t = 0; t < T; ++t) idx.push_back(t);
    } else if (T / 4 != frames_per_block) {  // T = 4: each frame twice, the first prepended
        const int repeat = frames_per_block / (T / 4);
        idx.push_back(0);
        for (int t = 0; t < T; ++t)
            for (int r = 0; r < repeat; ++r) idx.push_back(t);
    } else {  // T = 8: the first prepended
        idx.push_back(0);
        for (int t = 0; t < T; ++t) idx.push_back(t);
    }
    return idx;
}

}  // namespace

/// Persistent device buffers of a call (allocated once).
struct DreamZeroPolicy::Buffers {
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

std::unique_ptr<WeightSource> make_shape_only_weights(const ModelConfig& model) {
    return std::make_unique<ShapeOnlyWeights>(model);
}

DreamZeroPolicy::DreamZeroPolicy(const ModelConfig& model, const WeightSource& weights,
                                 const EmbodimentStatistics& statistics, const std::filesystem::path& tokenizer,
                                 const PolicyOptions& options, Backend& be)
    : model_(model), options_(options), statistics_(statistics), be_(be) {
    measuring_ = dynamic_cast<MeasuringBackend*>(&be) != nullptr;
    const DitConfig& d = model_.dit;
    const int lh = model_.canvas_height / 8, lw = model_.canvas_width / 8;
    DZR_CHECK(d.num_frame_per_block == 2, "model: num_frame_per_block {} is not supported (DreamZero uses 2)",
              d.num_frame_per_block);
    DZR_CHECK(model_.clip.num_tokens() > 0, "model: CLIP produces no tokens");

    // Plan the workspace first (on a MeasuringBackend running the same calls), so that the real
    // loading below can already use it.
    if (!measuring_) plan_workspace(weights, tokenizer);

    preprocessor_ = std::make_unique<ObservationPreprocessor>(
        ViewSize{model_.canvas_height / 2, model_.canvas_width / 2}, options_.unit_range);  // the canvas is 2 x 2 views
    tokenizer_ = std::make_unique<Umt5Tokenizer>(tokenizer);
    DZR_CHECK(tokenizer_->vocab_size() <= model_.t5.vocab,
              "tokenizer {} has {} pieces but the text encoder's vocabulary is {}: wrong tokenizer for this checkpoint",
              tokenizer_->model_path().string(), tokenizer_->vocab_size(), model_.t5.vocab);

    WeightLoader loader(weights, be_);
    text_encoder_ = std::make_unique<Umt5Encoder>(loader, model_.t5);
    image_encoder_ = std::make_unique<ClipVision>(loader, model_.clip, model_.canvas_height, model_.canvas_width);
    vae_ = std::make_unique<WanVae>(loader, model_.vae);
    dit_ = std::make_unique<CausalDit>(d, lh, lw, loader);

    const DType dt = be_.compute_dtype();
    const int z = model_.vae.z_dim;
    const int ys_frames = 1 + (model_.num_frames - 1) / 4;
    const int H = model_.canvas_height, W = model_.canvas_width;
    const int horizon = d.num_action_per_block, A = d.action_dim;
    buf_ = std::make_unique<Buffers>();
    buf_->clip_video = be_.alloc(Shape{3, kMaxClipFrames, H, W}, dt);
    buf_->ref_frame = be_.alloc(Shape{3, H, W}, dt);
    buf_->clip_feats = be_.alloc(Shape{model_.clip.num_tokens(), model_.clip.width}, dt);
    buf_->ys = be_.alloc(Shape{4 + z, ys_frames, lh, lw}, dt);
    buf_->clip_latent = be_.alloc(Shape{z, 3, lh, lw}, dt);
    buf_->text_pos = be_.alloc(Shape{model_.t5.text_len, model_.t5.dim}, dt);
    buf_->text_neg = be_.alloc(Shape{model_.t5.text_len, model_.t5.dim}, dt);
    for (Tensor* t : {&buf_->x, &buf_->x_in, &buf_->v_video, &buf_->v_uncond, &buf_->v_prev})
        *t = be_.alloc(Shape{z, d.num_frame_per_block, lh, lw}, dt);
    buf_->y_in = be_.alloc(Shape{4 + z, d.num_frame_per_block, lh, lw}, dt);
    for (Tensor* t : {&buf_->a, &buf_->v_action, &buf_->a_uncond}) *t = be_.alloc(Shape{horizon, A}, dt);
    buf_->state = be_.alloc(Shape{d.num_state_per_block, d.max_state_dim}, dt);

    FlowUniPCConfig uc;
    uc.num_steps = options_.sampling.num_inference_steps;
    uc.shift = options_.sampling.sigma_shift;
    video_sampler_ = std::make_unique<FlowUniPC>(be_, buf_->x.shape(), dt, uc);
    action_sampler_ = std::make_unique<FlowUniPC>(be_, buf_->a.shape(), dt, uc);
    schedule_ = std::make_unique<StepSchedule>(make_step_schedule(options_.sampling));
    noise_ = options_.noise ? options_.noise : std::make_shared<SeededNoise>(options_.sampling.seed);

    // KV caches.
    const KvGeometry geometry = KvGeometry::from_model(model_, dt, 2);
    options_.kv.validate(geometry);
    const int64_t image_tokens = model_.clip.num_tokens();
    if (options_.kv_mode == KvMode::Paged) {
        const size_t budget = resolve_kv_budget(geometry, options_.kv, options_.free_device_bytes);
        kv_manager_ = std::make_unique<KvCacheManager>(geometry, options_.kv, budget, &be_);
        kv_session_ = kv_manager_->open_session("policy");
        staging_kv_ = std::make_unique<DitCrossKv>(dit_->make_cross_kv(be_, image_tokens));
        for (int b = 0; b < 2; ++b) {
            // NOTE: on CUDA the Kernel path (device block table, paged attention) keeps every layer's
            // attend() capture-safe; on the CPU the Gather path is bit-exact with the dense reference.
            paged_[b] = std::make_unique<PagedSelfAttentionCache>(
                *kv_session_, b, be_.device().is_cuda() ? PagedAttentionPath::Kernel : PagedAttentionPath::Gather);
            branch_kv_[b] = std::make_unique<DitCrossKv>();
            branch_kv_[b]->layers.resize(size_t(d.num_layers));
        }
    } else {
        for (int b = 0; b < 2; ++b) {
            dense_[b] = std::make_unique<DenseSelfAttentionCache>(be_, geometry, options_.kv);
            branch_kv_[b] = std::make_unique<DitCrossKv>(dit_->make_cross_kv(be_, image_tokens));
        }
    }
    if (!measuring_) {
        log()->debug("policy: {}", describe());
    }
}

DreamZeroPolicy::~DreamZeroPolicy() = default;

void DreamZeroPolicy::plan_workspace(const WeightSource& weights, const std::filesystem::path& tokenizer) {
    (void)weights;
    // NOTE: the real backend plans each convolution as the calls are measured (cuDNN's engine as PyTorch picks
    // it, whatever its workspace), so the workspace holds what those engines take
    MeasuringBackend mb(be_.compute_dtype(), &be_);
    auto shapes = make_shape_only_weights(model_);
    PolicyOptions o = options_;
    o.check_finite = false;
    o.noise = std::make_shared<SeededNoise>(0);
    DreamZeroPolicy shadow(model_, *shapes, statistics_, tokenizer, o, mb);
    // A first call (prefill, CLIP, the 33-frame conditioning) and a commit call walk every shape.
    std::vector<uint8_t> frames(size_t(4) * kFrameHeight * kFrameWidth * 3, 0);
    Observation obs;
    obs.prompt = "plan the workspace";
    auto view = [&](int T) {
        return TensorView(frames.data(), DType::U8, Shape{T, kFrameHeight, kFrameWidth, 3}, Device::cpu());
    };
    obs.exterior_1 = obs.exterior_2 = obs.wrist = view(1);
    shadow.step(obs);
    obs.exterior_1 = obs.exterior_2 = obs.wrist = view(4);
    shadow.step(obs);
    if (options_.video_decode) {
        DZR_CHECK(model_.vae.has_decoder, "policy: video decoding needs the VAE decoder (model.vae.has_decoder)");
        // NOTE: the chunked decode's workspace does not depend on the number of latent frames.
        const int lh = model_.canvas_height / 8, lw = model_.canvas_width / 8;
        const Tensor latent = mb.alloc(Shape{model_.vae.z_dim, 3, lh, lw}, mb.compute_dtype());
        const Tensor video = mb.alloc(shadow.vae_->video_shape(latent.shape()), mb.compute_dtype());
        ArenaScope scope(mb.workspace());
        shadow.vae_->decode(latent, video);
    }
    workspace_bytes_ = mb.workspace().high_water() + (size_t(1) << 20);
    be_.reserve_workspace(workspace_bytes_);
}

size_t DreamZeroPolicy::kv_bytes() const {
    if (kv_manager_) return kv_manager_->plan().total_bytes;
    const KvGeometry g = KvGeometry::from_model(model_, be_.compute_dtype(), 2);
    const int64_t rows = int64_t(options_.kv.sink_frames + options_.kv.window_frames + g.chunk_frames) * g.tokens_per_frame;
    return size_t(2) * size_t(rows) * g.token_bytes();
}

TensorView DreamZeroPolicy::last_video_latent() const { return buf_->x.view(); }

Tensor DreamZeroPolicy::video_prediction() const {
    const int z = model_.vae.z_dim;
    const Shape xs = buf_->x.shape();  // [z, 2, h, w]
    const int64_t f = xs[1], plane = xs[2] * xs[3];
    // NOTE: step() leaves start_frame_ at 3 exactly when it denoised at start frame 1 (a window's first
    // call), where the reference prepends the reference frame's latent, ys[4:4+z, 0].
    const bool with_reference = start_frame_ == 1 + f;
    Tensor x = Tensor::host(xs, DType::F32);
    be_.download(buf_->x, x);
    Tensor out = Tensor::host(Shape{z, f + (with_reference ? 1 : 0), xs[2], xs[3]}, DType::F32);
    Tensor ys;
    if (with_reference) {
        ys = Tensor::host(buf_->ys.shape(), DType::F32);
        be_.download(buf_->ys, ys);
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

Tensor DreamZeroPolicy::decode_video(const TensorView& latents) {
    DZR_CHECK(model_.vae.has_decoder, "decode_video: the checkpoint's VAE was loaded without its decoder");
    DZR_CHECK(options_.video_decode || measuring_,
              "decode_video: the policy was built without PolicyOptions::video_decode (no workspace for it)");
    DZR_CHECK(latents.device.is_cpu() && latents.dtype == DType::F32 && latents.rank() == 4 &&
                  latents.dim(0) == model_.vae.z_dim && latents.dim(1) >= 1 && latents.dim(2) == model_.canvas_height / 8 &&
                  latents.dim(3) == model_.canvas_width / 8 && latents.is_contiguous(),
              "decode_video: latents must be host f32 [{}, K, {}, {}], got {}", model_.vae.z_dim,
              model_.canvas_height / 8, model_.canvas_width / 8, latents.str());
    const DType dt = be_.compute_dtype();
    const Tensor latent = be_.alloc(latents.shape, dt);
    const Tensor video = be_.alloc(vae_->video_shape(latents.shape), dt);  // [3, T, H, W]
    be_.upload(latents, latent);
    {
        ArenaScope scope(be_.workspace());
        vae_->decode(latent, video);
    }
    Tensor host = Tensor::host(video.shape(), DType::F32);
    be_.download(video, host);
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

std::string DreamZeroPolicy::describe() const {
    return fmt::format("DiT {}x{} ({} heads), umT5 {}x{}, CLIP {}x{}, VAE base {}, canvas {}x{}, {} KV {:.2f} GiB, "
                       "workspace {:.2f} GiB, steps {} ({}), cfg {}, noise: {}",
                       model_.dit.num_layers, model_.dit.dim, model_.dit.num_heads, model_.t5.num_layers, model_.t5.dim,
                       model_.clip.use_layers, model_.clip.width, model_.vae.base_dim, model_.canvas_height,
                       model_.canvas_width, options_.kv_mode == KvMode::Paged ? "paged" : "dense",
                       double(kv_bytes()) / double(1ull << 30), double(workspace_bytes_) / double(1ull << 30),
                       options_.sampling.num_inference_steps, schedule_->describe(), options_.sampling.cfg_scale,
                       noise_->describe());
}

void DreamZeroPolicy::reset() {
    started_ = false;
    start_frame_ = 0;
    prompt_ids_.clear();
    text_ready_ = false;
    if (kv_session_) kv_session_->reset({});
    for (auto& c : dense_)
        if (c) c->reset();
}

void DreamZeroPolicy::trace(std::string_view stage, const TensorView& t) {
    // NOTE: the override runs first, so that the trace (the parity dump) shows what is consumed.
    if (override_) override_(stage, call_index_, t);
    if (trace_) trace_(stage, call_index_, t);
}

void DreamZeroPolicy::check_finite(std::string_view stage, const TensorView& t) {
    if (!options_.check_finite || measuring_) return;
    Tensor host = Tensor::host(t.shape, DType::F32);
    be_.download(t, host);
    const float* p = host.ptr<float>();
    for (int64_t i = 0; i < host.numel(); ++i)
        DZR_CHECK(std::isfinite(p[i]), "call {}: non-finite value in stage {} (element {} of {})", call_index_, stage,
                  i, t.str());
}

void DreamZeroPolicy::sync_phase(double& slot, Timer& timer) {
    be_.synchronize();
    slot += timer.ms();
    timer.reset();
}

void DreamZeroPolicy::set_trace(PolicyTraceFn trace) {
    trace_ = std::move(trace);
    // the VAE encoder's first chunk, block by block ("vae.conv_in", "vae.block.<i>", "vae.head")
    if (vae_) vae_->set_trace(trace_ ? encoder_trace("vae.") : WanVae::TraceFn{});
}

void DreamZeroPolicy::encode_text(const std::vector<int64_t>& ids, int64_t length, const TensorView& out,
                                  const char* branch) {
    std::vector<int32_t> ids32(ids.begin(), ids.end());
    text_encoder_->forward(be_, ids32, int(length), out, encoder_trace(fmt::format("umt5.{}.", branch)));
}

std::function<void(const char*, int, const TensorView&)> DreamZeroPolicy::encoder_trace(std::string prefix) {
    if (!trace_) return {};
    // "umt5.embed" -> "<prefix>embed", "clip.layer_out" (layer 0) -> "<prefix>layer_out.0"
    return [this, prefix = std::move(prefix)](const char* name, int layer, const TensorView& t) {
        std::string_view n(name);
        if (const size_t dot = n.find('.'); dot != std::string_view::npos) n.remove_prefix(dot + 1);
        trace_(layer < 0 ? prefix + std::string(n) : fmt::format("{}{}.{}", prefix, n, layer), call_index_, t);
    };
}

void DreamZeroPolicy::populate_text_cross() {
    for (int b = 0; b < 2; ++b) {
        const TensorView& text = b == kPos ? buf_->text_pos.view() : buf_->text_neg.view();
        if (kv_session_) {
            dit_->compute_text_kv(be_, text, *staging_kv_);
            std::vector<LayerKv> layers;
            for (const auto& l : staging_kv_->layers) layers.push_back({l.k_txt, l.v_txt});
            kv_session_->populate_cross(b, CrossKind::Text, layers);
            const CrossAttentionCache& c = kv_session_->cross(b, CrossKind::Text);
            for (size_t i = 0; i < layers.size(); ++i) {
                branch_kv_[b]->layers[i].k_txt = c.k(int(i));
                branch_kv_[b]->layers[i].v_txt = c.v(int(i));
            }
        } else {
            dit_->compute_text_kv(be_, text, *branch_kv_[b]);
        }
    }
}

void DreamZeroPolicy::populate_image_cross() {
    if (kv_session_) {
        // NOTE: the image context is the same for both branches, so it is projected once.
        dit_->compute_image_kv(be_, buf_->clip_feats, *staging_kv_);
        std::vector<LayerKv> layers;
        for (const auto& l : staging_kv_->layers) layers.push_back({l.k_img, l.v_img});
        for (int b = 0; b < 2; ++b) {
            kv_session_->populate_cross(b, CrossKind::Image, layers);
            const CrossAttentionCache& c = kv_session_->cross(b, CrossKind::Image);
            for (size_t i = 0; i < layers.size(); ++i) {
                branch_kv_[b]->layers[i].k_img = c.k(int(i));
                branch_kv_[b]->layers[i].v_img = c.v(int(i));
            }
        }
    } else {
        for (int b = 0; b < 2; ++b) dit_->compute_image_kv(be_, buf_->clip_feats, *branch_kv_[b]);
    }
}

void DreamZeroPolicy::forward_branch(int branch, ForwardKind kind, const TensorView& x, const TensorView& y,
                                     int start_frame, int64_t timestep, const TensorView& video_out,
                                     const TensorView& action_out, int64_t action_timestep) {
    const DitConfig& d = model_.dit;
    KvForwardSpec spec;
    spec.commit = kind != ForwardKind::Denoise;
    spec.video_frames = int(x.dim(1));
    spec.register_tokens = kind == ForwardKind::Denoise ? d.num_action_per_block + d.num_state_per_block : 0;

    DitInputs in;
    in.x = x;
    in.y = y;
    in.start_frame = start_frame;
    in.timestep = timestep;
    if (kind == ForwardKind::Denoise) in.registers = DitRegisterInputs{buf_->a.view(), action_timestep, buf_->state.view()};
    DitOutputs out{video_out, action_out};
    DitForwardOptions opt;
    opt.check_finite = options_.check_finite && !measuring_;
    if (trace_) {
        static constexpr const char* kKind[3] = {"prefill", "commit", "denoise"};
        const std::string prefix = fmt::format("dit.{}.{}.", kKind[int(kind)], kBranchName[branch]);
        opt.trace = [this, prefix](std::string_view name, int layer, const TensorView& t) {
            trace_(layer < 0 ? prefix + std::string(name) : fmt::format("{}{}.{}", prefix, name, layer), call_index_, t);
        };
    }

    SelfAttentionCache* cache = nullptr;
    if (paged_[branch]) {
        paged_[branch]->begin(spec);
        cache = paged_[branch].get();
    } else {
        dense_[branch]->begin(spec);
        cache = dense_[branch].get();
    }
    try {
        dit_->forward(be_, in, *branch_kv_[branch], *cache, out, opt);
    } catch (...) {
        if (paged_[branch]) paged_[branch]->abort();
        else dense_[branch]->abort();
        throw;
    }
    if (paged_[branch]) paged_[branch]->commit();
    else dense_[branch]->commit();
}

PreparedObservation prepare_observation(const Observation& obs, const ModelConfig& model,
                                        const ObservationPreprocessor& preprocessor, const Umt5Tokenizer& tokenizer,
                                        bool bf16_inputs, PreparedObservation* reuse) {
    Timer timer;
    const int T = int(obs.exterior_1.rank() == 4 ? obs.exterior_1.dim(0) : 0);
    for (const auto* v : {&obs.exterior_1, &obs.exterior_2, &obs.wrist}) {
        DZR_CHECK(v->rank() == 4 && v->dtype == DType::U8 && v->dim(3) == 3 && v->is_contiguous(),
                  "observation: camera frames must be uint8 [T, H, W, 3], got {}", v->str());
        DZR_CHECK(v->dim(0) == T, "observation: cameras carry different frame counts ({} vs {})", v->dim(0), T);
    }
    DZR_CHECK(T == 1 || T == 4 || T == 8 || T == 9, "observation: {} frames per camera; a call takes 1, 4, 8 or 9", T);
    DZR_CHECK(!obs.prompt.empty(), "observation: empty prompt");
    DZR_CHECK(preprocessor.view() == (ViewSize{model.canvas_height / 2, model.canvas_width / 2}),
              "observation: the preprocessor's view size {}x{} is not half the {}x{} canvas",
              preprocessor.view().height, preprocessor.view().width, model.canvas_height, model.canvas_width);

    PreparedObservation p;
    if (reuse) p = std::move(*reuse);
    p.frames = T;
    p.joint_position = obs.joint_position;
    p.gripper_position = obs.gripper_position;
    // Views -> canvases -> the two possible model inputs (host); step() uploads the one its reset
    // decision needs.
    const size_t frame_values = size_t(3) * model.canvas_height * model.canvas_width;
    const int ref = (T == 4 || T == 9) ? T - 1 : 0;
    std::vector<int> clip;
    if (T > 1) {
        clip = commit_clip_indices(T, model.dit.num_frame_per_block);
        DZR_CHECK(int(clip.size()) == kMaxClipFrames, "observation: {} frames give a {}-frame clip", T, clip.size());
    }
    // NOTE: the unused dtype's inputs are emptied (capacity kept): step() uploads whichever is filled.
    if (bf16_inputs) {
        p.reference_input.clear();
        p.clip_input.clear();
        p.reference_input_bf16.resize(frame_values);
        p.clip_input_bf16.resize(frame_values * clip.size());
        preprocessor.run_bf16(obs.wrist, obs.exterior_1, obs.exterior_2, ref, clip, p.reference_input_bf16,
                              p.clip_input_bf16, &p.canvas_scratch);
    } else {
        p.reference_input_bf16.clear();
        p.clip_input_bf16.clear();
        p.reference_input.resize(frame_values);
        p.clip_input.resize(frame_values * clip.size());
        preprocessor.run(obs.wrist, obs.exterior_1, obs.exterior_2, ref, clip, p.reference_input, p.clip_input,
                         &p.canvas_scratch);
    }
    p.tokens = tokenize_droid_prompts(tokenizer, obs.prompt, model.t5.text_len);
    p.prepare_ms = timer.ms();
    return p;
}

PreparedObservation DreamZeroPolicy::prepare(const Observation& obs) const {
    // NOTE: on a bf16 backend the inputs are rounded to bf16 here, on the caller's (prefetch) thread, in
    // the same pass that builds them: step() then uploads without converting.
    PreparedObservation reuse;
    {
        std::lock_guard<std::mutex> lock(spare_mu_);
        if (!spare_.empty()) {
            reuse = std::move(spare_.back());
            spare_.pop_back();
        }
    }
    return prepare_observation(obs, model_, *preprocessor_, *tokenizer_, be_.compute_dtype() == DType::BF16,
                               &reuse);
}

void DreamZeroPolicy::recycle(PreparedObservation&& used) const {
    // NOTE: two sets cover a prefetching caller (one being prepared while one steps); more would only hold
    // memory.
    std::lock_guard<std::mutex> lock(spare_mu_);
    if (spare_.size() < 2) spare_.push_back(std::move(used));
}

PolicyCallResult DreamZeroPolicy::step(const Observation& obs) {
    PreparedObservation prepared = prepare(obs);
    PolicyCallResult result = step(prepared);
    recycle(std::move(prepared));
    return result;
}

PolicyCallResult DreamZeroPolicy::step(const PreparedObservation& obs) {
    const DitConfig& d = model_.dit;
    const int T = obs.frames;
    PolicyCallResult result;
    result.call_index = call_index_;
    result.times.host_prepare = obs.prepare_ms;
    Timer total, phase;
    ArenaScope call_scope(be_.workspace());
    try {
        const PromptTokens& tokens = obs.tokens;

        // Reset rules, in the reference's order (wan_flow_matching_action_tf.py:1031-1044).
        const bool prompt_changed = started_ && tokens.positive.ids != prompt_ids_;
        if (!started_) result.reset_reason = "first call";
        else if (prompt_changed) result.reset_reason = "prompt changed";
        else if (T == 1) result.reset_reason = "1-frame call";
        else if (start_frame_ >= d.local_attn_size()) result.reset_reason = "window full";
        result.reset = !result.reset_reason.empty();
        if (result.reset) {
            if (!started_ || prompt_changed) {
                if (kv_session_) kv_session_->reset({});
                text_ready_ = false;
            } else if (kv_session_) {
                kv_session_->reset_window();
            }
            for (auto& c : dense_)
                if (c) c->reset();
            start_frame_ = 0;
            prompt_ids_ = tokens.positive.ids;
            started_ = true;
        }

        // State: q99-normalized, zero-padded, rounded as the reference does (straight to bf16).
        std::vector<double> state = prepare_state(obs.joint_position, std::span<const double>(&obs.gripper_position, 1),
                                                  statistics_, d.max_state_dim);
        std::vector<float> state_f(state.size());
        for (size_t i = 0; i < state.size(); ++i)
            state_f[i] = be_.compute_dtype() == DType::BF16 ? round_f64_to_bf16(state[i]) : float(state[i]);
        be_.upload(TensorView(state_f.data(), DType::F32, buf_->state.shape()), buf_->state);
        trace("state", buf_->state);

        // The model input: the reference frame on a reset, else the commit clip.
        if (result.reset) {
            DZR_CHECK(!obs.reference_input_bf16.empty() || !obs.reference_input.empty(),
                      "policy: the prepared observation has no reference-frame input");
            if (!obs.reference_input_bf16.empty())
                be_.upload(TensorView(const_cast<uint16_t*>(obs.reference_input_bf16.data()), DType::BF16,
                                      buf_->ref_frame.shape()),
                           buf_->ref_frame);
            else
                be_.upload(TensorView(const_cast<float*>(obs.reference_input.data()), DType::F32, buf_->ref_frame.shape()),
                           buf_->ref_frame);
            trace("input.video", buf_->ref_frame);
        } else {
            DZR_CHECK(!obs.clip_input_bf16.empty() || !obs.clip_input.empty(),
                      "policy: the prepared observation of a {}-frame call has no clip input", T);
            if (!obs.clip_input_bf16.empty())
                be_.upload(TensorView(const_cast<uint16_t*>(obs.clip_input_bf16.data()), DType::BF16,
                                      buf_->clip_video.shape()),
                           buf_->clip_video);
            else
                be_.upload(TensorView(const_cast<float*>(obs.clip_input.data()), DType::F32, buf_->clip_video.shape()),
                           buf_->clip_video);
            trace("input.video", buf_->clip_video);
        }
        sync_phase(result.times.preprocess, phase);

        // ---- text: per prompt, both branches -------------------------------------------------------
        if (!text_ready_) {
            encode_text(tokens.positive.ids, tokens.positive.length, buf_->text_pos, "pos");
            encode_text(tokens.negative.ids, tokens.negative.length, buf_->text_neg, "neg");
            trace("text.pos", buf_->text_pos);
            trace("text.neg", buf_->text_neg);
            check_finite("text encoder", buf_->text_pos);
            populate_text_cross();
            text_ready_ = true;
        }
        sync_phase(result.times.text_encoder, phase);

        const int lh = model_.canvas_height / 8, lw = model_.canvas_width / 8;
        if (result.reset) {
            // ---- window start: CLIP + `ys`, then the prefill of the reference latent ---------------
            // NOTE: the reference's frame is channels-last in memory when the call has several frames (a slice
            // of the clip), and PyTorch then runs CLIP's patch convolution as an NHWC one
            image_encoder_->encode(be_, buf_->ref_frame, buf_->clip_feats, encoder_trace("clip."), T > 1);
            // NOTE: the reference encodes ys under torch.autocast(bf16) (f32 norms, one rounding per conv
            // input) and the commit clip with plain bf16 ops (docs/VAE.md, Precision).
            vae_->encode_conditioning(buf_->ref_frame, model_.num_frames, buf_->ys, VaePrecision::Autocast);
            trace("clip", buf_->clip_feats);
            trace("ys", buf_->ys);
            check_finite("image encoder", buf_->clip_feats);
            check_finite("VAE conditioning", buf_->ys);
            populate_image_cross();
            sync_phase(result.times.image_encoder, phase);

            // Contiguous [z, 1, h, w] and [4 + z, 1, h, w] tensors at the start of the input buffers.
            const int z = model_.vae.z_dim;
            TensorView xin(buf_->x_in.data(), buf_->x_in.dtype(), Shape{z, 1, lh, lw}, buf_->x_in.device());
            TensorView yin(buf_->y_in.data(), buf_->y_in.dtype(), Shape{4 + z, 1, lh, lw}, buf_->y_in.device());
            be_.copy(buf_->ys.view().slice(0, 4, z).slice(1, 0, 1), xin);
            be_.copy(buf_->ys.view().slice(1, 0, 1), yin);
            TensorView vout(buf_->v_uncond.data(), buf_->v_uncond.dtype(), Shape{z, 1, lh, lw}, buf_->v_uncond.device());
            for (int b = 0; b < 2; ++b) forward_branch(b, ForwardKind::Prefill, xin, yin, 0, 0, vout, {}, 0);
            start_frame_ = 1;
            sync_phase(result.times.kv_commit, phase);
        } else {
            // ---- commit the two newest observed latent frames -----------------------------------
            vae_->encode(buf_->clip_video, buf_->clip_latent, VaePrecision::Eager);
            trace("vae.clip", buf_->clip_latent);
            check_finite("VAE encode", buf_->clip_latent);
            sync_phase(result.times.vae_encode, phase);

            const int f = d.num_frame_per_block;
            const int ys_frames = int(buf_->ys.shape()[1]);
            const int y0 = start_frame_ <= ys_frames ? start_frame_ - f : ys_frames - f;
            be_.copy(buf_->clip_latent.view().slice(1, 3 - f, f), buf_->x_in);
            be_.copy(buf_->ys.view().slice(1, y0, f), buf_->y_in);
            for (int b = 0; b < 2; ++b)
                forward_branch(b, ForwardKind::Commit, buf_->x_in, buf_->y_in, start_frame_ - f, 0, buf_->v_uncond, {}, 0);
            sync_phase(result.times.kv_commit, phase);
        }

        // ---- denoise the next block -------------------------------------------------------------------
        result.start_frame = start_frame_;
        result.kv_tokens = int64_t(start_frame_) * d.frame_seqlen;
        {
            const int f = d.num_frame_per_block;
            const int ys_frames = int(buf_->ys.shape()[1]);
            const int y0 = start_frame_ + f <= ys_frames ? start_frame_ : ys_frames - f;
            be_.copy(buf_->ys.view().slice(1, y0, f), buf_->y_in);
        }
        upload_noise(be_, *noise_, NoiseKind::Video, call_index_, buf_->x);
        upload_noise(be_, *noise_, NoiseKind::Action, call_index_, buf_->a);
        trace("noise.video", buf_->x);
        trace("noise.action", buf_->a);

        DenoiseTensors dt{buf_->x.view(), buf_->a.view(), buf_->v_video.view(), buf_->v_action.view(),
                          options_.sampling.dynamic_schedule ? buf_->v_prev.view() : TensorView{}};
        double dit_ms = 0;
        Timer dit_timer;
        auto evaluate = [&](const DenoiseStep& s) {
            if (trace_ || override_) {  // the samples the DiT sees at this step (parity dumps)
                trace(fmt::format("sample.video.{}", s.index), buf_->x);
                trace(fmt::format("sample.action.{}", s.index), buf_->a);
            }
            const std::string where = fmt::format("call {}, denoising step {}", call_index_, s.index);
            check_finite_always(be_, where, "the video sample (sampler state)", buf_->x);
            check_finite_always(be_, where, "the action sample (sampler state)", buf_->a);
            be_.synchronize();
            dit_timer.reset();
            forward_branch(kPos, ForwardKind::Denoise, buf_->x, buf_->y_in, start_frame_, s.video_timestep,
                           buf_->v_video, buf_->v_action, s.action_timestep);
            forward_branch(kNeg, ForwardKind::Denoise, buf_->x, buf_->y_in, start_frame_, s.video_timestep,
                           buf_->v_uncond, buf_->a_uncond, s.action_timestep);
            trace(fmt::format("velocity.cond.{}", s.index), buf_->v_video);
            trace(fmt::format("velocity.uncond.{}", s.index), buf_->v_uncond);
            trace(fmt::format("velocity.action.{}", s.index), buf_->v_action);
            apply_cfg(be_, buf_->v_video, buf_->v_uncond, options_.sampling.cfg_scale, buf_->v_video);
            check_finite(fmt::format("DiT step {}", s.index), buf_->v_video);
            check_finite_always(be_, where, "the video velocity (after CFG)", buf_->v_video);
            check_finite_always(be_, where, "the action velocity", buf_->v_action);
            be_.synchronize();
            dit_ms += dit_timer.ms();
        };
        result.dit_evaluations = run_denoise_loop(be_, *video_sampler_, *action_sampler_, *schedule_, dt, evaluate);
        be_.synchronize();
        result.times.dit = dit_ms;
        result.times.scheduler = phase.ms() - dit_ms;
        phase.reset();
        trace("x", buf_->x);
        trace("actions", buf_->a);
        start_frame_ += d.num_frame_per_block;

        // ---- post-process ------------------------------------------------------------------------------
        Tensor a_host = Tensor::host(buf_->a.shape(), DType::F32);
        be_.download(buf_->a, a_host);
        result.actions_normalized.assign(a_host.ptr<float>(), a_host.ptr<float>() + a_host.numel());
        const std::string where = fmt::format("call {}, after denoising", call_index_);
        check_finite_always(be_, where, "the denoised video latent", buf_->x);
        if (!measuring_)
            check_finite_host(where, "the model's normalized actions", result.actions_normalized.data(),
                              result.actions_normalized.size());
        result.actions = postprocess_actions(result.actions_normalized, d.num_action_per_block, d.action_dim,
                                             obs.joint_position, statistics_);
        if (!measuring_)
            check_finite_host(fmt::format("call {}, post-processing", call_index_),
                              "the robot actions (q99 inverse plus the joint state)", result.actions.data(),
                              result.actions.size());
        sync_phase(result.times.postprocess, phase);
    } catch (...) {
        // Fail closed: the next call starts a new session (the KV session was aborted by the cache).
        started_ = false;
        text_ready_ = false;
        if (kv_session_) kv_session_->reset({});
        for (auto& c : dense_)
            if (c) c->reset();
        ++call_index_;
        throw;
    }
    result.times.total = total.ms();
    ++call_index_;
    return result;
}

}  // namespace dzr
