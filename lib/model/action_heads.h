#pragma once
/// DreamZero's additions to the causal DiT (dreamzero-reference.md §2.5.7): the state encoder, the
/// action encoder and the action decoder. All are "category-specific" linears with one category:
/// out = x · W[0] + b[0], W stored [1, in, out], b stored [1, out] (embodiment id forced to 0).
/// Inputs and outputs are on the backend in its compute dtype; forwards take temporaries from the
/// workspace arena.
#include <string>

#include "backend/backend.h"
#include "config/model_config.h"
#include "model/layers.h"
#include "weights/weight_source.h"

namespace dzr {

/// Two category-specific linears with a ReLU between: [M, in] -> [M, hidden] -> [M, out] (`layer1`, `layer2`).
class CategoryMlp {
  public:
    CategoryMlp() = default;
    /// Loads `<prefix>.layer1` [in -> hidden] and `<prefix>.layer2` [hidden -> out]; `what` names its input in
    /// messages.
    CategoryMlp(WeightLoader& loader, const std::string& prefix, int in, int hidden, int out, const char* what);
    void forward(Backend& be, const TensorView& x, const TensorView& out) const;

  private:
    CategoryLinear layer1_, layer2_;
    int hidden_ = 0;
    const char* what_ = "";
};

/// State [S, max_state_dim] -> S register tokens [S, dim]: Linear -> ReLU -> Linear.
class StateEncoder : public CategoryMlp {
  public:
    StateEncoder() = default;
    StateEncoder(const DitConfig& cfg, WeightLoader& loader);
};

/// Noisy actions [A, action_dim] at one timestep -> A register tokens [A, dim]:
/// W3 · swish(W2 · [W1 · a, τ]) with τ the [sin, cos] sinusoid of the action timestep.
class ActionEncoder {
  public:
    ActionEncoder() = default;
    ActionEncoder(const DitConfig& cfg, WeightLoader& loader);
    /// tau: [1, dim] action_timestep_sinusoid row (TimestepTables::action).
    void forward(Backend& be, const TensorView& action, const TensorView& tau, const TensorView& out) const;

  private:
    CategoryLinear w1_, w2_, w3_;  // w2_.w is [2·dim, dim]: rows [0, dim) act on W1·a, rows [dim, 2·dim) on τ
    int dim_ = 0;
};

/// Last-layer outputs of the A action tokens [A, dim] -> action velocity [A, action_dim]:
/// Linear -> ReLU -> Linear (no final norm, no modulation).
class ActionDecoder : public CategoryMlp {
  public:
    ActionDecoder() = default;
    ActionDecoder(const DitConfig& cfg, WeightLoader& loader);
};

}  // namespace dzr
