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
    be.gemm(p, x, w, b, out);
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
    GemmParams p;
    p.trans_b = false;
    // NOTE: W2 · cat[a, τ] = W2[:dim] · a + W2[dim:] · τ; τ is one row shared by every action token,
    // so its half is one GEMV broadcast over the rows instead of a concatenated [A, 2·dim] input.
    const TensorView a = be.scratch(Shape{A, dim_});
    w1_.forward(be, action, a);  // [A, action_dim] -> [A, dim]
    const TensorView h = be.scratch(Shape{A, dim_});
    be.gemm(p, a, w2_.w.view().slice(0, 0, dim_), w2_.b, h);  // [A, dim] -> [A, dim]
    const TensorView t = be.scratch(Shape{1, dim_});
    be.gemm(p, tau, w2_.w.view().slice(0, dim_, dim_), {}, t);  // [1, dim] -> [1, dim]
    be.add(h, t, h);
    be.activation({Activation::Silu}, h, h);
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
