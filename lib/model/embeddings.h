#pragma once
/// Timestep sinusoids of the causal DiT and of the action encoder (dreamzero-reference.md §2.5.2,
/// §2.5.7). Timesteps reach the network as integers in [0, kNumTrainTimesteps), so both sinusoids
/// are tabulated for every integer timestep at load and a forward takes a row view: no host work,
/// no upload inside a forward.
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "core/tensor.h"

namespace dzr {

/// Integer timesteps the DiT sees are in [0, kNumTrainTimesteps) (FlowUniPC num_train_timesteps).
inline constexpr int kNumTrainTimesteps = 1000;

/// DiT sinusoid of timestep t: [cos(t·ω_0..half−1), sin(t·ω_0..half−1)] with ω_j = 10000^(−j/half),
/// half = dim/2, computed in float64 (cos first).
std::vector<double> dit_timestep_sinusoid(int dim, double t);

/// Action-encoder sinusoid of timestep t: [sin(t·ω), cos(t·ω)] with ω_j = exp(−j·ln(10000)/half),
/// computed in float32 like the reference (sin first).
std::vector<float> action_timestep_sinusoid(int dim, float t);

/// Both sinusoids for every integer timestep, on the backend in its compute dtype.
class TimestepTables {
  public:
    TimestepTables() = default;
    /// dit_dim: DiT freq_dim (256); action_dim: action encoder width (the DiT dim).
    TimestepTables(Backend& be, int dit_dim, int action_dim);

    /// [1, dit_dim] row of timestep t. Throws dzr::Error outside [0, kNumTrainTimesteps).
    TensorView dit(int64_t t) const;
    /// [1, action_dim] row of timestep t. Throws dzr::Error outside [0, kNumTrainTimesteps).
    TensorView action(int64_t t) const;

  private:
    Tensor dit_;     // [kNumTrainTimesteps, dit_dim]
    Tensor action_;  // [kNumTrainTimesteps, action_dim]
};

}  // namespace dzr
