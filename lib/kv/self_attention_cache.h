#pragma once
/// The seam between the DiT's self-attention and the KV cache. A SelfAttentionCache serves one DiT
/// forward of one CFG branch: it holds the committed history (K after q/k-norm and RoPE, and V, of
/// earlier clean latent frames) and computes attention over [history | current tokens].
///
/// Implementations: a dense reference (contiguous per-layer history) and the paged cache (block
/// tables over a preallocated pool). Forward control (begin, commit, abort) belongs to the
/// implementation's owner (the policy), not to the DiT.
#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "config/kv_config.h"

namespace dzr {

class SelfAttentionCache {
public:
    virtual ~SelfAttentionCache() = default;

    /// Committed history tokens visible to this forward (csf * frame_seqlen in DreamZero).
    virtual int64_t history_tokens() const = 0;
    /// Whether the open forward is a committing one (prefill/commit): its video rows become history at commit.
    virtual bool committing() const = 0;

    /// Self-attention of layer `layer` for the current forward:
    ///   out = softmax(scale * q [K_hist | k]^T) [V_hist | v]
    /// q, k, v, out: [L, H, D] with L = current tokens, ordered video tokens first, then register
    /// (action, state) tokens. Every query sees every key (no mask). When the forward is a committing
    /// one (prefill/commit), the first `video_tokens` rows of k and v are staged and become history
    /// only when the owner commits the forward; register tokens are never stored.
    virtual void attend(Backend& be, int layer, const TensorView& q, const TensorView& k, const TensorView& v,
                        int64_t video_tokens, float scale, const TensorView& out) = 0;

    /// A committing forward's layer whose attention output nobody reads (DitForwardOptions::kv_only): stages the
    /// first `video_tokens` rows of k and v ([L, H, D]) exactly as attend() would, without attending. Throws outside
    /// a committing forward.
    virtual void store(Backend& be, int layer, const TensorView& k, const TensorView& v, int64_t video_tokens) = 0;
};

/// The self-attention of the B branches of one batched forward (CausalDit::forward_batch), layer `layer`: q, k, v and
/// out are [B·L, H, D] with branch b's rows (those of caches[b]) at [b·L, (b+1)·L). Paged caches on the kernel path
/// attend in one Backend::paged_attention_batched call (one cuDNN SDPA for every branch on the GPU in fast numerics);
/// any other set of caches attends branch by branch. Each branch's result is what its own attend() gives, up to the
/// batched call's rounding.
void attend_branches(Backend& be, int layer, std::span<SelfAttentionCache* const> caches, const TensorView& q,
                     const TensorView& k, const TensorView& v, int64_t video_tokens, float scale, const TensorView& out);

/// Where the DiT should write a batched denoising forward's current K and V rows of layer `layer` ([B·rows, H, D]
/// each, branch b's at [b·rows, (b+1)·rows)) so that attend_branches reads them where they lie: the mirrored lanes'
/// middle (KvCacheManager::middle_k) when `caches` are the two paged caches (kernel path) of one session with mirrored
/// lanes on `be`'s device, in a non-committing forward of `rows` = scratch_tokens current rows each, both in place.
/// Sets k and v and returns true; false (k and v untouched) otherwise, and the DiT writes its own buffers.
bool current_rows_in_place(const Backend& be, int layer, std::span<SelfAttentionCache* const> caches, int64_t rows,
                           TensorView& k, TensorView& v);

/// The forwards of one branch from an empty history to the longest history `config` lets it see (kv_limits): a
/// prefill, then chunk commits (with reset_at_boundary up to the last one max_committed_tokens allows; sliding,
/// up to the first one past it, which evicts), each followed by a denoising forward. The caches measure their
/// workspace over it (PagedSelfAttentionCache::attend_workspace_bytes, DenseSelfAttentionCache::workspace_bytes).
std::vector<KvForwardSpec> kv_fill_walk(const KvGeometry& geometry, const KvConfig& config);

/// Runs kv_fill_walk through `cache` (a PagedSelfAttentionCache or a DenseSelfAttentionCache using `be`, a
/// MeasuringBackend when measuring): per forward begin, an attend on every layer with q, k, v from be.alloc(),
/// commit.
template <typename Cache>
void run_kv_fill_walk(Backend& be, const KvGeometry& geometry, const KvConfig& config, Cache& cache) {
    for (const KvForwardSpec& spec : kv_fill_walk(geometry, config)) {
        cache.begin(spec);
        const int64_t video = int64_t(spec.video_frames) * geometry.tokens_per_frame;
        const Shape rows{video + spec.register_tokens, geometry.num_kv_heads, geometry.head_dim};
        const Tensor q = be.alloc(rows, be.compute_dtype()), k = be.alloc(rows, be.compute_dtype());
        const Tensor v = be.alloc(rows, be.compute_dtype()), out = be.alloc(rows, be.compute_dtype());
        for (int layer = 0; layer < geometry.num_layers; ++layer) cache.attend(be, layer, q, k, v, video, 1.0f, out);
        cache.commit();
    }
}

}  // namespace dzr
