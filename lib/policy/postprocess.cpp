#include "policy/postprocess.h"

#include "core/error.h"

namespace dzr {

float q99_unnormalize(float n, float q01, float q99) {
    const float range = q99 - q01;
    return (n + 1.0f) / 2.0f * range + q01;
}

std::vector<float> postprocess_actions(std::span<const float> action_pred, int horizon, int action_dim,
                                       std::span<const double> joint_state,
                                       const EmbodimentStatistics& stats) {
    DZR_CHECK(horizon >= 1 && action_dim >= kRobotActionDim &&
                  action_pred.size() == size_t(horizon) * size_t(action_dim),
              "actions: expected [{}, {}] = {} values with at least {} dims, got {} values", horizon,
              action_dim, size_t(horizon) * size_t(action_dim), kRobotActionDim, action_pred.size());
    DZR_CHECK(joint_state.size() == size_t(kDroidJointDims),
              "actions: the joint state has {} values, expected {}", joint_state.size(), kDroidJointDims);
    const KeyStatistics& joint = stats.get("action", "joint_position");
    const KeyStatistics& gripper = stats.get("action", "gripper_position");
    DZR_CHECK(joint.q01.size() == size_t(kDroidJointDims) && joint.q99.size() == size_t(kDroidJointDims),
              "actions: action.joint_position statistics have {} dims, expected {}", joint.q01.size(),
              kDroidJointDims);
    DZR_CHECK(
        gripper.q01.size() == size_t(kDroidGripperDims) && gripper.q99.size() == size_t(kDroidGripperDims),
        "actions: action.gripper_position statistics have {} dims, expected {}", gripper.q01.size(),
        kDroidGripperDims);
    std::vector<float> out(size_t(horizon) * size_t(kRobotActionDim));
    for (int t = 0; t < horizon; ++t) {
        const float* row = action_pred.data() + size_t(t) * size_t(action_dim);
        float* o = out.data() + size_t(t) * size_t(kRobotActionDim);
        for (int d = 0; d < kDroidJointDims; ++d) {
            const float rel = q99_unnormalize(row[d], joint.q01[size_t(d)], joint.q99[size_t(d)]);
            // NOTE: the reference adds the float64 numpy state to the float32 tensor, promoting to float64.
            o[d] = float(double(rel) + joint_state[size_t(d)]);
        }
        o[kDroidJointDims] = q99_unnormalize(row[kDroidJointDims], gripper.q01[0], gripper.q99[0]);
    }
    return out;
}

}  // namespace dzr
