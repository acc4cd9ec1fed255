#include "policy/step_plan.h"

namespace dzr {

StepSchedule make_step_schedule(const config::SamplingConfig& s) {
    if (s.dynamic_schedule) return StepSchedule::dynamic(s.num_inference_steps);
    if (!s.dit_step_mask.empty()) return StepSchedule::from_mask(s.dit_step_mask);
    if (s.num_dit_steps == s.num_inference_steps) return StepSchedule::all(s.num_inference_steps);
    return StepSchedule::from_num_dit_steps(s.num_dit_steps, s.num_inference_steps);
}

}  // namespace dzr
