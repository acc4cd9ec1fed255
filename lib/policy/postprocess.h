#pragma once
/// Action post-processing (dreamzero-reference.md §1.6): the model's normalized action chunk
/// [24, 32] -> robot actions [24, 8] float32 = 7 absolute joint targets + 1 absolute gripper.
///
///   dims 0..6: q99 inverse x = (n + 1) / 2 * (q99 - q01) + q01 in float32 (no clamp), with the
///              action.joint_position statistics (of the relative action), then + the call's raw
///              joint state in float64 (relative -> absolute), then float32;
///   dim 7:     q99 inverse with action.gripper_position, absolute;
///   dims 8..31 are discarded.
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

/// action_pred: [horizon, action_dim] row-major normalized actions (action_dim >= 8);
/// joint_state: the call's raw joint positions (7, float64). Returns [horizon, 8] row-major.
std::vector<float> postprocess_actions(std::span<const float> action_pred, int horizon, int action_dim,
                                       std::span<const double> joint_state,
                                       const EmbodimentStatistics& stats);

}  // namespace dzr
