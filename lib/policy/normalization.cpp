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

void normalize_key(std::span<const double> x, const ArraySpec& key, std::span<double> out, std::string_view what) {
    DZR_CHECK(x.size() == size_t(key.dim) && out.size() == x.size(), "normalization of {}: {} values for a key {} wide",
              what, x.size(), key.dim);
    const KeyStatistics& st = key.stats;
    auto need = [&](const std::vector<float>& v, const char* name) {
        DZR_CHECK(v.size() == x.size(), "{} normalization of {}: the statistics have {} {} entries, expected {}",
                  norm_mode_name(key.norm), what, v.size(), name, x.size());
    };
    switch (key.norm) {
        case NormMode::None:
            std::copy(x.begin(), x.end(), out.begin());
            return;
        case NormMode::Q99:
            q99_normalize(x, st, out, what);
            return;
        case NormMode::MeanStd:
            need(st.mean, "mean");
            need(st.std, "std");
            for (size_t i = 0; i < x.size(); ++i) {
                const double mean = st.mean[i], sd = st.std[i];
                out[i] = sd != 0.0 ? (x[i] - mean) / sd : x[i];
            }
            return;
        case NormMode::MinMax:
            need(st.min, "min");
            need(st.max, "max");
            for (size_t i = 0; i < x.size(); ++i) {
                const double lo = st.min[i], hi = st.max[i];
                double n = 0.0;
                if (lo != hi) {
                    n = (x[i] - lo) / (hi - lo);
                    n = 2.0 * n - 1.0;
                }
                out[i] = std::clamp(n, -1.0, 1.0);
            }
            return;
        case NormMode::Scale:
            need(st.min, "min");
            need(st.max, "max");
            for (size_t i = 0; i < x.size(); ++i) {
                const double abs_max = std::max(std::abs(double(st.min[i])), std::abs(double(st.max[i])));
                out[i] = abs_max != 0.0 ? x[i] / abs_max : 0.0;
            }
            return;
        case NormMode::Binary:
            for (size_t i = 0; i < x.size(); ++i) out[i] = x[i] > 0.5 ? 1.0 : 0.0;
            return;
    }
}

std::vector<double> prepare_state(std::span<const double> state, const Embodiment& e, int max_state_dim) {
    DZR_CHECK(state.size() == size_t(e.state_dim()), "state: embodiment {} has {} state values ({} keys), got {}",
              e.tag, e.state_dim(), e.state.size(), state.size());
    DZR_CHECK(max_state_dim >= e.state_dim(), "state: max_state_dim {} is below embodiment {}'s {} state dims",
              max_state_dim, e.tag, e.state_dim());
    std::vector<double> out(size_t(max_state_dim), 0.0);
    for (const auto& k : e.state)
        normalize_key(state.subspan(size_t(k.offset), size_t(k.dim)), k,
                      std::span<double>(out.data() + k.offset, size_t(k.dim)), "state." + k.key);
    return out;
}

Embodiment droid_embodiment(const EmbodimentStatistics& stats) {
    Embodiment e = builtin_embodiment("oxe_droid");
    for (auto* group : {&e.state, &e.action}) {
        const char* name = group == &e.state ? "state" : "action";
        for (auto& k : *group) {
            k.stats = stats.get(name, k.key);
            DZR_CHECK(k.stats.q01.size() == size_t(k.dim) && k.stats.q99.size() == size_t(k.dim),
                      "{}.{} statistics have {} / {} dims (q01 / q99), expected {}", name, k.key, k.stats.q01.size(),
                      k.stats.q99.size(), k.dim);
        }
    }
    e.has_statistics = true;
    return e;
}

std::vector<double> prepare_state(std::span<const double> joint_position,
                                  std::span<const double> gripper_position, const EmbodimentStatistics& stats,
                                  int max_state_dim) {
    DZR_CHECK(joint_position.size() == size_t(kDroidJointDims) &&
                  gripper_position.size() == size_t(kDroidGripperDims),
              "state: expected {} joint positions and {} gripper position, got {} and {}", kDroidJointDims,
              kDroidGripperDims, joint_position.size(), gripper_position.size());
    std::vector<double> state(joint_position.begin(), joint_position.end());
    state.insert(state.end(), gripper_position.begin(), gripper_position.end());
    return prepare_state(state, droid_embodiment(stats), max_state_dim);
}

namespace {

/// The problems of one key's statistics for its normalization mode: present, of the key's width, finite, and
/// spread (an equal pair would pass the state through unnormalized and collapse the actions to one value).
void check_key_statistics(const std::string& where, const KeyStatistics* k, int dim, NormMode mode,
                          std::vector<std::string>& problems) {
    if (mode == NormMode::None || mode == NormMode::Binary) return;
    if (!k) {
        problems.push_back(where + " is missing (the policy normalizes with it)");
        return;
    }
    const auto pair = [&](const std::vector<float>& lo_v, const std::vector<float>& hi_v, const char* lo_name,
                          const char* hi_name, bool strict_order) {
        if (lo_v.size() != size_t(dim) || hi_v.size() != size_t(dim)) {
            problems.push_back(fmt::format("{}: {} and {} need {} values, found {} and {}", where, lo_name, hi_name,
                                           dim, lo_v.size(), hi_v.size()));
            return;
        }
        for (int d = 0; d < dim; ++d) {
            const float lo = lo_v[size_t(d)], hi = hi_v[size_t(d)];
            if (!std::isfinite(lo) || !std::isfinite(hi))
                problems.push_back(
                    fmt::format("{}: dimension {}: {} {} and {} {} must be finite", where, d, lo_name, lo, hi_name, hi));
            else if (strict_order && !(lo < hi))
                problems.push_back(fmt::format("{}: dimension {}: {} = {} must be below {} = {} ({} normalization "
                                               "divides by their difference)",
                                               where, d, lo_name, lo, hi_name, hi, norm_mode_name(mode)));
        }
    };
    switch (mode) {
        case NormMode::Q99:
            pair(k->q01, k->q99, "q01", "q99", true);
            break;
        case NormMode::MinMax:
            pair(k->min, k->max, "min", "max", true);
            break;
        case NormMode::Scale:
            pair(k->min, k->max, "min", "max", false);
            break;
        case NormMode::MeanStd:
            pair(k->mean, k->std, "mean", "std", false);
            for (size_t d = 0; d < k->std.size(); ++d)
                if (std::isfinite(k->std[d]) && !(k->std[d] > 0.0f))
                    problems.push_back(fmt::format("{}: dimension {}: std = {} must be positive", where, d, k->std[d]));
            break;
        default:
            break;
    }
}

const KeyStatistics* find_statistics(const EmbodimentStatistics& stats, const char* group, const std::string& key) {
    const auto& g = std::string(group) == "state" ? stats.state : stats.action;
    const auto it = g.find(key);
    return it == g.end() ? nullptr : &it->second;
}

}  // namespace

std::vector<std::string> check_policy_statistics(const EmbodimentStatistics& stats, const std::string& source) {
    std::vector<std::string> problems;
    const std::pair<const char*, int> keys[] = {{"joint_position", kDroidJointDims}, {"gripper_position", kDroidGripperDims}};
    for (const char* group : {"state", "action"})
        for (const auto& [key, dim] : keys)
            check_key_statistics(fmt::format("{}: {}.statistics.{}.{}", source, stats.tag, group, key),
                                 find_statistics(stats, group, key), dim, NormMode::Q99, problems);
    return problems;
}

std::vector<std::string> check_policy_statistics(const Embodiment& e, const std::string& source) {
    std::vector<std::string> problems;
    for (const auto& [group, keys] : {std::pair{"state", &e.state}, std::pair{"action", &e.action}})
        for (const ArraySpec& k : *keys)
            check_key_statistics(fmt::format("{}: {}.statistics.{}.{}", source, e.tag, group, k.key),
                                 e.has_statistics ? &k.stats : nullptr, k.dim, k.norm, problems);
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
