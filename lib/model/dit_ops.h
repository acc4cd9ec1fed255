#pragma once
/// Layout helpers of the causal DiT, built on Backend::copy (strided views, no extra kernels):
/// patchify (the Conv3d patch embedding as a GEMM input) and unpatchify (dreamzero-reference.md
/// §2.5.1, §2.5.6). Both support a temporal patch size of 1 only (every DreamZero config).
#include "backend/backend.h"

namespace dzr {

/// Latent [C, f, H, W] -> patch rows [f·(H/ph)·(W/pw), C·ph·pw]: row = token (frame, row, column)
/// in row-major order, column = (c, q, r) with r fastest, i.e. the flattening of a Conv3d weight
/// [Co, C, 1, ph, pw]. So `linear(patches, w.reshape([Co, C·ph·pw]), b)` equals the strided Conv3d.
void patchify(Backend& be, const TensorView& latent, int ph, int pw, const TensorView& out);

/// Head outputs [f·gh·gw, ph·pw·C] with columns (q, r, c), c fastest -> [C, f, gh·ph, gw·pw]:
/// out[c, fi, ph·hi + q, pw·wi + r] = tokens[(fi·gh + hi)·gw + wi, (q·pw + r)·C + c].
void unpatchify(Backend& be, const TensorView& tokens, int frames, int gh, int gw, int ph, int pw,
                const TensorView& out);

}  // namespace dzr
