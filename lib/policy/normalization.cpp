#include "policy/normalization.h"

#include <fmt/format.h>

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

std::vector<std::string> check_policy_statistics(const EmbodimentStatistics& stats, const std::string& source) {
    std::vector<std::string> problems;
    const std::pair<const char*, int> keys[] = {{"joint_position", kDroidJointDims}, {"gripper_position", kDroidGripperDims}};
    for (const char* group : {"state", "action"}) {
        const auto& g = std::string(group) == "state" ? stats.state : stats.action;
        for (const auto& [key, dim] : keys) {
            const std::string where = fmt::format("{}: {}.statistics.{}.{}", source, stats.tag, group, key);
            auto it = g.find(key);
            if (it == g.end()) {
                problems.push_back(where + " is missing (the policy normalizes with it)");
                continue;
            }
            const KeyStatistics& k = it->second;
            if (k.q01.size() != size_t(dim) || k.q99.size() != size_t(dim)) {
                problems.push_back(fmt::format("{}: q01 and q99 need {} values, found {} and {}", where, dim,
                                               k.q01.size(), k.q99.size()));
                continue;
            }
            for (int d = 0; d < dim; ++d) {
                const float lo = k.q01[size_t(d)], hi = k.q99[size_t(d)];
                if (!std::isfinite(lo) || !std::isfinite(hi)) {
                    problems.push_back(fmt::format("{}: dimension {}: q01 {} and q99 {} must be finite", where, d, lo, hi));
                } else if (!(lo < hi)) {
                    problems.push_back(fmt::format("{}: dimension {}: q01 = {} must be below q99 = {} (the q99 "
                                                   "normalization divides by q99 - q01)",
                                                   where, d, lo, hi));
                }
            }
        }
    }
    return problems;
}

std::string check_state_range(std::string_view key, std::span<const double> values, int64_t dim,
                              const KeyStatistics& stats) {
    if (dim <= 0 || stats.q01.size() != size_t(dim) || stats.q99.size() != size_t(dim)) return {};
    int worst_dim = -1;
    double worst_value = 0, worst_excess = 0;
    for (size_t i = 0; i < values.size(); ++i) {
        const int64_t d = int64_t(i % size_t(dim));
        const double lo = stats.q01[size_t(d)], hi = stats.q99[size_t(d)], r = hi - lo;
        const double v = values[i];
        // NOTE: "far" is more than the whole q01..q99 range beyond either end; noise near the quantiles is normal.
        const double excess = v < lo - r ? (lo - v) / std::max(r, 1e-12) : v > hi + r ? (v - hi) / std::max(r, 1e-12) : 0;
        if (excess > worst_excess) {
            worst_excess = excess;
            worst_dim = int(d);
            worst_value = v;
        }
    }
    if (worst_dim < 0) return {};
    const double lo = stats.q01[size_t(worst_dim)], hi = stats.q99[size_t(worst_dim)];
    std::string cause;
    if (key == "joint_position") {
        const double as_radians = worst_value * 3.14159265358979323846 / 180.0;
        if (as_radians >= lo - (hi - lo) && as_radians <= hi + (hi - lo))
            cause = "; these look like degrees: dzr expects joint positions in radians";
        else
            cause = "; check the units (radians expected) and that the columns are the joints in order";
    } else if (key == "gripper_position") {
        cause = worst_value > 1.5 ? "; the gripper is expected in 0 (open) .. 1 (closed), not 0..100 or 0..255" : "";
    }
    return fmt::format("state {}[{}] reaches {:.6g}, far outside the checkpoint's q01..q99 range {:.6g}..{:.6g}{}",
                       key, worst_dim, worst_value, lo, hi, cause);
}

float round_f64_to_bf16(double v) {
    if (!std::isfinite(v) || v == 0.0) return float(v);
    int e = 0;
    const double m = std::frexp(v, &e);                 // |m| in [0.5, 1)
    const double r = std::nearbyint(std::ldexp(m, 8));  // 8 significant bits, ties to even
    return float(std::ldexp(r, e - 8));
}

}  // namespace dzr
