#pragma once
/// The official server's frame accumulation (ARDroidRoboarenaPolicy._convert_observation,
/// socket_test_optimized_AR.py:115-149; dreamzero-reference.md §1.3): every frame a request carries
/// ([H, W, 3] or [T, H, W, 3]) is appended to its camera's buffer; a session's first call uses the last
/// buffered frame, every later call the last 4, left-padded with the buffer's first frame while fewer than 4
/// exist. A client that sends one frame per call gets [f0], [f0, f0, f0, f1], [f0, f0, f1, f2],
/// [f0, f1, f2, f3], [f1, f2, f3, f4], ...
///
/// The official buffers grow for the whole session; a call can only ever use the first frame and the last 4,
/// so only those are kept here (the same frames are selected, in bounded memory).
#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include "serve/protocol.h"

namespace dzr::serve {

class FrameAccumulator {
  public:
    /// Frames per call after a session's first call (FRAMES_PER_CHUNK, socket_test_optimized_AR.py:55).
    static constexpr int kFramesPerChunk = 4;

    explicit FrameAccumulator(size_t cameras = kNumCameras) : cameras_(cameras) {}

    /// Forgets every frame (a new session).
    void clear();
    /// Appends a request's frames: one WireFrames per camera, each with the same frame count and size.
    void append(std::span<const WireFrames> cameras);
    /// Frames received since the last clear(), per camera.
    int64_t received() const { return received_; }
    /// The frames of the next call, 1 on a session's first call, else kFramesPerChunk: camera c's as
    /// contiguous uint8 [T, H, W, 3] in out[c] (resized; capacity reused). Returns the received-frame index
    /// of each of the T frames, oldest first (0 = the session's first frame). Needs a received frame.
    std::vector<int64_t> select(bool first_call, std::vector<std::vector<uint8_t>>& out) const;

  private:
    struct Camera {
        std::vector<uint8_t> first;               // received frame 0
        std::deque<std::vector<uint8_t>> recent;  // the last kFramesPerChunk received frames
    };
    const std::vector<uint8_t>& frame(size_t camera, int64_t index) const;

    size_t cameras_;
    size_t frame_bytes_ = 0;
    int64_t received_ = 0;
    std::vector<Camera> buffers_;
    std::vector<std::vector<uint8_t>> spare_;  // frames dropped from `recent`, reused
};

}  // namespace dzr::serve
