#include "sampling/step_schedule.h"

#include <charconv>

#include "core/error.h"

namespace dzr {
namespace {

constexpr int kPresetSteps = 16;

std::vector<bool> mask_from_steps(std::initializer_list<int> run, int num_steps) {
    std::vector<bool> m(size_t(num_steps), false);
    for (int s : run) m[size_t(s)] = true;
    return m;
}

}  // namespace

StepSchedule StepSchedule::all(int num_steps) {
    DZR_CHECK(num_steps >= 1, "step schedule: num_steps must be >= 1, got {}", num_steps);
    StepSchedule s;
    s.mask_.assign(size_t(num_steps), true);
    return s;
}

StepSchedule StepSchedule::from_num_dit_steps(int num_dit_steps, int num_steps) {
    // NOTE: the official presets (wan_flow_matching_action_tf.py:210-223) are 16-entry masks; any
    // value without a preset runs every step.
    const bool has_preset = num_dit_steps >= 5 && num_dit_steps <= 8;
    if (!has_preset) return all(num_steps);
    DZR_CHECK(num_steps == kPresetSteps,
              "step schedule: the NUM_DIT_STEPS={} preset is defined for {} denoising steps, not {}",
              num_dit_steps, kPresetSteps, num_steps);
    switch (num_dit_steps) {
        case 5:
            return from_mask(mask_from_steps({0, 1, 2, 7, 12}, kPresetSteps));
        case 6:
            return from_mask(mask_from_steps({0, 1, 5, 10, 14, 15}, kPresetSteps));
        case 7:
            return from_mask(mask_from_steps({0, 1, 2, 6, 10, 14, 15}, kPresetSteps));
        default:
            return from_mask(mask_from_steps({0, 1, 2, 6, 10, 13, 14, 15}, kPresetSteps));
    }
}

StepSchedule StepSchedule::from_mask(std::vector<bool> mask) {
    DZR_CHECK(!mask.empty(), "step schedule: empty step mask");
    DZR_CHECK(mask[0], "step schedule: step 0 must run (a skipped step reuses the previous velocity)");
    StepSchedule s;
    s.mask_ = std::move(mask);
    return s;
}

StepSchedule StepSchedule::parse(std::string_view spec, int num_steps) {
    DZR_CHECK(num_steps >= 1, "step schedule: num_steps must be >= 1, got {}", num_steps);
    if (spec == "all") return all(num_steps);
    if (spec == "dynamic") return dynamic(num_steps);
    DZR_CHECK(!spec.empty(), "step schedule: empty step list (expected e.g. \"0,1,2,6,10,13,14,15\")");
    std::vector<bool> mask(size_t(num_steps), false);
    size_t pos = 0;
    while (pos <= spec.size()) {
        const size_t comma = std::min(spec.find(',', pos), spec.size());
        std::string_view item = spec.substr(pos, comma - pos);
        while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
        while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
        int value = -1;
        const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
        DZR_CHECK(!item.empty() && ec == std::errc() && end == item.data() + item.size(),
                  "step schedule \"{}\": \"{}\" is not a step index", spec, item);
        DZR_CHECK(value >= 0 && value < num_steps, "step schedule \"{}\": step {} is outside 0..{}", spec,
                  value, num_steps - 1);
        DZR_CHECK(!mask[size_t(value)], "step schedule \"{}\": step {} is listed twice", spec, value);
        mask[size_t(value)] = true;
        pos = comma + 1;
    }
    DZR_CHECK(mask[0], "step schedule \"{}\": step 0 must run (a skipped step reuses the previous velocity)",
              spec);
    return from_mask(std::move(mask));
}

StepSchedule StepSchedule::dynamic(int num_steps, DynamicScheduleParams params) {
    DZR_CHECK(params.thresholds.size() == params.countdowns.size(),
              "step schedule: {} dynamic thresholds but {} countdowns", params.thresholds.size(),
              params.countdowns.size());
    DZR_CHECK(params.warmup_steps >= 1, "step schedule: the dynamic schedule needs >= 1 warm-up step");
    for (int c : params.countdowns)
        DZR_CHECK(c >= 1, "step schedule: dynamic countdowns must be >= 1, got {}", c);
    StepSchedule s = all(num_steps);
    s.dynamic_ = true;
    s.params_ = std::move(params);
    return s;
}

int StepSchedule::num_network_steps() const {
    int n = 0;
    for (bool b : mask_) n += b ? 1 : 0;
    return n;
}

std::string StepSchedule::describe() const {
    if (dynamic_) return "dynamic";
    std::string out;
    for (size_t i = 0; i < mask_.size(); ++i) {
        if (!mask_[i]) continue;
        if (!out.empty()) out += ',';
        out += std::to_string(i);
    }
    return out;
}

void StepSchedule::reset() {
    computed_ = 0;
    skip_countdown_ = 0;
    next_index_ = 0;
}

bool StepSchedule::should_run(int index, const std::function<double()>& similarity) {
    DZR_CHECK(index == next_index_ && index < num_steps(),
              "step schedule: step {} asked out of order (expected {} of {}; reset() starts a new loop)",
              index, next_index_, num_steps());
    ++next_index_;
    bool run = true;
    if (!dynamic_) {
        run = mask_[size_t(index)];
    } else if (computed_ < params_.warmup_steps) {
        run = true;
    } else if (skip_countdown_ > 1) {
        --skip_countdown_;
        run = false;
    } else if (skip_countdown_ == 1) {
        skip_countdown_ = 0;
        run = true;
    } else {
        DZR_CHECK(bool(similarity), "step schedule: the dynamic schedule needs a similarity callback");
        const double sim = similarity();
        for (size_t k = 0; k < params_.thresholds.size(); ++k) {
            if (sim > params_.thresholds[k]) {
                skip_countdown_ = params_.countdowns[k];
                run = false;
                break;
            }
        }
    }
    if (run) ++computed_;
    return run;
}

}  // namespace dzr
