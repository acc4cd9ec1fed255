#include "serve/session_frames.h"

#include <algorithm>
#include <cstring>

namespace dzr::serve {

void FrameAccumulator::clear() {
    for (Camera& cam : buffers_)
        for (auto& f : cam.recent) spare_.push_back(std::move(f));
    buffers_.clear();
    received_ = 0;
    frame_bytes_ = 0;
}

void FrameAccumulator::append(std::span<const WireFrames> cameras) {
    DZR_ASSERT(cameras.size() == cameras_);
    const int64_t n = cameras[0].frames;
    for (const WireFrames& w : cameras)
        DZR_ASSERT(w.frames == n && w.frame_bytes() == cameras[0].frame_bytes());
    if (received_ == 0) {
        buffers_.assign(cameras_, Camera{});
        frame_bytes_ = cameras[0].frame_bytes();
    }
    DZR_ASSERT(frame_bytes_ == cameras[0].frame_bytes());
    for (size_t c = 0; c < cameras_; ++c) {
        Camera& cam = buffers_[c];
        // NOTE: only the newest kFramesPerChunk of this request can stay in `recent`
        for (int64_t i = std::max<int64_t>(0, n - kFramesPerChunk); i < n; ++i) {
            std::vector<uint8_t> f;
            if (cam.recent.size() == size_t(kFramesPerChunk)) {
                f = std::move(cam.recent.front());
                cam.recent.pop_front();
            } else if (!spare_.empty()) {
                f = std::move(spare_.back());
                spare_.pop_back();
            }
            const auto src = cameras[c].frame(i);
            f.assign(src.begin(), src.end());
            cam.recent.push_back(std::move(f));
        }
        if (received_ == 0) {
            const auto src = cameras[c].frame(0);
            cam.first.assign(src.begin(), src.end());
        }
    }
    received_ += n;
}

const std::vector<uint8_t>& FrameAccumulator::frame(size_t camera, int64_t index) const {
    const Camera& cam = buffers_[camera];
    const int64_t oldest_recent = received_ - int64_t(cam.recent.size());
    if (index >= oldest_recent) return cam.recent[size_t(index - oldest_recent)];
    DZR_ASSERT(index == 0);
    return cam.first;
}

std::vector<int64_t> FrameAccumulator::select(bool first_call, std::vector<std::vector<uint8_t>>& out) const {
    DZR_ASSERT(received_ > 0);
    const int64_t want = first_call ? 1 : kFramesPerChunk;
    std::vector<int64_t> indices;
    // the last `want` frames; while fewer exist, the first frame repeated in front (SERVER.py:137-145)
    for (int64_t i = 0; i < want - received_; ++i) indices.push_back(0);
    for (int64_t i = std::max<int64_t>(0, received_ - want); i < received_; ++i) indices.push_back(i);
    out.resize(cameras_);
    for (size_t c = 0; c < cameras_; ++c) {
        out[c].resize(indices.size() * frame_bytes_);
        for (size_t k = 0; k < indices.size(); ++k)
            std::memcpy(out[c].data() + k * frame_bytes_, frame(c, indices[k]).data(), frame_bytes_);
    }
    return indices;
}

}  // namespace dzr::serve
