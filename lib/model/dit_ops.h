#pragma once
/// Layout helper of the causal DiT, built on Backend::copy (strided views, no extra kernels): unpatchify
/// (dreamzero-reference.md §2.5.6), for a temporal patch size of 1 (every DreamZero config). The patch
/// embedding itself is Backend::conv3d, as in the reference.
#include "backend/backend.h"

namespace dzr {

/// Head outputs [f·gh·gw, ph·pw·C] with columns (q, r, c), c fastest -> [C, f, gh·ph, gw·pw]:
/// out[c, fi, ph·hi + q, pw·wi + r] = tokens[(fi·gh + hi)·gw + wi, (q·pw + r)·C + c].
void unpatchify(Backend& be, const TensorView& tokens, int frames, int gh, int gw, int ph, int pw,
                const TensorView& out);

}  // namespace dzr
