/// The DiT layer in fast numerics, over every branch's rows: the memory-bound chains run fused (Backend's
/// FusedRowParams ops, f32 inside, one rounding per output), and the norms in front of FP8 Linears write their codes.
#include "model/dit_layer.h"

namespace dzr {

struct CausalDit::FastLayer : LayerPass {
    const FusedRowParams rows;
    const bool keep_rows;  // a trace wants every norm's rows: no norm writes its codes alone

    FastLayer(Backend& be_, const Step& s_, int li_, const Layer& w_, const DitForwardOptions& opt_,
              const DitConfig& cfg_, int64_t head_dim)
        : LayerPass(be_, s_, li_, w_, opt_, cfg_, head_dim),
          rows{cfg_.eps, s_.groups > 1 ? s_.video_tokens : s_.tokens, s_.tokens}, keep_rows(bool(opt_.trace)) {}

    /// out = LN(st.x) · (1 + scale) + shift, per token group, as the Linears `readers` read it.
    LinearInput modulated_norm(const Step& st, int shift_i, int scale_i, const TensorView& out,
                               std::initializer_list<const Linear*> readers) const {
        const AdaLayerNorm norm{rows, {}, {}, mod_vecs(mod, scale_i), mod_vecs(mod, shift_i)};
        return norm.forward(be, st.x, out, readers, keep_rows);
    }
    /// x += gate · yv, per token group.
    void gated_residual(const Step& st, const TensorView& yv, int gate_i) const {
        be.gated_residual(rows, st.x, yv, mod_vecs(mod, gate_i));
    }

    /// Whether this self-attention runs on branch 0's rows only and serves both branches.
    bool shares_layer0(bool kv_only) const {
        // NOTE: layer 0 of a batched forward sees the same rows in every branch (the same inputs: the text enters at
        // the cross-attention) and the same history (committed the same way): branch 0's self-attention serves both
        return opt.share_first_self_attention && li == 0 && B == 2 && !kv_only && !opt.trace;
    }

    bool self_attention(std::span<const DitBranch> branches, bool kv_only) const {
        const bool share = shares_layer0(kv_only);
        ArenaScope tmp(be.workspace());
        Step sa = s;  // the rows it runs on
        if (share) {
            sa.x = s.branch(s.x, 0);
            sa.batch = 1;
        }
        const std::span<const DitBranch> sa_branches = share ? branches.subspan(0, 1) : branches;
        const int64_t n = sa.x.dim(0);
        const TensorView hs = h.slice(0, 0, n), ys = y.slice(0, 0, n);
        const LinearInput hin = modulated_norm(sa, kShiftSa, kScaleSa, hs, {&w.q, &w.k, &w.v});
        trace("self_attn_in", hs);
        const TensorView raw = be.scratch(Shape{n, C});
        // q/k RMSNorm and RoPE (3-D on video rows, 1-D on register rows) in one op each
        const TensorView q = be.scratch(Shape{n, H, D});
        TensorView k = be.scratch(Shape{n, H, D});
        TensorView v = be.scratch(Shape{n, H, D});
        const TensorView regs_table = L > Lv ? s.rope_registers : TensorView{};
        // NOTE: the mirrored lanes' middle, where the batched attention reads both branches' current rows in place
        if (!kv_only && sa.batch == 2) {
            SelfAttentionCache* const both[2] = {sa_branches[0].cache, sa_branches[1].cache};
            TensorView kt, vt;
            if (current_rows_in_place(be, li, both, L, kt, vt)) {
                k = kt;
                v = vt;
            }
        }
        if (!kv_only) {
            w.q.forward(be, hin, raw);
            be.rms_norm_rope({cfg.eps, Lv, L}, raw, w.norm_q.w, s.rope_video, regs_table, q);
        }
        w.k.forward(be, hin, raw);
        be.rms_norm_rope({cfg.eps, Lv, L}, raw, w.norm_k.w, s.rope_video, regs_table, k);
        w.v.forward(be, hin, v.reshape(Shape{n, C}));
        if (kv_only) {
            // the committed rows are all this forward is for: store them, skip the rest of the layer
            for (int b = 0; b < sa.batch; ++b)
                sa_branches[size_t(b)].cache->store(be, li, s.branch(k, b), s.branch(v, b), Lv);
            return false;
        }
        // a shared layer 0 of a committing forward: branch 1's cache stores the same rows
        if (share && branches[1].cache->committing()) branches[1].cache->store(be, li, k, v, Lv);
        attend_self(sa_branches, q, k, v, ys);
        // NOTE: not Backend::gated_residual_norm (the add and norm3 in one pass): on the H200 it measured slower
        // than the two ops (`dzr bench fused`: 53.9 us against 45.7 us at [1785, 5120], docs/PERF.md)
        gated_residual(sa, ys, kGateSa);
        if (share) be.copy(s.branch(s.x, 0), s.branch(s.x, 1));
        block_done("x_self", "self-attention");
        return true;
    }

    void cross_attention(std::span<const DitBranch> branches) const {
        ArenaScope tmp(be.workspace());
        const AdaLayerNorm norm3{rows, w.norm3.w, w.norm3.b, {}, {}};
        const LinearInput hin = norm3.forward(be, s.x, h, {&w.cross_q}, keep_rows);
        const TensorView raw = be.scratch(Shape{BL, C});
        const TensorView q = be.scratch(Shape{BL, C});
        w.cross_q.forward(be, hin, raw);  // [L, C] -> [L, C]
        be.rms_norm_rope({cfg.eps}, raw, w.cross_norm_q.w, {}, {}, q.reshape(Shape{BL, H, D}));
        const TensorView o = attend_cross(branches, q.reshape(Shape{BL, H, D}));
        // x += cross_o(o): the GEMM accumulates into the residual (no "cross_attn" intermediate to trace)
        w.cross_o.forward_accumulate(be, o.reshape(Shape{BL, C}), s.x);  // [L, H, D] -> [L, C] -> += [L, C]
        block_done("x_cross", "cross-attention");
    }

    void feed_forward() const {
        // C -> ffn_dim -> GELU(tanh) -> C, modulated and gated
        ArenaScope tmp(be.workspace());
        const TensorView hidden = be.scratch(Shape{BL, cfg.ffn_dim});
        const LinearInput hin = modulated_norm(s, kShiftFf, kScaleFf, h, {&w.ffn1});
        // the bias and GELU in ffn1's GEMM epilogue; FP8 after a fused norm: in ffn2's quantization
        const LinearInput gelu = w.ffn1.forward_gelu(be, hin, hidden);  // [L, C] -> [L, ffn]
        w.ffn2.forward(be, gelu, y);                                     // [L, ffn] -> [L, C]
        trace("ffn", y);
        gated_residual(s, y, kGateFf);
        block_done({}, "feed-forward");
    }
};

void CausalDit::fast_layer(Backend& be, const Step& s, int li, std::span<const DitBranch> branches,
                           const DitForwardOptions& opt, bool kv_only) const {
    ArenaScope scope(be.workspace());
    const FastLayer p(be, s, li, layers_[size_t(li)], opt, cfg_, head_dim_);
    if (!p.self_attention(branches, kv_only)) return;  // kv_only: stopped once the K/V rows are stored
    p.cross_attention(branches);
    p.feed_forward();
}

}  // namespace dzr
