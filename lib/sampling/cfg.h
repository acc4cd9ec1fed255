#pragma once
/// Classifier-free guidance and the velocity similarity the dynamic step schedule uses, on Backend
/// ops. DreamZero guides the video velocity only (scale 5); the action velocity is the conditional
/// branch's, unguided.
#include "backend/backend.h"

namespace dzr {

inline constexpr float kDreamZeroCfgScale = 5.0f;

/// out = v_uncond + scale * (v_cond - v_uncond), elementwise in the reference's order
/// ((cond - uncond), times scale, plus uncond). All three tensors have the same number of
/// elements, dtype and contiguity; `out` may alias `v_cond` but not `v_uncond`.
void apply_cfg(Backend& be, const TensorView& v_cond, const TensorView& v_uncond, float scale,
               const TensorView& out);

/// Cosine similarity of a and b flattened per batch item (dim 0 when batch > 1), averaged over the
/// batch, as torch.nn.functional.cosine_similarity(a.flatten(1), b.flatten(1)).mean() with
/// eps 1e-8. Sums are taken in f32 on the backend (products of inputs converted to f32) and the
/// final ratio in double. Downloads three scalars per batch item, so it synchronizes.
double cosine_similarity(Backend& be, const TensorView& a, const TensorView& b, int64_t batch = 1);

}  // namespace dzr
