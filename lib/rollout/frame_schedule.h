#pragma once
/// Which episode frames each policy call receives, as the official test client (test_client_AR.py)
/// sends them: the first call gets frame [start]; every later call gets 4 frames at offsets
/// [-23, -16, -8, 0] around anchors start+23, start+47, start+71, ... (stride 24), i.e. [0, 7, 15, 23],
/// [24, 31, 39, 47], ...; indices before `start` are clamped to it. A call's robot state is the state
/// at its anchor frame (the first call's anchor is `start`). Calls stop at the first one whose frames
/// run past the episode, or after max_chunks.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace dzr::rollout {

struct FrameScheduleConfig {
    int64_t start_frame = 0;
    /// Anchor of the first 4-frame call, relative to start_frame.
    int64_t first_anchor = 23;
    /// Frames between consecutive anchors (the action horizon: 24 steps at 15 Hz).
    int64_t stride = 24;
    /// Frame offsets around each anchor, strictly increasing.
    std::vector<int64_t> offsets = {-23, -16, -8, 0};
    /// Limit on the 4-frame calls after the first call; -1 = as many as the episode holds.
    /// (The official client's default is 15.)
    int64_t max_chunks = -1;

    /// Throws dzr::Error describing the first invalid field.
    void validate() const;
};

/// One policy call of a rollout.
struct ScheduledCall {
    int64_t index = 0;            // 0 for the first call
    int64_t anchor = 0;           // frame whose state the call uses; its actions start here
    std::vector<int64_t> frames;  // episode frame indices sent to the model, oldest first
    bool first() const { return index == 0; }
};

class FrameSchedule {
public:
    explicit FrameSchedule(FrameScheduleConfig config = {});

    const FrameScheduleConfig& config() const { return config_; }

    /// Every call for an episode of `num_frames` frames (empty when the first frame is missing).
    std::vector<ScheduledCall> calls(int64_t num_frames) const;
    /// calls(num_frames).size(), computed in closed form.
    int64_t num_calls(int64_t num_frames) const;
    /// Frames needed for the first call and one 4-frame call (start + first_anchor + 1 with the
    /// default offsets), or only for the first call when max_chunks is 0.
    int64_t min_frames() const;
    /// "frame [0]; then [a-23, a-16, a-8, a] for a = 23, 47, ..." for logs and manifests.
    std::string describe() const;
    /// The anchor of 4-frame chunk `chunk` (call chunk + 1), whether or not the episode reaches it.
    int64_t anchor_of(int64_t chunk) const { return config_.start_frame + config_.first_anchor + chunk * config_.stride; }

private:
    /// The newest frame chunk `chunk` needs: its anchor (for the state) or its newest offset frame.
    /// Clamping to start_frame never raises it, since every anchor is >= start_frame.
    int64_t last_needed(int64_t chunk) const { return anchor_of(chunk) + std::max<int64_t>(0, config_.offsets.back()); }

    FrameScheduleConfig config_;
};

}  // namespace dzr::rollout
