#pragma once
/// The causal Wan DiT of DreamZero with its state encoder, action encoder and action decoder
/// (dreamzero-reference.md §2.4-§2.5). One forward function serves the three forward kinds of a
/// policy call (§1.5):
///   prefill  1 latent frame at start frame 0, timestep 0, no registers (K/V committed by the owner)
///   commit   2 latent frames at start frame csf−2, timestep 0, no registers (committed)
///   denoise  2 latent frames at start frame csf with 24 action + 1 state register tokens, reading
///            the cache (nothing committed)
/// Whether K/V become history is the SelfAttentionCache owner's decision, not the DiT's.
///
/// Weights are loaded once into typed members; a forward goes through Backend ops only, takes its
/// activations from the workspace arena (ArenaScope) and makes no allocation and no host sync
/// (except in the check_finite debug mode).
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "kv/self_attention_cache.h"
#include "model/action_heads.h"
#include "model/embeddings.h"
#include "model/layer_stream.h"
#include "model/layers.h"
#include "model/rope.h"
#include "config/model_config.h"
#include "weights/weight_source.h"

namespace dzr {

/// Cross-attention keys and values of one CFG branch's context (CLIP image tokens and umT5 text
/// rows), per layer. They depend only on the context, so they are computed once per branch (text:
/// per prompt, image: per window) and reused by every forward of that branch. The views point
/// either into `storage` (CausalDit::make_cross_kv) or into memory owned elsewhere (e.g. the
/// layers of a kv::CrossAttentionCache); each is a contiguous [tokens, H, D] compute-dtype tensor.
struct DitCrossKv {
    struct Layer {
        TensorView k_txt, v_txt;  // [text_len, H, D]; k after norm_k
        TensorView k_img, v_img;  // [image_tokens, H, D]; k after norm_k_img
        /// An FP8 cross cache (kv.dtype fp8): the views above are E4M3 and these their f32 scales, one per token
        /// and head ([tokens, H]); the forward dequantizes each layer's K and V before attending. Undefined otherwise.
        TensorView k_txt_scale, v_txt_scale, k_img_scale, v_img_scale;
    };
    std::vector<Layer> layers;
    std::vector<Tensor> storage;  // backing memory when owned; empty for borrowed views
};

/// The register tokens of a denoising forward.
struct DitRegisterInputs {
    TensorView noisy_action;  // [num_action_per_block, action_dim]
    int64_t timestep = 0;     // integer action timestep in [0, 1000)
    TensorView state;         // [num_state_per_block, max_state_dim] (normalized, zero-padded)
};

/// Inputs of one forward; every view lives on the backend's device (any float dtype).
struct DitInputs {
    TensorView x;          // noisy (or clean) latent [out_dim, f, H/8, W/8], f = 1 or 2
    TensorView y;          // conditioning slice [in_dim − out_dim, f, H/8, W/8] (mask 4 + latent 16)
    int start_frame = 0;   // RoPE start frame (latent frames since the window start)
    int64_t timestep = 0;  // integer video timestep in [0, 1000)
    std::optional<DitRegisterInputs> registers;  // present for denoising forwards only
    /// Set: the sinusoids are read from these rows, which the caller staged for this forward's timesteps
    /// (CausalDit::stage_timesteps), instead of from the tables; the forward then queues the same ops at every
    /// timestep (what a CUDA graph replay needs).
    const TimestepRows* time_rows = nullptr;
};

/// Caller-owned outputs (any float dtype, on the backend's device).
struct DitOutputs {
    TensorView video_velocity;   // [out_dim, f, H/8, W/8]
    TensorView action_velocity;  // [num_action_per_block, action_dim]; needed when registers are present
};

/// Called with named intermediates (layer −1 outside the layers). The view is valid only during the
/// call (arena memory); copy or download what you keep.
using DitTraceFn = std::function<void(std::string_view name, int layer, const TensorView& t)>;

/// One branch of a batched forward (CausalDit::forward_batch): its cross-attention K/V, its self-attention cache and
/// its outputs. out.action_velocity undefined: the branch's action decoder is skipped (the unconditional branch's is
/// never used).
struct DitBranch {
    const DitCrossKv* cross = nullptr;
    SelfAttentionCache* cache = nullptr;
    DitOutputs out;
    /// The branch's own outputs traced (the patch embedding, the head's input and output, "head_norm" in reference
    /// numerics, and "action_velocity"), as DitForwardOptions::trace names them; empty: DitForwardOptions::trace, which a batched
    /// forward does not take (its layer intermediates hold every branch's rows).
    DitTraceFn trace;
};

struct DitForwardOptions {
    DitTraceFn trace;           // empty: no tracing, no cost
    bool check_finite = false;  // debug: download each stage's output and throw on NaN/Inf (syncs)
    /// A committing forward whose outputs nobody reads (the prefill and the commit of observed frames): the last
    /// layer stops once its K/V rows are stored (SelfAttentionCache::store), and the head and the action decoder do
    /// not run; the outputs are left unwritten. Fast numerics without a trace only (otherwise ignored): reference
    /// numerics run every op of the official forward.
    bool kv_only = false;
    /// A batched forward of two branches (fast numerics, no trace): layer 0's self-attention, whose rows and history
    /// are the same in both branches (the text enters at its cross-attention), runs on branch 0's rows only and branch
    /// 1 takes its result (a committing forward stores the same K/V rows into branch 1's cache).
    bool share_first_self_attention = false;
};

class CausalDit {
  public:
    /// Loads every DiT weight (prefix action_head.model.) through `loader` onto loader.backend()
    /// and precomputes the RoPE and timestep tables. latent_height/width are the VAE latent sides
    /// (canvas / 8); their patch grid must hold cfg.frame_seqlen tokens. `offload_layers`: that many layers keep
    /// their weights in host memory and are streamed in as they run (model/layer_stream.h; same numbers).
    CausalDit(const DitConfig& cfg, int latent_height, int latent_width, WeightLoader& loader,
              int offload_layers = 0);
    CausalDit(const CausalDit&) = delete;
    CausalDit& operator=(const CausalDit&) = delete;
    /// The layers streamed from host memory (none on a measuring backend).
    const LayerStream& layer_stream() const { return stream_; }

    const DitConfig& config() const { return cfg_; }
    int grid_height() const { return grid_h_; }
    int grid_width() const { return grid_w_; }

    /// Persistent (non-arena) storage for one branch's cross-attention K/V.
    DitCrossKv make_cross_kv(Backend& be, int64_t image_tokens) const;

    /// Fills every layer's k_txt/v_txt from text [text_len, text_dim] (umT5 output, pad rows zeroed):
    /// text_embedding, then each layer's k (+ norm_k) and v projections.
    /// `layer_done` (optional) runs after each layer's K and V are written (a caller that quantizes them into an FP8
    /// cache reuses one layer's views for every layer).
    void compute_text_kv(Backend& be, const TensorView& text, DitCrossKv& kv,
                         const std::function<void(size_t)>& layer_done = {}) const;
    /// Fills every layer's k_img/v_img from clip_features [image_tokens, image_dim] (CLIP
    /// penultimate block): img_emb, then each layer's k_img (+ norm_k_img) and v_img projections.
    void compute_image_kv(Backend& be, const TensorView& clip_features, DitCrossKv& kv,
                          const std::function<void(size_t)>& layer_done = {}) const;
    /// Both of the above.
    void compute_cross_kv(Backend& be, const TensorView& clip_features, const TensorView& text,
                          DitCrossKv& kv) const {
        compute_text_kv(be, text, kv);
        compute_image_kv(be, clip_features, kv);
    }

    /// Workspace-arena bytes one forward with `frames` latent frames (with or without the register tokens)
    /// takes on `be`, not counting what the SelfAttentionCache itself takes during attend(): the forward
    /// measured on a MeasuringBackend over `be` (measure_workspace); `branches` > 1: a batched forward of that many
    /// branches (forward_batch).
    size_t forward_workspace_bytes(Backend& be, int frames, bool registers, int branches = 1) const;
    /// Workspace-arena bytes of compute_text_kv / compute_image_kv (the larger) on `be`, measured likewise.
    size_t cross_kv_workspace_bytes(Backend& be, int64_t image_tokens) const;

    /// Rows for DitInputs::time_rows on `be` (persistent; `be` is the backend this DiT was loaded on).
    TimestepRows make_timestep_rows(Backend& be) const { return timesteps_.make_rows(be); }
    /// Queues the copies of the rows of `timestep` (and of `action_timestep` when >= 0: a denoising forward) into
    /// `rows`. Throws for a timestep outside [0, kNumTrainTimesteps) before queueing anything.
    void stage_timesteps(Backend& be, int64_t timestep, int64_t action_timestep, const TimestepRows& rows) const {
        timesteps_.stage(be, timestep, action_timestep, rows);
    }

    /// One DiT forward. Self-attention goes through `cache` (history | current tokens).
    void forward(Backend& be, const DitInputs& in, const DitCrossKv& cross, SelfAttentionCache& cache,
                 const DitOutputs& out, const DitForwardOptions& opt = {}) const;

    /// The forwards of several branches that share every input of `in` (latents, conditioning, registers,
    /// timesteps) and differ in their cross-attention K/V and self-attention caches (the CFG branches), as one
    /// forward: their token rows are stacked, so the embeddings run once and every linear layer and fused row op
    /// once over all branches' rows; self-attention and the text cross-attention run per branch, the image
    /// cross-attention once when the branches share its K/V. `fast` numerics only (a GEMM over more rows may sum
    /// in another order than the reference's), no trace. One branch: exactly forward().
    void forward_batch(Backend& be, const DitInputs& in, std::span<const DitBranch> branches,
                       const DitForwardOptions& opt = {}) const;

  private:
    struct Layer {
        Tensor modulation;  // [6, dim]: shift/scale/gate of self-attention, then of the FFN
        Linear q, k, v, o;
        RmsNorm norm_q, norm_k;
        LayerNorm norm3;  // affine LayerNorm before cross-attention
        Linear cross_q, cross_k, cross_v, cross_o, cross_k_img, cross_v_img;
        RmsNorm cross_norm_q, cross_norm_k, cross_norm_k_img;
        Linear ffn1, ffn2;
    };
    /// Every tensor of a layer, those of its cross K/V projections first (LayerStream::Part::Prefix:
    /// kCrossKvTensors of them). A new Layer member goes here too, or a streamed layer would leave it in host memory.
    static std::vector<Tensor*> layer_tensors(Layer& l);
    static constexpr size_t kCrossKvTensors = 14;
    struct Step;  // per-forward state shared by the layers (dit_layer.h)

    enum class CrossContext : uint8_t { Text, Image };
    /// Every layer's cross K and V of one context ctx [tokens, dim] (text_embedding's or img_emb's output)
    /// into kv's text or image views: k = norm_k(k(ctx)), v = v(ctx).
    void project_cross_kv(Backend& be, const TensorView& ctx, CrossContext which, DitCrossKv& kv,
                          const std::function<void(size_t)>& layer_done) const;
    struct ForwardShape;  // one forward's sizes (causal_dit.cpp)
    /// Checks a forward's inputs against the model and every branch's outputs and cache; its sizes.
    ForwardShape check_forward(const Backend& be, const DitInputs& in, std::span<const DitBranch> branches,
                               const DitForwardOptions& opt) const;
    /// s.x's first branch rows (patch embedding, then the register tokens) and s.e, s.e0 (the time embedding).
    void embed_tokens(Backend& be, const DitInputs& in, std::span<const DitBranch> branches,
                      const DitForwardOptions& opt, const ForwardShape& fs, const Step& s) const;
    struct LayerPass;       // one layer's inputs and scratch rows, and the steps both numerics share (dit_layer.h)
    struct ReferenceLayer;  // a layer's blocks in reference numerics (dit_layer_reference.cpp)
    struct FastLayer;       // a layer's blocks in fast numerics (dit_layer_fast.cpp)
    /// One layer in reference numerics (one branch): PyTorch's eager ops with their rounding points, adding
    /// self-attention, cross-attention and feed-forward into the residual s.x.
    void reference_layer(Backend& be, const Step& s, int li, const DitBranch& branch,
                         const DitForwardOptions& opt) const;
    /// One layer in fast numerics over every branch's rows (fused row ops; FP8 Linears read their norm's codes).
    /// kv_only: the layer's K/V rows stored into every branch's cache, and nothing after them.
    void fast_layer(Backend& be, const Step& s, int li, std::span<const DitBranch> branches,
                    const DitForwardOptions& opt, bool kv_only) const;
    /// The head on branch b's video rows into `out`.
    void head_forward(Backend& be, const Step& s, int b, const DitOutputs& out, const DitTraceFn& trace,
                      const DitForwardOptions& opt) const;

    DitConfig cfg_;
    int grid_h_ = 0;
    int grid_w_ = 0;
    int head_dim_ = 0;
    DType dtype_ = DType::F32;  // the loading backend's compute dtype (weights and activations)

    Tensor patch_w_, patch_b_;  // the Conv3d: w [dim, in_dim, pt, ph, pw], b [dim]
    Linear text_emb1_, text_emb2_;
    Linear time_emb1_, time_emb2_;
    Linear time_proj_;          // [6·dim, dim]
    LayerNorm img_norm_in_;     // LayerNorm(image_dim), eps 1e-5
    Linear img_fc1_, img_fc2_;
    LayerNorm img_norm_out_;    // LayerNorm(dim), eps 1e-5
    LayerNorm norm_;            // the blocks' norm1/norm2 and the head's norm: no affine, eps cfg.eps
    std::vector<Layer> layers_;
    LayerStream stream_;  // the layers kept in host memory (offload_layers)
    Tensor head_modulation_;  // [2, dim]: shift, scale
    Linear head_;             // [ph·pw·out_dim, dim]

    StateEncoder state_encoder_;
    ActionEncoder action_encoder_;
    ActionDecoder action_decoder_;

    DitRopeTables rope_;
    TimestepTables timesteps_;
};

}  // namespace dzr
