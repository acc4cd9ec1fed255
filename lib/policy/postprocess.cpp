#include "policy/postprocess.h"

#include "core/error.h"

namespace dzr {

float q99_unnormalize(float n, float q01, float q99) {
    const float range = q99 - q01;
    return (n + 1.0f) / 2.0f * range + q01;
}

float unnormalize_value(float n, const ArraySpec& key, size_t i) {
    const KeyStatistics& st = key.stats;
    switch (key.norm) {
        case NormMode::None:
            return n;
        case NormMode::Q99:
            return q99_unnormalize(n, st.q01[i], st.q99[i]);
        case NormMode::MeanStd:
            return n * st.std[i] + st.mean[i];
        case NormMode::MinMax: {
            const float range = st.max[i] - st.min[i];
            return (n + 1.0f) / 2.0f * range + st.min[i];
        }
        case NormMode::Binary:
            return n > 0.5f ? 1.0f : 0.0f;
        case NormMode::Scale:
            break;
    }
    DZR_THROW("action.{}: normalization mode {} has no inverse", key.key, norm_mode_name(key.norm));
}

std::vector<float> postprocess_actions(std::span<const float> action_pred, int horizon, int action_dim,
                                       std::span<const double> state, const Embodiment& e) {
    const int out_dim = e.action_dim();
    DZR_CHECK(horizon >= 1 && out_dim >= 1 && action_dim >= out_dim &&
                  action_pred.size() == size_t(horizon) * size_t(action_dim),
              "actions: expected [{}, {}] = {} values with at least {} dims (embodiment {}), got {} values", horizon,
              action_dim, size_t(horizon) * size_t(action_dim), out_dim, e.tag, action_pred.size());
    DZR_CHECK(state.size() == size_t(e.state_dim()), "actions: the state has {} values, embodiment {} has {}",
              state.size(), e.tag, e.state_dim());
    for (const auto& k : e.action) {
        if (k.norm == NormMode::Q99)
            DZR_CHECK(k.stats.q01.size() == size_t(k.dim) && k.stats.q99.size() == size_t(k.dim),
                      "actions: action.{} statistics have {} / {} dims (q01 / q99), expected {}", k.key,
                      k.stats.q01.size(), k.stats.q99.size(), k.dim);
        if (k.norm == NormMode::MeanStd)
            DZR_CHECK(k.stats.mean.size() == size_t(k.dim) && k.stats.std.size() == size_t(k.dim),
                      "actions: action.{} has no mean/std statistics of {} dims", k.key, k.dim);
        if (k.norm == NormMode::MinMax)
            DZR_CHECK(k.stats.min.size() == size_t(k.dim) && k.stats.max.size() == size_t(k.dim),
                      "actions: action.{} has no min/max statistics of {} dims", k.key, k.dim);
        DZR_CHECK(k.norm != NormMode::Scale, "actions: action.{} is normalized with `scale`, which has no inverse", k.key);
    }
    // The state offset of each relative key (checked by check_embodiment; checked again here, cheaply).
    std::vector<int> state_offset(e.action.size(), -1);
    for (size_t a = 0; a < e.action.size(); ++a) {
        if (!e.action[a].relative) continue;
        const ArraySpec* s = e.find_state(e.action[a].key);
        DZR_CHECK(s != nullptr && s->dim == e.action[a].dim, "actions: relative action.{} has no state.{} of {} dims",
                  e.action[a].key, e.action[a].key, e.action[a].dim);
        state_offset[a] = s->offset;
    }
    std::vector<float> out(size_t(horizon) * size_t(out_dim));
    for (int t = 0; t < horizon; ++t) {
        const float* row = action_pred.data() + size_t(t) * size_t(action_dim);
        float* o = out.data() + size_t(t) * size_t(out_dim);
        for (size_t a = 0; a < e.action.size(); ++a) {
            const ArraySpec& k = e.action[a];
            for (int d = 0; d < k.dim; ++d) {
                const float v = unnormalize_value(row[k.offset + d], k, size_t(d));
                // NOTE: the reference adds the float64 numpy state to the float32 tensor, promoting to float64.
                o[k.offset + d] = state_offset[a] >= 0 ? float(double(v) + state[size_t(state_offset[a] + d)]) : v;
            }
        }
    }
    return out;
}

std::vector<float> postprocess_actions(std::span<const float> action_pred, int horizon, int action_dim,
                                       std::span<const double> joint_state,
                                       const EmbodimentStatistics& stats) {
    DZR_CHECK(joint_state.size() == size_t(kDroidJointDims),
              "actions: the joint state has {} values, expected {}", joint_state.size(), kDroidJointDims);
    // NOTE: the gripper state does not enter the DROID actions (the gripper action is absolute).
    std::vector<double> state(joint_state.begin(), joint_state.end());
    state.push_back(0.0);
    return postprocess_actions(action_pred, horizon, action_dim, state, droid_embodiment(stats));
}

}  // namespace dzr
