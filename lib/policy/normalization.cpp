#include "policy/normalization.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace dzr {

void q99_normalize(std::span<const double> x, const KeyStatistics& stats, std::span<double> out,
                   std::string_view key) {
    DZR_CHECK(stats.q01.size() == x.size() && stats.q99.size() == x.size() && out.size() == x.size(),
              "q99 normalization of {}: {} values but the statistics have q01 {} / q99 {} entries", key,
              x.size(), stats.q01.size(), stats.q99.size());
    for (size_t i = 0; i < x.size(); ++i) {
        // NOTE: metadata.json holds float64 numbers and the reference normalizes in float64; the
        // statistics reach us as float (KeyStatistics), widened here.
        const double q01 = stats.q01[i], q99 = stats.q99[i];
        double n = x[i];
        if (q01 != q99) {
            n = (x[i] - q01) / (q99 - q01);
            n = 2.0 * n - 1.0;
        }
        out[i] = std::clamp(n, -1.0, 1.0);
    }
}

std::vector<double> prepare_state(std::span<const double> joint_position,
                                  std::span<const double> gripper_position, const EmbodimentStatistics& stats,
                                  int max_state_dim) {
    DZR_CHECK(joint_position.size() == size_t(kDroidJointDims) &&
                  gripper_position.size() == size_t(kDroidGripperDims),
              "state: expected {} joint positions and {} gripper position, got {} and {}", kDroidJointDims,
              kDroidGripperDims, joint_position.size(), gripper_position.size());
    DZR_CHECK(max_state_dim >= kDroidStateDims, "state: max_state_dim {} is below the {} state dims",
              max_state_dim, kDroidStateDims);
    std::vector<double> out(size_t(max_state_dim), 0.0);
    q99_normalize(joint_position, stats.get("state", "joint_position"),
                  std::span<double>(out.data(), size_t(kDroidJointDims)), "state.joint_position");
    q99_normalize(gripper_position, stats.get("state", "gripper_position"),
                  std::span<double>(out.data() + kDroidJointDims, size_t(kDroidGripperDims)),
                  "state.gripper_position");
    return out;
}

float round_f64_to_bf16(double v) {
    if (!std::isfinite(v) || v == 0.0) return float(v);
    int e = 0;
    const double m = std::frexp(v, &e);                 // |m| in [0.5, 1)
    const double r = std::nearbyint(std::ldexp(m, 8));  // 8 significant bits, ties to even
    return float(std::ldexp(r, e - 8));
}

}  // namespace dzr
