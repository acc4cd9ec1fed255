#pragma once
/// State normalization of the policy (the reference's StateActionTransform, groot/vla/data/transform/
/// state_action.py Normalizer.forward) per key of the embodiment, with the statistics of
/// experiment_cfg/metadata.json, and DreamTransform's zero-padding to max_state_dim.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "config/embodiment.h"
#include "config/statistics.h"

namespace dzr {

inline constexpr int kDroidJointDims = 7;
inline constexpr int kDroidGripperDims = 1;
inline constexpr int kDroidStateDims = kDroidJointDims + kDroidGripperDims;
inline constexpr int kMaxStateDim = 64;  ///< the DiT's state width (droid_relative.yaml max_state_dim)

/// n = clamp(2 (x - q01) / (q99 - q01) - 1, -1, 1) per dim in float64; dims with q01 == q99 pass x
/// through before the clamp. `key` names the statistics in errors (dimension mismatch).
void q99_normalize(std::span<const double> x, const KeyStatistics& stats, std::span<double> out,
                   std::string_view key);

/// Normalizer.forward of one key on float64 values with its float32 statistics widened, by mode:
///   q99       as q99_normalize
///   mean_std  (x - mean) / std where std != 0, else x (no clamp)
///   min_max   clamp(2 (x - min) / (max - min) - 1, -1, 1) where min != max, else 0
///   scale     x / max(|min|, |max|) where that is not 0, else 0
///   binary    1 where x > 0.5, else 0
///   none      x
/// `what` names the key in errors.
void normalize_key(std::span<const double> x, const ArraySpec& key, std::span<double> out, std::string_view what);

/// The policy's state input: `state` (the embodiment's state keys concatenated, raw) normalized key by key
/// and zero-padded to `max_state_dim`, in float64. Throws naming the embodiment when the widths differ.
std::vector<double> prepare_state(std::span<const double> state, const Embodiment& embodiment, int max_state_dim);

/// DROID's form: normalized state.joint_position (7) and state.gripper_position (1) of `stats`,
/// concatenated (joint first) and zero-padded to `max_state_dim`, in float64.
std::vector<double> prepare_state(std::span<const double> joint_position,
                                  std::span<const double> gripper_position, const EmbodimentStatistics& stats,
                                  int max_state_dim = kMaxStateDim);

/// The built-in oxe_droid embodiment with `stats` bound (joint 7, gripper 1; throws when the statistics of
/// those keys are missing or of another width).
Embodiment droid_embodiment(const EmbodimentStatistics& stats);

/// What the policy needs of an embodiment's statistics, checked before anything runs: state and action
/// joint_position (7 dims) and gripper_position (1 dim), finite, with q01 < q99 in every dimension (an equal
/// pair would pass the state through unnormalized and collapse the actions to q01). Returns one line per problem,
/// each starting with `source` (the metadata.json path); empty when usable.
std::vector<std::string> check_policy_statistics(const EmbodimentStatistics& stats, const std::string& source);
/// The same for every normalized state and action key of an embodiment with its bound statistics, by the key's
/// normalization mode (q01 < q99, min < max, std > 0, all finite, of the key's width).
std::vector<std::string> check_policy_statistics(const Embodiment& e, const std::string& source);

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
