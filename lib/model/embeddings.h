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

/// A forward's timestep rows at fixed device addresses (TimestepTables::make_rows, filled by stage()): a forward that
/// reads its sinusoids from here instead of from the tables' rows queues the same ops for every timestep, so a CUDA
/// graph captured at one timestep replays at any other (the rows are rewritten before each replay, on the stream).
struct TimestepRows {
    Tensor dit;     ///< [2, dit_dim]: row 0 the video timestep's sinusoid, row 1 the action timestep's
    Tensor action;  ///< [1, action_dim]: the action timestep's action-encoder sinusoid
};

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

    /// Persistent rows for stage() on `be` (the tables' backend or another of the same geometry).
    TimestepRows make_rows(Backend& be) const;
    /// Queues device copies of timestep `video`'s DiT row into rows.dit[0] and, when `action` >= 0, of timestep
    /// `action`'s DiT and action-encoder rows into rows.dit[1] and rows.action. Throws (before queueing anything)
    /// for a timestep outside [0, kNumTrainTimesteps). `be` must be the tables' backend.
    void stage(Backend& be, int64_t video, int64_t action, const TimestepRows& rows) const;

  private:
    Tensor dit_;     // [kNumTrainTimesteps, dit_dim]
    Tensor action_;  // [kNumTrainTimesteps, action_dim]
};

}  // namespace dzr
