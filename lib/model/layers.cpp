#include "model/layers.h"

#include <cmath>

#include "core/error.h"

namespace dzr {

Tensor reshaped(const Tensor& t, Shape shape) {
    return Tensor(t.storage(), t.view().reshape(shape));
}

void Linear::load(WeightLoader& loader, const std::string& prefix, int64_t in, int64_t out, bool bias,
                  WeightInit init) {
    w = loader.require(prefix + ".weight", Shape{out, in}, init);
    b = bias ? loader.require(prefix + ".bias", Shape{out}, WeightInit::bias()) : Tensor{};
    scale = Tensor{};
}

void Linear::forward(Backend& be, const TensorView& x, const TensorView& out) const {
    DZR_CHECK(!scale.defined(), "linear: scaled (FP8) weights {} are not supported yet", w.view().str());
    be.linear(x, w, b, out);
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
