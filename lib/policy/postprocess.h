#pragma once
/// Action post-processing (dreamzero-reference.md §1.6) for any embodiment: the model's normalized action
/// chunk [horizon, action_dim] -> robot actions [horizon, D] float32, D = the embodiment's action width:
///
///   per action key (ConcatTransform.unapply slices them in concatenation order; dims past the last key are
///   discarded), the inverse normalization (Normalizer.inverse) in float32 with float32 statistics, no clamp:
///     q99       (n + 1) / 2 * (q99 - q01) + q01
///     mean_std  n * std + mean
///     min_max   (n + 1) / 2 * (max - min) + min
///     binary    1 where n > 0.5, else 0
///     none      n
///   relative keys (relative_action_keys): + the call's raw state of the key of the same name in float64
///   (numpy promotes), then float32.
///
/// DROID: dims 0..6 are the relative joint positions (+ the joint state), dim 7 the absolute gripper.
#include <span>
#include <vector>

#include "policy/normalization.h"

namespace dzr {

inline constexpr int kPolicyActionHorizon = 24;  ///< actions per call (1.6 s at 15 Hz)
inline constexpr int kModelActionDim = 32;       ///< the DiT's action width (max_action_dim)
inline constexpr int kRobotActionDim = kDroidJointDims + kDroidGripperDims;

/// q99 inverse of one value in float32 with float32 statistics, as Normalizer.inverse on a float32
/// tensor: ((n + 1) / 2) * (q99 - q01) + q01.
float q99_unnormalize(float n, float q01, float q99);

/// Normalizer.inverse of element `i` of `key` (float32).
float unnormalize_value(float n, const ArraySpec& key, size_t i);

/// action_pred: [horizon, action_dim] row-major normalized actions (action_dim >= the embodiment's width);
/// state: the call's raw state (the embodiment's state keys concatenated, float64). Returns
/// [horizon, embodiment.action_dim()] row-major.
std::vector<float> postprocess_actions(std::span<const float> action_pred, int horizon, int action_dim,
                                       std::span<const double> state, const Embodiment& embodiment);

/// DROID's form: `joint_state` is the call's raw joint positions (7, float64). Returns [horizon, 8].
std::vector<float> postprocess_actions(std::span<const float> action_pred, int horizon, int action_dim,
                                       std::span<const double> joint_state,
                                       const EmbodimentStatistics& stats);

}  // namespace dzr
