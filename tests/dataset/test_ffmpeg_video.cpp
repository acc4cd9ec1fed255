#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "dataset/ffmpeg_video.h"
#include "io/npy.h"
#include "support/test_support.h"

// The fixtures come from tests/dataset/make_test_videos.py: small H.264 and AV1 mp4s plus PyAV's decode of
// every frame. DZR_VIDEO_FIXTURES names a directory that already holds them; otherwise the script writes them
// to a temporary directory (needs python3 with PyAV and numpy), and without those the binary exits 77 (ctest:
// skipped).

using namespace dzr;
using namespace dzr::dataset;
namespace fs = std::filesystem;
using test::contains;
using test::error_of;

namespace {

/// The fixture videos (make_test_videos.py's VIDEOS).
const std::vector<std::string> kVideos = {
    "h264_faststart_64x48_15fps", "h264_bframes_320x180_30fps", "h264_bt709_320x180_15fps",
    "h264_fullrange_64x48_15fps", "h264_100x60_15fps",          "av1_64x48_15fps",
    "av1_320x180_30fps",
};

struct Fixtures {
    std::unique_ptr<test::TempDir> tmp;  // when generated here
    fs::path dir;
    std::string why_not;  // non-empty: cannot run here
};

Fixtures make_fixtures() {
    Fixtures f;
    if (const char* env = std::getenv("DZR_VIDEO_FIXTURES")) {
        f.dir = env;
        return f;
    }
    f.tmp = std::make_unique<test::TempDir>();
    f.dir = f.tmp->path();
    const fs::path script = test::source_dir() / "tests" / "dataset" / "make_test_videos.py";
    // NOTE: DZR_PYTHON (scripts/lib/python.sh) is the Python that has PyAV; ctest passes it
    const char* python = std::getenv("DZR_PYTHON");
    const std::string cmd = fmt::format("'{}' '{}' '{}' 2>&1", python ? python : "python3", script.string(), f.dir.string());
    std::string output;
    if (FILE* p = popen(cmd.c_str(), "r")) {
        char buf[512];
        while (std::fgets(buf, sizeof(buf), p)) output += buf;
        if (pclose(p) == 0) return f;
    }
    f.why_not = "no DZR_VIDEO_FIXTURES and " + script.string() +
                " failed (needs python3 with PyAV and numpy): " + output;
    return f;
}

/// The fixture directory; skips the whole binary (exit 77) when there are no fixtures on this machine.
const fs::path& fixture_dir() {
    static const Fixtures f = make_fixtures();
    if (!f.why_not.empty()) {
        MESSAGE("skipped: " << f.why_not);
        std::exit(test::kSkipExitCode);
    }
    return f.dir;
}

/// One fixture: the video and PyAV's frames [N, H, W, 3] and pts [N].
struct Reference {
    fs::path mp4;
    io::NpyArray frames;
    std::vector<double> pts;

    int64_t count() const { return frames.dim(0); }
    size_t frame_bytes() const { return size_t(frames.dim(1) * frames.dim(2) * 3); }
    const uint8_t* frame(int64_t i) const { return frames.ptr<uint8_t>() + size_t(i) * frame_bytes(); }
    double frame_interval() const { return pts[1] - pts[0]; }
};

Reference load(const std::string& name) {
    const fs::path dir = fixture_dir();
    Reference r;
    r.mp4 = dir / (name + ".mp4");
    REQUIRE_MESSAGE(fs::exists(r.mp4), r.mp4.string() << " is missing (regenerate with make_test_videos.py)");
    r.frames = io::read_npy(dir / (name + ".frames.npy"));
    const io::NpyArray pts = io::read_npy(dir / (name + ".pts.npy"));
    REQUIRE(r.frames.dtype() == io::NpyDType::U1);
    REQUIRE(r.frames.rank() == 4);
    REQUIRE(r.frames.dim(3) == 3);
    REQUIRE(pts.dtype() == io::NpyDType::F8);
    REQUIRE(pts.numel() == r.frames.dim(0));
    REQUIRE(pts.numel() >= 30);
    r.pts.assign(pts.ptr<double>(), pts.ptr<double>() + pts.numel());
    return r;
}

/// The largest |a - b| over one decoded frame and one reference frame.
int max_abs_diff(const uint8_t* a, const uint8_t* b, size_t n) {
    int worst = 0;
    for (size_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(int(a[i]) - int(b[i])));
    return worst;
}

/// Checks that row i of `got` is reference frame rows[i].
void check_rows(const Reference& ref, const Tensor& got, const std::vector<int64_t>& rows) {
    REQUIRE(got.dtype() == DType::U8);
    REQUIRE(got.shape() == Shape{int64_t(rows.size()), ref.frames.dim(1), ref.frames.dim(2), 3});
    for (size_t i = 0; i < rows.size(); ++i) {
        const uint8_t* row = got.ptr<uint8_t>() + i * ref.frame_bytes();
        CHECK_MESSAGE(max_abs_diff(row, ref.frame(rows[i]), ref.frame_bytes()) == 0,
                      ref.mp4.filename().string() << ": output row " << i << " is not frame " << rows[i]);
    }
}

std::string slurp(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& p, const std::string& bytes) {
    std::ofstream out(p, std::ios::binary);
    out.write(bytes.data(), std::streamsize(bytes.size()));
}

/// Byte offset of the payload of the top-level MP4 box `type` ("mdat"); npos when there is none.
size_t mp4_box_payload(const std::string& bytes, const char* type) {
    size_t at = 0;
    while (at + 8 <= bytes.size()) {
        const auto* b = reinterpret_cast<const uint8_t*>(bytes.data() + at);
        const uint64_t size = (uint64_t(b[0]) << 24) | (uint64_t(b[1]) << 16) | (uint64_t(b[2]) << 8) | b[3];
        if (std::memcmp(b + 4, type, 4) == 0) return at + 8;
        if (size < 8) break;  // 64-bit or to-the-end sizes: not in these small files
        at += size_t(size);
    }
    return std::string::npos;
}

}  // namespace

TEST_CASE("every frame of each fixture equals PyAV's rgb24 decode, at PyAV's pts") {
    for (const std::string& name : kVideos) {
        CAPTURE(name);
        const Reference ref = load(name);
        FfmpegVideo video(ref.mp4);
        const VideoStreamInfo& info = video.info();
        CHECK(info.codec == (name.starts_with("av1") ? "av1" : "h264"));
        CHECK(info.decoder == (name.starts_with("av1") ? "libdav1d" : "h264"));
        CHECK(info.width == ref.frames.dim(2));
        CHECK(info.height == ref.frames.dim(1));
        CHECK(info.fps == doctest::Approx(1.0 / ref.frame_interval()).epsilon(1e-6));
        CHECK(info.frame_count == ref.count());
        CHECK(info.start_s == doctest::Approx(ref.pts[0]));
        CHECK(info.duration_s == doctest::Approx(ref.pts.back() + ref.frame_interval()).epsilon(1e-3));

        std::vector<double> chosen;
        const Tensor got = video.frames_at(ref.pts, 1e-4, &chosen);
        REQUIRE(got.shape() == Shape{ref.count(), ref.frames.dim(1), ref.frames.dim(2), 3});
        int worst = 0;
        for (int64_t i = 0; i < ref.count(); ++i)
            worst = std::max(worst, max_abs_diff(got.ptr<uint8_t>() + size_t(i) * ref.frame_bytes(),
                                                 ref.frame(i), ref.frame_bytes()));
        MESSAGE(name << " (" << info.decoder << ", " << info.pix_fmt << "): max |ours - PyAV| = " << worst);
        CHECK(worst == 0);
        REQUIRE(chosen.size() == ref.pts.size());
        for (size_t i = 0; i < chosen.size(); ++i)
            CHECK(chosen[i] == doctest::Approx(ref.pts[i]).epsilon(1e-12));
    }
}

TEST_CASE("each frame alone, asked for in a shuffled order (seeks back and forth, B-frames included)") {
    for (const std::string& name : kVideos) {
        CAPTURE(name);
        const Reference ref = load(name);
        FfmpegVideo video(ref.mp4);
        const int64_t n = ref.count();
        REQUIRE(std::gcd(n, int64_t(7)) == 1);
        for (int64_t j = 0; j < n; ++j) {
            const int64_t k = (j * 7) % n;  // 7 is coprime to the 36 frames: every frame once
            check_rows(ref, video.frames_at({ref.pts[size_t(k)]}, 1e-4), {k});
        }
    }
}

TEST_CASE(
    "a sparse subset in the middle, off the frame times and with duplicates, picks the nearest frames") {
    for (const std::string& name : kVideos) {
        CAPTURE(name);
        const Reference ref = load(name);
        FfmpegVideo video(ref.mp4);
        const double dt = ref.frame_interval();
        const auto at = [&](int64_t k) { return ref.pts[size_t(k)]; };
        std::vector<double> chosen;
        // Rows 13, 13, 14, 17, 17, 22: off by up to 0.4 frame either way, a duplicate both exact and shifted.
        const std::vector<double> ts = {at(13) - 0.4 * dt, at(13),
                                        at(14) + 0.3 * dt, at(17) - 0.1 * dt,
                                        at(17) + 0.2 * dt, at(22) + 0.4 * dt};
        check_rows(ref, video.frames_at(ts, 0.45 * dt, &chosen), {13, 13, 14, 17, 17, 22});
        CHECK(chosen == std::vector<double>{at(13), at(13), at(14), at(17), at(17), at(22)});
        // The same frame many times over: one decode, many copies.
        check_rows(ref, video.frames_at(std::vector<double>(5, at(20)), 1e-4), {20, 20, 20, 20, 20});
        // No timestamps: no frames.
        CHECK(video.frames_at({}, 1e-4).shape() == Shape{0, ref.frames.dim(1), ref.frames.dim(2), 3});
    }
}

TEST_CASE("a timestamp farther than the tolerance from every frame is an error naming the nearest frame") {
    const Reference ref = load("h264_bframes_320x180_30fps");
    FfmpegVideo video(ref.mp4);
    const double dt = ref.frame_interval();
    const double t = ref.pts[5] + 0.4 * dt;
    const std::string msg = error_of([&] { video.frames_at({ref.pts[2], t}, 0.1 * dt); });
    INFO(msg);
    CHECK(contains(msg, ref.mp4.string()));
    CHECK(contains(msg, fmt::format("{:.6f}", t)));
    CHECK(contains(msg, fmt::format("{:.6f}", ref.pts[5])));
    // Within the tolerance the same request succeeds, and the object is still usable after the error.
    check_rows(ref, video.frames_at({ref.pts[2], t}, 0.5 * dt), {2, 5});
    // Halfway between two frames: a tie goes to the earlier frame, as LeRobot's argmin does.
    std::vector<double> chosen;
    video.frames_at({0.5 * (ref.pts[8] + ref.pts[9])}, 0.6 * dt, &chosen);
    CHECK(chosen[0] == doctest::Approx(ref.pts[8]).epsilon(1e-12));
}

TEST_CASE("a timestamp past the end is an error naming the file and the last frame") {
    for (const std::string name : {"h264_bframes_320x180_30fps", "av1_64x48_15fps"}) {
        CAPTURE(name);
        const Reference ref = load(name);
        FfmpegVideo video(ref.mp4);
        const double last = ref.pts.back();
        const std::string msg = error_of([&] { video.frames_at({ref.pts[30], last + 1.0}, 1e-4); });
        INFO(msg);
        CHECK(contains(msg, ref.mp4.string()));
        CHECK(contains(msg, "ends before"));
        CHECK(contains(msg, fmt::format("{:.6f}", last + 1.0)));
        CHECK(contains(msg, fmt::format("{:.6f}", last)));
        // Just past the last frame but within the tolerance: the last frame.
        check_rows(ref, video.frames_at({last + 0.5e-4}, 1e-4), {ref.count() - 1});
    }
}

TEST_CASE("check_timestamps accepts what frames_at accepts and refuses what it refuses, decoding nothing") {
    for (const std::string& name : kVideos) {
        CAPTURE(name);
        const Reference ref = load(name);
        FfmpegVideo video(ref.mp4);
        const double dt = ref.frame_interval();
        // Every frame time, then a sparse subset off the frame times (B-frames reorder the packets' pts).
        CHECK_NOTHROW(video.check_timestamps(ref.pts, 1e-4));
        CHECK_NOTHROW(video.check_timestamps({ref.pts[13] - 0.4 * dt, ref.pts[17] + 0.2 * dt, ref.pts[22]}, 0.45 * dt));
        CHECK_NOTHROW(video.check_timestamps({}, 1e-4));
        // Off by more than the tolerance: the nearest frame named, as frames_at does.
        const double off = ref.pts[5] + 0.4 * dt;
        std::string msg = error_of([&] { video.check_timestamps({ref.pts[2], off}, 0.1 * dt); });
        CHECK(contains(msg, fmt::format("{:.6f}", off)));
        CHECK(contains(msg, fmt::format("{:.6f}", ref.pts[5])));
        CHECK(!error_of([&] { video.frames_at({ref.pts[2], off}, 0.1 * dt); }).empty());
        // Past the end.
        const double last = ref.pts.back();
        msg = error_of([&] { video.check_timestamps({ref.pts[30], last + 1.0}, 1e-4); });
        CHECK(contains(msg, "ends before"));
        CHECK(contains(msg, fmt::format("{:.6f}", last)));
        CHECK_NOTHROW(video.check_timestamps({last + 0.5e-4}, 1e-4));
        // Not ascending.
        CHECK(!error_of([&] { video.check_timestamps({ref.pts[3], ref.pts[2]}, 1e-4); }).empty());
        // The object still decodes exactly after the checks.
        check_rows(ref, video.frames_at({ref.pts[4]}, 1e-4), {4});
    }
}

TEST_CASE("a file cut short is an error, not a crash, and what is left before the cut still decodes") {
    test::TempDir tmp;
    // moov at the end (PyAV's default): without it the file does not open.
    {
        const Reference ref = load("av1_320x180_30fps");
        const std::string bytes = slurp(ref.mp4);
        const fs::path cut = tmp / "av1_cut.mp4";
        write_bytes(cut, bytes.substr(0, bytes.size() / 2));
        const std::string msg = error_of([&] { FfmpegVideo v(cut); });
        INFO(msg);
        CHECK(contains(msg, cut.string()));
    }
    // moov at the front: the file opens, the frames before the cut decode exactly (so nothing past them was
    // decoded), and a timestamp past the cut is an error.
    {
        const Reference ref = load("h264_faststart_64x48_15fps");
        const std::string bytes = slurp(ref.mp4);
        const fs::path cut = tmp / "h264_cut.mp4";
        write_bytes(cut, bytes.substr(0, bytes.size() / 2));
        FfmpegVideo video(cut);
        check_rows(ref, video.frames_at({ref.pts[0], ref.pts[3]}, 1e-4), {0, 3});
        const std::string msg = error_of([&] { video.frames_at({ref.pts.back()}, 1e-4); });
        INFO(msg);
        CHECK(contains(msg, cut.string()));
        CHECK(contains(msg, fmt::format("{:.6f}", ref.pts.back())));
    }
}

TEST_CASE("garbage in the first GOP is an error for its frames; a seek past it decodes exactly") {
    test::TempDir tmp;
    const Reference ref = load("h264_faststart_64x48_15fps");
    std::string bytes = slurp(ref.mp4);
    const size_t mdat = mp4_box_payload(bytes, "mdat");
    REQUIRE(mdat != std::string::npos);
    // x264 puts its ~700-byte SEI first; overwrite what follows in the first key frame and its P-frames.
    uint32_t state = 12345;
    for (size_t i = mdat + 900; i < mdat + 3000 && i < bytes.size(); ++i) {
        state = state * 1103515245u + 12345u;
        bytes[i] = char(state >> 24);
    }
    const fs::path bad = tmp / "garbage.mp4";
    write_bytes(bad, bytes);
    FfmpegVideo video(bad);
    const std::string msg =
        error_of([&] { video.frames_at(std::vector<double>(ref.pts.begin(), ref.pts.begin() + 10), 1e-4); });
    INFO(msg);
    CHECK(contains(msg, bad.string()));
    check_rows(ref, video.frames_at({ref.pts[20], ref.pts[35]}, 1e-4), {20, 35});
}

TEST_CASE("a missing file, a file that is no video and bad timestamps are errors naming the file") {
    test::TempDir tmp;
    const fs::path missing = tmp / "missing.mp4";
    std::string msg = error_of([&] { FfmpegVideo v(missing); });
    CHECK(contains(msg, missing.string()));
    CHECK(contains(msg, "not found"));

    const fs::path text = tmp / "notes.mp4";
    write_bytes(text, "these are not the frames you are looking for\n");
    msg = error_of([&] { FfmpegVideo v(text); });
    INFO(msg);
    CHECK(contains(msg, text.string()));

    const Reference ref = load("h264_faststart_64x48_15fps");
    const fs::path npy = fixture_dir() / "h264_faststart_64x48_15fps.pts.npy";
    msg = error_of([&] { FfmpegVideo v(npy); });
    CHECK(contains(msg, npy.string()));

    const fs::path audio = fixture_dir() / "audio_only.mp4";
    msg = error_of([&] { FfmpegVideo v(audio); });
    INFO(msg);
    CHECK(contains(msg, audio.string()));
    CHECK(contains(msg, "no video stream"));

    msg = error_of([&] { FfmpegVideo v(tmp.path()); });
    CHECK(contains(msg, tmp.path().string()));

    FfmpegVideo video(ref.mp4);
    msg = error_of([&] { video.frames_at({ref.pts[3], ref.pts[2]}, 1e-4); });
    CHECK(contains(msg, ref.mp4.string()));
    CHECK(contains(msg, "ascending"));
    msg = error_of([&] { video.frames_at({std::nan("")}, 1e-4); });
    CHECK(contains(msg, "finite"));
}

TEST_CASE("ffmpeg_version names the libraries and whether dav1d is there") {
    const std::string v = ffmpeg_version();
    MESSAGE(v);
    CHECK(contains(v, "libavformat "));
    CHECK(contains(v, "libavcodec "));
    CHECK(contains(v, "(dav1d: "));
}
