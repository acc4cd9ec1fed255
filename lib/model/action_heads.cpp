#include "model/action_heads.h"

#include "core/error.h"
#include "weights/keys.h"

namespace dzr {
namespace {

void check_rows(const TensorView& x, int64_t cols, const char* what) {
    DZR_CHECK(x.rank() == 2 && x.dim(1) == cols, "{}: expected [rows, {}], got {}", what, cols, x.str());
}

}  // namespace

CategoryMlp::CategoryMlp(WeightLoader& loader, const std::string& prefix, int in, int hidden, int out,
                         const char* what)
    : hidden_(hidden), what_(what) {
    layer1_.load(loader, prefix + ".layer1", in, hidden);
    layer2_.load(loader, prefix + ".layer2", hidden, out);
}

void CategoryMlp::forward(Backend& be, const TensorView& x, const TensorView& out) const {
    check_rows(x, layer1_.in_features(), what_);
    ArenaScope scope(be.workspace());
    // [M, in] -> [M, hidden] -> [M, out]
    const TensorView h = be.scratch(Shape{x.dim(0), hidden_});
    layer1_.forward(be, x, h);
    be.activation({Activation::Relu}, h, h);
    layer2_.forward(be, h, out);
}

StateEncoder::StateEncoder(const DitConfig& cfg, WeightLoader& loader)
    : CategoryMlp(loader, keys::dit("state_encoder"), cfg.max_state_dim, cfg.hidden_size, cfg.dim,
                  "state encoder input") {}

ActionEncoder::ActionEncoder(const DitConfig& cfg, WeightLoader& loader) : dim_(cfg.dim) {
    w1_.load(loader, keys::dit("action_encoder.W1"), cfg.action_dim, cfg.dim);
    w2_.load(loader, keys::dit("action_encoder.W2"), 2 * cfg.dim, cfg.dim);
    w3_.load(loader, keys::dit("action_encoder.W3"), cfg.dim, cfg.dim);
}

void ActionEncoder::forward(Backend& be, const TensorView& action, const TensorView& tau,
                            const TensorView& out) const {
    check_rows(action, w1_.in_features(), "action encoder input");
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

ActionDecoder::ActionDecoder(const DitConfig& cfg, WeightLoader& loader)
    : CategoryMlp(loader, keys::dit("action_decoder"), cfg.dim, cfg.hidden_size, cfg.action_dim,
                  "action decoder input") {}

}  // namespace dzr
