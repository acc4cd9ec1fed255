#include "sampling/denoise_loop.h"

#include "core/error.h"
#include "sampling/cfg.h"

namespace dzr {

int run_denoise_loop(Backend& be, FlowUniPC& video_sampler, FlowUniPC& action_sampler, StepSchedule& schedule,
                     const DenoiseTensors& t, const VelocityFn& evaluate) {
    const int n = video_sampler.num_steps();
    DZR_CHECK(action_sampler.num_steps() == n && schedule.num_steps() == n,
              "denoise loop: video sampler ({}), action sampler ({}) and step schedule ({}) disagree on the "
              "step count",
              n, action_sampler.num_steps(), schedule.num_steps());
    DZR_CHECK(bool(evaluate), "denoise loop: no velocity evaluator");
    if (schedule.is_dynamic()) {
        DZR_CHECK(t.previous_video_velocity.defined() &&
                      t.previous_video_velocity.numel() == t.video_velocity.numel() &&
                      t.previous_video_velocity.dtype == t.video_velocity.dtype,
                  "denoise loop: the dynamic schedule needs previous_video_velocity like video_velocity {}",
                  t.video_velocity.str());
    }
    video_sampler.reset();
    action_sampler.reset();
    schedule.reset();
    auto similarity = [&] { return cosine_similarity(be, t.video_velocity, t.previous_video_velocity); };
    int evaluations = 0;
    for (int i = 0; i < n; ++i) {
        const bool run = schedule.should_run(i, similarity);
        if (run) {
            if (schedule.is_dynamic() && evaluations > 0)
                be.copy(t.video_velocity, t.previous_video_velocity);
            evaluate(DenoiseStep{i, video_sampler.timestep(i), action_sampler.timestep(i)});
            ++evaluations;
        }
        DZR_CHECK(evaluations > 0, "denoise loop: step {} skipped before any network evaluation", i);
        video_sampler.step(t.video_velocity, t.video);
        action_sampler.step(t.action_velocity, t.action);
    }
    return evaluations;
}

}  // namespace dzr
