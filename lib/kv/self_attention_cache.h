#pragma once
/// The seam between the DiT's self-attention and the KV cache. A SelfAttentionCache serves one DiT
/// forward of one CFG branch: it holds the committed history (K after q/k-norm and RoPE, and V, of
/// earlier clean latent frames) and computes attention over [history | current tokens].
///
/// Implementations: a dense reference (contiguous per-layer history) and the paged cache (block
/// tables over a preallocated pool). Forward control (begin, commit, abort) belongs to the
/// implementation's owner (the policy), not to the DiT.
#include <cstdint>

#include "backend/backend.h"

namespace dzr {

class SelfAttentionCache {
public:
    virtual ~SelfAttentionCache() = default;

    /// Committed history tokens visible to this forward (csf * frame_seqlen in DreamZero).
    virtual int64_t history_tokens() const = 0;

    /// Self-attention of layer `layer` for the current forward:
    ///   out = softmax(scale * q [K_hist | k]^T) [V_hist | v]
    /// q, k, v, out: [L, H, D] with L = current tokens, ordered video tokens first, then register
    /// (action, state) tokens. Every query sees every key (no mask). When the forward is a committing
    /// one (prefill/commit), the first `video_tokens` rows of k and v are staged and become history
    /// only when the owner commits the forward; register tokens are never stored.
    virtual void attend(Backend& be, int layer, const TensorView& q, const TensorView& k, const TensorView& v,
                        int64_t video_tokens, float scale, const TensorView& out) = 0;
};

}  // namespace dzr
