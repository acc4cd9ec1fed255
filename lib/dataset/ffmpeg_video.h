#pragma once
/// Frames of LeRobot dataset videos (H.264 and AV1 in MP4) decoded with FFmpeg's libraries directly, by
/// timestamp: seek to the key frame before the first one, decode forward, keep the frame nearest to each.
/// The RGB frames equal what LeRobot's pyav backend sees (PyAV's frame.to_ndarray(format="rgb24")); measured
/// bit exact for 8-bit 4:2:0 H.264 and AV1 on x86-64 (tests/dataset/test_ffmpeg_video.cpp).
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace dzr::dataset {

/// What the container and the codec parameters say about the video stream.
struct VideoStreamInfo {
    std::string codec;        ///< "h264", "av1"
    std::string decoder;      ///< the decoder used: "h264", "libdav1d"
    std::string pix_fmt;      ///< "yuv420p"
    int width = 0, height = 0;
    double fps = 0;           ///< avg_frame_rate
    double start_s = 0;       ///< stream start time in seconds
    double duration_s = 0;
    int64_t frame_count = 0;  ///< the container's nb_frames (0 if unknown)
};

class FfmpegVideo {
public:
    /// Opens the file and its decoder. Throws dzr::Error naming the file when it is missing, is not a video,
    /// has no video stream or no decoder for it (AV1 needs libdav1d).
    explicit FfmpegVideo(const std::filesystem::path& file);
    ~FfmpegVideo();
    FfmpegVideo(const FfmpegVideo&) = delete;
    FfmpegVideo& operator=(const FfmpegVideo&) = delete;

    const VideoStreamInfo& info() const;

    /// uint8 RGB [N, H, W, 3]: the decoded frame nearest to each of `timestamps_s` (seconds on the stream's
    /// clock, ascending, duplicates allowed; a tie goes to the earlier frame, as in LeRobot).
    /// Seeks once to the key frame at or before the first timestamp and decodes forward, stopping after the
    /// frame past the last one. Throws dzr::Error naming the file and the timestamp when the nearest frame's
    /// pts is farther than `tolerance_s`, when the stream ends before a timestamp, or when decoding fails.
    /// `chosen_pts` (optional) receives each chosen frame's pts in seconds.
    Tensor frames_at(const std::vector<double>& timestamps_s, double tolerance_s,
                     std::vector<double>* chosen_pts = nullptr);

    /// The checks of frames_at() that need no decoding: the packets' timestamps (demuxed from the key frame
    /// before the first timestamp) put a frame within `tolerance_s` of each of `timestamps_s`, no packet is
    /// flagged corrupt, and the stream does not end early. A bitstream that fails to decode is found only by
    /// frames_at(). Throws dzr::Error as frames_at() does.
    void check_timestamps(const std::vector<double>& timestamps_s, double tolerance_s);

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

/// The FFmpeg libraries this build runs with, for `dzr info`:
/// "libavformat 59.27.100, libavcodec 59.37.100 (dav1d: yes)".
std::string ffmpeg_version();

}  // namespace dzr::dataset
