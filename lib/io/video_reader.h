#pragma once
/// Video decoding and encoding behind one small interface. The implementation lives in the
/// `dzr_io` library: lib/io/opencv/ (OpenCV videoio, FFmpeg backend) or lib/io/no_opencv/ (every
/// call explains that the build has no video support and that frames must be given as .npy).
///
/// NOTE: code in the engine library `dzr` must not call these functions directly (dzr is linked
/// before dzr_io); it takes a VideoOpener from the application instead (see EpisodeOptions).
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "core/tensor.h"

namespace dzr::io {

/// What a video container says about its stream.
struct VideoInfo {
    int64_t frame_count = 0;  // the container's claim (0 when unknown); read_all() counts for real
    double fps = 0.0;
    int width = 0;
    int height = 0;
};

class VideoReader {
public:
    virtual ~VideoReader() = default;
    /// Container metadata, available right after opening.
    virtual const VideoInfo& info() const = 0;
    /// Decodes every frame: uint8 RGB [T, H, W, 3] with T the number of frames actually decoded.
    /// Throws dzr::Error naming the file and the frame index when a frame cannot be decoded or the
    /// stream ends before the frame count the container declares.
    virtual Tensor read_all() = 0;
};

using VideoOpener = std::function<std::unique_ptr<VideoReader>(const std::filesystem::path&)>;

/// Encodes uint8 RGB frames [T, H, W, 3] at `fps` into a video file, atomically; returns the codec used.
using VideoWriterFn = std::function<std::string(const std::filesystem::path&, const TensorView&, double fps)>;

/// Opens a video file for decoding. Throws dzr::Error naming the file when it cannot be opened.
std::unique_ptr<VideoReader> open_video(const std::filesystem::path& path);

/// Writes uint8 RGB frames [T, H, W, 3] as an MP4 (H.264 "avc1" when the FFmpeg build has an
/// encoder for it, else MPEG-4 part 2 "mp4v"), atomically. Returns the codec tag used.
std::string write_video_mp4(const std::filesystem::path& path, const TensorView& frames, double fps);

/// A video encoder whose files browsers play, and the container it writes.
struct VideoEncoder {
    std::string extension;  ///< ".webm" or ".mp4"
    std::string codec;      ///< the FourCC: "VP90", "VP80" or "avc1"
    /// Encodes uint8 RGB frames [T, H, W, 3] at `fps` atomically, then decodes the file again and
    /// checks that every frame is there; returns the codec. Throws dzr::Error naming the file.
    VideoWriterFn write;
};

/// The first of VP9 in WebM, VP8 in WebM and H.264 in MP4 that this build's FFmpeg encodes and
/// decodes back frame for frame (tried once on a few small frames, then remembered); none without.
std::optional<VideoEncoder> browser_video_encoder();

/// True when this build can decode and encode video.
bool video_io_available();
/// A short description of the video backend ("OpenCV 4.6.0 (FFmpeg)" or "none").
std::string video_io_backend();

}  // namespace dzr::io
