#include "model/action_heads.h"

#include "core/error.h"
#include "weights/keys.h"

namespace dzr {
namespace {

/// A rank-2 view of an owning tensor without copying (same storage).
Tensor reshaped(const Tensor& t, Shape shape) {
    return Tensor(t.storage(), t.view().reshape(shape));
}

void check_rows(const TensorView& x, int64_t cols, const char* what) {
    DZR_CHECK(x.rank() == 2 && x.dim(1) == cols, "{}: expected [rows, {}], got {}", what, cols, x.str());
}

}  // namespace

CategoryLinear CategoryLinear::load(WeightLoader& loader, const std::string& module, int in, int out) {
    CategoryLinear l;
    l.w = reshaped(loader.require(module + ".W", Shape{1, in, out}), Shape{in, out});
    l.b = reshaped(loader.require(module + ".b", Shape{1, out}), Shape{out});
    return l;
}

void CategoryLinear::forward(Backend& be, const TensorView& x, const TensorView& out) const {
    GemmParams p;
    p.trans_b = false;  // W is stored [in, out] and used as x · W
    // NOTE: the reference's CategorySpecificLinear is bmm(x, W) + b: two ops, so on bf16 the product is
    // rounded before the bias is added (a bias epilogue would round once).
    be.gemm(p, x, w, {}, out);
    be.add(out, b, out);  // [rows, out] + [out]
}

StateEncoder::StateEncoder(const DitConfig& cfg, WeightLoader& loader) : hidden_(cfg.hidden_size) {
    layer1_ =
        CategoryLinear::load(loader, keys::dit("state_encoder.layer1"), cfg.max_state_dim, cfg.hidden_size);
    layer2_ = CategoryLinear::load(loader, keys::dit("state_encoder.layer2"), cfg.hidden_size, cfg.dim);
}

void StateEncoder::forward(Backend& be, const TensorView& state, const TensorView& out) const {
    check_rows(state, layer1_.w.shape()[0], "state encoder input");
    ArenaScope scope(be.workspace());
    // [S, max_state_dim] -> [S, hidden] -> [S, dim]
    const TensorView h = be.scratch(Shape{state.dim(0), hidden_});
    layer1_.forward(be, state, h);
    be.activation({Activation::Relu}, h, h);
    layer2_.forward(be, h, out);
}

ActionEncoder::ActionEncoder(const DitConfig& cfg, WeightLoader& loader) : dim_(cfg.dim) {
    w1_ = CategoryLinear::load(loader, keys::dit("action_encoder.W1"), cfg.action_dim, cfg.dim);
    w2_ = CategoryLinear::load(loader, keys::dit("action_encoder.W2"), 2 * cfg.dim, cfg.dim);
    w3_ = CategoryLinear::load(loader, keys::dit("action_encoder.W3"), cfg.dim, cfg.dim);
}

void ActionEncoder::forward(Backend& be, const TensorView& action, const TensorView& tau,
                            const TensorView& out) const {
    check_rows(action, w1_.w.shape()[0], "action encoder input");
    check_rows(tau, dim_, "action encoder timestep sinusoid");
    const int64_t A = action.dim(0);
    ArenaScope scope(be.workspace());
    // NOTE: W2 runs on the concatenation [a, τ] (τ repeated on every row) as one K = 2·dim product, as
    // the reference does: splitting it into two GEMMs would add a bf16 rounding. Swish is x·sigmoid(x)
    // as two ops (sigmoid, then the product), again as the reference rounds.
    const TensorView halves = be.scratch(Shape{2, A, dim_});  // [a | τ repeated] as two planes
    w1_.forward(be, action, halves.slice(0, 0, 1).reshape(Shape{A, dim_}));  // [A, action_dim] -> [A, dim]
    const TensorView tau_rows(tau.data, tau.dtype, Shape{A, dim_}, {0, 1}, tau.device);  // τ on every row
    be.copy(tau_rows, halves.slice(0, 1, 1).reshape(Shape{A, dim_}));
    const TensorView cat = be.scratch(Shape{A, 2, dim_});
    be.copy(halves.permute({1, 0, 2}), cat);  // [2, A, dim] -> [A, 2, dim] = cat[a, τ] per row
    const TensorView h = be.scratch(Shape{A, dim_});
    w2_.forward(be, cat.reshape(Shape{A, 2 * dim_}), h);  // [A, 2·dim] -> [A, dim]
    const TensorView sig = be.scratch(Shape{A, dim_});
    be.activation({Activation::Sigmoid}, h, sig);
    be.mul(h, sig, h);
    w3_.forward(be, h, out);  // [A, dim] -> [A, dim]
}

ActionDecoder::ActionDecoder(const DitConfig& cfg, WeightLoader& loader) : hidden_(cfg.hidden_size) {
    layer1_ = CategoryLinear::load(loader, keys::dit("action_decoder.layer1"), cfg.dim, cfg.hidden_size);
    layer2_ =
        CategoryLinear::load(loader, keys::dit("action_decoder.layer2"), cfg.hidden_size, cfg.action_dim);
}

void ActionDecoder::forward(Backend& be, const TensorView& x, const TensorView& out) const {
    check_rows(x, layer1_.w.shape()[0], "action decoder input");
    ArenaScope scope(be.workspace());
    // [A, dim] -> [A, hidden] -> [A, action_dim]
    const TensorView h = be.scratch(Shape{x.dim(0), hidden_});
    layer1_.forward(be, x, h);
    be.activation({Activation::Relu}, h, h);
    layer2_.forward(be, h, out);
}

}  // namespace dzr
