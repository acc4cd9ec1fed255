#pragma once
/// q99 normalization of the robot state and its inverse for actions (the reference's
/// StateActionTransform, groot/vla/data/transform/state_action.py Normalizer, mode "q99"), with the
/// statistics of experiment_cfg/metadata.json (weights/checkpoint.h: EmbodimentStatistics).
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "weights/checkpoint.h"

namespace dzr {

inline constexpr int kDroidJointDims = 7;
inline constexpr int kDroidGripperDims = 1;
inline constexpr int kDroidStateDims = kDroidJointDims + kDroidGripperDims;
inline constexpr int kMaxStateDim = 64;  ///< the DiT's state width (droid_relative.yaml max_state_dim)

/// n = clamp(2 (x - q01) / (q99 - q01) - 1, -1, 1) per dim in float64; dims with q01 == q99 pass x
/// through before the clamp. `key` names the statistics in errors (dimension mismatch).
void q99_normalize(std::span<const double> x, const KeyStatistics& stats, std::span<double> out,
                   std::string_view key);

/// The policy's state input: normalized state.joint_position (7) and state.gripper_position (1) of
/// `stats`, concatenated (joint first) and zero-padded to `max_state_dim`, in float64.
std::vector<double> prepare_state(std::span<const double> joint_position,
                                  std::span<const double> gripper_position, const EmbodimentStatistics& stats,
                                  int max_state_dim = kMaxStateDim);

/// What the policy needs of an embodiment's statistics, checked before anything runs: state and action
/// joint_position (7 dims) and gripper_position (1 dim), finite, with q01 < q99 in every dimension (an equal
/// pair would pass the state through unnormalized and collapse the actions to q01). Returns one line per problem,
/// each starting with `source` (the metadata.json path); empty when usable.
std::vector<std::string> check_policy_statistics(const EmbodimentStatistics& stats, const std::string& source);

/// The state far outside what the checkpoint saw: values beyond [q01 - r, q99 + r] (r = q99 - q01) in some
/// dimension of `key` ([rows, dim] row-major). Returns one warning naming the worst dimension and its range,
/// with the likely cause (degrees instead of radians for a joint, 0..255 or 0..100 for a gripper); empty when
/// every value is within.
std::string check_state_range(std::string_view key, std::span<const double> values, int64_t dim,
                              const KeyStatistics& stats);

/// Rounds a double straight to the nearest bf16 (ties to even), as torch's float64 -> bfloat16 cast
/// does, and returns it as float (exactly representable). Rounding through float32 first can differ
/// at ties.
float round_f64_to_bf16(double v);

}  // namespace dzr
