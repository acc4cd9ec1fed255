// Built with -DDZR_OPENCV=OFF: no video codecs. Every entry point explains how to supply frames instead.
#include "core/error.h"
#include "io/video_reader.h"

namespace dzr::io {

namespace {

constexpr const char* kHint =
    "this dzr build has no video support (configured with -DDZR_OPENCV=OFF); provide the camera frames "
    "as .npy uint8 [T, H, W, 3] instead (`dzr episode convert` on a build with OpenCV writes them)";

}  // namespace

std::unique_ptr<VideoReader> open_video(const std::filesystem::path& path) {
    DZR_THROW("{}: cannot decode video: {}", path.string(), kHint);
}

std::string write_video_mp4(const std::filesystem::path& path, const TensorView&, double) {
    DZR_THROW("{}: cannot encode video: {}", path.string(), kHint);
}

std::optional<VideoEncoder> browser_video_encoder() { return std::nullopt; }

bool video_io_available() { return false; }

std::string video_io_backend() { return "none"; }

}  // namespace dzr::io
