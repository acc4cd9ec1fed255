#include "model/causal_dit.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "backend/measuring_backend.h"
#include "core/error.h"
#include "model/dit_layer.h"
#include "model/dit_ops.h"
#include "weights/keys.h"

namespace dzr {
namespace {

// NOTE: nn.LayerNorm's default eps; the img_emb MLP's LayerNorms do not take the DiT's eps.
constexpr float kImgEmbLayerNormEps = 1e-5f;

}  // namespace

std::vector<Tensor*> CausalDit::layer_tensors(Layer& l) {
    std::vector<Tensor*> t;
    for (Linear* lin : {&l.cross_k, &l.cross_v, &l.cross_k_img, &l.cross_v_img}) t.insert(t.end(), {&lin->w, &lin->b, &lin->scale});
    t.insert(t.end(), {&l.cross_norm_k.w, &l.cross_norm_k_img.w});
    DZR_CHECK(t.size() == kCrossKvTensors, "causal dit: {} cross K/V tensors, kCrossKvTensors says {}", t.size(),
              kCrossKvTensors);
    t.insert(t.end(), {&l.modulation, &l.norm_q.w, &l.norm_k.w, &l.norm3.w, &l.norm3.b, &l.cross_norm_q.w});
    for (Linear* lin : {&l.q, &l.k, &l.v, &l.o, &l.cross_q, &l.cross_o, &l.ffn1, &l.ffn2})
        t.insert(t.end(), {&lin->w, &lin->b, &lin->scale});
    return t;
}

CausalDit::CausalDit(const DitConfig& cfg, int latent_height, int latent_width, WeightLoader& loader,
                     int offload_layers)
    : cfg_(cfg) {
    const int C = cfg.dim;
    DZR_CHECK(C > 0 && cfg.num_heads > 0 && C % cfg.num_heads == 0 && (C / cfg.num_heads) % 2 == 0,
              "causal dit: dim {} must split into {} heads of even size", C, cfg.num_heads);
    const int pt = cfg.patch_size[0], ph = cfg.patch_size[1], pw = cfg.patch_size[2];
    DZR_CHECK(pt == 1 && ph > 0 && pw > 0,
              "causal dit: patch size ({}, {}, {}) is not supported (temporal patch 1 only)", pt, ph, pw);
    DZR_CHECK(latent_height > 0 && latent_width > 0 && latent_height % ph == 0 && latent_width % pw == 0,
              "causal dit: latent {}x{} is not divisible by the patch size {}x{}", latent_height,
              latent_width, ph, pw);
    grid_h_ = latent_height / ph;
    grid_w_ = latent_width / pw;
    DZR_CHECK(grid_h_ * grid_w_ == cfg.frame_seqlen,
              "causal dit: frame_seqlen {} does not match the {}x{} latent ({}x{} = {} patches per frame)",
              cfg.frame_seqlen, latent_height, latent_width, grid_h_, grid_w_, grid_h_ * grid_w_);
    DZR_CHECK(cfg.in_dim > cfg.out_dim && cfg.num_frame_per_block > 0 && cfg.max_chunk_size > 0,
              "causal dit: invalid geometry (in_dim {}, out_dim {}, {} frames per block, max_chunk_size {})",
              cfg.in_dim, cfg.out_dim, cfg.num_frame_per_block, cfg.max_chunk_size);
    head_dim_ = C / cfg.num_heads;
    dtype_ = loader.backend().compute_dtype();

    // NOTE: the weights are declared in the checkpoint inventory's order (model/inventory.h, `dzr ckpt make`
    // writes them so): the action heads, the embeddings, the blocks, the head, then img_emb.
    state_encoder_ = StateEncoder(cfg, loader);
    action_encoder_ = ActionEncoder(cfg, loader);
    action_decoder_ = ActionDecoder(cfg, loader);

    using keys::dit;
    patch_w_ = loader.require(dit("patch_embedding.weight"), Shape{C, cfg.in_dim, pt, ph, pw});
    patch_b_ = loader.require(dit("patch_embedding.bias"), Shape{C}, WeightInit::bias());
    text_emb1_.load(loader, dit("text_embedding.0"), cfg.text_dim, C);
    text_emb2_.load(loader, dit("text_embedding.2"), C, C);
    time_emb1_.load(loader, dit("time_embedding.0"), cfg.freq_dim, C);
    time_emb2_.load(loader, dit("time_embedding.2"), C, C);
    time_proj_.load(loader, dit("time_projection.1"), C, 6 * C);  // 6 modulation vectors per token
    norm_ = LayerNorm(cfg.eps);

    // NOTE: the modulation tables are scaled like a [dim]-wide weight, not by their fan-in (6·dim, 2·dim).
    const WeightInit modulation_init = WeightInit::normal(1.0f / std::sqrt(float(C)));
    layers_.resize(size_t(cfg.num_layers));
    stream_ = LayerStream(loader.backend(), streamed_layers(cfg.num_layers, offload_layers));
    for (int i = 0; i < cfg.num_layers; ++i) {
        std::optional<WeightLoader::OnHost> on_host;
        if (stream_.streams(i))
            on_host.emplace(loader, [](const Shape& shape, DType dtype) { return Tensor::host(shape, dtype); });
        const std::string block = keys::dit_block(i);  // "action_head.model.blocks.{i}."
        const auto key = [&block](std::string_view suffix) { return block + std::string(suffix); };
        // an attention's q, k, v, o projections and q/k RMSNorms (`<block><name>.*`), in the checkpoint's order
        const auto attention = [&](std::string_view name, Linear& q, Linear& k, Linear& v, Linear& o, RmsNorm& norm_q,
                                   RmsNorm& norm_k) {
            const std::string prefix = key(name) + ".";
            q.load(loader, prefix + "q", C, C);
            k.load(loader, prefix + "k", C, C);
            v.load(loader, prefix + "v", C, C);
            o.load(loader, prefix + "o", C, C);
            norm_q.load(loader, prefix + "norm_q", C, cfg.eps);
            norm_k.load(loader, prefix + "norm_k", C, cfg.eps);
        };
        Layer& l = layers_[size_t(i)];
        l.modulation = reshaped(loader.require(key("modulation"), Shape{1, 6, C}, modulation_init), Shape{6, C});
        attention("self_attn", l.q, l.k, l.v, l.o, l.norm_q, l.norm_k);
        l.norm3.load(loader, key("norm3"), C, cfg.eps);
        attention("cross_attn", l.cross_q, l.cross_k, l.cross_v, l.cross_o, l.cross_norm_q, l.cross_norm_k);
        l.cross_k_img.load(loader, key("cross_attn.k_img"), C, C);
        l.cross_v_img.load(loader, key("cross_attn.v_img"), C, C);
        l.cross_norm_k_img.load(loader, key("cross_attn.norm_k_img"), C, cfg.eps);
        l.ffn1.load(loader, key("ffn.0"), C, cfg.ffn_dim);
        l.ffn2.load(loader, key("ffn.2"), cfg.ffn_dim, C);
        if (on_host) {
            on_host.reset();
            stream_.adopt(i, layer_tensors(l), kCrossKvTensors);
        }
    }
    head_modulation_ =
        reshaped(loader.require(dit("head.modulation"), Shape{1, 2, C}, modulation_init), Shape{2, C});
    head_.load(loader, dit("head.head"), C, pt * ph * pw * cfg.out_dim);
    img_norm_in_.load(loader, dit("img_emb.proj.0"), cfg.image_dim, kImgEmbLayerNormEps);
    img_fc1_.load(loader, dit("img_emb.proj.1"), cfg.image_dim, cfg.image_dim);
    img_fc2_.load(loader, dit("img_emb.proj.3"), cfg.image_dim, C);
    img_norm_out_.load(loader, dit("img_emb.proj.4"), C, kImgEmbLayerNormEps);

    // NOTE: start frames 0..local_attn_size with a full block after each, and register block
    // indices k = (start_frame − 1) / frames_per_block up to max_chunk_size; the policy uses less.
    Backend& be = loader.backend();
    rope_ = DitRopeTables(be, head_dim_, grid_h_, grid_w_, cfg.local_attn_size() + cfg.num_frame_per_block,
                          cfg.max_chunk_size, cfg.num_action_per_block, cfg.num_state_per_block);
    timesteps_ = TimestepTables(be, cfg.freq_dim, C);
}

DitCrossKv CausalDit::make_cross_kv(Backend& be, int64_t image_tokens) const {
    DZR_CHECK(image_tokens > 0, "causal dit: cross-attention needs at least one image token, got {}",
              image_tokens);
    DitCrossKv kv;
    kv.layers.resize(layers_.size());
    const int64_t H = cfg_.num_heads, D = head_dim_;
    const auto make = [&](int64_t tokens) {
        kv.storage.push_back(be.alloc(Shape{tokens, H, D}, be.compute_dtype()));
        return kv.storage.back().view();
    };
    for (auto& l : kv.layers) {
        l.k_txt = make(cfg_.text_len);
        l.v_txt = make(cfg_.text_len);
        l.k_img = make(image_tokens);
        l.v_img = make(image_tokens);
    }
    return kv;
}

namespace {

/// A cross K/V destination as the [tokens, C] matrix a projection writes.
TensorView cross_dst(Backend& be, const TensorView& t, int64_t tokens, int64_t C, int64_t H, const char* what,
                     size_t layer) {
    DZR_CHECK(t.rank() == 3 && t.dim(0) == tokens && t.dim(1) == H && t.dim(2) * H == C &&
                  t.is_contiguous() && t.dtype == be.compute_dtype() && t.device == be.device(),
              "causal dit: cross K/V {} of layer {} is {}, expected a contiguous {}[{}, {}, {}] on {}", what,
              layer, t.str(), dtype_name(be.compute_dtype()), tokens, H, C / H, be.device().str());
    return t.reshape(Shape{tokens, C});  // [tokens, H, D] -> [tokens, C]
}

}  // namespace

void CausalDit::compute_text_kv(Backend& be, const TensorView& text, DitCrossKv& kv,
                                const std::function<void(size_t)>& layer_done) const {
    const int64_t C = cfg_.dim;
    DZR_CHECK(text.rank() == 2 && text.dim(0) == cfg_.text_len && text.dim(1) == cfg_.text_dim,
              "causal dit: text context {} should be [{}, {}] (text_len, text_dim)", text.str(),
              cfg_.text_len, cfg_.text_dim);
    const int64_t Lt = text.dim(0);
    ArenaScope scope(be.workspace());
    // text_embedding: [Lt, text_dim] -> [Lt, C] -> GELU(tanh) -> [Lt, C]
    const TensorView t_in = be.scratch(Shape{Lt, cfg_.text_dim});
    be.copy(text, t_in);
    const TensorView t_hidden = be.scratch(Shape{Lt, C});
    text_emb1_.forward(be, t_in, t_hidden);
    be.activation({Activation::GeluTanh}, t_hidden, t_hidden);
    const TensorView ctx = be.scratch(Shape{Lt, C});
    text_emb2_.forward(be, t_hidden, ctx);

    project_cross_kv(be, ctx, CrossContext::Text, kv, layer_done);
}

void CausalDit::compute_image_kv(Backend& be, const TensorView& clip_features, DitCrossKv& kv,
                                 const std::function<void(size_t)>& layer_done) const {
    const int64_t C = cfg_.dim;
    DZR_CHECK(clip_features.rank() == 2 && clip_features.dim(0) > 0 && clip_features.dim(1) == cfg_.image_dim,
              "causal dit: image context {} should be [tokens, {}] (image_dim)", clip_features.str(),
              cfg_.image_dim);
    const int64_t Li = clip_features.dim(0);
    ArenaScope scope(be.workspace());
    // img_emb: LayerNorm -> [Li, image_dim] -> GELU(erf) -> [Li, C] -> LayerNorm
    const TensorView i_in = be.scratch(Shape{Li, cfg_.image_dim});
    be.copy(clip_features, i_in);
    const TensorView i_norm = be.scratch(Shape{Li, cfg_.image_dim});
    img_norm_in_.forward(be, i_in, i_norm);
    const TensorView i_hidden = be.scratch(Shape{Li, cfg_.image_dim});
    img_fc1_.forward(be, i_norm, i_hidden);
    be.activation({Activation::GeluErf}, i_hidden, i_hidden);
    const TensorView i_proj = be.scratch(Shape{Li, C});
    img_fc2_.forward(be, i_hidden, i_proj);
    const TensorView ctx = be.scratch(Shape{Li, C});
    img_norm_out_.forward(be, i_proj, ctx);

    project_cross_kv(be, ctx, CrossContext::Image, kv, layer_done);
}

void CausalDit::project_cross_kv(Backend& be, const TensorView& ctx, CrossContext which, DitCrossKv& kv,
                                 const std::function<void(size_t)>& layer_done) const {
    DZR_CHECK(kv.layers.size() == layers_.size(), "causal dit: cross K/V holds {} layers, the model has {}",
              kv.layers.size(), layers_.size());
    const bool image = which == CrossContext::Image;
    const int64_t L = ctx.dim(0), C = cfg_.dim, H = cfg_.num_heads;
    const TensorView k_raw = be.scratch(Shape{L, C});
    stream_.begin(be, LayerStream::Part::Prefix);
    for (size_t i = 0; i < layers_.size(); ++i) {
        stream_.before(be, int(i));
        const Layer& l = layers_[i];
        const DitCrossKv::Layer& dst = kv.layers[i];
        // [L, C] -> [L, C] = [L, H, D]; RMSNorm over all C channels before the head split
        (image ? l.cross_k_img : l.cross_k).forward(be, ctx, k_raw);
        (image ? l.cross_norm_k_img : l.cross_norm_k)
            .forward(be, k_raw, cross_dst(be, image ? dst.k_img : dst.k_txt, L, C, H, image ? "k_img" : "k_txt", i));
        (image ? l.cross_v_img : l.cross_v)
            .forward(be, ctx, cross_dst(be, image ? dst.v_img : dst.v_txt, L, C, H, image ? "v_img" : "v_txt", i));
        stream_.after(be, int(i));
        if (layer_done) layer_done(i);
    }
}

namespace {

/// A SelfAttentionCache with no history that attends to nothing and takes no workspace: the DiT's own
/// workspace is measured around it.
class NoHistoryCache final : public SelfAttentionCache {
  public:
    int64_t history_tokens() const override { return 0; }
    bool committing() const override { return false; }
    void attend(Backend&, int, const TensorView&, const TensorView&, const TensorView&, int64_t, float,
                const TensorView&) override {}
    void store(Backend&, int, const TensorView&, const TensorView&, int64_t) override {}
};

}  // namespace

size_t CausalDit::forward_workspace_bytes(Backend& be, int frames, bool registers, int branches) const {
    const DitConfig& c = cfg_;
    const int64_t lat_h = int64_t(grid_h_) * c.patch_size[1], lat_w = int64_t(grid_w_) * c.patch_size[2];
    return measure_workspace(be, [&](Backend& mb) {
        const Tensor x = mb.alloc(Shape{c.out_dim, frames, lat_h, lat_w}, mb.compute_dtype());
        const Tensor y = mb.alloc(Shape{c.in_dim - c.out_dim, frames, lat_h, lat_w}, mb.compute_dtype());
        DitInputs in{x, y, registers ? 1 : 0, 0, std::nullopt};
        const Tensor action = mb.alloc(Shape{c.num_action_per_block, c.action_dim}, mb.compute_dtype());
        const Tensor state = mb.alloc(Shape{c.num_state_per_block, c.max_state_dim}, mb.compute_dtype());
        if (registers) in.registers = DitRegisterInputs{action, 0, state};
        const DitCrossKv cross = make_cross_kv(mb, 1);
        std::vector<NoHistoryCache> caches(size_t(std::max(branches, 1)));
        std::vector<DitBranch> list;
        for (NoHistoryCache& cache : caches)
            list.push_back({&cross, &cache, DitOutputs{mb.alloc(x.shape(), mb.compute_dtype()), action}, {}});
        forward_batch(mb, in, list);
    });
}

size_t CausalDit::cross_kv_workspace_bytes(Backend& be, int64_t image_tokens) const {
    return measure_workspace(be, [&](Backend& mb) {
        DitCrossKv kv = make_cross_kv(mb, image_tokens);
        compute_text_kv(mb, mb.alloc(Shape{cfg_.text_len, cfg_.text_dim}, mb.compute_dtype()), kv);
        compute_image_kv(mb, mb.alloc(Shape{image_tokens, cfg_.image_dim}, mb.compute_dtype()), kv);
    });
}

void CausalDit::forward(Backend& be, const DitInputs& in, const DitCrossKv& cross, SelfAttentionCache& cache,
                        const DitOutputs& out, const DitForwardOptions& opt) const {
    const DitBranch branch{&cross, &cache, out, {}};
    forward_batch(be, in, std::span<const DitBranch>(&branch, 1), opt);
}

/// The sizes of one forward, from its inputs.
struct CausalDit::ForwardShape {
    int64_t f = 0, Lv = 0, A = 0, S = 0, L = 0;
    bool has_regs = false;
};

CausalDit::ForwardShape CausalDit::check_forward(const Backend& be, const DitInputs& in,
                                                 std::span<const DitBranch> branches,
                                                 const DitForwardOptions& opt) const {
    const DitConfig& c = cfg_;
    const int B = int(branches.size());
    DZR_CHECK(B >= 1, "causal dit: a forward needs at least one branch");
    DZR_CHECK(B == 1 || (be.numerics() == Numerics::Fast && !opt.trace),
              "causal dit: a batched forward of {} branches needs fast numerics and no trace", B);
    const int ph = c.patch_size[1], pw = c.patch_size[2];
    const int64_t lat_h = int64_t(grid_h_) * ph, lat_w = int64_t(grid_w_) * pw;

    DZR_CHECK(in.x.rank() == 4 && in.x.dim(0) == c.out_dim && in.x.dim(2) == lat_h && in.x.dim(3) == lat_w,
              "causal dit: latent x {} should be [{}, frames, {}, {}]", in.x.str(), c.out_dim, lat_h, lat_w);
    const int64_t f = in.x.dim(1);
    DZR_CHECK(f >= 1 && f <= c.num_frame_per_block,
              "causal dit: a forward takes 1 to {} latent frames, got {}", c.num_frame_per_block, f);
    DZR_CHECK(in.y.rank() == 4 && in.y.dim(0) == c.in_dim - c.out_dim && in.y.dim(1) == f &&
                  in.y.dim(2) == lat_h && in.y.dim(3) == lat_w,
              "causal dit: conditioning y {} should be [{}, {}, {}, {}]", in.y.str(), c.in_dim - c.out_dim, f,
              lat_h, lat_w);
    const int64_t Lv = f * c.frame_seqlen;
    const int64_t window = int64_t(c.local_attn_size()) * c.frame_seqlen;
    for (const DitBranch& br : branches) {
        DZR_CHECK(br.cross != nullptr && br.cache != nullptr, "causal dit: a branch without cross K/V or cache");
        const DitOutputs& out = br.out;
        const DitCrossKv& cross = *br.cross;
        DZR_CHECK(out.video_velocity.shape == in.x.shape && out.video_velocity.is_contiguous(),
                  "causal dit: video output {} should be a contiguous {}", out.video_velocity.str(),
                  in.x.shape.str());
        DZR_CHECK(
            cross.layers.size() == layers_.size(),
            "causal dit: cross-attention K/V holds {} layers, the model has {} (run compute_cross_kv first)",
            cross.layers.size(), layers_.size());
        DZR_CHECK(
            layers_.empty() || (cross.layers[0].k_txt.defined() && cross.layers[0].k_img.defined()),
            "causal dit: cross-attention K/V views are not set (run compute_text_kv and compute_image_kv first)");
        // NOTE: the reference would drop the oldest keys past the window; the policy resets before
        // that can happen, so reaching it means a scheduling bug, not something to emulate silently.
        DZR_CHECK(
            br.cache->history_tokens() + Lv <= window,
            "causal dit: {} history tokens + {} new video tokens exceed the attention window of {} tokens ({} "
            "latent frames)",
            br.cache->history_tokens(), Lv, window, c.local_attn_size());
    }

    const bool has_regs = in.registers.has_value();
    const int64_t A = has_regs ? c.num_action_per_block : 0;
    const int64_t S = has_regs ? c.num_state_per_block : 0;
    const int64_t L = Lv + A + S;
    if (has_regs) {
        const DitRegisterInputs& r = *in.registers;
        DZR_CHECK(
            r.noisy_action.rank() == 2 && r.noisy_action.dim(0) == A && r.noisy_action.dim(1) == c.action_dim,
            "causal dit: noisy action {} should be [{}, {}]", r.noisy_action.str(), A, c.action_dim);
        DZR_CHECK(r.state.rank() == 2 && r.state.dim(0) == S && r.state.dim(1) == c.max_state_dim,
                  "causal dit: state {} should be [{}, {}]", r.state.str(), S, c.max_state_dim);
        for (const DitBranch& br : branches) {
            const TensorView& av = br.out.action_velocity;
            // NOTE: a single forward always decodes its actions; a batched one skips a branch without an output
            DZR_CHECK((B > 1 && !av.defined()) ||
                          (av.rank() == 2 && av.dim(0) == A && av.dim(1) == c.action_dim && av.is_contiguous()),
                      "causal dit: action output {} should be a contiguous [{}, {}]", av.str(), A, c.action_dim);
        }
        DZR_CHECK(in.start_frame >= 1, "causal dit: a denoising forward needs start frame >= 1, got {}",
                  in.start_frame);
    }

    return {f, Lv, A, S, L, has_regs};
}

void CausalDit::embed_tokens(Backend& be, const DitInputs& in, std::span<const DitBranch> branches,
                             const DitForwardOptions& opt, const ForwardShape& fs, const Step& s) const {
    const DitConfig& c = cfg_;
    const int64_t C = c.dim, f = fs.f, Lv = fs.Lv, A = fs.A, S = fs.S;
    const bool has_regs = fs.has_regs;
    const int ph = c.patch_size[1], pw = c.patch_size[2];
    const int64_t lat_h = int64_t(grid_h_) * ph, lat_w = int64_t(grid_w_) * pw;
    // Table rows first: a timestep outside [0, 1000) fails before any work is queued.
    // NOTE: staged rows (in.time_rows) sit at fixed addresses, so a captured forward replays at any timestep
    const TimestepRows* staged = in.time_rows;
    const TensorView sin_video = staged ? staged->dit.view().slice(0, 0, 1) : timesteps_.dit(in.timestep);
    const TensorView sin_regs = !has_regs ? TensorView{}
                                : staged  ? staged->dit.view().slice(0, 1, 1)
                                          : timesteps_.dit(in.registers->timestep);
    const TensorView tau = !has_regs ? TensorView{} : staged ? staged->action.view()
                                                             : timesteps_.action(in.registers->timestep);

    {  // patch embedding: the Conv3d(in_dim -> C, kernel = stride = (1, ph, pw)) itself, then [C, Lv] -> rows
        // NOTE: a convolution, not patchify + GEMM: in bf16 the two sum the products in different orders,
        // and cuDNN's convolution is what PyTorch runs (bit-identical on the H200, scripts/parity/
        // kernel_probe.py); it rounds the product, then the bias add rounds.
        ArenaScope tmp(be.workspace());
        const TensorView latent = be.scratch(Shape{c.in_dim, f, lat_h, lat_w});
        be.copy(in.x, latent.slice(0, 0, c.out_dim));  // channels [x (16) | y (20)]
        be.copy(in.y, latent.slice(0, c.out_dim, c.in_dim - c.out_dim));
        const TensorView emb = be.scratch(Shape{C, f, grid_h_, grid_w_});
        Conv3dParams conv;
        conv.stride[1] = ph, conv.stride[2] = pw;
        be.conv3d(conv, latent, patch_w_, patch_b_, emb);
        be.copy(emb.reshape(Shape{C, Lv}).permute({1, 0}), s.x.slice(0, 0, Lv));  // [C, Lv] -> [Lv, C]
    }
    if (opt.trace) opt.trace("patch_embed", -1, s.x.slice(0, 0, Lv));
    for (const DitBranch& br : branches)
        if (br.trace) br.trace("patch_embed", -1, s.x.slice(0, 0, Lv));  // every branch's first rows
    if (opt.check_finite) check_finite(be, s.x.slice(0, 0, Lv), "patch embedding", -1);

    if (has_regs) {  // register tokens: 24 actions then 1 state, appended after the video tokens
        const DitRegisterInputs& r = *in.registers;
        ArenaScope tmp(be.workspace());
        const TensorView action = be.scratch(Shape{A, c.action_dim});
        be.copy(r.noisy_action, action);
        action_encoder_.forward(be, action, tau, s.x.slice(0, Lv, A));
        const TensorView state = be.scratch(Shape{S, c.max_state_dim});
        be.copy(r.state, state);
        state_encoder_.forward(be, state, s.x.slice(0, Lv + A, S));
        if (opt.trace) {
            opt.trace("action_tokens", -1, s.x.slice(0, Lv, A));
            opt.trace("state_tokens", -1, s.x.slice(0, Lv + A, S));
        }
        if (opt.check_finite) check_finite(be, s.x.slice(0, Lv, A + S), "register tokens", -1);
    }

    {  // time embedding, once per distinct timestep: row 0 video, row 1 actions + state
        ArenaScope tmp(be.workspace());
        const TensorView sinusoid = be.scratch(Shape{s.groups, c.freq_dim});
        be.copy(sin_video, sinusoid.slice(0, 0, 1));
        if (has_regs) be.copy(sin_regs, sinusoid.slice(0, 1, 1));
        if (opt.trace) {
            opt.trace("time_sin", -1, sinusoid);
            if (has_regs) opt.trace("action_tau", -1, tau);
        }
        const TensorView hidden = be.scratch(Shape{s.groups, C});
        time_emb1_.forward(be, sinusoid, hidden);  // [G, freq_dim] -> [G, C]
        be.activation({Activation::Silu}, hidden, hidden);
        time_emb2_.forward(be, hidden, s.e);  // [G, C] -> [G, C]
        const TensorView act = be.scratch(Shape{s.groups, C});
        be.activation({Activation::Silu}, s.e, act);
        time_proj_.forward(be, act, s.e0.reshape(Shape{s.groups, 6 * C}));  // [G, C] -> [G, 6C]
    }
    if (opt.trace) {
        opt.trace("time_e", -1, s.e);
        opt.trace("time_e0", -1, s.e0);
    }

}

void CausalDit::forward_batch(Backend& be, const DitInputs& in, std::span<const DitBranch> branches,
                              const DitForwardOptions& opt) const {
    const DitConfig& c = cfg_;
    const int B = int(branches.size());
    const ForwardShape fs = check_forward(be, in, branches, opt);
    const int64_t C = c.dim, Lv = fs.Lv, A = fs.A, L = fs.L;
    const bool has_regs = fs.has_regs;

    ArenaScope scope(be.workspace());
    Step s;
    s.tokens = L;
    s.batch = B;
    s.video_tokens = Lv;
    s.frames = fs.f;
    s.groups = has_regs ? 2 : 1;
    s.x = be.scratch(Shape{B * L, C});
    s.e = be.scratch(Shape{s.groups, C});
    s.e0 = be.scratch(Shape{s.groups, 6, C});
    s.rope_video = rope_.video(in.start_frame, int(fs.f));
    if (has_regs) s.rope_registers = rope_.registers((in.start_frame - 1) / c.num_frame_per_block);
    embed_tokens(be, in, branches, opt, fs, s);

    // every branch starts from the same embedded rows
    for (int b = 1; b < B; ++b) be.copy(s.branch(s.x, 0), s.branch(s.x, b));

    // the numerics, chosen once: each has its own layer function (check_forward: reference runs one branch)
    const bool fast = be.numerics() == Numerics::Fast;
    // NOTE: a forward of committed rows only needs every layer's K/V: the last layer stops after storing them
    const bool kv_only = opt.kv_only && !opt.trace && fast && !layers_.empty();
    stream_.begin(be, LayerStream::Part::Whole);
    for (size_t i = 0; i < layers_.size(); ++i) {
        stream_.before(be, int(i));
        if (fast)
            fast_layer(be, s, int(i), branches, opt, kv_only && i + 1 == layers_.size());
        else
            reference_layer(be, s, int(i), branches[0], opt);
        stream_.after(be, int(i));
        if (opt.trace) opt.trace("layer_out", int(i), s.x);
    }
    if (kv_only) return;

    // a branch's own outputs go to its trace, or the forward's (one branch)
    const auto branch_trace = [&](int b) -> const DitTraceFn& {
        return branches[size_t(b)].trace ? branches[size_t(b)].trace : opt.trace;
    };
    for (int b = 0; b < B; ++b) head_forward(be, s, b, branches[size_t(b)].out, branch_trace(b), opt);

    for (int b = 0; b < B && has_regs; ++b) {  // action decoder on the action tokens' outputs; the state token is discarded
        const TensorView& action_out = branches[size_t(b)].out.action_velocity;
        if (!action_out.defined()) continue;
        ArenaScope tmp(be.workspace());
        // NOTE: fast numerics: the decoder's last GEMM writes the output's dtype (f32 there) from its accumulator
        const TensorView velocity = be.scratch(
            Shape{A, c.action_dim}, be.numerics() == Numerics::Fast ? action_out.dtype : be.compute_dtype());
        action_decoder_.forward(be, s.branch(s.x, b).slice(0, Lv, A), velocity);
        if (const DitTraceFn& trace = branch_trace(b)) trace("action_velocity", -1, velocity);
        if (opt.check_finite) check_finite(be, velocity, "action decoder", -1);
        be.copy(velocity, action_out);
    }
}

void CausalDit::head_forward(Backend& be, const Step& s, int b, const DitOutputs& out, const DitTraceFn& trace,
                             const DitForwardOptions& opt) const {
    const int64_t C = cfg_.dim, Lv = s.video_tokens;
    const int ph = cfg_.patch_size[1], pw = cfg_.patch_size[2];
    ArenaScope scope(be.workspace());
    // (shift, scale) = head.modulation [2, C] + e_video (the time_embedding output, not e0)
    const TensorView mod = be.scratch(Shape{2, C});
    be.add(head_modulation_, s.e.slice(0, 0, 1), mod);
    TensorView h;
    if (be.numerics() == Numerics::Fast) {
        // h = LN(x) · (1 + scale) + shift in one op (one group: the video rows)
        h = be.scratch(Shape{Lv, C});
        be.ada_layer_norm({cfg_.eps}, s.branch(s.x, b).slice(0, 0, Lv), {}, {}, mod.slice(0, 1, 1), mod.slice(0, 0, 1),
                          h);
    } else {
        const TensorView scale1 = be.scratch(Shape{1, C});
        be.scale({1.0f, 1.0f}, mod.slice(0, 1, 1), scale1);
        h = be.scratch(Shape{Lv, C});
        norm_.forward(be, s.branch(s.x, b).slice(0, 0, Lv), h);
        if (trace) trace("head_norm", -1, h);
        be.mul(h, scale1, h);
        be.add(h, mod.slice(0, 0, 1), h);
    }
    if (trace) trace("head_in", -1, h);  // the head Linear's input
    // NOTE: fast numerics: the head's GEMM writes the output's dtype (f32 there: the velocities are not rounded to bf16
    // before the guidance amplifies their difference fivefold)
    const DType head_dt = be.numerics() == Numerics::Fast ? out.video_velocity.dtype : be.compute_dtype();
    const TensorView tokens = be.scratch(Shape{Lv, int64_t(ph) * pw * cfg_.out_dim}, head_dt);
    head_.forward(be, h, tokens);  // [Lv, C] -> [Lv, ph·pw·out_dim]
    if (trace) trace("head", -1, tokens);
    if (opt.check_finite) check_finite(be, tokens, "head", -1);
    unpatchify(be, tokens, int(s.frames), grid_h_, grid_w_, ph, pw, out.video_velocity);  // converts dtype
}

}  // namespace dzr
