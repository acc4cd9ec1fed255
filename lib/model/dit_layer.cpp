#include "model/dit_layer.h"

#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"

namespace dzr {

TensorView mod_vec(const TensorView& mod, int g, int i) {
    return mod.slice(0, g, 1).slice(1, i, 1).reshape(Shape{mod.dim(2)});
}

TensorView mod_vecs(const TensorView& mod, int i) {
    const int64_t G = mod.dim(0), C = mod.dim(2);
    char* base = static_cast<char*>(mod.data) + size_t(i) * size_t(C) * dtype_size(mod.dtype);
    return TensorView(base, mod.dtype, Shape{G, C}, Shape{mod.strides[0], 1}, mod.device);
}

void check_finite(Backend& be, const TensorView& t, std::string_view stage, int layer) {
    std::vector<float> host(size_t(t.numel()));
    be.download(t, TensorView(host.data(), DType::F32, t.shape));
    const int64_t cols = t.cols();
    for (size_t i = 0; i < host.size(); ++i) {
        if (std::isfinite(host[i])) continue;
        const std::string where =
            layer >= 0 ? fmt::format("{} of layer {}", stage, layer) : std::string(stage);
        DZR_THROW("causal dit: non-finite value {} in the {} output (tensor {}, row {}, column {})", host[i],
                  where, t.shape.str(), int64_t(i) / cols, int64_t(i) % cols);
    }
}

CausalDit::LayerPass::LayerPass(Backend& be_, const Step& s_, int li_, const Layer& w_, const DitForwardOptions& opt_,
                                const DitConfig& cfg_, int64_t head_dim)
    : be(be_), s(s_), li(li_), w(w_), opt(opt_), cfg(cfg_), BL(s_.x.dim(0)), L(s_.tokens), C(cfg_.dim),
      H(cfg_.num_heads), D(head_dim), Lv(s_.video_tokens), B(s_.batch),
      attn_scale(float(1.0 / std::sqrt(double(head_dim)))) {
    mod = be.scratch(Shape{s.groups, 6, C});
    be.add(s.e0, w.modulation, mod);
    h = be.scratch(Shape{BL, C});
    y = be.scratch(Shape{BL, C});
}

void CausalDit::LayerPass::block_done(std::string_view name, std::string_view stage) const {
    if (!name.empty()) trace(name, s.x);
    if (opt.check_finite) check_finite(be, s.x, stage, li);
}

void CausalDit::LayerPass::attend_self(std::span<const DitBranch> branches, const TensorView& q, const TensorView& k,
                                       const TensorView& v, const TensorView& out) const {
    trace("q", q);
    trace("k", k);
    trace("v", v);
    const int64_t rows = q.dim(0);
    const TensorView attn = be.scratch(Shape{rows, H, D});
    // NOTE: the batched branches' paged caches attend in one call (one cuDNN SDPA of batch B in fast numerics:
    // 8-13% faster than one call per branch at the DiT's shapes, docs/PERF.md, "Attention")
    std::vector<SelfAttentionCache*> caches;
    for (const DitBranch& br : branches) caches.push_back(br.cache);
    attend_branches(be, li, caches, q, k, v, Lv, attn_scale, attn);
    w.o.forward(be, attn.reshape(Shape{rows, C}), out);  // [L, H, D] -> [L, C] -> [L, C]
    trace("self_attn", out);
}

TensorView CausalDit::LayerPass::attend_cross(std::span<const DitBranch> branches, const TensorView& q3) const {
    const TensorView o_txt = be.scratch(Shape{BL, H, D});
    const TensorView o_img = be.scratch(Shape{BL, H, D});
    // an FP8 cross cache: each K and V dequantized into the workspace (per token and head scales) first
    const auto dequantized = [&](const TensorView& t, const TensorView& scales) {
        if (t.dtype != DType::F8_E4M3) return t;
        const TensorView out = be.scratch(t.shape);
        const int64_t rows = t.dim(0) * t.dim(1);
        be.dequantize_fp8(t.reshape(Shape{rows, t.dim(2)}), scales.reshape(Shape{rows}),
                          out.reshape(Shape{rows, t.dim(2)}));
        return out;
    };
    const auto layer_kv = [&](int b) -> const DitCrossKv::Layer& {
        return branches[size_t(b)].cross->layers[size_t(li)];
    };
    for (int b = 0; b < B; ++b) {
        const DitCrossKv::Layer& ckv = layer_kv(b);
        be.attention({attn_scale}, s.branch(q3, b), dequantized(ckv.k_txt, ckv.k_txt_scale),
                     dequantized(ckv.v_txt, ckv.v_txt_scale), {}, s.branch(o_txt, b));
    }
    // NOTE: the branches of one device share one image cache (one CLIP context): one attention over all rows
    bool shared_image = true;
    for (int b = 1; b < B; ++b)
        shared_image = shared_image && layer_kv(b).k_img.data == layer_kv(0).k_img.data &&
                       layer_kv(b).v_img.data == layer_kv(0).v_img.data;
    for (int b = 0; b < (shared_image ? 1 : B); ++b) {
        const DitCrossKv::Layer& ckv = layer_kv(b);
        be.attention({attn_scale}, shared_image ? q3 : s.branch(q3, b), dequantized(ckv.k_img, ckv.k_img_scale),
                     dequantized(ckv.v_img, ckv.v_img_scale), {}, shared_image ? o_img : s.branch(o_img, b));
    }
    be.add(o_txt, o_img, o_txt);
    return o_txt;
}

}  // namespace dzr
