#pragma once
/// The umT5-XXL encoder that turns a tokenized prompt into the DiT's text context
/// (dreamzero-reference.md §2.1; checkpoint prefix action_head.text_encoder.).
///
/// Per layer, pre-norm: x += Attn(RMS1(x)); x += FFN(RMS2(x)). T5 RMSNorm has no mean subtraction
/// and no bias; attention has no 1/sqrt(d) scale, a per-layer relative-position bias and a key
/// padding mask; the FFN is fc2(fc1(x) ⊙ gelu_tanh(gate(x))). A final RMSNorm follows, and rows at
/// positions >= the number of real tokens are set to zero.
///
/// Precision: on a bf16 backend every intermediate the reference's eager bf16 forward rounds is rounded
/// here too, and nothing else: q kᵀ, (q kᵀ + bias), the softmax probabilities (computed in f32), p v,
/// each GELU step (Activation::GeluTanhStepwise), the normalized value inside RMSNorm, every Linear
/// output and every residual add. The relative-position bias is held in the compute dtype.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "core/tensor.h"
#include "config/model_config.h"
#include "model/layers.h"
#include "weights/weight_source.h"

namespace dzr {

/// T5's bidirectional relative-position bucket for rel = key index − query index: half of the
/// buckets per sign (offset num_buckets/2 when rel > 0); n = |rel| maps to itself below
/// max_exact = num_buckets/4, else to min(num_buckets/2 − 1, max_exact + floor(log(n / max_exact) /
/// log(max_distance / max_exact) · (num_buckets/2 − max_exact))), evaluated in f32 like the reference.
int t5_relative_bucket(int64_t rel, int num_buckets, int max_distance = 128);

/// The additive logit value of a masked key: the lowest finite bf16 value (torch.finfo(bf16).min,
/// what the reference fills masked positions with). Exactly representable in f32 and bf16.
inline constexpr float kT5MaskedLogit = -3.3895313892515355e38f;

class Umt5Encoder {
  public:
    /// Optional per-stage hook for parity dumps: (stage name, layer or -1, tensor on the backend).
    using TraceFn = std::function<void(const char* name, int layer, const TensorView& t)>;

    Umt5Encoder() = default;
    /// Loads every weight under action_head.text_encoder. with the shapes `cfg` implies and builds the
    /// relative-position one-hot table for `cfg.text_len` tokens.
    Umt5Encoder(WeightLoader& loader, const T5Config& cfg);

    /// Encodes one prompt. ids: cfg.text_len token ids (real tokens then padding), each < cfg.vocab;
    /// num_tokens: how many leading ids are real (the tokenizer's attention-mask ones, incl. EOS),
    /// 1..text_len. out: [text_len, dim] in the backend's compute dtype. Rows >= num_tokens are zero.
    ///
    /// NOTE: the token-embedding gather is driven from the host (ids are known there before the forward):
    /// one device copy per row of the resident table. No host sync and no allocation; the encoder runs
    /// once per prompt, outside the per-step hot path. A device `embedding_lookup(table, ids, out)` op
    /// would turn the text_len copies into one launch.
    void forward(Backend& be, std::span<const int32_t> ids, int num_tokens, const TensorView& out,
                 const TraceFn& trace = {}) const;

    /// The attention bias [num_heads, text_len, text_len] (compute dtype, contiguous) of layer `layer`
    /// for a prompt of `num_tokens` real tokens: bias[h, q, k] = pos_table[bucket(k − q), h] for
    /// k < num_tokens, and kT5MaskedLogit for padding keys k >= num_tokens. forward() calls it once per
    /// layer.
    void attention_bias(Backend& be, int layer, int num_tokens, const TensorView& out) const;

    /// Workspace bytes forward() takes on `be` at most (a prompt shorter than text_len, whose key mask takes a
    /// row): the forward measured on a MeasuringBackend over `be` (measure_workspace).
    size_t workspace_bytes(Backend& be) const;

    const T5Config& config() const { return cfg_; }

  private:
    struct Layer {
        RmsNorm norm1;
        Linear q, k, v;    // [dim_attn, dim], no bias
        Linear o;          // [dim, dim_attn]
        Tensor pos_table;  // [num_buckets, num_heads]
        RmsNorm norm2;
        Linear gate;       // [ffn_dim, dim]
        Linear fc1;        // [ffn_dim, dim]
        Linear fc2;        // [dim, ffn_dim]
    };

    T5Config cfg_;
    Tensor token_embedding_;  // [vocab, dim]
    std::vector<Layer> layers_;
    RmsNorm norm_;
    // NOTE: the bias of every layer is pos_tableᵀ · onehot: [num_buckets, text_len²] (compute dtype) with
    // a 1 at (bucket(k − q), q·text_len + k). Built once at load (16 MiB in bf16 at the real 32 × 512²)
    // so a layer's [H, L, L] bias is one GEMM into reused scratch (32 MiB in bf16 at the real 64 heads),
    // instead of keeping 24 precomputed biases.
    Tensor bucket_onehot_;
};

}  // namespace dzr
