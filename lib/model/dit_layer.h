#pragma once
/// Inside the causal DiT (causal_dit.cpp and its two layer files, dit_layer_reference.cpp and dit_layer_fast.cpp):
/// the per-forward state the layers share and the part of a layer's pass both numerics run alike. Not a public header.
#include <span>
#include <string_view>

#include "model/causal_dit.h"

namespace dzr {

/// Order of the six modulation vectors of a layer (dreamzero-reference.md §2.5.3).
enum DitModIndex : int { kShiftSa = 0, kScaleSa = 1, kGateSa = 2, kShiftFf = 3, kScaleFf = 4, kGateFf = 5 };

/// Row g of a [G, 6, C] modulation tensor, vector i: [C].
TensorView mod_vec(const TensorView& mod, int g, int i);
/// Vector i of every group of a [G, 6, C] modulation tensor: a [G, C] view with a row stride of 6·C (fast numerics'
/// fused ops read the groups' rows through it).
TensorView mod_vecs(const TensorView& mod, int i);
/// Debug mode: download `t` and throw naming the stage and layer (-1: outside the layers) at the first NaN/Inf.
void check_finite(Backend& be, const TensorView& t, std::string_view stage, int layer);

/// Per-forward state shared by the layers: the residual stream and its two token groups (video rows, register rows),
/// each with its own time-embedding row. A batched forward stacks its branches' rows: branch b holds rows
/// [b·L, (b + 1)·L), each block grouped alike.
struct CausalDit::Step {
    TensorView x;              // [B·L, dim] residual stream, per branch video rows then register rows
    int64_t tokens = 0;        // L: one branch's rows
    int batch = 1;             // B: branches
    int64_t video_tokens = 0;  // Lv = frames · frame_seqlen
    int64_t frames = 0;
    int groups = 1;             // 1: video only; 2: video + registers
    TensorView e;               // [G, dim] time_embedding output per group
    TensorView e0;              // [G, 6, dim] time_projection output per group
    TensorView rope_video;      // f32 [Lv, D/2, 2]
    TensorView rope_registers;  // f32 [R, D/2, 2] (registers only)

    /// Rows of `t` ([L, ...], one branch) belonging to group g.
    TensorView rows(const TensorView& t, int g) const {
        return g == 0 ? t.slice(0, 0, video_tokens) : t.slice(0, video_tokens, t.dim(0) - video_tokens);
    }
    /// Branch b's rows of `t` ([B·L, ...]).
    TensorView branch(const TensorView& t, int b) const { return t.slice(0, b * tokens, tokens); }
};

/// One layer's pass, the part both numerics share: its inputs, the modulation, the two scratch rows h and y, and the
/// attention steps (the layer files add each numerics' own ops: ReferenceLayer, FastLayer).
struct CausalDit::LayerPass {
    Backend& be;
    const Step& s;
    const int li;
    const Layer& w;
    const DitForwardOptions& opt;
    const DitConfig& cfg;
    // NOTE: BL: the rows of every branch (the linear layers and row ops); L: one branch's (attention, groups)
    const int64_t BL, L, C, H, D, Lv;
    const int B;
    const float attn_scale;
    TensorView mod;   // mod[g] = modulation [6, C] + e0[g]
    TensorView h, y;  // [BL, C] each

    /// Takes the layer's modulation (one add) and its scratch rows from the workspace.
    LayerPass(Backend& be, const Step& s, int li, const Layer& w, const DitForwardOptions& opt, const DitConfig& cfg,
              int64_t head_dim);

    void trace(std::string_view name, const TensorView& t) const {
        if (opt.trace) opt.trace(name, li, t);
    }
    /// The end of a block: the residual traced as `name` (none when empty), and checked in the debug mode.
    void block_done(std::string_view name, std::string_view stage) const;
    /// q, k, v [rows, H, D] traced, the branches' self-attention over their caches (history | current rows), then
    /// out [rows, C] = o(attention).
    void attend_self(std::span<const DitBranch> branches, const TensorView& q, const TensorView& k,
                     const TensorView& v, const TensorView& out) const;
    /// Cross-attention of q3 [BL, H, D] without its o projection: separate softmaxes over each branch's text and image
    /// keys, summed, [BL, H, D] in the workspace (an FP8 cross cache dequantized first).
    TensorView attend_cross(std::span<const DitBranch> branches, const TensorView& q3) const;
};

}  // namespace dzr
