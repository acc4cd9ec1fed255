#include "dataset/ffmpeg_video.h"

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/pixdesc.h>
#include <libswscale/swscale.h>
}

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>

#include "core/error.h"

namespace dzr::dataset {

namespace fs = std::filesystem;

namespace {

//
// RAII for the FFmpeg objects
//

struct FormatCloser {
    void operator()(AVFormatContext* p) const { avformat_close_input(&p); }
};
struct CodecFreer {
    void operator()(AVCodecContext* p) const { avcodec_free_context(&p); }
};
struct PacketFreer {
    void operator()(AVPacket* p) const { av_packet_free(&p); }
};
struct FrameFreer {
    void operator()(AVFrame* p) const { av_frame_free(&p); }
};
struct SwsFreer {
    void operator()(SwsContext* p) const { sws_freeContext(p); }
};
using FormatPtr = std::unique_ptr<AVFormatContext, FormatCloser>;
using CodecPtr = std::unique_ptr<AVCodecContext, CodecFreer>;
using PacketPtr = std::unique_ptr<AVPacket, PacketFreer>;
using FramePtr = std::unique_ptr<AVFrame, FrameFreer>;
using SwsPtr = std::unique_ptr<SwsContext, SwsFreer>;

std::string av_error_text(int rc) {
    char buf[AV_ERROR_MAX_STRING_SIZE] = {};
    av_strerror(rc, buf, sizeof(buf));
    return buf;
}

FramePtr new_frame() {
    FramePtr f(av_frame_alloc());
    if (!f) DZR_THROW("out of memory allocating an FFmpeg frame");
    return f;
}

double to_seconds(int64_t ts, AVRational tb) {
    return double(ts) * av_q2d(tb);
}

/// "59.37.100" from a library's packed version number.
std::string version_text(unsigned v) {
    return fmt::format("{}.{}.{}", v >> 16, (v >> 8) & 0xff, v & 0xff);
}

/// The deprecated full-range ("J") formats some decoders still output for full-range H.264.
bool is_jpeg_pix_fmt(AVPixelFormat p) {
    return p == AV_PIX_FMT_YUVJ420P || p == AV_PIX_FMT_YUVJ422P || p == AV_PIX_FMT_YUVJ444P ||
           p == AV_PIX_FMT_YUVJ440P || p == AV_PIX_FMT_YUVJ411P;
}

/// The decoder for a stream. AV1 goes through libdav1d: FFmpeg's native AV1 decoder only drives
/// hardware, and PyAV's wheels decode AV1 with libdav1d too.
const AVCodec* find_decoder(const fs::path& file, AVCodecID id) {
    if (id == AV_CODEC_ID_AV1) {
        if (const AVCodec* c = avcodec_find_decoder_by_name("libdav1d")) return c;
        DZR_THROW("{}: AV1 video needs libdav1d, and this FFmpeg (libavcodec {}) was built without it",
                  file.string(), version_text(avcodec_version()));
    }
    const AVCodec* c = avcodec_find_decoder(id);
    DZR_CHECK(c != nullptr, "{}: this FFmpeg (libavcodec {}) has no decoder for codec '{}'", file.string(),
              version_text(avcodec_version()), avcodec_get_name(id));
    return c;
}

/// What frames_at() and check_timestamps() take: finite, ascending timestamps and a tolerance >= 0.
void check_request(const std::string& name, const std::vector<double>& timestamps_s, double tolerance_s) {
    for (size_t i = 0; i < timestamps_s.size(); ++i) {
        DZR_CHECK(std::isfinite(timestamps_s[i]), "{}: timestamp {} is not a finite number", name, i);
        DZR_CHECK(i == 0 || timestamps_s[i] >= timestamps_s[i - 1],
                  "{}: timestamps must be ascending, found {:.6f} s after {:.6f} s", name, timestamps_s[i],
                  timestamps_s[i - 1]);
    }
    DZR_CHECK(std::isfinite(tolerance_s) && tolerance_s >= 0, "{}: the tolerance must be >= 0, found {}", name,
              tolerance_s);
}

}  // namespace

struct FfmpegVideo::Impl {
    fs::path file;
    std::string name;  // file.string(), for messages
    FormatPtr fmt;
    CodecPtr dec;
    AVStream* stream = nullptr;
    VideoStreamInfo info;
    PacketPtr packet;

    // The RGB converter of the last frame layout seen (rebuilt when the format, size or colour tags change).
    SwsPtr sws;
    int sws_key[5] = {-1, -1, -1, -1, -1};
    std::vector<uint8_t> staging;  // RGB rows at the stride the converter needs

    void open();
    void seek(double t);
    bool next_frame(AVFrame* out, double t);
    void to_rgb(const AVFrame* frame, uint8_t* dst, double t);
    double pts_of(const AVFrame* f, double t) const;
};

void FfmpegVideo::Impl::open() {
    std::error_code ec;
    DZR_CHECK(fs::exists(file, ec), "{}: video file not found", name);
    DZR_CHECK(fs::is_regular_file(file, ec), "{}: not a video file (not a regular file)", name);
    AVFormatContext* raw = nullptr;
    if (int rc = avformat_open_input(&raw, name.c_str(), nullptr, nullptr); rc < 0)
        DZR_THROW("{}: not a readable video file ({})", name, av_error_text(rc));
    fmt.reset(raw);
    if (int rc = avformat_find_stream_info(fmt.get(), nullptr); rc < 0)
        DZR_THROW("{}: cannot read the stream parameters ({})", name, av_error_text(rc));
    const int index = av_find_best_stream(fmt.get(), AVMEDIA_TYPE_VIDEO, -1, -1, nullptr, 0);
    DZR_CHECK(index >= 0, "{}: no video stream (the container holds {} stream(s) of other kinds)", name,
              fmt->nb_streams);
    stream = fmt->streams[index];
    const AVCodecParameters* par = stream->codecpar;

    const AVCodec* codec = find_decoder(file, par->codec_id);
    dec.reset(avcodec_alloc_context3(codec));
    DZR_CHECK(dec != nullptr, "{}: out of memory allocating the {} decoder", name, codec->name);
    if (int rc = avcodec_parameters_to_context(dec.get(), par); rc < 0)
        DZR_THROW("{}: bad {} codec parameters ({})", name, codec->name, av_error_text(rc));
    dec->pkt_timebase = stream->time_base;
    // NOTE: threads change speed only: H.264 and AV1 decoding is bit exact whatever the thread count.
    dec->thread_count = 0;
    dec->thread_type = FF_THREAD_FRAME | FF_THREAD_SLICE;
    if (int rc = avcodec_open2(dec.get(), codec, nullptr); rc < 0)
        DZR_THROW("{}: cannot open the {} decoder ({})", name, codec->name, av_error_text(rc));

    packet.reset(av_packet_alloc());
    DZR_CHECK(packet != nullptr, "{}: out of memory allocating a packet", name);

    info.codec = avcodec_get_name(par->codec_id);
    info.decoder = codec->name;
    const char* pf = av_get_pix_fmt_name(AVPixelFormat(par->format));
    info.pix_fmt = pf ? pf : "unknown";
    info.width = par->width;
    info.height = par->height;
    DZR_CHECK(info.width > 0 && info.height > 0, "{}: the video stream has no frame size ({}x{})", name,
              info.width, info.height);
    info.fps = stream->avg_frame_rate.den != 0 ? av_q2d(stream->avg_frame_rate) : 0.0;
    info.start_s =
        stream->start_time != AV_NOPTS_VALUE ? to_seconds(stream->start_time, stream->time_base) : 0.0;
    if (stream->duration != AV_NOPTS_VALUE)
        info.duration_s = to_seconds(stream->duration, stream->time_base);
    else if (fmt->duration != AV_NOPTS_VALUE)
        info.duration_s = double(fmt->duration) / AV_TIME_BASE;
    info.frame_count = stream->nb_frames;
}

double FfmpegVideo::Impl::pts_of(const AVFrame* f, double t) const {
    DZR_CHECK(f->best_effort_timestamp != AV_NOPTS_VALUE,
              "{}: a frame decoded for timestamp {:.6f} s has no timestamp", name, t);
    return to_seconds(f->best_effort_timestamp, stream->time_base);
}

void FfmpegVideo::Impl::seek(double t) {
    // BACKWARD: the key frame at or before t, so every frame from t on can be decoded.
    const int64_t ts = int64_t(std::floor(t / av_q2d(stream->time_base)));
    if (int rc = av_seek_frame(fmt.get(), stream->index, ts, AVSEEK_FLAG_BACKWARD); rc < 0) {
        // Before the first key frame there is nothing to seek back to: start from the beginning.
        rc = avformat_seek_file(fmt.get(), stream->index, std::numeric_limits<int64_t>::min(), ts, ts, 0);
        if (rc < 0) DZR_THROW("{}: cannot seek to {:.6f} s ({})", name, t, av_error_text(rc));
    }
    avcodec_flush_buffers(dec.get());
}

/// Decodes the next frame into `out`; false at the end of the stream. `t` is the timestamp being looked for
/// (for messages).
bool FfmpegVideo::Impl::next_frame(AVFrame* out, double t) {
    for (;;) {
        int rc = avcodec_receive_frame(dec.get(), out);
        if (rc == 0) return true;
        if (rc == AVERROR_EOF) return false;
        if (rc != AVERROR(EAGAIN))
            DZR_THROW("{}: decoding failed near timestamp {:.6f} s ({})", name, t, av_error_text(rc));

        // The decoder wants input: the next packet of our stream, or the drain signal at the end.
        for (;;) {
            rc = av_read_frame(fmt.get(), packet.get());
            if (rc == AVERROR_EOF) {
                rc = avcodec_send_packet(dec.get(), nullptr);
                if (rc < 0 && rc != AVERROR_EOF)
                    DZR_THROW("{}: draining the decoder failed near timestamp {:.6f} s ({})", name, t,
                              av_error_text(rc));
                break;
            }
            if (rc < 0)
                DZR_THROW("{}: reading the video failed near timestamp {:.6f} s ({})", name, t,
                          av_error_text(rc));
            if (packet->stream_index != stream->index) {
                av_packet_unref(packet.get());
                continue;
            }
            const bool corrupt = (packet->flags & AV_PKT_FLAG_CORRUPT) != 0;
            rc = avcodec_send_packet(dec.get(), packet.get());
            av_packet_unref(packet.get());
            DZR_CHECK(!corrupt, "{}: a corrupt or truncated packet near timestamp {:.6f} s", name, t);
            if (rc < 0)
                DZR_THROW("{}: decoding failed near timestamp {:.6f} s ({})", name, t, av_error_text(rc));
            break;
        }
    }
}

void FfmpegVideo::Impl::to_rgb(const AVFrame* f, uint8_t* dst, double t) {
    DZR_CHECK(f->width == info.width && f->height == info.height,
              "{}: the frame for timestamp {:.6f} s is {}x{}, the stream says {}x{}", name, t, f->width,
              f->height, info.width, info.height);
    const int key[5] = {f->format, f->width, f->height, int(f->colorspace), int(f->color_range)};
    if (!sws || std::memcmp(key, sws_key, sizeof(key)) != 0) {
        // PyAV's to_ndarray(format="rgb24"): SWS_BILINEAR, the YUV matrix from the frame's colorspace tag
        // (BT.601 when unspecified), limited range unless the frame says full, full-range RGB out.
        sws.reset(sws_getContext(f->width, f->height, AVPixelFormat(f->format), f->width, f->height,
                                 AV_PIX_FMT_RGB24, SWS_BILINEAR, nullptr, nullptr, nullptr));
        DZR_CHECK(sws != nullptr, "{}: cannot convert {} frames to RGB", name,
                  av_get_pix_fmt_name(AVPixelFormat(f->format)));
        const bool full_range =
            f->color_range == AVCOL_RANGE_JPEG || is_jpeg_pix_fmt(AVPixelFormat(f->format));
        DZR_CHECK(sws_setColorspaceDetails(sws.get(), sws_getCoefficients(int(f->colorspace)), full_range,
                                           sws_getCoefficients(SWS_CS_DEFAULT), 1, 0, 1 << 16, 1 << 16) >= 0,
                  "{}: cannot convert {} frames (colorspace {}) to RGB", name,
                  av_get_pix_fmt_name(AVPixelFormat(f->format)), av_color_space_name(f->colorspace));
        std::memcpy(sws_key, key, sizeof(key));
    }
    // NOTE: the x86 converter works in blocks of 8 pixels and skips the last partial block when the row
    // stride cannot hold a whole one (FFmpeg 5.1 leaves those pixels unwritten). PyAV's frames have a stride
    // of at least 3 * align(width, 16), so convert into such rows, then copy the width out.
    const int stride = 3 * ((f->width + 15) & ~15);
    staging.resize(size_t(stride) * size_t(f->height) + 64);
    uint8_t* dst_planes[4] = {staging.data(), nullptr, nullptr, nullptr};
    int dst_strides[4] = {stride, 0, 0, 0};
    const int rows = sws_scale(sws.get(), f->data, f->linesize, 0, f->height, dst_planes, dst_strides);
    DZR_CHECK(rows == f->height, "{}: converting the frame for timestamp {:.6f} s to RGB failed", name, t);
    const size_t row_bytes = size_t(3 * f->width);
    for (int y = 0; y < f->height; ++y)
        std::memcpy(dst + size_t(y) * row_bytes, staging.data() + size_t(y) * size_t(stride), row_bytes);
}

FfmpegVideo::FfmpegVideo(const fs::path& file) : impl_(std::make_unique<Impl>()) {
    // NOTE: FFmpeg's own notices (dav1d's banner, "moov atom not found") would interleave with dzr's log; its
    // errors reach the user through ours, which name the file and the timestamp
    static std::once_flag quiet;
    std::call_once(quiet, [] { av_log_set_level(AV_LOG_FATAL); });
    impl_->file = file;
    impl_->name = file.string();
    impl_->open();
}

FfmpegVideo::~FfmpegVideo() = default;

const VideoStreamInfo& FfmpegVideo::info() const {
    return impl_->info;
}

Tensor FfmpegVideo::frames_at(const std::vector<double>& timestamps_s, double tolerance_s,
                              std::vector<double>* chosen_pts) {
    Impl& m = *impl_;
    const int64_t n = int64_t(timestamps_s.size());
    const int64_t h = m.info.height, w = m.info.width;
    const size_t frame_bytes = size_t(h * w * 3);
    check_request(m.name, timestamps_s, tolerance_s);
    Tensor out = Tensor::host(Shape{n, h, w, 3}, DType::U8);
    if (chosen_pts) chosen_pts->assign(size_t(n), 0.0);
    if (n == 0) return out;
    uint8_t* rows = out.ptr<uint8_t>();

    FramePtr prev = new_frame(), cur = new_frame();
    bool have_prev = false;
    double prev_pts = 0, cur_pts = 0;
    const double t0 = timestamps_s[0];

    // The first decoded frame must not lie after t0 (or a nearer frame could precede it): with B-frames a key
    // frame's pts exceeds its dts, and the demuxer seeks on dts. Back off until it does, or the stream
    // begins.
    bool have_cur = false;
    for (double back = 0;; back = back == 0 ? 1.0 : 2 * back) {
        m.seek(t0 - back);
        have_cur = m.next_frame(cur.get(), t0);
        if (!have_cur) break;
        cur_pts = m.pts_of(cur.get(), t0);
        if (cur_pts <= t0 || t0 - back < m.info.start_s) break;
        av_frame_unref(cur.get());
    }

    int64_t i = 0;
    int64_t last_row = -1;  // the output row holding the last converted frame
    double last_row_pts = std::numeric_limits<double>::quiet_NaN();
    auto emit = [&](int64_t idx, const AVFrame* f, double pts) {
        const double t = timestamps_s[size_t(idx)];
        DZR_CHECK(std::abs(pts - t) <= tolerance_s,
                  "{}: no frame within {} s of timestamp {:.6f} s (the nearest frame is at {:.6f} s)", m.name,
                  tolerance_s, t, pts);
        // NOTE: a decoder conceals a broken slice and flags the frame: its pixels are made up.
        DZR_CHECK((f->flags & AV_FRAME_FLAG_CORRUPT) == 0 && f->decode_error_flags == 0,
                  "{}: the frame at {:.6f} s chosen for timestamp {:.6f} s is corrupt", m.name, pts, t);
        uint8_t* dst = rows + size_t(idx) * frame_bytes;
        if (last_row >= 0 && pts == last_row_pts)
            std::memcpy(dst, rows + size_t(last_row) * frame_bytes, frame_bytes);
        else
            m.to_rgb(f, dst, t);
        last_row = idx;
        last_row_pts = pts;
        if (chosen_pts) (*chosen_pts)[size_t(idx)] = pts;
    };

    while (have_cur && i < n) {
        // Every timestamp at or before this frame is settled: its nearest frame is this one or the previous.
        while (i < n && timestamps_s[size_t(i)] <= cur_pts) {
            const double t = timestamps_s[size_t(i)];
            if (have_prev && t - prev_pts <= cur_pts - t)
                emit(i, prev.get(), prev_pts);  // a tie goes to the earlier frame
            else
                emit(i, cur.get(), cur_pts);
            ++i;
        }
        if (i == n) break;
        av_frame_unref(prev.get());
        av_frame_move_ref(prev.get(), cur.get());
        prev_pts = cur_pts;
        have_prev = true;
        have_cur = m.next_frame(cur.get(), timestamps_s[size_t(i)]);
        if (have_cur) {
            cur_pts = m.pts_of(cur.get(), timestamps_s[size_t(i)]);
            DZR_CHECK(cur_pts > prev_pts, "{}: frame timestamps go backwards ({:.6f} s after {:.6f} s)",
                      m.name, cur_pts, prev_pts);
        }
    }
    // The stream ended: what is left lies past the last frame, which is the nearest one if close enough.
    for (; i < n; ++i) {
        const double t = timestamps_s[size_t(i)];
        DZR_CHECK(
            have_prev,
            "{}: the stream ends before timestamp {:.6f} s (no frame decodes from the key frame before it; "
            "is the file cut short?)",
            m.name, t);
        DZR_CHECK(t - prev_pts <= tolerance_s,
                  "{}: the stream ends before timestamp {:.6f} s (the last frame is at {:.6f} s)", m.name, t,
                  prev_pts);
        emit(i, prev.get(), prev_pts);
    }
    return out;
}

void FfmpegVideo::check_timestamps(const std::vector<double>& timestamps_s, double tolerance_s) {
    Impl& m = *impl_;
    check_request(m.name, timestamps_s, tolerance_s);
    if (timestamps_s.empty()) return;
    const double first = timestamps_s.front(), last = timestamps_s.back();
    // NOTE: a packet's pts is its frame's; pts >= dts, so once the dts passes the last timestamp's window no
    // later packet can fall inside it. A second of lead covers B-frames ahead of the key frame sought.
    m.seek(first - 1.0);
    std::vector<double> pts;
    for (;;) {
        const int rc = av_read_frame(m.fmt.get(), m.packet.get());
        if (rc == AVERROR_EOF) break;
        if (rc < 0) DZR_THROW("{}: reading the video failed ({})", m.name, av_error_text(rc));
        const AVPacket& p = *m.packet;
        const bool ours = p.stream_index == m.stream->index;
        const bool corrupt = (p.flags & AV_PKT_FLAG_CORRUPT) != 0;
        const int64_t ts = p.pts != AV_NOPTS_VALUE ? p.pts : p.dts;
        const int64_t order = p.dts != AV_NOPTS_VALUE ? p.dts : p.pts;
        av_packet_unref(m.packet.get());
        if (!ours) continue;
        DZR_CHECK(ts != AV_NOPTS_VALUE, "{}: a video packet has no timestamp", m.name);
        DZR_CHECK(!corrupt, "{}: a corrupt or truncated packet at {:.6f} s", m.name, to_seconds(ts, m.stream->time_base));
        pts.push_back(to_seconds(ts, m.stream->time_base));
        if (to_seconds(order, m.stream->time_base) > last + tolerance_s) break;
    }
    DZR_CHECK(!pts.empty(), "{}: the stream holds no frame from {:.6f} s on (is the file cut short?)", m.name, first);
    std::sort(pts.begin(), pts.end());
    for (double t : timestamps_s) {
        auto it = std::lower_bound(pts.begin(), pts.end(), t);
        double nearest = it == pts.end() ? pts.back() : *it;
        if (it != pts.begin() && t - *std::prev(it) <= nearest - t) nearest = *std::prev(it);
        if (it == pts.end())
            DZR_CHECK(t - nearest <= tolerance_s, "{}: the stream ends before timestamp {:.6f} s (the last frame is "
                      "at {:.6f} s)", m.name, t, nearest);
        DZR_CHECK(std::abs(nearest - t) <= tolerance_s,
                  "{}: no frame within {} s of timestamp {:.6f} s (the nearest frame is at {:.6f} s)", m.name,
                  tolerance_s, t, nearest);
    }
}

std::string ffmpeg_version() {
    const bool dav1d = avcodec_find_decoder_by_name("libdav1d") != nullptr;
    return fmt::format("libavformat {}, libavcodec {} (dav1d: {})", version_text(avformat_version()),
                       version_text(avcodec_version()), dav1d ? "yes" : "no");
}

}  // namespace dzr::dataset
