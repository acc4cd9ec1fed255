#pragma once
/// FP8 Linear weights (`precision: fp8`, `dzr ckpt quantize --precision fp8`): which weights the default
/// quantizes, the key of a weight's scale, host quantization of one weight and the check of a stored scale.
///
/// Storage (docs/CHECKPOINTS.md "FP8 checkpoints"): a quantized Linear stores `<module>.weight` as F8_E4M3
/// [out, in] and `<module>.weight_scale` as F32 [out], one scale per output channel, with
/// weight[o, i] ~= e4m3(q[o, i]) * weight_scale[o] (core/fp8.h: weight_scale[o] = max_i |w[o, i]| / 448).
/// Every other tensor keeps its dtype.
#include <optional>
#include <string>
#include <string_view>

#include "core/tensor.h"
#include "weights/weight_source.h"

namespace dzr {

/// One row of the default FP8 choice: a module of the DiT (its path under `action_head.model.`, `blocks.*.`
/// standing for every layer) and whether `--precision fp8` runs its Linear weight as E4M3.
struct Fp8LayerRule {
    std::string_view module;
    bool fp8;
    std::string_view reason;
};

/// The default choice, one table (docs/CHECKPOINTS.md prints it): the DiT layers' twelve Linears are FP8; the
/// DiT's other Linears stay in the compute dtype. What is not a Linear (the patch embedding's convolution, the
/// modulation tables, norms, the action and state encoders' CategoryLinears) and every other network (umT5, CLIP,
/// the VAE) keep their dtype too. A checkpoint written with another choice loads as it is stored: any Linear
/// stored as F8_E4M3 with a valid scale runs FP8 under `precision: fp8`.
inline constexpr Fp8LayerRule kFp8LayerTable[] = {
    {"blocks.*.self_attn.q", true, "per-forward GEMM (M = all tokens)"},
    {"blocks.*.self_attn.k", true, "per-forward GEMM"},
    {"blocks.*.self_attn.v", true, "per-forward GEMM"},
    {"blocks.*.self_attn.o", true, "per-forward GEMM"},
    {"blocks.*.cross_attn.q", true, "per-forward GEMM"},
    {"blocks.*.cross_attn.o", true, "per-forward GEMM"},
    {"blocks.*.ffn.0", true, "per-forward GEMM (5120 -> 13824 at DROID)"},
    {"blocks.*.ffn.2", true, "per-forward GEMM (13824 -> 5120 at DROID)"},
    {"blocks.*.cross_attn.k", true, "text K: once per prompt; FP8 for its memory (26 M parameters per layer)"},
    {"blocks.*.cross_attn.v", true, "text V: once per prompt; FP8 for its memory"},
    {"blocks.*.cross_attn.k_img", true, "image K: once per window; FP8 for its memory"},
    {"blocks.*.cross_attn.v_img", true, "image V: once per window; FP8 for its memory"},
    {"text_embedding.0", false, "once per prompt, outside the layers"},
    {"text_embedding.2", false, "once per prompt, outside the layers"},
    {"time_embedding.0", false, "1-2 rows per forward: no GEMM to speed up; feeds every modulation"},
    {"time_embedding.2", false, "1-2 rows per forward; feeds every modulation"},
    {"time_projection.1", false, "1-2 rows per forward; it is the modulation of every layer"},
    {"img_emb.proj.1", false, "once per window, outside the layers"},
    {"img_emb.proj.3", false, "once per window, outside the layers"},
    {"head.head", false, "the output projection to the video velocity (small, precision-sensitive)"},
};

/// The rule of a checkpoint key (`action_head.model.blocks.3.ffn.0.weight` -> "blocks.*.ffn.0"); nullptr for a key
/// no row names (every non-DiT key, the DiT's non-Linear tensors and biases).
const Fp8LayerRule* fp8_layer_rule(std::string_view weight_key);
/// True when the default choice quantizes this weight key.
bool fp8_by_default(std::string_view weight_key);

/// `<module>.weight` -> `<module>.weight_scale`. Throws for a key without the `.weight` suffix.
std::string fp8_scale_key(std::string_view weight_key);

/// A weight quantized on the host: q F8_E4M3 [out, in] and scale F32 [out].
struct Fp8Weight {
    Tensor q;
    Tensor scale;
};

/// Quantizes a host weight [out, in] (f32, bf16 or f16; any strides) per output channel (core/fp8.h). Throws naming
/// `key` when a value is NaN or infinite (a scale must be finite and positive). `scales_only`: q is left undefined
/// (the scales alone cost one pass over the values).
Fp8Weight quantize_weight_fp8(const TensorView& w, const std::string& key, bool scales_only = false);

/// What is wrong with the stored scale of the F8_E4M3 weight `weight_key` with `out` output channels: "" when
/// nothing; else one sentence ("missing", "is bf16 [4], expected f32 [8]", "element 3 is -0.5: scales must be finite
/// and positive"). Reads the scale's values (out floats).
std::string fp8_scale_problem(const WeightSource& source, const std::string& weight_key, int64_t out);

}  // namespace dzr
