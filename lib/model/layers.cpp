#include "model/layers.h"

#include <cmath>

#include "core/error.h"

namespace dzr {

Tensor reshaped(const Tensor& t, Shape shape) {
    return Tensor(t.storage(), t.view().reshape(shape));
}

void Linear::load(WeightLoader& loader, const std::string& prefix, int64_t in, int64_t out, bool bias,
                  WeightInit init) {
    LinearWeight lw = loader.require_linear(prefix + ".weight", Shape{out, in}, init);
    w = std::move(lw.w);
    scale = std::move(lw.scale);
    b = bias ? loader.require(prefix + ".bias", Shape{out}, WeightInit::bias()) : Tensor{};
}

void Linear::forward(Backend& be, const TensorView& x, const TensorView& out) const {
    if (!fp8()) {
        be.linear(x, w, b, out);
        return;
    }
    // FP8: x quantized per token (row) into the workspace, then the E4M3 GEMM with both scales and the bias
    ArenaScope scope(be.workspace());
    forward(be, x, Fp8Input::quantize(be, x, true), out);
}

Fp8Input Fp8Input::quantize(Backend& be, const TensorView& x, bool fp8) {
    if (!fp8) return {};
    const int64_t rows = x.rows(), in = x.cols();
    Fp8Input r;
    r.q = be.scratch(Shape{rows, in}, DType::F8_E4M3);
    r.scales = be.scratch(Shape{rows}, DType::F32);
    be.quantize_fp8(x.rank() == 2 ? x : x.reshape(Shape{rows, in}), r.q, r.scales);
    return r;
}

void Linear::forward(Backend& be, const TensorView& x, const Fp8Input& xq, const TensorView& out) const {
    if (!fp8() || !xq.defined()) {
        forward(be, x, out);
        return;
    }
    DZR_CHECK(xq.q.rows() == x.rows() && xq.q.cols() == in_features(),
              "linear: the quantized input {} does not match x {} and the weight {}", xq.q.str(), x.str(), w.view().str());
    be.gemm_fp8(xq.q, xq.scales, w, scale, b, out);
}

LinearInput LinearInput::shared(Backend& be, const TensorView& x, std::initializer_list<const Linear*> readers) {
    bool any_fp8 = false;
    for (const Linear* r : readers) any_fp8 = any_fp8 || r->fp8();
    return {x, Fp8Input::quantize(be, x, readers.size() > 1 && any_fp8)};
}

void Linear::forward(Backend& be, const LinearInput& in, const TensorView& out) const {
    if (in.gelu) {
        if (!fp8()) {
            be.activation({Activation::GeluTanh}, in.rows, in.rows);
            forward(be, in.rows, out);
            return;
        }
        ArenaScope scope(be.workspace());
        Fp8Input q;
        q.q = be.scratch(in.rows.shape, DType::F8_E4M3);
        q.scales = be.scratch(Shape{in.rows.rows()}, DType::F32);
        be.activation_quantize_fp8({Activation::GeluTanh}, in.rows, q.q, q.scales);
        forward(be, in.rows, q, out);
        return;
    }
    if (in.rows.defined()) {
        forward(be, in.rows, in.fp8, out);
        return;
    }
    DZR_CHECK(fp8() && in.fp8.defined() && in.fp8.q.cols() == in_features(),
              "linear: the codes {} alone do not fit the weight {} (an FP8 weight of {} inputs reads them)",
              in.fp8.q.str(), w.view().str(), in_features());
    be.gemm_fp8(in.fp8.q, in.fp8.scales, w, scale, b, out);
}

LinearInput Linear::forward_gelu(Backend& be, const LinearInput& in, const TensorView& out) const {
    if (!in.rows.defined()) {
        forward(be, in, out);
        return {out, {}, true};
    }
    if (fp8() && in.fp8.defined()) {
        forward(be, in, out);
        be.activation({Activation::GeluTanh}, out, out);
    } else {
        forward_gelu(be, in.rows, out);
    }
    return {out, {}, false};
}

void Linear::forward_gelu(Backend& be, const TensorView& x, const TensorView& out) const {
    if (!fp8()) {
        be.gemm_gelu(GemmParams{}, x, w, b, out);
        return;
    }
    forward(be, x, out);
    be.activation({Activation::GeluTanh}, out, out);
}

void Linear::forward_accumulate(Backend& be, const TensorView& x, const TensorView& out) const {
    if (!fp8()) {
        GemmParams p;
        p.beta = 1.0f;
        be.gemm(p, x, w, b, out);
        return;
    }
    ArenaScope scope(be.workspace());
    const TensorView y = be.scratch(out.shape, out.dtype);
    forward(be, x, y);
    be.add(out, y, out);
}

size_t Linear::fp8_workspace_bytes(int64_t rows) const {
    if (!fp8()) return 0;
    const auto aligned = [](size_t n) { return (n + Arena::kAlign - 1) / Arena::kAlign * Arena::kAlign; };
    return aligned(size_t(rows * in_features())) + aligned(size_t(rows) * sizeof(float));
}

LinearInput AdaLayerNorm::forward(Backend& be, const TensorView& x, const TensorView& out,
                                  std::initializer_list<const Linear*> readers, bool keep_rows) const {
    bool all_fp8 = readers.size() > 0;
    for (const Linear* r : readers) all_fp8 = all_fp8 && r->fp8();
    if (all_fp8 && !keep_rows) {
        LinearInput in;
        in.fp8.q = be.scratch(Shape{x.dim(0), x.cols()}, DType::F8_E4M3);
        in.fp8.scales = be.scratch(Shape{x.dim(0)}, DType::F32);
        be.ada_layer_norm_fp8(rows, x, weight, bias, scale, shift, in.fp8.q, in.fp8.scales);
        return in;
    }
    be.ada_layer_norm(rows, x, weight, bias, scale, shift, out);
    return LinearInput::shared(be, out, readers);
}

void RmsNorm::load(WeightLoader& loader, const std::string& prefix, int64_t channels, float epsilon) {
    w = loader.require(prefix + ".weight", Shape{channels}, WeightInit::norm_scale());
    eps = epsilon;
}

void RmsNorm::forward(Backend& be, const TensorView& x, const TensorView& out) const {
    be.rms_norm(RmsNormParams{eps}, x, w, out);
}

void LayerNorm::load(WeightLoader& loader, const std::string& prefix, int64_t channels, float epsilon) {
    w = loader.require(prefix + ".weight", Shape{channels}, WeightInit::norm_scale());
    b = loader.require(prefix + ".bias", Shape{channels}, WeightInit::bias());
    eps = epsilon;
}

void LayerNorm::forward(Backend& be, const TensorView& x, const TensorView& out) const {
    be.layer_norm(LayerNormParams{eps}, x, w, b, out);
}

void CategoryLinear::load(WeightLoader& loader, const std::string& prefix, int64_t in, int64_t out) {
    w = reshaped(loader.require(prefix + ".W", Shape{1, in, out}, WeightInit::normal(1.0f / std::sqrt(float(in)))),
                 Shape{in, out});
    b = reshaped(loader.require(prefix + ".b", Shape{1, out}, WeightInit::bias()), Shape{out});
}

void CategoryLinear::forward(Backend& be, const TensorView& x, const TensorView& out) const {
    GemmParams p;
    p.trans_b = false;  // W is stored [in, out] and used as x · W
    // NOTE: the reference's CategorySpecificLinear is bmm(x, W) + b: two ops, so on bf16 the product is
    // rounded before the bias is added (a bias epilogue would round once).
    be.gemm(p, x, w, {}, out);
    be.add(out, b, out);  // [rows, out] + [out]
}

}  // namespace dzr
