#include "weights/inventory.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <set>

#include "weights/keys.h"

namespace dzr {

namespace {

constexpr float kBiasStd = 0.02f;
constexpr float kNormJitter = 0.05f;

/// Collects the inventory of one component; each helper adds the tensors of one reference module.
class Builder {
  public:
    Builder(std::vector<ExpectedWeight>& out, Component c) : out_(out), c_(c) {}

    void add(std::string key, Shape shape, WeightInit init) {
        out_.push_back({std::move(key), shape, c_, init});
    }

    /// A weight whose fan-in is the product of every dimension but the first ([out, in, k...]).
    void weight(std::string key, Shape shape, float gain = 1.0f) {
        int64_t fan_in = 1;
        for (int d = 1; d < shape.rank(); ++d) fan_in *= shape[d];
        add(std::move(key), shape, {InitKind::Normal, gain / std::sqrt(float(fan_in > 0 ? fan_in : 1))});
    }
    void bias(std::string key, int64_t n) { add(std::move(key), Shape{n}, {InitKind::Normal, kBiasStd}); }

    /// nn.Linear(in, out): weight [out, in] (+ bias [out]).
    void linear(const std::string& p, int64_t out, int64_t in, bool with_bias = true, float gain = 1.0f) {
        weight(p + "weight", Shape{out, in}, gain);
        if (with_bias) bias(p + "bias", out);
    }
    /// CategorySpecificLinear with one category: W [1, in, out] (used as x @ W), b [1, out].
    void category_linear(const std::string& p, int64_t in, int64_t out) {
        add(p + "W", Shape{1, in, out}, {InitKind::Normal, 1.0f / std::sqrt(float(in))});
        add(p + "b", Shape{1, out}, {InitKind::Normal, kBiasStd});
    }
    /// Affine LayerNorm: weight and bias [n].
    void layer_norm(const std::string& p, int64_t n) {
        add(p + "weight", Shape{n}, {InitKind::OnesJitter, kNormJitter});
        bias(p + "bias", n);
    }
    void norm_scale(std::string key, Shape shape) {
        add(std::move(key), shape, {InitKind::OnesJitter, kNormJitter});
    }
    /// Conv with bias: weight [out, in, k...] and bias [out].
    void conv(const std::string& p, Shape w) {
        weight(p + "weight", w);
        bias(p + "bias", w[0]);
    }

  private:
    std::vector<ExpectedWeight>& out_;
    Component c_;
};

void dit_weights(const DitConfig& d, std::vector<ExpectedWeight>& out) {
    Builder b(out, Component::Dit);
    const int64_t dim = d.dim;
    b.category_linear(keys::dit("state_encoder.layer1."), d.max_state_dim, d.hidden_size);
    b.category_linear(keys::dit("state_encoder.layer2."), d.hidden_size, dim);
    b.category_linear(keys::dit("action_encoder.W1."), d.action_dim, dim);
    b.category_linear(keys::dit("action_encoder.W2."), 2 * dim, dim);  // [action features | sinusoid]
    b.category_linear(keys::dit("action_encoder.W3."), dim, dim);
    b.category_linear(keys::dit("action_decoder.layer1."), dim, d.hidden_size);
    b.category_linear(keys::dit("action_decoder.layer2."), d.hidden_size, d.action_dim);
    const auto& p = d.patch_size;
    b.conv(keys::dit("patch_embedding."), Shape{dim, d.in_dim, p[0], p[1], p[2]});
    b.linear(keys::dit("text_embedding.0."), dim, d.text_dim);
    b.linear(keys::dit("text_embedding.2."), dim, dim);
    b.linear(keys::dit("time_embedding.0."), dim, d.freq_dim);
    b.linear(keys::dit("time_embedding.2."), dim, dim);
    b.linear(keys::dit("time_projection.1."), 6 * dim, dim);  // 6 modulation vectors per token
    for (int i = 0; i < d.num_layers; ++i) {
        const std::string blk = keys::dit_block(i);
        b.add(blk + "modulation", Shape{1, 6, dim}, {InitKind::Normal, 1.0f / std::sqrt(float(dim))});
        for (const char* proj : {"q", "k", "v", "o"}) b.linear(blk + "self_attn." + proj + ".", dim, dim);
        b.norm_scale(blk + "self_attn.norm_q.weight", Shape{dim});
        b.norm_scale(blk + "self_attn.norm_k.weight", Shape{dim});
        b.layer_norm(blk + "norm3.", dim);
        for (const char* proj : {"q", "k", "v", "o"}) b.linear(blk + "cross_attn." + proj + ".", dim, dim);
        b.norm_scale(blk + "cross_attn.norm_q.weight", Shape{dim});
        b.norm_scale(blk + "cross_attn.norm_k.weight", Shape{dim});
        b.linear(blk + "cross_attn.k_img.", dim, dim);
        b.linear(blk + "cross_attn.v_img.", dim, dim);
        b.norm_scale(blk + "cross_attn.norm_k_img.weight", Shape{dim});
        b.linear(blk + "ffn.0.", d.ffn_dim, dim);
        b.linear(blk + "ffn.2.", dim, d.ffn_dim);
    }
    b.add(keys::dit("head.modulation"), Shape{1, 2, dim}, {InitKind::Normal, 1.0f / std::sqrt(float(dim))});
    b.linear(keys::dit("head.head."), int64_t(d.out_dim) * p[0] * p[1] * p[2], dim);
    b.layer_norm(keys::dit("img_emb.proj.0."), d.image_dim);
    b.linear(keys::dit("img_emb.proj.1."), d.image_dim, d.image_dim);
    b.linear(keys::dit("img_emb.proj.3."), dim, d.image_dim);
    b.layer_norm(keys::dit("img_emb.proj.4."), dim);
}

void t5_weights(const T5Config& t, std::vector<ExpectedWeight>& out) {
    Builder b(out, Component::TextEncoder);
    b.add(keys::t5("token_embedding.weight"), Shape{t.vocab, t.dim}, {InitKind::Normal, 1.0f});
    // NOTE: T5 attention has no 1/sqrt(head_dim) logit scale; fold it into q's init so random logits stay
    // O(1).
    const float q_gain = 1.0f / std::sqrt(float(t.dim_attn / t.num_heads));
    for (int j = 0; j < t.num_layers; ++j) {
        const std::string blk = keys::t5_block(j);
        b.norm_scale(blk + "norm1.weight", Shape{t.dim});
        b.linear(blk + "attn.q.", t.dim_attn, t.dim, false, q_gain);
        b.linear(blk + "attn.k.", t.dim_attn, t.dim, false);
        b.linear(blk + "attn.v.", t.dim_attn, t.dim, false);
        b.linear(blk + "attn.o.", t.dim, t.dim_attn, false);
        b.norm_scale(blk + "norm2.weight", Shape{t.dim});
        b.linear(blk + "ffn.gate.0.", t.ffn_dim, t.dim, false);
        b.linear(blk + "ffn.fc1.", t.ffn_dim, t.dim, false);
        b.linear(blk + "ffn.fc2.", t.dim, t.ffn_dim, false);
        b.add(blk + "pos_embedding.embedding.weight", Shape{t.num_buckets, t.num_heads},
              {InitKind::Normal, 0.5f});
    }
    b.norm_scale(keys::t5("norm.weight"), Shape{t.dim});
}

void clip_weights(const ClipConfig& c, std::vector<ExpectedWeight>& out) {
    Builder b(out, Component::ImageEncoder);
    const int64_t w = c.width;
    const float embed_std = 1.0f / std::sqrt(float(w));
    b.add(keys::clip("log_scale"), Shape{}, {InitKind::Constant, std::log(1.0f / 0.07f)});  // CLIP's init
    b.add(keys::clip("visual.cls_embedding"), Shape{1, 1, w}, {InitKind::Normal, embed_std});
    b.add(keys::clip("visual.pos_embedding"), Shape{1, c.num_tokens(), w}, {InitKind::Normal, embed_std});
    b.add(keys::clip("visual.head"), Shape{w, c.embed_dim},
          {InitKind::Normal, embed_std});  // used as x @ head
    b.weight(keys::clip("visual.patch_embedding.weight"), Shape{w, 3, c.patch_size, c.patch_size});
    b.layer_norm(keys::clip("visual.pre_norm."), w);
    for (int i = 0; i < c.num_layers; ++i) {
        const std::string blk = keys::clip_block(i);
        b.layer_norm(blk + "norm1.", w);
        b.linear(blk + "attn.to_qkv.", 3 * w, w);  // rows [q | k | v]
        b.linear(blk + "attn.proj.", w, w);
        b.layer_norm(blk + "norm2.", w);
        b.linear(blk + "mlp.0.", c.mlp_dim, w);
        b.linear(blk + "mlp.2.", w, c.mlp_dim);
    }
    b.layer_norm(keys::clip("visual.post_norm."), w);
}

/// Wan ResidualBlock(in, out): RMS, SiLU, conv3, RMS, SiLU, dropout, conv3 (+ 1x1x1 shortcut if in != out).
void vae_residual(Builder& b, const std::string& p, int64_t in, int64_t out) {
    b.norm_scale(p + "residual.0.gamma", Shape{in, 1, 1, 1});
    b.conv(p + "residual.2.", Shape{out, in, 3, 3, 3});
    b.norm_scale(p + "residual.3.gamma", Shape{out, 1, 1, 1});
    b.conv(p + "residual.6.", Shape{out, out, 3, 3, 3});
    if (in != out) b.conv(p + "shortcut.", Shape{out, in, 1, 1, 1});
}

/// Single-head spatial attention of the VAE middle: RMS over channels, 1x1 qkv, 1x1 proj.
void vae_attention(Builder& b, const std::string& p, int64_t c) {
    b.norm_scale(p + "norm.gamma", Shape{c, 1, 1});
    b.conv(p + "to_qkv.", Shape{3 * c, c, 1, 1});
    b.conv(p + "proj.", Shape{c, c, 1, 1});
}

void vae_weights(const VaeConfig& v, std::vector<ExpectedWeight>& out) {
    Builder b(out, Component::Vae);
    const int64_t z = v.z_dim;
    const size_t stages = v.dim_mult.size();

    // encoder: dims = base * [1, dim_mult...]
    std::vector<int64_t> dims = {v.base_dim};
    for (int m : v.dim_mult) dims.push_back(int64_t(v.base_dim) * m);
    b.conv(keys::vae_encoder("conv1."), Shape{dims[0], 3, 3, 3, 3});
    int idx = 0;
    for (size_t i = 0; i < stages; ++i) {
        int64_t in = dims[i];
        const int64_t o = dims[i + 1];
        for (int r = 0; r < v.num_res_blocks; ++r, in = o)
            vae_residual(b, keys::vae_encoder_down(idx++), in, o);
        if (i + 1 < stages) {
            const std::string p = keys::vae_encoder_down(idx++);
            b.conv(p + "resample.1.", Shape{o, o, 3, 3});  // zero-pad + 3x3 stride-2 conv
            if (v.temporal_downsample[i]) b.conv(p + "time_conv.", Shape{o, o, 3, 1, 1});
        }
    }
    const int64_t top = dims.back();
    vae_residual(b, keys::vae_encoder_middle(0), top, top);
    vae_attention(b, keys::vae_encoder_middle(1), top);
    vae_residual(b, keys::vae_encoder_middle(2), top, top);
    b.norm_scale(keys::vae_encoder("head.0.gamma"), Shape{top, 1, 1, 1});
    b.conv(keys::vae_encoder("head.2."), Shape{2 * z, top, 3, 3, 3});  // mean and log-variance
    b.conv(keys::vae("conv1."), Shape{2 * z, 2 * z, 1, 1, 1});
    b.conv(keys::vae("conv2."), Shape{z, z, 1, 1, 1});
    if (!v.has_decoder) return;

    // decoder: dims = base * [dim_mult[-1], reversed(dim_mult)...]
    std::vector<int64_t> ddims = {int64_t(v.base_dim) * v.dim_mult.back()};
    for (size_t i = stages; i-- > 0;) ddims.push_back(int64_t(v.base_dim) * v.dim_mult[i]);
    b.conv(keys::vae_decoder("conv1."), Shape{ddims[0], z, 3, 3, 3});
    vae_residual(b, keys::vae_decoder_middle(0), ddims[0], ddims[0]);
    vae_attention(b, keys::vae_decoder_middle(1), ddims[0]);
    vae_residual(b, keys::vae_decoder_middle(2), ddims[0], ddims[0]);
    idx = 0;
    for (size_t i = 0; i < stages; ++i) {
        // NOTE: every upsample halves the channels (Conv2d(c, c/2)), so later stages start at half width.
        int64_t in = i == 0 ? ddims[0] : ddims[i] / 2;
        const int64_t o = ddims[i + 1];
        for (int r = 0; r <= v.num_res_blocks; ++r, in = o)
            vae_residual(b, keys::vae_decoder_up(idx++), in, o);
        if (i + 1 < stages) {
            const std::string p = keys::vae_decoder_up(idx++);
            b.conv(p + "resample.1.", Shape{o / 2, o, 3, 3});  // nearest x2 + 3x3 conv
            // temporal upsampling mirrors the encoder's downsampling in reverse order
            if (v.temporal_downsample[stages - 2 - i]) b.conv(p + "time_conv.", Shape{2 * o, o, 3, 1, 1});
        }
    }
    b.norm_scale(keys::vae_decoder("head.0.gamma"), Shape{ddims.back(), 1, 1, 1});
    b.conv(keys::vae_decoder("head.2."), Shape{3, ddims.back(), 3, 3, 3});
}

}  // namespace

std::string_view component_name(Component c) {
    switch (c) {
        case Component::Dit:
            return "DiT";
        case Component::TextEncoder:
            return "text encoder";
        case Component::ImageEncoder:
            return "image encoder";
        case Component::Vae:
            return "VAE";
        case Component::Backbone:
            return "backbone";
        case Component::Other:
            return "other";
    }
    return "?";
}

Component component_of(std::string_view key) {
    if (keys::has_prefix(key, keys::kDit)) return Component::Dit;
    if (keys::has_prefix(key, keys::kTextEncoder)) return Component::TextEncoder;
    if (keys::has_prefix(key, keys::kImageEncoder)) return Component::ImageEncoder;
    if (keys::has_prefix(key, keys::kVae)) return Component::Vae;
    if (keys::has_prefix(key, keys::kBackbone)) return Component::Backbone;
    return Component::Other;
}

std::vector<ExpectedWeight> expected_weights(const ModelConfig& config) {
    std::vector<ExpectedWeight> out;
    dit_weights(config.dit, out);
    t5_weights(config.t5, out);
    clip_weights(config.clip, out);
    vae_weights(config.vae, out);
    return out;
}

uint64_t ComponentCensus::total_tensors() const {
    uint64_t n = 0;
    for (auto v : tensors) n += v;
    return n;
}

uint64_t ComponentCensus::total_params() const {
    uint64_t n = 0;
    for (auto v : params) n += v;
    return n;
}

ComponentCensus census(const std::vector<ExpectedWeight>& weights) {
    ComponentCensus c;
    for (const auto& w : weights) {
        c.tensors[size_t(w.component)] += 1;
        c.params[size_t(w.component)] += uint64_t(w.shape.numel());
    }
    return c;
}

bool is_lora_key(std::string_view key) {
    for (std::string_view marker :
         {".lora_A.", ".lora_B.", ".lora_embedding_A", ".lora_embedding_B", ".lora_magnitude"})
        if (key.find(marker) != std::string_view::npos) return true;
    return false;
}

bool WeightCheckReport::ok() const {
    return missing.empty() && unexpected.empty() && lora.empty() && shape_mismatch.empty() &&
           dtype_mismatch.empty();
}

std::string WeightCheckReport::message(const std::string& what, size_t cap) const {
    if (ok())
        return fmt::format("{}: all {} expected weights present with the expected shapes", what, checked);
    std::vector<std::string> counts;
    auto count = [&](size_t n, const char* one, const char* many) {
        if (n) counts.push_back(fmt::format("{} {}", n, n == 1 ? one : many));
    };
    count(missing.size(), "missing", "missing");
    count(unexpected.size(), "unexpected", "unexpected");
    count(shape_mismatch.size(), "with the wrong shape", "with the wrong shape");
    count(dtype_mismatch.size(), "with the wrong dtype", "with the wrong dtype");
    count(lora.size(), "LoRA adapter tensor", "LoRA adapter tensors");
    std::string msg =
        fmt::format("{} does not match the expected weights: {}", what, fmt::join(counts, ", "));

    auto group = [&](const char* title, size_t n, const std::string& note, auto&& line) {
        if (n == 0) return;
        msg += fmt::format("\n  {} ({}){}:", title, n, note);
        for (size_t i = 0; i < n && i < cap; ++i) msg += "\n    " + line(i);
        if (n > cap) msg += fmt::format("\n    ... and {} more", n - cap);
    };
    group("missing", missing.size(), "",
          [&](size_t i) { return missing[i].key + " " + missing[i].shape.str(); });
    group("unexpected", unexpected.size(), "", [&](size_t i) { return unexpected[i]; });
    group("wrong shape", shape_mismatch.size(), "", [&](size_t i) {
        const auto& m = shape_mismatch[i];
        return fmt::format("{}: expected {}, found {} ({})", m.key, m.expected, m.found, m.location);
    });
    group("wrong dtype", dtype_mismatch.size(), "", [&](size_t i) {
        const auto& m = dtype_mismatch[i];
        return fmt::format("{}: expected {}, found {} ({})", m.key, m.expected, m.found, m.location);
    });
    group("LoRA adapters", lora.size(),
          "; unmerged PEFT adapters are not supported: merge them into the base weights and save the "
          "checkpoint "
          "again",
          [&](size_t i) { return lora[i]; });
    return msg;
}

WeightCheckReport check_weights(const WeightSource& source, const std::vector<ExpectedWeight>& expected) {
    WeightCheckReport r;
    std::set<std::string> known;
    for (const auto& e : expected) {
        known.insert(e.key);
        auto v = source.find(e.key);
        if (!v) {
            r.missing.push_back(e);
        } else if (v->shape != e.shape) {
            r.shape_mismatch.push_back({e.key, source.location(e.key), e.shape.str(), v->shape.str()});
        } else if (v->dtype != DType::BF16 && v->dtype != DType::F16 && v->dtype != DType::F32) {
            r.dtype_mismatch.push_back(
                {e.key, source.location(e.key), "bf16, f16 or f32", std::string(dtype_name(v->dtype))});
        } else {
            ++r.checked;
        }
    }
    for (const auto& k : source.keys()) {
        if (known.count(k) || component_of(k) == Component::Backbone) continue;
        if (is_lora_key(k)) {
            r.lora.push_back(k);
        } else {
            r.unexpected.push_back(k + " (" + source.location(k) + ")");
        }
    }
    return r;
}

}  // namespace dzr
