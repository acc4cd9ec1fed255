#pragma once
/// Shared pieces of the VAE tests: an in-memory WeightSource with random weights under the real key
/// names (from the weights inventory), a tiny-geometry harness, a no-op measuring backend, and an
/// independent naive re-computation of the reference VAE in double precision. The naive model is a
/// literal transcription of VAE.py's chunk loop (frame 0, then 4 frames; per-conv feat_cache with
/// its 'Rep' marker), written from dreamzero-reference.md §2.3 and the reference code, not from
/// lib/model.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/measuring_backend.h"
#include "core/error.h"
#include "core/tensor.h"
#include "model/inventory.h"
#include "model/wan_vae.h"
#include "support/test_support.h"
#include "weights/inventory.h"
#include "config/model_config.h"
#include "support/map_weight_source.h"
#include "weights/weight_source.h"

namespace dzr::test {

// ---- weights -------------------------------------------------------------------------------------

using VaeWeightSource = MapSource;  // host f32, or data-less views for measuring

/// The VAE rows of the weights inventory for this geometry.
inline std::vector<ExpectedWeight> vae_inventory(const VaeConfig& vae) {
    ModelConfig mc;
    mc.vae = vae;
    std::vector<ExpectedWeight> out;
    for (auto& w : expected_weights(mc))
        if (w.component == Component::Vae) out.push_back(std::move(w));
    return out;
}

inline uint64_t fnv1a(const std::string& s) {
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
    return h;
}

/// Random weights under the real keys: conv/linear weights uniform with variance 1/fan_in, biases in
/// [-0.1, 0.1), norm gammas in [0.8, 1.2) (not 1, so a missing gamma shows).
inline VaeWeightSource random_vae_weights(const VaeConfig& vae, uint64_t seed) {
    VaeWeightSource src;
    for (const auto& w : vae_inventory(vae)) {
        const size_t n = size_t(w.shape.numel());
        const uint64_t s = seed ^ fnv1a(w.key);
        const bool gamma = w.key.size() >= 5 && w.key.compare(w.key.size() - 5, 5, "gamma") == 0;
        const bool bias = w.key.size() >= 4 && w.key.compare(w.key.size() - 4, 4, "bias") == 0;
        std::vector<float> v;
        if (gamma) {
            v = random_floats(n, s, 0.8f, 1.2f);
        } else if (bias) {
            v = random_floats(n, s, -0.1f, 0.1f);
        } else {
            const double fan_in = double(w.shape.numel()) / double(w.shape[0]);
            const float a = float(std::sqrt(3.0 / fan_in));
            v = random_floats(n, s, -a, a);
        }
        src.tensors[w.key] = Tensor::host_f32(w.shape, v);
    }
    return src;
}

/// The tiny geometry of the tests: base_dim 4 (channels 4/8/16), z 16, the real layout otherwise.
inline VaeConfig tiny_vae_config(int base_dim = 4) {
    VaeConfig c;
    c.base_dim = base_dim;
    return c;
}

/// A CPU backend, random weights and the loaded VAE.
struct TinyVae {
    std::unique_ptr<Backend> be = make_cpu_backend(size_t(256) << 20);
    VaeConfig config;
    VaeWeightSource source;
    std::unique_ptr<WeightLoader> loader;
    std::unique_ptr<WanVae> vae;

    explicit TinyVae(VaeConfig cfg = tiny_vae_config(), uint64_t seed = 7)
        : config(cfg), source(random_vae_weights(cfg, seed)) {
        loader = std::make_unique<WeightLoader>(source, *be);
        vae = std::make_unique<WanVae>(*loader, config);
    }
};

/// A clip in [-1, 1): [3, T, H, W].
inline Tensor random_video(int64_t T, int64_t H, int64_t W, uint64_t seed) {
    return Tensor::host_f32(Shape{3, T, H, W}, random_floats(size_t(3 * T * H * W), seed));
}

inline bool bit_equal(const TensorView& a, const TensorView& b) {
    if (a.shape != b.shape) return false;
    const std::vector<float> x = to_f32_vector(a), y = to_f32_vector(b);
    for (size_t i = 0; i < x.size(); ++i)
        if (std::memcmp(&x[i], &y[i], sizeof(float)) != 0) return false;
    return true;
}

// ---- a backend that only measures ----------------------------------------------------------------

/// Runs a forward without computing anything: weights and activations have no memory and every op is
/// a no-op. The workspace's high-water mark is the workspace a real backend of the same compute dtype
/// needs.
inline void* fake_address() { return MeasuringBackend::fake_address(); }

/// Data-less weights with the inventory's shapes (for the MeasuringBackend).
inline VaeWeightSource shape_only_vae_weights(const VaeConfig& vae) {
    VaeWeightSource src;
    for (const auto& w : vae_inventory(vae))
        src.tensors[w.key] = Tensor(nullptr, TensorView(fake_address(), DType::BF16, w.shape, Device::cpu()));
    return src;
}

// ---- naive reference in double -------------------------------------------------------------------

/// A [C, T, H, W] volume in double.
struct Vol {
    int64_t C = 0, T = 0, H = 0, W = 0;
    std::vector<double> v;

    Vol() = default;
    Vol(int64_t c, int64_t t, int64_t h, int64_t w) : C(c), T(t), H(h), W(w), v(size_t(c * t * h * w), 0.0) {}
    double& at(int64_t c, int64_t t, int64_t h, int64_t w) {
        return v[size_t(((c * T + t) * H + h) * W + w)];
    }
    double at(int64_t c, int64_t t, int64_t h, int64_t w) const {
        return v[size_t(((c * T + t) * H + h) * W + w)];
    }
};

inline Vol vol_from(const TensorView& host) {
    Vol x(host.dim(0), host.dim(1), host.dim(2), host.dim(3));
    const std::vector<float> f = to_f32_vector(host);
    for (size_t i = 0; i < f.size(); ++i) x.v[i] = f[i];
    return x;
}

/// Frames [t0, t0 + n).
inline Vol frames_of(const Vol& x, int64_t t0, int64_t n) {
    Vol y(x.C, n, x.H, x.W);
    for (int64_t c = 0; c < x.C; ++c)
        for (int64_t t = 0; t < n; ++t)
            for (int64_t h = 0; h < x.H; ++h)
                for (int64_t w = 0; w < x.W; ++w) y.at(c, t, h, w) = x.at(c, t0 + t, h, w);
    return y;
}

/// Concatenation along time.
inline Vol cat_time(const Vol& a, const Vol& b) {
    if (a.T == 0) return b;
    Vol y(a.C, a.T + b.T, a.H, a.W);
    for (int64_t c = 0; c < a.C; ++c)
        for (int64_t t = 0; t < y.T; ++t)
            for (int64_t h = 0; h < a.H; ++h)
                for (int64_t w = 0; w < a.W; ++w)
                    y.at(c, t, h, w) = t < a.T ? a.at(c, t, h, w) : b.at(c, t - a.T, h, w);
    return y;
}

/// Plain zero-padded 3-D convolution: w [Co, Ci, kt, kh, kw] (row-major floats), bias [Co].
inline Vol conv3d_ref(const Vol& x, const std::vector<float>& w, const std::vector<float>& bias, int64_t Co,
                      std::array<int, 3> k, std::array<int, 3> stride, std::array<int, 3> pad_before,
                      std::array<int, 3> pad_after) {
    const int64_t To = (x.T + pad_before[0] + pad_after[0] - k[0]) / stride[0] + 1;
    const int64_t Ho = (x.H + pad_before[1] + pad_after[1] - k[1]) / stride[1] + 1;
    const int64_t Wo = (x.W + pad_before[2] + pad_after[2] - k[2]) / stride[2] + 1;
    Vol y(Co, std::max<int64_t>(To, 0), Ho, Wo);
    for (int64_t o = 0; o < Co; ++o)
        for (int64_t t = 0; t < y.T; ++t)
            for (int64_t h = 0; h < Ho; ++h)
                for (int64_t ww = 0; ww < Wo; ++ww) {
                    double acc = bias.empty() ? 0.0 : bias[size_t(o)];
                    for (int64_t ci = 0; ci < x.C; ++ci)
                        for (int a = 0; a < k[0]; ++a)
                            for (int b = 0; b < k[1]; ++b)
                                for (int c = 0; c < k[2]; ++c) {
                                    const int64_t it = t * stride[0] - pad_before[0] + a;
                                    const int64_t ih = h * stride[1] - pad_before[1] + b;
                                    const int64_t iw = ww * stride[2] - pad_before[2] + c;
                                    if (it < 0 || it >= x.T || ih < 0 || ih >= x.H || iw < 0 || iw >= x.W)
                                        continue;
                                    acc +=
                                        double(
                                            w[size_t((((o * x.C + ci) * k[0] + a) * k[1] + b) * k[2] + c)]) *
                                        x.at(ci, it, ih, iw);
                                }
                    y.at(o, t, h, ww) = acc;
                }
    return y;
}

/// F.normalize(x, dim=channels) * sqrt(C) * gamma.
inline Vol rms_ref(const Vol& x, const std::vector<float>& gamma) {
    Vol y = x;
    for (int64_t t = 0; t < x.T; ++t)
        for (int64_t h = 0; h < x.H; ++h)
            for (int64_t w = 0; w < x.W; ++w) {
                double ss = 0;
                for (int64_t c = 0; c < x.C; ++c) ss += x.at(c, t, h, w) * x.at(c, t, h, w);
                const double denom = std::max(std::sqrt(ss), 1e-12);
                for (int64_t c = 0; c < x.C; ++c)
                    y.at(c, t, h, w) = x.at(c, t, h, w) / denom * std::sqrt(double(x.C)) * gamma[size_t(c)];
            }
    return y;
}

inline Vol silu_ref(Vol x) {
    for (double& a : x.v) a = a / (1.0 + std::exp(-a));
    return x;
}

inline Vol add_ref(Vol a, const Vol& b) {
    for (size_t i = 0; i < a.v.size(); ++i) a.v[i] += b.v[i];
    return a;
}

/// Single-head attention over the H*W tokens of each frame (AttentionBlock), prefix = module path.
inline Vol attention_block_ref(const Vol& x, const VaeWeightSource& src, const std::string& p) {
    const int64_t C = x.C, L = x.H * x.W;
    const Vol xn = rms_ref(x, src.values(p + "norm.gamma"));
    const std::vector<float> wq = src.values(p + "to_qkv.weight"), bq = src.values(p + "to_qkv.bias");
    const std::vector<float> wp = src.values(p + "proj.weight"), bp = src.values(p + "proj.bias");
    Vol y = x;
    for (int64_t t = 0; t < x.T; ++t) {
        // qkv[l][j] = sum_c wq[j, c] xn[c, l] + bq[j]; q = cols [0, C), k = [C, 2C), v = [2C, 3C)
        std::vector<double> qkv(size_t(L * 3 * C));
        for (int64_t l = 0; l < L; ++l)
            for (int64_t j = 0; j < 3 * C; ++j) {
                double acc = bq[size_t(j)];
                for (int64_t c = 0; c < C; ++c)
                    acc += double(wq[size_t(j * C + c)]) * xn.at(c, t, l / x.W, l % x.W);
                qkv[size_t(l * 3 * C + j)] = acc;
            }
        std::vector<double> o(size_t(L * C), 0.0);
        for (int64_t i = 0; i < L; ++i) {
            std::vector<double> s(static_cast<size_t>(L));
            double mx = -INFINITY;
            for (int64_t j = 0; j < L; ++j) {
                double d = 0;
                for (int64_t c = 0; c < C; ++c)
                    d += qkv[size_t(i * 3 * C + c)] * qkv[size_t(j * 3 * C + C + c)];
                s[size_t(j)] = d / std::sqrt(double(C));
                mx = std::max(mx, s[size_t(j)]);
            }
            double sum = 0;
            for (auto& e : s) sum += (e = std::exp(e - mx));
            for (int64_t j = 0; j < L; ++j)
                for (int64_t c = 0; c < C; ++c)
                    o[size_t(i * C + c)] += s[size_t(j)] / sum * qkv[size_t(j * 3 * C + 2 * C + c)];
        }
        for (int64_t c = 0; c < C; ++c)
            for (int64_t l = 0; l < L; ++l) {
                double acc = bp[size_t(c)];
                for (int64_t k = 0; k < C; ++k) acc += double(wp[size_t(c * C + k)]) * o[size_t(l * C + k)];
                y.at(c, t, l / x.W, l % x.W) += acc;
            }
    }
    return y;
}

/// The literal reference VAE (VideoVAE_.encode / decode with feat_cache), in double.
class RefVae {
  public:
    RefVae(const VaeWeightSource& src, const VaeConfig& cfg) : src_(src), cfg_(cfg) {}

    /// VideoVAE_.encode: frame 0, then chunks of 4, feat_cache shared; conv1; mu; (mu - mean) * (1/std).
    Vol encode(const Vol& video) {
        cache_.assign(256, Entry{});
        const int64_t iters = 1 + (video.T - 1) / 4;
        Vol out;
        for (int64_t i = 0; i < iters; ++i) {
            idx_ = 0;
            const Vol chunk = i == 0 ? frames_of(video, 0, 1) : frames_of(video, 1 + 4 * (i - 1), 4);
            out = cat_time(out, encoder(chunk));
        }
        const int z = cfg_.z_dim;
        const Vol moments =
            conv(out, "action_head.vae.model.conv1.", 2 * z, {1, 1, 1}, {1, 1, 1}, {0, 0, 0}, {0, 0, 0});
        Vol mu = frames_of(moments, 0, moments.T);
        mu.C = z;
        mu.v.resize(size_t(z * mu.T * mu.H * mu.W));
        for (int64_t c = 0; c < z; ++c) {
            const double inv = double(1.0f / WanVae::kLatentStd[size_t(c)]);
            for (int64_t t = 0; t < mu.T; ++t)
                for (int64_t h = 0; h < mu.H; ++h)
                    for (int64_t w = 0; w < mu.W; ++w)
                        mu.at(c, t, h, w) = (mu.at(c, t, h, w) - WanVae::kLatentMean[size_t(c)]) * inv;
        }
        return mu;
    }

    /// VideoVAE_.decode + clamp: z / (1/std) + mean; conv2; one latent frame per chunk.
    Vol decode(Vol z) {
        cache_.assign(256, Entry{});
        for (int64_t c = 0; c < z.C; ++c) {
            const double inv = double(1.0f / WanVae::kLatentStd[size_t(c)]);
            for (int64_t t = 0; t < z.T; ++t)
                for (int64_t h = 0; h < z.H; ++h)
                    for (int64_t w = 0; w < z.W; ++w)
                        z.at(c, t, h, w) = z.at(c, t, h, w) / inv + WanVae::kLatentMean[size_t(c)];
        }
        const Vol x =
            conv(z, "action_head.vae.model.conv2.", z.C, {1, 1, 1}, {1, 1, 1}, {0, 0, 0}, {0, 0, 0});
        Vol out;
        for (int64_t i = 0; i < x.T; ++i) {
            idx_ = 0;
            out = cat_time(out, decoder(frames_of(x, i, 1)));
        }
        for (double& a : out.v) a = std::min(1.0, std::max(-1.0, a));
        return out;
    }

  private:
    struct Entry {
        enum Kind { None, Rep, Frames } kind = None;
        Vol t;
    };

    Vol conv(const Vol& x, const std::string& p, int64_t co, std::array<int, 3> k, std::array<int, 3> stride,
             std::array<int, 3> pb, std::array<int, 3> pa) const {
        return conv3d_ref(x, src_.values(p + "weight"), src_.values(p + "bias"), co, k, stride, pb, pa);
    }

    int64_t out_ch(const std::string& p) const { return src_.tensors.at(p + "weight").shape()[0]; }

    /// CausalConv3d.forward(x, cache_x): kernel k, padding (pt, ph, pw).
    Vol causal(Vol x, const Entry* cache, const std::string& p, std::array<int, 3> k,
               std::array<int, 3> pad) const {
        int pt = 2 * pad[0];
        if (cache && cache->kind == Entry::Frames && pt > 0) {
            pt -= int(cache->t.T);
            x = cat_time(cache->t, x);
        }
        return conv(x, p, out_ch(p), k, {1, 1, 1}, {pt, pad[1], pad[2]}, {0, pad[1], pad[2]});
    }

    /// The `cache_x = x[:, :, -2:] (+ previous last frame)` / conv / store pattern of the 3x3x3 convs.
    Vol cached_conv3(const Vol& x, const std::string& p) {
        Entry& e = cache_[size_t(idx_)];
        Vol cache_x = frames_of(x, std::max<int64_t>(0, x.T - 2), std::min<int64_t>(2, x.T));
        if (cache_x.T < 2 && e.kind != Entry::None) cache_x = cat_time(frames_of(e.t, e.t.T - 1, 1), cache_x);
        Vol y = causal(x, e.kind == Entry::None ? nullptr : &e, p, {3, 3, 3}, {1, 1, 1});
        e.kind = Entry::Frames;
        e.t = cache_x;
        ++idx_;
        return y;
    }

    Vol residual(const Vol& x, const std::string& p) {
        const std::string sc = p + "shortcut.";
        const Vol h = src_.tensors.count(sc + "weight")
                          ? conv(x, sc, out_ch(sc), {1, 1, 1}, {1, 1, 1}, {0, 0, 0}, {0, 0, 0})
                          : x;
        Vol y = silu_ref(rms_ref(x, src_.values(p + "residual.0.gamma")));
        y = cached_conv3(y, p + "residual.2.");
        y = silu_ref(rms_ref(y, src_.values(p + "residual.3.gamma")));
        y = cached_conv3(y, p + "residual.6.");
        return add_ref(y, h);
    }

    /// Per frame: ZeroPad2d((0,1,0,1)) + Conv2d(3, stride 2), or nearest x2 + Conv2d(3, pad 1).
    Vol spatial(const Vol& x, const std::string& p, bool up) const {
        const std::vector<float> w = src_.values(p + "resample.1.weight"),
                                 b = src_.values(p + "resample.1.bias");
        const int64_t co = src_.tensors.at(p + "resample.1.weight").shape()[0];
        if (!up) return conv3d_ref(x, w, b, co, {1, 3, 3}, {1, 2, 2}, {0, 0, 0}, {0, 1, 1});
        Vol u(x.C, x.T, 2 * x.H, 2 * x.W);
        for (int64_t c = 0; c < x.C; ++c)
            for (int64_t t = 0; t < x.T; ++t)
                for (int64_t h = 0; h < u.H; ++h)
                    for (int64_t ww = 0; ww < u.W; ++ww) u.at(c, t, h, ww) = x.at(c, t, h / 2, ww / 2);
        return conv3d_ref(u, w, b, co, {1, 3, 3}, {1, 1, 1}, {0, 1, 1}, {0, 1, 1});
    }

    Vol down3d(const Vol& x, const std::string& p) {
        Vol y = spatial(x, p, false);
        Entry& e = cache_[size_t(idx_++)];
        if (e.kind == Entry::None) {
            e.kind = Entry::Frames;
            e.t = y;
            return y;
        }
        const Vol cache_x = frames_of(y, y.T - 1, 1);
        y = conv(cat_time(frames_of(e.t, e.t.T - 1, 1), y), p + "time_conv.", x.C, {3, 1, 1}, {2, 1, 1},
                 {0, 0, 0}, {0, 0, 0});
        e.t = cache_x;
        return y;
    }

    Vol up3d(Vol x, const std::string& p) {
        Entry& e = cache_[size_t(idx_++)];
        if (e.kind == Entry::None) {
            e.kind = Entry::Rep;
        } else {
            Vol cache_x = frames_of(x, std::max<int64_t>(0, x.T - 2), std::min<int64_t>(2, x.T));
            if (cache_x.T < 2 && e.kind != Entry::Rep)
                cache_x = cat_time(frames_of(e.t, e.t.T - 1, 1), cache_x);
            if (cache_x.T < 2 && e.kind == Entry::Rep) cache_x = cat_time(Vol(x.C, 1, x.H, x.W), cache_x);
            const Vol tc =
                causal(x, e.kind == Entry::Rep ? nullptr : &e, p + "time_conv.", {3, 1, 1}, {1, 0, 0});
            e.kind = Entry::Frames;
            e.t = cache_x;
            // [2C, T] -> reshape (2, C, T) -> stack on a new axis after T -> [C, 2T]
            Vol d(x.C, 2 * x.T, x.H, x.W);
            for (int64_t c = 0; c < x.C; ++c)
                for (int64_t t = 0; t < x.T; ++t)
                    for (int s = 0; s < 2; ++s)
                        for (int64_t h = 0; h < x.H; ++h)
                            for (int64_t w = 0; w < x.W; ++w)
                                d.at(c, 2 * t + s, h, w) = tc.at(s * x.C + c, t, h, w);
            x = d;
        }
        return spatial(x, p, true);
    }

    Vol head(const Vol& x, const std::string& p) {
        const Vol y = silu_ref(rms_ref(x, src_.values(p + "head.0.gamma")));
        return cached_conv3(y, p + "head.2.");
    }

    /// Encoder3d.forward for one chunk.
    Vol encoder(const Vol& chunk) {
        const std::string p = "action_head.vae.model.encoder.";
        Vol x = cached_conv3(chunk, p + "conv1.");
        const int stages = int(cfg_.dim_mult.size());
        int idx = 0;
        for (int i = 0; i < stages; ++i) {
            for (int r = 0; r < cfg_.num_res_blocks; ++r)
                x = residual(x, p + "downsamples." + std::to_string(idx++) + ".");
            if (i != stages - 1) {
                const std::string rp = p + "downsamples." + std::to_string(idx++) + ".";
                x = cfg_.temporal_downsample[size_t(i)] ? down3d(x, rp) : spatial(x, rp, false);
            }
        }
        x = residual(x, p + "middle.0.");
        x = attention_block_ref(x, src_, p + "middle.1.");
        x = residual(x, p + "middle.2.");
        return head(x, p);
    }

    /// Decoder3d.forward for one latent frame.
    Vol decoder(const Vol& chunk) {
        const std::string p = "action_head.vae.model.decoder.";
        Vol x = cached_conv3(chunk, p + "conv1.");
        x = residual(x, p + "middle.0.");
        x = attention_block_ref(x, src_, p + "middle.1.");
        x = residual(x, p + "middle.2.");
        const int stages = int(cfg_.dim_mult.size());
        int idx = 0;
        for (int i = 0; i < stages; ++i) {
            for (int r = 0; r < cfg_.num_res_blocks + 1; ++r)
                x = residual(x, p + "upsamples." + std::to_string(idx++) + ".");
            if (i != stages - 1) {
                const std::string rp = p + "upsamples." + std::to_string(idx++) + ".";
                // temperal_upsample = temperal_downsample[::-1]
                x = cfg_.temporal_downsample[size_t(stages - 2 - i)] ? up3d(x, rp) : spatial(x, rp, true);
            }
        }
        return head(x, p);
    }

    const VaeWeightSource& src_;
    VaeConfig cfg_;
    std::vector<Entry> cache_;
    int idx_ = 0;
};

/// Largest |a - b| over two same-sized float / double sequences.
inline double max_abs_diff(const std::vector<float>& a, const Vol& b) {
    double m = 0;
    for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double(a[i]) - b.v[i]));
    return m;
}

inline double max_abs(const Vol& b) {
    double m = 0;
    for (double x : b.v) m = std::max(m, std::abs(x));
    return m;
}

}  // namespace dzr::test
