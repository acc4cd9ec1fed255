#pragma once
/// Which denoising steps evaluate the DiT, from the run's sampling settings (config/run_config.h says which
/// combinations are valid; reading the config rejects the others).
#include "config/run_config.h"
#include "sampling/step_schedule.h"

namespace dzr {

/// The dynamic schedule, an explicit mask, every step (num_dit_steps = num_inference_steps) or a preset.
StepSchedule make_step_schedule(const config::SamplingConfig& sampling);

}  // namespace dzr
