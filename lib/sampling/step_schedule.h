#pragma once
/// Which denoising steps evaluate the DiT ("DiT cache" in the official code). On a skipped step the
/// last computed velocities are reused (zero-order hold) and both schedulers still step.
///
/// Kinds:
///  - fixed mask: the official NUM_DIT_STEPS presets for 16 steps (8 -> {0,1,2,6,10,13,14,15}, the
///    default; 5, 6 and 7 have their own masks; any other value runs every step), or a user mask;
///  - dynamic (official DYNAMIC_CACHE_SCHEDULE): always run the first two steps, then compare the
///    two most recent computed CFG video velocities by cosine similarity: > 0.95 skips this step and
///    the next 3, > 0.93 skips this step and the next one; after a skip run one step and re-evaluate.
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace dzr {

/// Thresholds of the dynamic schedule, checked in order: similarity > threshold => skip the current
/// step and the next `countdown - 1` steps.
struct DynamicScheduleParams {
    int warmup_steps = 2;
    std::vector<double> thresholds = {0.95, 0.93};
    std::vector<int> countdowns = {4, 2};
};

class StepSchedule {
  public:
    /// Every step runs.
    static StepSchedule all(int num_steps);
    /// The official NUM_DIT_STEPS presets (defined for 16 steps; with another step count every
    /// preset but "all" is an error).
    static StepSchedule from_num_dit_steps(int num_dit_steps, int num_steps = 16);
    /// A user mask; step 0 must run (a skipped step needs a velocity to reuse).
    static StepSchedule from_mask(std::vector<bool> mask);
    /// A user list of steps to run: "0,1,2,6,10,13,14,15" (sorted or not, no duplicates), or "all".
    static StepSchedule parse(std::string_view spec, int num_steps);
    static StepSchedule dynamic(int num_steps, DynamicScheduleParams params = {});

    bool is_dynamic() const { return dynamic_; }
    int num_steps() const { return int(mask_.size()); }
    /// The fixed mask (all true for a dynamic schedule: its decisions are made while running).
    const std::vector<bool>& mask() const { return mask_; }
    /// Steps a fixed mask runs.
    int num_network_steps() const;
    /// "0,1,2,6,10,13,14,15" or "dynamic".
    std::string describe() const;

    /// Start a new denoising loop.
    void reset();
    /// Decide whether step `index` (0..num_steps-1, in order) evaluates the network. For a dynamic
    /// schedule `similarity` is called only when the decision needs the cosine similarity of the two
    /// most recent computed video velocities; a fixed schedule never calls it.
    bool should_run(int index, const std::function<double()>& similarity = {});
    /// Network evaluations decided since reset().
    int computed_steps() const { return computed_; }

  private:
    std::vector<bool> mask_;
    bool dynamic_ = false;
    DynamicScheduleParams params_;
    int computed_ = 0;
    int skip_countdown_ = 0;
    int next_index_ = 0;
};

}  // namespace dzr
