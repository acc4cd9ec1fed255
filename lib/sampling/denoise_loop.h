#pragma once
/// The denoising loop of one policy call, without the network: for each of the n steps, ask the
/// step schedule whether the DiT runs; if so let the caller evaluate it (the caller writes the CFG
/// video velocity and the conditional action velocity), else keep the previous velocities
/// (zero-order hold); then step both FlowUniPC samplers. Mirrors the official loop
/// (wan_flow_matching_action_tf.py:1227-1305).
#include <cstdint>
#include <functional>

#include "backend/backend.h"
#include "sampling/flow_unipc.h"
#include "sampling/step_schedule.h"

namespace dzr {

/// Device tensors of the loop. The samples are updated in place; the velocities hold the last
/// computed values between steps.
struct DenoiseTensors {
    TensorView video;                    ///< x, video latent (in: noise, out: denoised)
    TensorView action;                   ///< action chunk (in: noise, out: denoised, normalized)
    TensorView video_velocity;           ///< written by the evaluator: guided video velocity
    TensorView action_velocity;          ///< written by the evaluator: conditional action velocity
    TensorView previous_video_velocity;  ///< dynamic schedule only: the one computed before
};

/// What the evaluator is asked at a network step.
struct DenoiseStep {
    int index = 0;
    int64_t video_timestep = 0;   ///< integer timestep the DiT sees for the video tokens
    int64_t action_timestep = 0;  ///< and for the action tokens (equal unless schedules differ)
};

/// Reads tensors.video / tensors.action and writes tensors.video_velocity / action_velocity.
using VelocityFn = std::function<void(const DenoiseStep&)>;

/// Runs the loop; resets both samplers and the schedule first. Returns the number of network
/// evaluations. A dynamic schedule needs `previous_video_velocity` (same shape and dtype as
/// video_velocity); its similarity check synchronizes with the device.
int run_denoise_loop(Backend& be, FlowUniPC& video_sampler, FlowUniPC& action_sampler, StepSchedule& schedule,
                     const DenoiseTensors& tensors, const VelocityFn& evaluate);

}  // namespace dzr
