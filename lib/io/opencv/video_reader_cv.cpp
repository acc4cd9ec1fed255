// Video decoding and encoding through OpenCV's videoio (FFmpeg backend).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

// NOTE: OpenCV 4.6's headers mix enum types in arithmetic, which C++20 deprecates; the warning is
// theirs, not ours, so silence it around the includes only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-enum-enum-conversion"
#include <opencv2/core.hpp>
#include <opencv2/core/utils/logger.hpp>
#include <opencv2/imgproc.hpp>
#include <opencv2/videoio.hpp>
#pragma GCC diagnostic pop

#include <fmt/format.h>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/video_reader.h"

namespace dzr::io {

namespace fs = std::filesystem;

namespace {

class CvVideoReader final : public VideoReader {
public:
    explicit CvVideoReader(const fs::path& path) : path_(path) {
        std::error_code ec;
        DZR_CHECK(fs::is_regular_file(path, ec), "{}: no such file", path.string());
        DZR_CHECK(cap_.open(path.string(), cv::CAP_FFMPEG) && cap_.isOpened(),
                  "{}: unreadable video: OpenCV/FFmpeg cannot open it (not a video, or damaged or "
                  "truncated before its index)", path.string());
        info_.frame_count = std::max<int64_t>(0, int64_t(cap_.get(cv::CAP_PROP_FRAME_COUNT)));
        info_.fps = cap_.get(cv::CAP_PROP_FPS);
        info_.width = int(cap_.get(cv::CAP_PROP_FRAME_WIDTH));
        info_.height = int(cap_.get(cv::CAP_PROP_FRAME_HEIGHT));
    }

    const VideoInfo& info() const override { return info_; }

    Tensor read_all() override {
        DZR_CHECK(!consumed_, "{}: read_all() called twice", path_.string());
        consumed_ = true;
        const std::string name = path_.string();
        // Frames go straight into a tensor sized by the container's claim; should the stream hold
        // more, they spill into `extra` and everything is joined at the end.
        Tensor out;
        std::vector<uint8_t> extra;
        int height = 0, width = 0;
        size_t frame_bytes = 0;
        int64_t count = 0;
        cv::Mat bgr;
        cv::Mat rgb;
        while (true) {
            bool ok = false;
            try {
                ok = cap_.read(bgr);
            } catch (const cv::Exception& e) {
                DZR_THROW("{}: frame {} cannot be decoded: {}", name, count, e.what());
            }
            if (!ok || bgr.empty()) break;
            DZR_CHECK(bgr.type() == CV_8UC3, "{}: frame {}: expected 8-bit colour, decoder gave OpenCV type {}",
                      name, count, bgr.type());
            if (count == 0) {
                height = bgr.rows;
                width = bgr.cols;
                frame_bytes = size_t(height) * size_t(width) * 3;
                // NOTE: the claim comes from the file; cap what we trust it with (~2 GiB up front).
                const int64_t planned = std::clamp<int64_t>(info_.frame_count, 1, int64_t((size_t(1) << 31) / frame_bytes) + 1);
                out = Tensor::host({planned, height, width, 3}, DType::U8);
            }
            DZR_CHECK(bgr.rows == height && bgr.cols == width, "{}: frame {} is {}x{}, earlier frames are {}x{}",
                      name, count, bgr.cols, bgr.rows, width, height);
            cv::cvtColor(bgr, rgb, cv::COLOR_BGR2RGB);
            DZR_ASSERT(rgb.isContinuous());
            if (count < out.shape()[0]) {
                std::memcpy(out.ptr<uint8_t>() + size_t(count) * frame_bytes, rgb.data, frame_bytes);
            } else {
                extra.insert(extra.end(), rgb.data, rgb.data + frame_bytes);
            }
            ++count;
        }
        DZR_CHECK(count > 0, "{}: frame 0 cannot be decoded (no frames in the stream)", name);
        // NOTE: the count comes from the frames decoded; fewer than the container declares means the
        // data ends early (a truncated or damaged file), which would silently shorten the episode.
        DZR_CHECK(info_.frame_count == 0 || count >= info_.frame_count,
                  "{}: truncated or damaged video: frame {} cannot be decoded (the container declares {} frames)",
                  name, count, info_.frame_count);
        info_.frame_count = count;
        info_.width = width;
        info_.height = height;
        if (count == out.shape()[0]) return out;
        if (count < out.shape()[0]) return Tensor(out.storage(), out.view().slice(0, 0, count));
        Tensor all = Tensor::host({count, height, width, 3}, DType::U8);
        const size_t head = size_t(out.shape()[0]) * frame_bytes;
        std::memcpy(all.data(), out.data(), head);
        std::memcpy(all.ptr<uint8_t>() + head, extra.data(), extra.size());
        return all;
    }

private:
    fs::path path_;
    cv::VideoCapture cap_;
    VideoInfo info_;
    bool consumed_ = false;
};

}  // namespace

std::unique_ptr<VideoReader> open_video(const fs::path& path) { return std::make_unique<CvVideoReader>(path); }

namespace {

void check_frames(const std::string& name, const TensorView& frames, double fps) {
    DZR_CHECK(frames.device.is_cpu() && frames.is_contiguous() && frames.dtype == DType::U8 && frames.rank() == 4 &&
                  frames.dim(3) == 3 && frames.dim(0) > 0,
              "{}: video frames must be a non-empty contiguous host uint8 [T, H, W, 3] tensor, got {}", name,
              frames.str());
    DZR_CHECK(fps > 0, "{}: fps must be positive, got {}", name, fps);
}

/// Sends the process's stderr to /dev/null while it lives.
/// NOTE: OpenCV 4.6's FFmpeg writer prints "tag ... is not supported with codec id ... and format 'webm'"
/// with a bare fprintf for every WebM file (Matroska has no FourCC list; the codec is still the one
/// asked for), past its own log level; the line alarms users for nothing.
class QuietStderr {
public:
    QuietStderr() {
        std::fflush(stderr);
        saved_ = ::dup(STDERR_FILENO);
        const int null = ::open("/dev/null", O_WRONLY);
        if (saved_ >= 0 && null >= 0) ::dup2(null, STDERR_FILENO);
        if (null >= 0) ::close(null);
    }
    ~QuietStderr() {
        std::fflush(stderr);
        if (saved_ >= 0) {
            ::dup2(saved_, STDERR_FILENO);
            ::close(saved_);
        }
    }
    QuietStderr(const QuietStderr&) = delete;
    QuietStderr& operator=(const QuietStderr&) = delete;

private:
    int saved_ = -1;
};

/// Encodes `frames` into `temp` with the first FourCC of `tags` that OpenCV/FFmpeg opens; returns it,
/// or "" when none opens.
std::string encode(const fs::path& temp, const TensorView& frames, double fps, std::initializer_list<const char*> tags) {
    const int height = int(frames.dim(1));
    const int width = int(frames.dim(2));
    // NOTE: OpenCV logs an error for every codec tag its FFmpeg build lacks; we try them in turn, so
    // those lines are noise.
    const auto old_level = cv::utils::logging::setLogLevel(cv::utils::logging::LOG_LEVEL_SILENT);
    cv::VideoWriter writer;
    std::string used;
    for (const char* tag : tags) {
        const QuietStderr quiet;
        if (writer.open(temp.string(), cv::CAP_FFMPEG, cv::VideoWriter::fourcc(tag[0], tag[1], tag[2], tag[3]), fps,
                        cv::Size(width, height), true)) {
            used = tag;
            break;
        }
    }
    cv::utils::logging::setLogLevel(old_level);
    if (used.empty()) return used;
    cv::Mat bgr;
    const size_t frame_bytes = size_t(height) * size_t(width) * 3;
    for (int64_t t = 0; t < frames.dim(0); ++t) {
        const cv::Mat rgb(height, width, CV_8UC3, static_cast<uint8_t*>(frames.data) + size_t(t) * frame_bytes);
        cv::cvtColor(rgb, bgr, cv::COLOR_RGB2BGR);
        writer.write(bgr);
    }
    writer.release();
    return used;
}

/// Removes a temporary file unless kept.
struct TempGuard {
    const fs::path& p;
    bool keep = false;
    ~TempGuard() {
        std::error_code ec;
        if (!keep) fs::remove(p, ec);
    }
};

void move_into_place(const fs::path& temp, const fs::path& path, TempGuard& guard) {
    std::error_code ec;
    fs::rename(temp, path, ec);
    DZR_CHECK(!ec, "{}: cannot move {} into place: {}", path.string(), temp.string(), ec.message());
    guard.keep = true;
}

/// Decodes `file` and checks that it holds `frames`' count and size; the error says what differs.
void verify_video(const fs::path& file, const std::string& name, const std::string& codec, const TensorView& frames) {
    std::error_code ec;
    DZR_CHECK(fs::is_regular_file(file, ec) && fs::file_size(file, ec) > 0, "{}: the {} encoder wrote nothing", name,
              codec);
    Tensor back;
    try {
        back = CvVideoReader(file).read_all();
    } catch (const Error& e) {
        DZR_THROW("{}: the {} video does not decode again: {}", name, codec, e.what());
    }
    DZR_CHECK((back.shape() == Shape{frames.dim(0), frames.dim(1), frames.dim(2), 3}),
              "{}: the {} video decodes to {} frames of {}x{}, {} of {}x{} were written", name, codec, back.shape()[0],
              back.shape()[2], back.shape()[1], frames.dim(0), frames.dim(2), frames.dim(1));
}

}  // namespace

std::string write_video_mp4(const fs::path& path, const TensorView& frames, double fps) {
    const std::string name = path.string();
    check_frames(name, frames, fps);
    const fs::path temp = temp_path_for(path, /*keep_extension=*/true);
    TempGuard guard{temp};
    const std::string used = encode(temp, frames, fps, {"avc1", "mp4v"});
    DZR_CHECK(!used.empty(), "{}: OpenCV/FFmpeg has no MP4 encoder (tried avc1 and mp4v)", name);
    std::error_code ec;
    DZR_CHECK(fs::is_regular_file(temp, ec) && fs::file_size(temp, ec) > 0, "{}: the video encoder wrote nothing",
              name);
    move_into_place(temp, path, guard);
    return used;
}

namespace {

/// Writes with exactly `codec` and verifies the file before it is moved into place.
std::string write_checked(const fs::path& path, const TensorView& frames, double fps, const std::string& codec) {
    const std::string name = path.string();
    check_frames(name, frames, fps);
    const fs::path temp = temp_path_for(path, /*keep_extension=*/true);
    TempGuard guard{temp};
    DZR_CHECK(encode(temp, frames, fps, {codec.c_str()}) == codec, "{}: OpenCV/FFmpeg cannot open a {} encoder", name,
              codec);
    verify_video(temp, name, codec, frames);
    move_into_place(temp, path, guard);
    return codec;
}

}  // namespace

std::optional<VideoEncoder> browser_video_encoder() {
    static const std::optional<VideoEncoder> chosen = []() -> std::optional<VideoEncoder> {
        // A few frames of a moving gradient: enough for the encoder to produce real packets.
        constexpr int64_t kT = 4, kH = 32, kW = 48;
        std::vector<uint8_t> pixels(size_t(kT * kH * kW * 3));
        for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = uint8_t((i * 7 + i / (kW * 3) * 13) & 0xff);
        const TensorView frames(pixels.data(), DType::U8, Shape{kT, kH, kW, 3});
        std::error_code ec;
        const fs::path dir = fs::temp_directory_path(ec);
        if (ec) return std::nullopt;
        // NOTE: WebM first: every browser plays VP8/VP9, while H.264 needs a browser built with its
        // decoder (some Chromium builds lack it). VP8 before VP9: at OpenCV's default settings libvpx's
        // VP9 took 34.8 s against VP8's 3.8 s for 50 frames of 640x352 (Debian 12, FFmpeg 5.1).
        for (const auto& [codec, ext] : {std::pair{"VP80", ".webm"}, std::pair{"VP90", ".webm"}, std::pair{"avc1", ".mp4"}}) {
            const fs::path probe = dir / fmt::format("dzr-video-probe-{}{}", ::getpid(), ext);
            try {
                write_checked(probe, frames, 5.0, codec);
                fs::remove(probe, ec);
                return VideoEncoder{ext, codec, [codec = std::string(codec)](const fs::path& p, const TensorView& f,
                                                                               double fps) {
                                        return write_checked(p, f, fps, codec);
                                    }};
            } catch (const Error&) {
                fs::remove(probe, ec);
            }
        }
        return std::nullopt;
    }();
    return chosen;
}

bool video_io_available() { return true; }

std::string video_io_backend() { return std::string("OpenCV ") + CV_VERSION + " (FFmpeg)"; }

}  // namespace dzr::io
