#include "model/image_resize.h"

#include <algorithm>
#include <cmath>

#include "backend/measuring_backend.h"
#include "core/error.h"

namespace dzr {
namespace {

// Keys' cubic convolution kernel, written in the two pieces PyTorch evaluates (|x| <= 1, 1 < |x| < 2).
float cubic_near(float x, float a) {
    return ((a + 2.0f) * x - (a + 3.0f)) * x * x + 1.0f;
}
float cubic_far(float x, float a) {
    return ((a * x - 5.0f * a) * x + 8.0f * a) * x - 4.0f * a;
}

// NOTE: the matrices stay f32 on every backend, and apply() runs its GEMMs in f32: in bf16 the taps
// would not sum to one (a flat image would not stay flat), while PyTorch accumulates in f32 too.
Tensor upload_matrix(Backend& be, const std::vector<float>& values, int rows, int cols) {
    Tensor host = Tensor::host_f32(Shape{rows, cols}, values);
    Tensor dev = be.alloc(Shape{rows, cols}, DType::F32);
    be.upload(host, dev);
    return dev;
}

}  // namespace

std::vector<float> bicubic_weight_matrix(int in_size, int out_size) {
    DZR_CHECK(in_size > 0 && out_size > 0, "bicubic resize: sizes must be positive, got {} -> {}", in_size,
              out_size);
    // NOTE: f32 throughout, as in PyTorch's upsample_bicubic2d CUDA kernel (accscalar_t = float for
    // f32 and bf16 inputs): scale = in / out, src = scale * (dst + 0.5) - 0.5, not clamped at 0.
    const float scale = float(in_size) / float(out_size);
    std::vector<float> w(size_t(out_size) * size_t(in_size), 0.0f);
    for (int o = 0; o < out_size; ++o) {
        const float src = scale * (float(o) + 0.5f) - 0.5f;
        const float fl = std::floor(src);
        const int i0 = int(fl);
        const float t = src - fl;
        const float coeff[4] = {cubic_far(t + 1.0f, kBicubicA), cubic_near(t, kBicubicA),
                                cubic_near(1.0f - t, kBicubicA), cubic_far(2.0f - t, kBicubicA)};
        for (int k = 0; k < 4; ++k) {
            const int i = std::clamp(i0 - 1 + k, 0, in_size - 1);
            w[size_t(o) * size_t(in_size) + size_t(i)] += coeff[k];
        }
    }
    return w;
}

BicubicResize::BicubicResize(Backend& be, int in_height, int in_width, int out_height, int out_width)
    : in_h_(in_height), in_w_(in_width), out_h_(out_height), out_w_(out_width) {
    wy_ = upload_matrix(be, bicubic_weight_matrix(in_h_, out_h_), out_h_, in_h_);
    wx_ = upload_matrix(be, bicubic_weight_matrix(in_w_, out_w_), out_w_, in_w_);
}

size_t BicubicResize::workspace_bytes(Backend& be, int channels, DType dtype) const {
    return measure_workspace(be, [&](Backend& mb) {
        apply(mb, mb.alloc(Shape{channels, in_h_, in_w_}, dtype), mb.alloc(Shape{channels, out_h_, out_w_}, dtype));
    });
}

void BicubicResize::apply(Backend& be, const TensorView& src, const TensorView& dst) const {
    DZR_CHECK(wy_.defined(), "bicubic resize: apply() on a resize that was never set up");
    DZR_CHECK(src.rank() == 3 && src.dim(1) == in_h_ && src.dim(2) == in_w_ && src.is_contiguous(),
              "bicubic resize: input must be a contiguous [C, {}, {}] image, got {}", in_h_, in_w_,
              src.str());
    const int64_t c = src.dim(0);
    DZR_CHECK(dst.rank() == 3 && dst.dim(0) == c && dst.dim(1) == out_h_ && dst.dim(2) == out_w_ &&
                  dst.is_contiguous(),
              "bicubic resize: output must be a contiguous [{}, {}, {}] image, got {}", c, out_h_, out_w_,
              dst.str());
    ArenaScope scope(be.workspace());
    TensorView in = src;
    if (src.dtype != DType::F32) {
        in = be.scratch(src.shape, DType::F32);
        be.copy(src, in);
    }
    const TensorView out = dst.dtype == DType::F32 ? dst : be.scratch(dst.shape, DType::F32);
    // A backend with PyTorch's own kernel arithmetic (CUDA) resizes directly, bit for bit as the reference.
    if (be.capabilities().resize_bicubic) {
        be.resize_bicubic(in, out);
        if (out.data != dst.data) be.copy(out, dst);
        return;
    }
    // NOTE: x first, then y, the order of PyTorch's kernel (it interpolates four input rows along x, then
    // combines them along y), so the f32 sums associate the same way.
    // Columns: tmp = src · Wxᵀ   [C·in_h, in_w] · [in_w, out_w] -> [C·in_h, out_w]
    const TensorView tmp = be.scratch(Shape{c, in_h_, out_w_}, DType::F32);
    be.gemm(GemmParams{false, true, 1.0f, 0.0f}, in.reshape(Shape{c * in_h_, in_w_}), wx_,
            {}, tmp.reshape(Shape{c * in_h_, out_w_}));
    // Rows: out[c] = Wy · tmp[c]   [out_h, in_h] · [in_h, out_w] -> [out_h, out_w] (Wy broadcast over c)
    const TensorView wy_b(wy_.data(), DType::F32, Shape{c, out_h_, in_h_}, Shape{0, in_h_, 1}, wy_.device());
    be.gemm(GemmParams{false, false, 1.0f, 0.0f}, wy_b, tmp, {}, out);
    if (out.data != dst.data) be.copy(out, dst);
}

}  // namespace dzr
