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

float round_f64_to_bf16(double v) {
    if (!std::isfinite(v) || v == 0.0) return float(v);
    int e = 0;
    const double m = std::frexp(v, &e);                 // |m| in [0.5, 1)
    const double r = std::nearbyint(std::ldexp(m, 8));  // 8 significant bits, ties to even
    return float(std::ldexp(r, e - 8));
}

}  // namespace dzr
