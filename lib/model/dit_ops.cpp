#include "model/dit_ops.h"

#include "core/error.h"

namespace dzr {

void unpatchify(Backend& be, const TensorView& tokens, int frames, int gh, int gw, int ph, int pw,
                const TensorView& out) {
    DZR_CHECK(tokens.rank() == 2 && tokens.is_contiguous() && tokens.dim(0) == int64_t(frames) * gh * gw &&
                  tokens.dim(1) % (int64_t(ph) * pw) == 0,
              "unpatchify: tokens {} do not fit {} frames of {}x{} patches of {}x{}", tokens.str(), frames,
              gh, gw, ph, pw);
    const int64_t C = tokens.dim(1) / (int64_t(ph) * pw);
    DZR_CHECK(out.rank() == 4 && out.dim(0) == C && out.dim(1) == frames && out.dim(2) == int64_t(gh) * ph &&
                  out.dim(3) == int64_t(gw) * pw,
              "unpatchify: output {} should be [{}, {}, {}, {}]", out.str(), C, frames, gh * ph, gw * pw);
    // [L, ph·pw·C] -> [f, gh, gw, ph, pw, C] -> [C, f, gh, ph, gw, pw] = [C, f, H, W]
    const TensorView src = tokens.reshape(Shape{frames, gh, gw, ph, pw, C}).permute({5, 0, 1, 3, 2, 4});
    be.copy(src, out.reshape(Shape{C, frames, gh, ph, gw, pw}));
}

}  // namespace dzr
