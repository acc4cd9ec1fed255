#include "rollout/frame_schedule.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"

namespace dzr::rollout {

void FrameScheduleConfig::validate() const {
    DZR_CHECK(start_frame >= 0, "frame schedule: start frame must be >= 0, got {}", start_frame);
    DZR_CHECK(first_anchor >= 0, "frame schedule: first anchor must be >= 0, got {}", first_anchor);
    DZR_CHECK(stride > 0, "frame schedule: stride must be positive, got {}", stride);
    DZR_CHECK(!offsets.empty(), "frame schedule: at least one frame offset is needed");
    for (size_t i = 1; i < offsets.size(); ++i)
        DZR_CHECK(offsets[i] > offsets[i - 1], "frame schedule: offsets must be strictly increasing, got [{}]",
                  fmt::join(offsets, ", "));
    DZR_CHECK(max_chunks >= -1, "frame schedule: max chunks must be >= 0 (or -1 for all), got {}", max_chunks);
}

FrameSchedule::FrameSchedule(FrameScheduleConfig config) : config_(std::move(config)) { config_.validate(); }

int64_t FrameSchedule::num_calls(int64_t num_frames) const {
    if (num_frames <= config_.start_frame) return 0;
    // Chunk k needs frame last_needed(k) = anchor_k + max(0, last offset), which grows by `stride`.
    const int64_t need0 = last_needed(0);
    int64_t chunks = need0 < num_frames ? (num_frames - 1 - need0) / config_.stride + 1 : 0;
    if (config_.max_chunks >= 0) chunks = std::min(chunks, config_.max_chunks);
    return 1 + chunks;
}

std::vector<ScheduledCall> FrameSchedule::calls(int64_t num_frames) const {
    std::vector<ScheduledCall> out;
    if (num_frames <= config_.start_frame) return out;
    out.push_back({0, config_.start_frame, {config_.start_frame}});
    for (int64_t k = 0; config_.max_chunks < 0 || k < config_.max_chunks; ++k) {
        ScheduledCall call;
        call.index = k + 1;
        call.anchor = anchor_of(k);
        for (int64_t off : config_.offsets) call.frames.push_back(std::max(call.anchor + off, config_.start_frame));
        if (last_needed(k) >= num_frames) break;
        out.push_back(std::move(call));
    }
    return out;
}

int64_t FrameSchedule::min_frames() const {
    return config_.max_chunks == 0 ? config_.start_frame + 1 : last_needed(0) + 1;
}

std::string FrameSchedule::describe() const {
    std::string offs;
    for (int64_t o : config_.offsets) offs += fmt::format("{}a{}{}", offs.empty() ? "" : ", ", o < 0 ? "" : "+", o);
    return fmt::format("frame [{}]; then [{}] for a = {}, {}, ... (stride {}){}", config_.start_frame, offs,
                       anchor_of(0), anchor_of(1), config_.stride,
                       config_.max_chunks >= 0 ? fmt::format(", at most {} chunks", config_.max_chunks) : "");
}

}  // namespace dzr::rollout
