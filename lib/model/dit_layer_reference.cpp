/// The DiT layer in reference numerics: PyTorch's eager ops with their rounding points (one branch).
#include "model/dit_layer.h"

namespace dzr {

struct CausalDit::ReferenceLayer : LayerPass {
    const LayerNorm& norm;  // the blocks' norm1/norm2: no affine
    TensorView mod1;        // mod + 1: the modulation's scales as the reference multiplies by them

    ReferenceLayer(Backend& be_, const Step& s_, int li_, const Layer& w_, const DitForwardOptions& opt_,
                   const DitConfig& cfg_, int64_t head_dim, const LayerNorm& norm_)
        : LayerPass(be_, s_, li_, w_, opt_, cfg_, head_dim), norm(norm_) {
        mod1 = be.scratch(Shape{s.groups, 6, C});
        be.scale({1.0f, 1.0f}, mod, mod1);
    }

    /// out = LN(x) · (1 + scale) + shift, per token group.
    void modulated_norm(int shift_i, int scale_i, const TensorView& out) const {
        norm.forward(be, s.x, out);
        for (int g = 0; g < s.groups; ++g) {
            const TensorView hg = s.rows(out, g);
            be.mul(hg, mod_vec(mod1, g, scale_i), hg);
            be.add(hg, mod_vec(mod, g, shift_i), hg);
        }
    }
    /// x += gate · yv, per token group (yv is scaled in place).
    void gated_residual(const TensorView& yv, int gate_i) const {
        for (int g = 0; g < s.groups; ++g) {
            const TensorView yg = s.rows(yv, g), xg = s.rows(s.x, g);
            be.mul(yg, mod_vec(mod, g, gate_i), yg);
            be.add(xg, yg, xg);
        }
    }

    void self_attention(const DitBranch& branch) const {
        // self-attention over [history | video | registers]
        ArenaScope tmp(be.workspace());
        modulated_norm(kShiftSa, kScaleSa, h);
        const LinearInput hin = LinearInput::shared(be, h, {&w.q, &w.k, &w.v});
        trace("self_attn_in", h);
        const TensorView raw = be.scratch(Shape{L, C});
        const TensorView qn = be.scratch(Shape{L, C});
        const TensorView kn = be.scratch(Shape{L, C});
        const TensorView v = be.scratch(Shape{L, C});
        w.q.forward(be, hin, raw);  // [L, C] -> [L, C]
        w.norm_q.forward(be, raw, qn);
        w.k.forward(be, hin, raw);  // [L, C] -> [L, C]
        w.norm_k.forward(be, raw, kn);
        w.v.forward(be, hin, v);  // [L, C] -> [L, C]

        // [L, C] -> [L, H, D]; RoPE: 3-D on video rows, 1-D on register rows
        const TensorView q = be.scratch(Shape{L, H, D});
        const TensorView k = be.scratch(Shape{L, H, D});
        const TensorView qn3 = qn.reshape(Shape{L, H, D}), kn3 = kn.reshape(Shape{L, H, D});
        be.rope({}, qn3.slice(0, 0, Lv), s.rope_video, q.slice(0, 0, Lv));
        be.rope({}, kn3.slice(0, 0, Lv), s.rope_video, k.slice(0, 0, Lv));
        if (L > Lv) {
            be.rope({}, qn3.slice(0, Lv, L - Lv), s.rope_registers, q.slice(0, Lv, L - Lv));
            be.rope({}, kn3.slice(0, Lv, L - Lv), s.rope_registers, k.slice(0, Lv, L - Lv));
        }
        attend_self({&branch, 1}, q, k, v.reshape(Shape{L, H, D}), y);
        gated_residual(y, kGateSa);
        block_done("x_self", "self-attention");
    }

    void cross_attention(const DitBranch& branch) const {
        ArenaScope tmp(be.workspace());
        w.norm3.forward(be, s.x, h);
        const TensorView raw = be.scratch(Shape{L, C});
        const TensorView q = be.scratch(Shape{L, C});
        w.cross_q.forward(be, h, raw);  // [L, C] -> [L, C]
        w.cross_norm_q.forward(be, raw, q);
        const TensorView o = attend_cross({&branch, 1}, q.reshape(Shape{L, H, D}));
        w.cross_o.forward(be, o.reshape(Shape{L, C}), y);  // [L, H, D] -> [L, C] -> [L, C]
        trace("cross_attn", y);
        be.add(s.x, y, s.x);
        block_done("x_cross", "cross-attention");
    }

    void feed_forward() const {
        // C -> ffn_dim -> GELU(tanh) -> C, modulated and gated
        ArenaScope tmp(be.workspace());
        const TensorView hidden = be.scratch(Shape{L, cfg.ffn_dim});
        modulated_norm(kShiftFf, kScaleFf, h);
        w.ffn1.forward(be, h, hidden);  // [L, C] -> [L, ffn]
        be.activation({Activation::GeluTanh}, hidden, hidden);
        w.ffn2.forward(be, hidden, y);  // [L, ffn] -> [L, C]
        trace("ffn", y);
        gated_residual(y, kGateFf);
        block_done({}, "feed-forward");
    }
};

void CausalDit::reference_layer(Backend& be, const Step& s, int li, const DitBranch& branch,
                                const DitForwardOptions& opt) const {
    ArenaScope scope(be.workspace());
    const ReferenceLayer p(be, s, li, layers_[size_t(li)], opt, cfg_, head_dim_, norm_);
    p.self_attention(branch);
    p.cross_attention(branch);
    p.feed_forward();
}

}  // namespace dzr
