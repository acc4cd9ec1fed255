#pragma once
/// Shared pieces of the DiT tests: an in-memory WeightSource filled with random weights under the
/// real checkpoint key names, a dense test-local SelfAttentionCache, and an independent naive
/// re-computation of the DiT in double precision written from dreamzero-reference.md §2.5.
#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdint>
#include <map>
#include <numbers>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "core/tensor.h"
#include "kv/self_attention_cache.h"
#include "config/model_config.h"
#include "support/map_weight_source.h"
#include "weights/weight_source.h"

namespace dzr::test {

/// Tiny DiT geometry: 2 layers, dim 128, a 4x8 latent (2x4 = 8 tokens per frame).
inline DitConfig tiny_dit_config(int num_heads = 1) {
    DitConfig c;
    c.dim = 128;
    c.num_layers = 2;
    c.num_heads = num_heads;
    c.ffn_dim = 256;
    c.in_dim = 36;
    c.out_dim = 16;
    c.freq_dim = 256;
    c.text_dim = 32;
    c.text_len = 16;
    c.frame_seqlen = 8;
    c.num_frame_per_block = 2;
    c.num_action_per_block = 24;
    c.num_state_per_block = 1;
    c.max_chunk_size = 4;
    c.action_dim = 32;
    c.max_state_dim = 16;
    c.hidden_size = 64;
    c.image_dim = 48;
    return c;
}
inline constexpr int kTinyLatentH = 4;
inline constexpr int kTinyLatentW = 8;
inline constexpr int kTinyImageTokens = 5;

using MapWeightSource = MapSource;

/// Random DiT weights under the checkpoint key names of dreamzero-reference.md §4.2 (typed here
/// on purpose, independently of the library's key helper). Scales keep activations O(1).
inline void fill_dit_weights(MapWeightSource& src, const DitConfig& c, uint64_t seed) {
    std::mt19937_64 rng(seed);
    const std::string p = "action_head.model.";
    const int64_t C = c.dim;
    auto linear = [&](const std::string& m, int64_t in, int64_t out) {
        const float s = 1.0f / std::sqrt(float(in));
        src.put(p + m + ".weight", Shape{out, in}, rng, -s, s);
        src.put(p + m + ".bias", Shape{out}, rng, -0.1f, 0.1f);
    };
    auto category = [&](const std::string& m, int64_t in, int64_t out) {
        const float s = 1.0f / std::sqrt(float(in));
        src.put(p + m + ".W", Shape{1, in, out}, rng, -s, s);
        src.put(p + m + ".b", Shape{1, out}, rng, -0.1f, 0.1f);
    };
    auto gain = [&](const std::string& k, int64_t n) { src.put(p + k, Shape{n}, rng, 0.8f, 1.2f); };
    auto bias = [&](const std::string& k, int64_t n) { src.put(p + k, Shape{n}, rng, -0.1f, 0.1f); };

    const float ps = 1.0f / std::sqrt(float(c.in_dim * 4));
    src.put(p + "patch_embedding.weight", Shape{C, c.in_dim, 1, 2, 2}, rng, -ps, ps);
    bias("patch_embedding.bias", C);
    linear("text_embedding.0", c.text_dim, C);
    linear("text_embedding.2", C, C);
    linear("time_embedding.0", c.freq_dim, C);
    linear("time_embedding.2", C, C);
    linear("time_projection.1", C, 6 * C);
    gain("img_emb.proj.0.weight", c.image_dim);
    bias("img_emb.proj.0.bias", c.image_dim);
    linear("img_emb.proj.1", c.image_dim, c.image_dim);
    linear("img_emb.proj.3", c.image_dim, C);
    gain("img_emb.proj.4.weight", C);
    bias("img_emb.proj.4.bias", C);
    for (int i = 0; i < c.num_layers; ++i) {
        const std::string b = "blocks." + std::to_string(i) + ".";
        src.put(p + b + "modulation", Shape{1, 6, C}, rng, -0.3f, 0.3f);
        for (const char* n : {"q", "k", "v", "o"}) linear(b + "self_attn." + n, C, C);
        gain(b + "self_attn.norm_q.weight", C);
        gain(b + "self_attn.norm_k.weight", C);
        gain(b + "norm3.weight", C);
        bias(b + "norm3.bias", C);
        for (const char* n : {"q", "k", "v", "o", "k_img", "v_img"}) linear(b + "cross_attn." + n, C, C);
        gain(b + "cross_attn.norm_q.weight", C);
        gain(b + "cross_attn.norm_k.weight", C);
        gain(b + "cross_attn.norm_k_img.weight", C);
        linear(b + "ffn.0", C, c.ffn_dim);
        linear(b + "ffn.2", c.ffn_dim, C);
    }
    src.put(p + "head.modulation", Shape{1, 2, C}, rng, -0.3f, 0.3f);
    linear("head.head", C, 4 * c.out_dim);
    category("state_encoder.layer1", c.max_state_dim, c.hidden_size);
    category("state_encoder.layer2", c.hidden_size, C);
    category("action_encoder.W1", c.action_dim, C);
    category("action_encoder.W2", 2 * C, C);
    category("action_encoder.W3", C, C);
    category("action_decoder.layer1", C, c.hidden_size);
    category("action_decoder.layer2", c.hidden_size, c.action_dim);
}

/// Dense SelfAttentionCache for tests: host-memory history per layer, committed on demand, with
/// counters of what each attend() saw.
class DenseTestCache final : public SelfAttentionCache {
  public:
    DenseTestCache(int layers, int heads, int head_dim)
        : row_(int64_t(heads) * head_dim),
          heads_(heads),
          head_dim_(head_dim),
          k_hist_(size_t(layers)),
          v_hist_(size_t(layers)),
          k_stage_(size_t(layers)),
          v_stage_(size_t(layers)),
          last_keys(size_t(layers), -1),
          last_queries(size_t(layers), -1),
          staged_rows(size_t(layers), 0) {}

    /// Starts a forward; a committing one stages the video K/V of every layer.
    void begin(bool committing) {
        committing_ = committing;
        for (auto& s : k_stage_) s.clear();
        for (auto& s : v_stage_) s.clear();
        std::fill(staged_rows.begin(), staged_rows.end(), 0);
    }
    /// Appends the staged K/V to the history.
    void commit() {
        for (size_t l = 0; l < k_hist_.size(); ++l) {
            k_hist_[l].insert(k_hist_[l].end(), k_stage_[l].begin(), k_stage_[l].end());
            v_hist_[l].insert(v_hist_[l].end(), v_stage_[l].begin(), v_stage_[l].end());
        }
        begin(false);
    }

    int64_t history_tokens() const override { return int64_t(k_hist_[0].size()) / row_; }
    bool committing() const override { return committing_; }
    const std::vector<float>& history_k(int layer) const { return k_hist_[size_t(layer)]; }
    const std::vector<float>& history_v(int layer) const { return v_hist_[size_t(layer)]; }

    void attend(Backend& be, int layer, const TensorView& q, const TensorView& k, const TensorView& v,
                int64_t video_tokens, float scale, const TensorView& out) override {
        const int64_t L = k.dim(0);
        std::vector<float> K = k_hist_[size_t(layer)], V = v_hist_[size_t(layer)];
        const std::vector<float> kc = to_f32_vector(k), vc = to_f32_vector(v);
        K.insert(K.end(), kc.begin(), kc.end());
        V.insert(V.end(), vc.begin(), vc.end());
        const int64_t Lk = int64_t(K.size()) / row_;
        be.attention({scale}, q, TensorView(K.data(), DType::F32, Shape{Lk, heads_, head_dim_}),
                     TensorView(V.data(), DType::F32, Shape{Lk, heads_, head_dim_}), {}, out);
        last_keys[size_t(layer)] = Lk;
        last_queries[size_t(layer)] = q.dim(0);
        if (committing_) {
            DZR_ASSERT(video_tokens <= L);
            k_stage_[size_t(layer)].assign(kc.begin(), kc.begin() + video_tokens * row_);
            v_stage_[size_t(layer)].assign(vc.begin(), vc.begin() + video_tokens * row_);
            staged_rows[size_t(layer)] = video_tokens;
        }
    }
    void store(Backend&, int layer, const TensorView& k, const TensorView& v, int64_t video_tokens) override {
        DZR_ASSERT(committing_ && video_tokens <= k.dim(0));
        const std::vector<float> kc = to_f32_vector(k), vc = to_f32_vector(v);
        k_stage_[size_t(layer)].assign(kc.begin(), kc.begin() + video_tokens * row_);
        v_stage_[size_t(layer)].assign(vc.begin(), vc.begin() + video_tokens * row_);
        staged_rows[size_t(layer)] = video_tokens;
        ++stores;
    }

  private:
    int64_t row_;
    int heads_, head_dim_;
    bool committing_ = false;
    std::vector<std::vector<float>> k_hist_, v_hist_, k_stage_, v_stage_;

  public:
    std::vector<int64_t> last_keys, last_queries, staged_rows;
    int stores = 0;  // store() calls (kv_only forwards' last layers)
};

// ---------------------------------------------------------------------------------------------
// Naive reference: plain loops in double, one token at a time, from the spec text.
// ---------------------------------------------------------------------------------------------

using Vec = std::vector<double>;

/// Host weights of the naive model, read from the same map the loader uses.
struct NaiveWeights {
    const MapWeightSource& src;
    Vec get(const std::string& suffix) const {
        const std::vector<float> f = src.values("action_head.model." + suffix);
        return Vec(f.begin(), f.end());
    }
};

/// y = W x + b for a PyTorch Linear (W [out, in]).
inline Vec nv_linear(const Vec& W, const Vec& b, const Vec& x) {
    const size_t out = b.size(), in = x.size();
    Vec y(out);
    for (size_t o = 0; o < out; ++o) {
        double s = b[o];
        for (size_t i = 0; i < in; ++i) s += W[o * in + i] * x[i];
        y[o] = s;
    }
    return y;
}
/// y = x W + b for a category-specific linear (W [1, in, out]).
inline Vec nv_xw(const Vec& W, const Vec& b, const Vec& x) {
    const size_t out = b.size(), in = x.size();
    Vec y(b.begin(), b.end());
    for (size_t i = 0; i < in; ++i)
        for (size_t o = 0; o < out; ++o) y[o] += x[i] * W[i * out + o];
    return y;
}
inline Vec nv_layer_norm(const Vec& x, double eps, const Vec* w = nullptr, const Vec* b = nullptr) {
    double mean = 0, var = 0;
    for (double v : x) mean += v;
    mean /= double(x.size());
    for (double v : x) var += (v - mean) * (v - mean);
    var /= double(x.size());
    Vec y(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
        y[i] = (x[i] - mean) / std::sqrt(var + eps);
        if (w) y[i] *= (*w)[i];
        if (b) y[i] += (*b)[i];
    }
    return y;
}
inline Vec nv_rms_norm(const Vec& x, const Vec& w, double eps) {
    double ms = 0;
    for (double v : x) ms += v * v;
    ms /= double(x.size());
    Vec y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] / std::sqrt(ms + eps) * w[i];
    return y;
}
inline double nv_silu(double v) {
    return v / (1.0 + std::exp(-v));
}
inline double nv_gelu_tanh(double v) {
    return 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (v + 0.044715 * v * v * v)));
}
inline double nv_gelu_erf(double v) {
    return 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)));
}

/// softmax(q·k / sqrt(d)) v for one head; keys/values are rows of `ks` / `vs` at offset `off`.
inline Vec nv_attend_head(const Vec& q, const std::vector<Vec>& ks, const std::vector<Vec>& vs, size_t off,
                          size_t d) {
    std::vector<double> s(ks.size());
    double mx = -1e300;
    for (size_t j = 0; j < ks.size(); ++j) {
        double dot = 0;
        for (size_t i = 0; i < d; ++i) dot += q[off + i] * ks[j][off + i];
        s[j] = dot / std::sqrt(double(d));
        mx = std::max(mx, s[j]);
    }
    double sum = 0;
    for (auto& v : s) sum += (v = std::exp(v - mx));
    Vec o(d, 0.0);
    for (size_t j = 0; j < ks.size(); ++j)
        for (size_t i = 0; i < d; ++i) o[i] += s[j] / sum * vs[j][off + i];
    return o;
}

/// Multi-head attention of every query row over all key rows.
inline std::vector<Vec> nv_attention(const std::vector<Vec>& qs, const std::vector<Vec>& ks,
                                     const std::vector<Vec>& vs, int heads) {
    const size_t C = qs[0].size(), d = C / size_t(heads);
    std::vector<Vec> out;
    for (const Vec& q : qs) {
        Vec o(C);
        for (int h = 0; h < heads; ++h) {
            const Vec oh = nv_attend_head(q, ks, vs, size_t(h) * d, d);
            std::copy(oh.begin(), oh.end(), o.begin() + ptrdiff_t(size_t(h) * d));
        }
        out.push_back(o);
    }
    return out;
}

/// Rotate interleaved pairs of every head of `x` by the given per-pair angles.
inline Vec nv_rotate(const Vec& x, const std::vector<double>& angles, int heads) {
    const size_t d = x.size() / size_t(heads);
    Vec y = x;
    for (int h = 0; h < heads; ++h)
        for (size_t j = 0; j < angles.size(); ++j) {
            const size_t i = size_t(h) * d + 2 * j;
            const std::complex<double> z(x[i], x[i + 1]);
            const std::complex<double> r = z * std::polar(1.0, angles[j]);
            y[i] = r.real();
            y[i + 1] = r.imag();
        }
    return y;
}

/// The naive DiT: context from scratch every forward, per-token time embedding, full history.
struct NaiveDit {
    const DitConfig& c;
    NaiveWeights w;
    int gh, gw;
    std::vector<std::vector<Vec>> k_hist, v_hist;                // [layer][token] -> C
    std::map<std::string, std::vector<std::vector<Vec>>> trace;  // name -> [layer][token] (last forward)

    NaiveDit(const DitConfig& cfg, const MapWeightSource& src, int latent_h, int latent_w)
        : c(cfg),
          w{src},
          gh(latent_h / 2),
          gw(latent_w / 2),
          k_hist(size_t(cfg.num_layers)),
          v_hist(size_t(cfg.num_layers)) {}

    struct Registers {
        std::vector<float> action;  // [A, action_dim]
        int64_t timestep;
        std::vector<float> state;  // [S, max_state_dim]
    };
    struct Result {
        Vec video;   // [out_dim, f, H, W]
        Vec action;  // [A, action_dim]
    };

    /// e and e0 of one token from its timestep.
    std::pair<Vec, Vec> time_embed(double t) const {
        const int half = c.freq_dim / 2;
        Vec s(size_t(c.freq_dim));
        for (int j = 0; j < half; ++j) {
            const double arg = t * std::pow(10000.0, -double(j) / half);
            s[size_t(j)] = std::cos(arg);
            s[size_t(half + j)] = std::sin(arg);
        }
        Vec h = nv_linear(w.get("time_embedding.0.weight"), w.get("time_embedding.0.bias"), s);
        for (auto& v : h) v = nv_silu(v);
        const Vec e = nv_linear(w.get("time_embedding.2.weight"), w.get("time_embedding.2.bias"), h);
        Vec se = e;
        for (auto& v : se) v = nv_silu(v);
        return {e, nv_linear(w.get("time_projection.1.weight"), w.get("time_projection.1.bias"), se)};
    }

    std::vector<Vec> text_context(const std::vector<float>& text) const {
        std::vector<Vec> out;
        const Vec W0 = w.get("text_embedding.0.weight"), b0 = w.get("text_embedding.0.bias");
        const Vec W2 = w.get("text_embedding.2.weight"), b2 = w.get("text_embedding.2.bias");
        for (int r = 0; r < c.text_len; ++r) {
            Vec x(text.begin() + ptrdiff_t(r) * c.text_dim, text.begin() + ptrdiff_t(r + 1) * c.text_dim);
            Vec h = nv_linear(W0, b0, x);
            for (auto& v : h) v = nv_gelu_tanh(v);
            out.push_back(nv_linear(W2, b2, h));
        }
        return out;
    }

    std::vector<Vec> image_context(const std::vector<float>& clip, int tokens) const {
        std::vector<Vec> out;
        const Vec g0 = w.get("img_emb.proj.0.weight"), b0 = w.get("img_emb.proj.0.bias");
        const Vec g4 = w.get("img_emb.proj.4.weight"), b4 = w.get("img_emb.proj.4.bias");
        for (int r = 0; r < tokens; ++r) {
            Vec x(clip.begin() + ptrdiff_t(r) * c.image_dim, clip.begin() + ptrdiff_t(r + 1) * c.image_dim);
            Vec h = nv_linear(w.get("img_emb.proj.1.weight"), w.get("img_emb.proj.1.bias"),
                              nv_layer_norm(x, 1e-5, &g0, &b0));
            for (auto& v : h) v = nv_gelu_erf(v);
            out.push_back(nv_layer_norm(
                nv_linear(w.get("img_emb.proj.3.weight"), w.get("img_emb.proj.3.bias"), h), 1e-5, &g4, &b4));
        }
        return out;
    }

    /// Cross-attention of layer li for queries built from `xs` (the residual stream after self-attention).
    std::vector<Vec> cross_attention(int li, const std::vector<Vec>& xs, const std::vector<Vec>& ctx_txt,
                                     const std::vector<Vec>& ctx_img) const {
        const std::string b = "blocks." + std::to_string(li) + ".";
        const Vec n3w = w.get(b + "norm3.weight"), n3b = w.get(b + "norm3.bias");
        auto proj = [&](const std::string& n, const std::vector<Vec>& rows, const char* norm) {
            std::vector<Vec> out;
            for (const Vec& r : rows) {
                Vec y = nv_linear(w.get(b + "cross_attn." + n + ".weight"),
                                  w.get(b + "cross_attn." + n + ".bias"), r);
                if (norm) y = nv_rms_norm(y, w.get(b + "cross_attn." + norm + ".weight"), c.eps);
                out.push_back(y);
            }
            return out;
        };
        std::vector<Vec> n3;
        for (const Vec& x : xs) n3.push_back(nv_layer_norm(x, c.eps, &n3w, &n3b));
        const std::vector<Vec> q = proj("q", n3, "norm_q");
        const std::vector<Vec> o_t =
            nv_attention(q, proj("k", ctx_txt, "norm_k"), proj("v", ctx_txt, nullptr), c.num_heads);
        const std::vector<Vec> o_i = nv_attention(q, proj("k_img", ctx_img, "norm_k_img"),
                                                  proj("v_img", ctx_img, nullptr), c.num_heads);
        std::vector<Vec> out;
        for (size_t t = 0; t < xs.size(); ++t) {
            Vec s(o_t[t].size());
            for (size_t i = 0; i < s.size(); ++i) s[i] = o_t[t][i] + o_i[t][i];
            out.push_back(nv_linear(w.get(b + "cross_attn.o.weight"), w.get(b + "cross_attn.o.bias"), s));
        }
        return out;
    }

    /// RoPE angles of a video token (3 bands) and of register token r of block index k.
    std::vector<double> video_angles(int frame, int hi, int wi) const {
        const int d = c.dim / c.num_heads;
        const int hw = 2 * (d / 6), t = d - 2 * hw;
        std::vector<double> a;
        for (int j = 0; j < t / 2; ++j) a.push_back(frame * std::pow(10000.0, -2.0 * j / t));
        for (int j = 0; j < hw / 2; ++j) a.push_back(hi * std::pow(10000.0, -2.0 * j / hw));
        for (int j = 0; j < hw / 2; ++j) a.push_back(wi * std::pow(10000.0, -2.0 * j / hw));
        return a;
    }
    std::vector<double> register_angles(int k, int r) const {
        const int d = c.dim / c.num_heads;
        const int pos = r < c.num_action_per_block ? k * c.num_action_per_block + r
                                                   : k * c.num_state_per_block + (r - c.num_action_per_block);
        std::vector<double> a;
        for (int j = 0; j < d / 2; ++j) a.push_back(pos * std::pow(10000.0, -2.0 * j / d));
        return a;
    }

    Result forward(const std::vector<float>& x, const std::vector<float>& y, int frames, int start_frame,
                   int64_t timestep, const std::optional<Registers>& regs, const std::vector<float>& clip,
                   const std::vector<float>& text, bool commit) {
        trace.clear();
        const int C = c.dim, H8 = 2 * gh, W8 = 2 * gw, Lv = frames * gh * gw;
        const int A = regs ? c.num_action_per_block : 0, S = regs ? c.num_state_per_block : 0;
        const std::vector<Vec> ctx_txt = text_context(text), ctx_img = image_context(clip, kTinyImageTokens);

        // patch embedding: a Conv3d with kernel = stride = (1, 2, 2) on cat[x, y]
        const Vec pw = w.get("patch_embedding.weight"), pb = w.get("patch_embedding.bias");
        auto in_at = [&](int ch, int fi, int r, int col) -> double {
            const size_t plane = size_t(fi) * H8 * W8 + size_t(r) * W8 + size_t(col);
            return ch < c.out_dim ? x[size_t(ch) * frames * H8 * W8 + plane]
                                  : y[size_t(ch - c.out_dim) * frames * H8 * W8 + plane];
        };
        std::vector<Vec> xs;
        std::vector<double> tok_t;
        for (int fi = 0; fi < frames; ++fi)
            for (int hi = 0; hi < gh; ++hi)
                for (int wi = 0; wi < gw; ++wi) {
                    Vec v(pb.begin(), pb.end());
                    for (int co = 0; co < C; ++co)
                        for (int ci = 0; ci < c.in_dim; ++ci)
                            for (int q = 0; q < 2; ++q)
                                for (int r = 0; r < 2; ++r)
                                    v[size_t(co)] += pw[((size_t(co) * c.in_dim + ci) * 2 + q) * 2 + r] *
                                                     in_at(ci, fi, 2 * hi + q, 2 * wi + r);
                    xs.push_back(v);
                    tok_t.push_back(double(timestep));
                }
        if (regs) {
            // action encoder: W3 swish(W2 [W1 a, tau]) with tau = [sin, cos]
            const int half = C / 2;
            for (int a = 0; a < A; ++a) {
                Vec act(regs->action.begin() + ptrdiff_t(a) * c.action_dim,
                        regs->action.begin() + ptrdiff_t(a + 1) * c.action_dim);
                Vec cat = nv_xw(w.get("action_encoder.W1.W"), w.get("action_encoder.W1.b"), act);
                for (int j = 0; j < half; ++j)
                    cat.push_back(std::sin(double(regs->timestep) * std::exp(-j * std::log(10000.0) / half)));
                for (int j = 0; j < half; ++j)
                    cat.push_back(std::cos(double(regs->timestep) * std::exp(-j * std::log(10000.0) / half)));
                Vec h = nv_xw(w.get("action_encoder.W2.W"), w.get("action_encoder.W2.b"), cat);
                for (auto& v : h) v = nv_silu(v);
                xs.push_back(nv_xw(w.get("action_encoder.W3.W"), w.get("action_encoder.W3.b"), h));
                tok_t.push_back(double(regs->timestep));
            }
            for (int s = 0; s < S; ++s) {
                Vec st(regs->state.begin() + ptrdiff_t(s) * c.max_state_dim,
                       regs->state.begin() + ptrdiff_t(s + 1) * c.max_state_dim);
                Vec h = nv_xw(w.get("state_encoder.layer1.W"), w.get("state_encoder.layer1.b"), st);
                for (auto& v : h) v = std::max(v, 0.0);
                xs.push_back(nv_xw(w.get("state_encoder.layer2.W"), w.get("state_encoder.layer2.b"), h));
                tok_t.push_back(double(regs->timestep));
            }
        }
        const int L = int(xs.size());
        std::vector<Vec> es, e0s;
        for (int t = 0; t < L; ++t) {
            auto [e, e0] = time_embed(tok_t[size_t(t)]);
            es.push_back(e);
            e0s.push_back(e0);
        }
        trace["time_e0"] = {e0s};

        std::vector<std::vector<double>> angles;
        for (int fi = 0; fi < frames; ++fi)
            for (int hi = 0; hi < gh; ++hi)
                for (int wi = 0; wi < gw; ++wi) angles.push_back(video_angles(start_frame + fi, hi, wi));
        for (int r = 0; r < A + S; ++r)
            angles.push_back(register_angles((start_frame - 1) / c.num_frame_per_block, r));

        for (int li = 0; li < c.num_layers; ++li) {
            const std::string b = "blocks." + std::to_string(li) + ".";
            const Vec mod = w.get(b + "modulation");
            auto m = [&](int t, int i, int ch) {
                return mod[size_t(i * C + ch)] + e0s[size_t(t)][size_t(i * C + ch)];
            };
            // self-attention
            std::vector<Vec> qs, ks, vs;
            for (int t = 0; t < L; ++t) {
                Vec h = nv_layer_norm(xs[size_t(t)], c.eps);
                for (int ch = 0; ch < C; ++ch)
                    h[size_t(ch)] = h[size_t(ch)] * (1 + m(t, 1, ch)) + m(t, 0, ch);
                Vec q =
                    nv_rms_norm(nv_linear(w.get(b + "self_attn.q.weight"), w.get(b + "self_attn.q.bias"), h),
                                w.get(b + "self_attn.norm_q.weight"), c.eps);
                Vec k =
                    nv_rms_norm(nv_linear(w.get(b + "self_attn.k.weight"), w.get(b + "self_attn.k.bias"), h),
                                w.get(b + "self_attn.norm_k.weight"), c.eps);
                qs.push_back(nv_rotate(q, angles[size_t(t)], c.num_heads));
                ks.push_back(nv_rotate(k, angles[size_t(t)], c.num_heads));
                vs.push_back(nv_linear(w.get(b + "self_attn.v.weight"), w.get(b + "self_attn.v.bias"), h));
            }
            std::vector<Vec> keys = k_hist[size_t(li)], vals = v_hist[size_t(li)];
            keys.insert(keys.end(), ks.begin(), ks.end());
            vals.insert(vals.end(), vs.begin(), vs.end());
            const std::vector<Vec> att = nv_attention(qs, keys, vals, c.num_heads);
            if (commit) {
                k_hist[size_t(li)].insert(k_hist[size_t(li)].end(), ks.begin(), ks.begin() + Lv);
                v_hist[size_t(li)].insert(v_hist[size_t(li)].end(), vs.begin(), vs.begin() + Lv);
            }
            for (int t = 0; t < L; ++t) {
                const Vec o =
                    nv_linear(w.get(b + "self_attn.o.weight"), w.get(b + "self_attn.o.bias"), att[size_t(t)]);
                for (int ch = 0; ch < C; ++ch) xs[size_t(t)][size_t(ch)] += m(t, 2, ch) * o[size_t(ch)];
            }
            trace["x_self"].push_back(xs);
            // cross-attention (no modulation, no gate)
            const std::vector<Vec> ca = cross_attention(li, xs, ctx_txt, ctx_img);
            for (int t = 0; t < L; ++t)
                for (int ch = 0; ch < C; ++ch) xs[size_t(t)][size_t(ch)] += ca[size_t(t)][size_t(ch)];
            trace["cross_attn"].push_back(ca);
            // feed-forward
            for (int t = 0; t < L; ++t) {
                Vec h = nv_layer_norm(xs[size_t(t)], c.eps);
                for (int ch = 0; ch < C; ++ch)
                    h[size_t(ch)] = h[size_t(ch)] * (1 + m(t, 4, ch)) + m(t, 3, ch);
                Vec f1 = nv_linear(w.get(b + "ffn.0.weight"), w.get(b + "ffn.0.bias"), h);
                for (auto& v : f1) v = nv_gelu_tanh(v);
                const Vec f2 = nv_linear(w.get(b + "ffn.2.weight"), w.get(b + "ffn.2.bias"), f1);
                for (int ch = 0; ch < C; ++ch) xs[size_t(t)][size_t(ch)] += m(t, 5, ch) * f2[size_t(ch)];
            }
            trace["layer_out"].push_back(xs);
        }

        Result res;
        // head on video tokens with e (not e0), then unpatchify: out[c, fi, 2hi+q, 2wi+r]
        const Vec hm = w.get("head.modulation");
        res.video.assign(size_t(c.out_dim) * frames * H8 * W8, 0.0);
        for (int t = 0; t < Lv; ++t) {
            Vec h = nv_layer_norm(xs[size_t(t)], c.eps);
            for (int ch = 0; ch < C; ++ch)
                h[size_t(ch)] = h[size_t(ch)] * (1 + hm[size_t(C + ch)] + es[size_t(t)][size_t(ch)]) +
                                hm[size_t(ch)] + es[size_t(t)][size_t(ch)];
            const Vec o = nv_linear(w.get("head.head.weight"), w.get("head.head.bias"), h);
            const int fi = t / (gh * gw), hi = (t / gw) % gh, wi = t % gw;
            for (int q = 0; q < 2; ++q)
                for (int r = 0; r < 2; ++r)
                    for (int ch = 0; ch < c.out_dim; ++ch)
                        res.video[((size_t(ch) * frames + fi) * H8 + 2 * hi + q) * W8 + 2 * wi + r] =
                            o[size_t((q * 2 + r) * c.out_dim + ch)];
        }
        for (int a = 0; a < A; ++a) {  // action decoder, no final norm
            Vec h =
                nv_xw(w.get("action_decoder.layer1.W"), w.get("action_decoder.layer1.b"), xs[size_t(Lv + a)]);
            for (auto& v : h) v = std::max(v, 0.0);
            const Vec o = nv_xw(w.get("action_decoder.layer2.W"), w.get("action_decoder.layer2.b"), h);
            res.action.insert(res.action.end(), o.begin(), o.end());
        }
        return res;
    }
};

/// max |a − b| over max |b| (+ a floor), for comparing f32 results with the double reference.
inline double rel_max_err(const std::vector<float>& got, const Vec& ref) {
    DZR_ASSERT(got.size() == ref.size());
    double err = 0, mag = 1e-6;
    for (size_t i = 0; i < got.size(); ++i) {
        err = std::max(err, std::abs(double(got[i]) - ref[i]));
        mag = std::max(mag, std::abs(ref[i]));
    }
    return err / mag;
}

}  // namespace dzr::test
