// Video decoding and encoding through OpenCV's videoio (FFmpeg backend).
#include <algorithm>
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

std::string write_video_mp4(const fs::path& path, const TensorView& frames, double fps) {
    const std::string name = path.string();
    DZR_CHECK(frames.device.is_cpu() && frames.is_contiguous() && frames.dtype == DType::U8 &&
                  frames.rank() == 4 && frames.dim(3) == 3 && frames.dim(0) > 0,
              "{}: video frames must be a non-empty contiguous host uint8 [T, H, W, 3] tensor, got {}", name,
              frames.str());
    DZR_CHECK(fps > 0, "{}: fps must be positive, got {}", name, fps);
    const int height = int(frames.dim(1));
    const int width = int(frames.dim(2));
    const fs::path temp = temp_path_for(path, /*keep_extension=*/true);
    struct TempGuard {
        const fs::path& p;
        bool keep = false;
        ~TempGuard() {
            std::error_code ec;
            if (!keep) fs::remove(p, ec);
        }
    } guard{temp};

    // NOTE: OpenCV logs an error for every codec tag its FFmpeg build lacks; we try them in turn, so
    // those lines are noise.
    const auto old_level = cv::utils::logging::setLogLevel(cv::utils::logging::LOG_LEVEL_SILENT);
    cv::VideoWriter writer;
    std::string used;
    for (const char* tag : {"avc1", "mp4v"}) {
        if (writer.open(temp.string(), cv::CAP_FFMPEG, cv::VideoWriter::fourcc(tag[0], tag[1], tag[2], tag[3]), fps,
                        cv::Size(width, height), true)) {
            used = tag;
            break;
        }
    }
    cv::utils::logging::setLogLevel(old_level);
    DZR_CHECK(!used.empty(), "{}: OpenCV/FFmpeg has no MP4 encoder (tried avc1 and mp4v)", name);
    cv::Mat bgr;
    const size_t frame_bytes = size_t(height) * size_t(width) * 3;
    for (int64_t t = 0; t < frames.dim(0); ++t) {
        const cv::Mat rgb(height, width, CV_8UC3, static_cast<uint8_t*>(frames.data) + size_t(t) * frame_bytes);
        cv::cvtColor(rgb, bgr, cv::COLOR_RGB2BGR);
        writer.write(bgr);
    }
    writer.release();
    std::error_code ec;
    DZR_CHECK(fs::is_regular_file(temp, ec) && fs::file_size(temp, ec) > 0, "{}: the video encoder wrote nothing",
              name);
    fs::rename(temp, path, ec);
    DZR_CHECK(!ec, "{}: cannot move {} into place: {}", name, temp.string(), ec.message());
    guard.keep = true;
    return used;
}

bool video_io_available() { return true; }

std::string video_io_backend() { return std::string("OpenCV ") + CV_VERSION + " (FFmpeg)"; }

}  // namespace dzr::io
