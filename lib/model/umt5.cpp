#include "model/umt5.h"

#include <algorithm>
#include <cmath>

#include "backend/measuring_backend.h"
#include "core/error.h"
#include "weights/keys.h"

namespace dzr {

int t5_relative_bucket(int64_t rel, int num_buckets, int max_distance) {
    DZR_ASSERT(num_buckets >= 4 && num_buckets % 2 == 0);
    const int half = num_buckets / 2;  // buckets per sign
    const int max_exact = half / 2;
    DZR_ASSERT(max_distance > max_exact);
    const int offset = rel > 0 ? half : 0;
    const int64_t n = rel < 0 ? -rel : rel;
    if (n < max_exact) return offset + int(n);
    // NOTE: f32 like the reference (torch.log on a float tensor, then .long() truncation). For the real
    // 32 buckets / distance 128 this agrees with exact arithmetic for every n, including the exact
    // boundaries n = 16, 32, 64 (the tests check n < 4096).
    const float ratio = float(n) / float(max_exact);
    const float span = float(std::log(double(max_distance) / double(max_exact)));
    const float scaled = std::log(ratio) / span * float(half - max_exact);
    const int64_t large = max_exact + int64_t(scaled);
    return offset + int(std::min<int64_t>(large, half - 1));
}

Umt5Encoder::Umt5Encoder(WeightLoader& loader, const T5Config& cfg) : cfg_(cfg) {
    DZR_CHECK(
        cfg.dim > 0 && cfg.dim_attn > 0 && cfg.ffn_dim > 0 && cfg.num_layers > 0 && cfg.vocab > 0 &&
            cfg.text_len > 0,
        "umT5 config: dim {}, dim_attn {}, ffn_dim {}, layers {}, vocab {}, text_len {} must be positive",
        cfg.dim, cfg.dim_attn, cfg.ffn_dim, cfg.num_layers, cfg.vocab, cfg.text_len);
    DZR_CHECK(cfg.num_heads > 0 && cfg.dim_attn % cfg.num_heads == 0,
              "umT5 config: dim_attn {} is not a multiple of num_heads {}", cfg.dim_attn, cfg.num_heads);
    DZR_CHECK(cfg.num_buckets >= 4 && cfg.num_buckets % 2 == 0,
              "umT5 config: num_buckets must be even and >= 4, got {}", cfg.num_buckets);
    const int64_t d = cfg.dim, da = cfg.dim_attn, f = cfg.ffn_dim;
    token_embedding_ =
        loader.require(keys::t5("token_embedding.weight"), Shape{cfg.vocab, d}, WeightInit::normal(1.0f));
    // NOTE: T5 attention has no 1/sqrt(head_dim) logit scale; made-up weights fold it into q's init so that
    // random logits stay O(1).
    const WeightInit q_init = WeightInit::fan_in(1.0f / std::sqrt(float(cfg.dim_attn / cfg.num_heads)));
    layers_.resize(size_t(cfg.num_layers));
    for (int i = 0; i < cfg.num_layers; ++i) {
        Layer& l = layers_[size_t(i)];
        const std::string block = keys::t5_block(i);
        l.norm1.load(loader, block + "norm1", d, cfg.eps);
        l.q.load(loader, block + "attn.q", d, da, false, q_init);
        l.k.load(loader, block + "attn.k", d, da, false);
        l.v.load(loader, block + "attn.v", d, da, false);
        l.o.load(loader, block + "attn.o", da, d, false);
        l.norm2.load(loader, block + "norm2", d, cfg.eps);
        l.gate.load(loader, block + "ffn.gate.0", d, f, false);
        l.fc1.load(loader, block + "ffn.fc1", d, f, false);
        l.fc2.load(loader, block + "ffn.fc2", f, d, false);
        // NOTE: in the compute dtype, as the reference's bias is its bf16 embedding rows.
        l.pos_table = loader.require(block + "pos_embedding.embedding.weight",
                                     Shape{cfg.num_buckets, cfg.num_heads}, WeightInit::normal(0.5f));
    }
    norm_.load(loader, keys::t5("norm"), d, cfg.eps);

    const int64_t len = cfg.text_len;
    Tensor onehot = Tensor::host(Shape{cfg.num_buckets, len * len}, DType::F32);  // zero-filled
    float* p = onehot.ptr<float>();
    for (int64_t q = 0; q < len; ++q)
        for (int64_t k = 0; k < len; ++k)
            p[t5_relative_bucket(k - q, cfg.num_buckets) * len * len + q * len + k] = 1.0f;
    Backend& be = loader.backend();
    // NOTE: 0 and 1 are exact in bf16, and each bias entry is one table value times 1 summed with zeros,
    // so the bias GEMM reproduces the table entries exactly in the compute dtype.
    bucket_onehot_ = be.alloc(onehot.shape(), be.compute_dtype());
    be.upload(onehot, bucket_onehot_);
}

size_t Umt5Encoder::workspace_bytes(Backend& be) const {
    const std::vector<int32_t> ids(size_t(cfg_.text_len), 0);
    return measure_workspace(be, [&](Backend& mb) {
        forward(mb, ids, 1, mb.alloc(Shape{cfg_.text_len, cfg_.dim}, mb.compute_dtype()));
    });
}

void Umt5Encoder::attention_bias(Backend& be, int layer, int num_tokens, const TensorView& out) const {
    DZR_CHECK(layer >= 0 && layer < int(layers_.size()), "umT5: layer {} out of range [0, {})", layer,
              layers_.size());
    const int64_t len = cfg_.text_len, nh = cfg_.num_heads;
    DZR_CHECK(num_tokens >= 1 && num_tokens <= len, "umT5: number of real tokens must be in [1, {}], got {}",
              len, num_tokens);
    const DType dt = be.compute_dtype();
    DZR_CHECK(out.rank() == 3 && out.dim(0) == nh && out.dim(1) == len && out.dim(2) == len && out.dtype == dt &&
                  out.is_contiguous(),
              "umT5: attention bias must be a contiguous {}[{}, {}, {}], got {}", dtype_name(dt), nh, len, len,
              out.str());
    ArenaScope scope(be.workspace());
    // Relative positions: [B, H]ᵀ · [B, L·L] -> [H, L·L] = [H, L, L]
    be.gemm(GemmParams{true, false, 1.0f, 0.0f}, layers_[size_t(layer)].pos_table, bucket_onehot_, {},
            out.reshape(Shape{nh, len * len}));
    // Key padding mask over the last (key) dim: 0 for real keys, the masked logit for padding.
    // NOTE: pos_bias + kT5MaskedLogit rounds to exactly kT5MaskedLogit in f32 and bf16 (|pos_bias| is far
    // below half an ulp of it), which is the reference's masked_fill_ of its bias before the logits add.
    if (num_tokens < len) {
        const TensorView key_mask = be.scratch(Shape{len});
        be.fill(key_mask.slice(0, 0, num_tokens), 0.0f);
        be.fill(key_mask.slice(0, num_tokens, len - num_tokens), kT5MaskedLogit);
        be.add(out, key_mask, out);  // [H, L, L] + [L]
    }
}

void Umt5Encoder::forward(Backend& be, std::span<const int32_t> ids, int num_tokens, const TensorView& out,
                          const TraceFn& trace) const {
    DZR_CHECK(!layers_.empty(), "umT5: forward() on an encoder that was never loaded");
    const int64_t len = cfg_.text_len, d = cfg_.dim, da = cfg_.dim_attn, nh = cfg_.num_heads;
    const int64_t hd = da / nh;
    DZR_CHECK(int64_t(ids.size()) == len, "umT5: expected {} token ids (text_len), got {}", len, ids.size());
    DZR_CHECK(num_tokens >= 1 && num_tokens <= len, "umT5: number of real tokens must be in [1, {}], got {}",
              len, num_tokens);
    for (size_t i = 0; i < ids.size(); ++i)
        DZR_CHECK(ids[i] >= 0 && ids[i] < cfg_.vocab,
                  "umT5: token id {} at position {} is outside the vocabulary [0, {})", ids[i], i,
                  cfg_.vocab);
    const DType dt = be.compute_dtype();
    DZR_CHECK(
        out.rank() == 2 && out.dim(0) == len && out.dim(1) == d && out.dtype == dt && out.is_contiguous(),
        "umT5: output must be a contiguous {}[{}, {}], got {}", dtype_name(dt), len, d, out.str());

    ArenaScope scope(be.workspace());
    const TensorView x = be.scratch(Shape{len, d});
    const TensorView h = be.scratch(Shape{len, d});
    const TensorView q = be.scratch(Shape{len, da});
    const TensorView k = be.scratch(Shape{len, da});
    const TensorView v = be.scratch(Shape{len, da});
    const TensorView att = be.scratch(Shape{len, da});
    const TensorView att_heads = be.scratch(Shape{nh, len, hd});  // P·V as the batched GEMM writes it
    const TensorView g = be.scratch(Shape{len, cfg_.ffn_dim});
    const TensorView f = be.scratch(Shape{len, cfg_.ffn_dim});
    const TensorView bias = be.scratch(Shape{nh, len, len});    // the bias, then the probabilities
    const TensorView logits = be.scratch(Shape{nh, len, len});  // the logits, then logits + bias
    // Per-head views of the [L, da] projections: [L, da] -> [L, H, hd] -> [H, L, hd] (strides hd, da, 1)
    const auto heads = [&](const TensorView& t) { return t.reshape(Shape{len, nh, hd}).permute({1, 0, 2}); };

    // Token embedding: one row copy per position of the resident [vocab, d] table.
    for (int64_t i = 0; i < len; ++i)
        be.copy(token_embedding_.view().slice(0, ids[size_t(i)], 1), x.slice(0, i, 1));
    if (trace) trace("umt5.embed", -1, x);

    for (int i = 0; i < cfg_.num_layers; ++i) {
        const Layer& l = layers_[size_t(i)];
        l.norm1.forward(be, x, h);
        l.q.forward(be, h, q);  // [L, d] -> [L, da]
        l.k.forward(be, h, k);
        l.v.forward(be, h, v);
        attention_bias(be, i, num_tokens, bias);
        // NOTE: written out op by op, as the reference's eager attention rounds (on bf16) after each
        // step: logits = q kᵀ (no 1/sqrt(head_dim) scale in T5), logits + bias, softmax in f32, p v.
        // [H, L, hd] x [H, L, hd]ᵀ -> [H, L, L]
        be.gemm(GemmParams{false, true, 1.0f, 0.0f}, heads(q), heads(k), {}, logits);
        be.add(logits, bias, logits);
        be.softmax(SoftmaxParams{1.0f}, logits, bias);
        // [H, L, L] x [H, L, hd] -> [H, L, hd], then merged into att [L, H·hd]
        // NOTE: into a contiguous [H, L, hd] first, as the reference's einsum -> bmm writes it, so the GEMM
        // library sees the same output layout (and so picks the same kernel) as PyTorch's call.
        be.gemm(GemmParams{false, false, 1.0f, 0.0f}, bias, heads(v), {}, att_heads);
        be.copy(att_heads.permute({1, 0, 2}), att.reshape(Shape{len, nh, hd}));  // [H, L, hd] -> [L, H, hd]
        l.o.forward(be, att, h);  // [L, da] -> [L, d]
        be.add(x, h, x);

        l.norm2.forward(be, x, h);
        l.gate.forward(be, h, g);  // [L, d] -> [L, ffn]
        // NOTE: umT5's own GELU module is eight eager ops (eight bf16 roundings), not the fused tanh GELU.
        be.activation(ActivationParams{Activation::GeluTanhStepwise}, g, g);
        l.fc1.forward(be, h, f);  // [L, d] -> [L, ffn]
        be.mul(f, g, f);
        l.fc2.forward(be, f, h);  // [L, ffn] -> [L, d]
        be.add(x, h, x);
        if (trace) trace("umt5.layer_out", i, x);
    }
    norm_.forward(be, x, out);
    if (num_tokens < len) be.fill(out.slice(0, num_tokens, len - num_tokens), 0.0f);
    if (trace) trace("umt5.out", -1, out);
}

}  // namespace dzr
