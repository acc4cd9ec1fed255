#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/episode.h"
#include "io/episode_source.h"
#include "io/npy.h"
#include "io/synth_episode.h"
#include "io/video_reader.h"
#include "rollout/frame_schedule.h"
#include "support/test_support.h"

using namespace dzr;
using namespace dzr::io;
namespace fs = std::filesystem;

namespace {

using test::contains;

void write_text(const fs::path& p, const std::string& text) {
    std::ofstream out(p, std::ios::binary);
    out << text;
}

/// uint8 frames [T, H, W, 3] whose value encodes (t, y, x, c), so any mix-up of frames shows.
NpyArray make_frames(int64_t t, int64_t h, int64_t w, int salt = 0) {
    NpyArray a(NpyDType::U1, {t, h, w, 3});
    auto* p = a.ptr<uint8_t>();
    for (int64_t i = 0; i < a.numel(); ++i) {
        const int64_t c = i % 3, x = (i / 3) % w, y = (i / (3 * w)) % h, f = i / (3 * w * h);
        p[i] = uint8_t((f * 7 + y * 3 + x * 5 + c * 11 + salt * 50) % 256);
    }
    return a;
}

std::vector<double> ramp(int64_t rows, int64_t cols, double scale) {
    std::vector<double> v(size_t(rows * cols));
    for (size_t i = 0; i < v.size(); ++i) v[i] = scale * double(i);
    return v;
}

struct EpisodeFiles {
    int64_t frames = 30;
    int64_t height = 6;
    int64_t width = 8;
    bool state = true;
    bool actions = true;
    std::string yaml = "prompt: pick up the red cup\nfps: 15\n";
};

void write_episode(const fs::path& dir, const EpisodeFiles& f) {
    fs::create_directories(dir);
    for (int i = 0; i < kNumCameras; ++i)
        write_npy(dir / (std::string(kCameraNames[size_t(i)]) + ".npy"), make_frames(f.frames, f.height, f.width, i));
    if (f.state) {
        write_npy_f64(dir / "joint_position.npy", {f.frames, 7}, ramp(f.frames, 7, 0.01));
        write_npy_f64(dir / "gripper_position.npy", {f.frames, 1}, ramp(f.frames, 1, 0.5));
    }
    if (f.actions) {
        const auto a = ramp(f.frames, 8, 0.25);
        write_npy_f32(dir / "actions.npy", {f.frames, 8}, std::vector<float>(a.begin(), a.end()));
    }
    if (!f.yaml.empty()) write_text(dir / "episode.yaml", f.yaml);
}

std::string read_error(const fs::path& dir, const EpisodeOptions& opt = {}) {
    try {
        read_episode(dir, opt);
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}

/// A fake decoder: every file decodes to `frames` frames at `fps`; a file whose name contains
/// "broken" fails the way a damaged video does.
VideoOpener fake_opener(int64_t frames, double fps) {
    struct Fake final : VideoReader {
        VideoInfo i;
        const VideoInfo& info() const override { return i; }
        Tensor read_all() override { return make_frames(i.frame_count, i.height, i.width).to_tensor(); }
    };
    return [=](const fs::path& p) -> std::unique_ptr<VideoReader> {
        if (contains(p.filename().string(), "broken")) DZR_THROW("{}: frame 3 cannot be decoded", p.string());
        auto r = std::make_unique<Fake>();
        r->i = {frames, contains(p.filename().string(), "wrist") ? fps * 2 : fps, 8, 6};
        return r;
    };
}

// --- MP4 helpers: relocate the 'moov' box in front of 'mdat' ("faststart"), so that a truncated
// file still declares its frame count and the decoder runs out of data mid-stream. ---

uint64_t be(const std::string& b, size_t off, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v = (v << 8) | uint8_t(b[off + size_t(i)]);
    return v;
}

void put_be(std::string& b, size_t off, uint64_t v, int n) {
    for (int i = n - 1; i >= 0; --i, v >>= 8) b[off + size_t(i)] = char(v & 0xff);
}

void shift_chunk_offsets(std::string& b, size_t begin, size_t end, uint64_t delta) {
    for (size_t p = begin; p + 8 <= end;) {
        const uint64_t size = be(b, p, 4);
        const std::string type = b.substr(p + 4, 4);
        REQUIRE(size >= 8);
        if (type == "trak" || type == "mdia" || type == "minf" || type == "stbl") {
            shift_chunk_offsets(b, p + 8, p + size, delta);
        } else if (type == "stco" || type == "co64") {
            const int w = type == "stco" ? 4 : 8;
            const uint64_t n = be(b, p + 12, 4);
            for (uint64_t k = 0; k < n; ++k) {
                const size_t at = p + 16 + size_t(k) * size_t(w);
                put_be(b, at, be(b, at, w) + delta, w);
            }
        }
        p += size;
    }
}

std::string faststart(const std::string& file) {
    std::vector<std::pair<std::string, std::string>> boxes;  // (type, bytes)
    for (size_t p = 0; p + 8 <= file.size();) {
        const uint64_t size = be(file, p, 4);
        REQUIRE(size >= 8);  // OpenCV's small files use 32-bit box sizes
        boxes.emplace_back(file.substr(p + 4, 4), file.substr(p, size));
        p += size;
    }
    std::string moov;
    for (auto& [type, bytes] : boxes)
        if (type == "moov") moov = bytes;
    REQUIRE(!moov.empty());
    shift_chunk_offsets(moov, 8, moov.size(), moov.size());
    std::string out;
    for (auto& [type, bytes] : boxes) {
        if (type == "moov") continue;
        if (type == "mdat") out += moov;
        out += bytes;
    }
    return out;
}

std::string slurp(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace

TEST_CASE("episode reader loads npy cameras, state, actions and episode.yaml") {
    test::TempDir dir;
    write_episode(dir / "ep", {});
    const Episode ep = read_episode(dir / "ep", {});
    CHECK(ep.name == "ep");
    CHECK(ep.prompt == "pick up the red cup");
    CHECK(ep.fps == 15.0);
    CHECK(ep.num_frames == 30);
    for (int i = 0; i < kNumCameras; ++i) {
        const auto& c = ep.cameras[size_t(i)];
        CHECK(c.name == kCameraNames[size_t(i)]);
        CHECK(c.frames.shape() == Shape{30, 6, 8, 3});
        CHECK(c.width == 8);
        CHECK(c.height == 6);
        // frame 5, row 2, column 3, channel 1 of camera i
        const size_t at = ((5 * 6 + 2) * 8 + 3) * 3 + 1;
        CHECK(int(c.frames.ptr<uint8_t>()[at]) == (5 * 7 + 2 * 3 + 3 * 5 + 11 + i * 50) % 256);
    }
    CHECK(ep.state_array("joint_position").present);
    CHECK(ep.state_array("gripper_position").present);
    REQUIRE(ep.has_actions());
    CHECK(ep.actions.size() == 30 * 8);
    CHECK(ep.actions[8 * 3 + 2] == doctest::Approx(0.25 * 26));
    const auto s = ep.state_at(4);
    CHECK(s[0] == doctest::Approx(0.01 * 28));
    CHECK(s[6] == doctest::Approx(0.01 * 34));
    CHECK(s[7] == doctest::Approx(0.5 * 4));
    CHECK_THROWS_AS(ep.state_at(30), Error);
    // The frame size differs from DROID's 320x180: allowed, but reported.
    CHECK(contains(ep.summary(), "8x6"));
    CHECK(contains(ep.warnings.back(), "not DROID's 320x180"));
}

TEST_CASE("episode reader fills absent state with zeros and warns") {
    test::TempDir dir;
    EpisodeFiles f;
    f.state = false;
    f.actions = false;
    f.height = 180;
    f.width = 320;
    f.frames = 3;
    write_episode(dir / "ep", f);
    const Episode ep = read_episode(dir / "ep", {});
    CHECK_FALSE(ep.state_array("joint_position").present);
    CHECK_FALSE(ep.has_actions());
    CHECK(ep.state_array("joint_position").values == std::vector<double>(3 * 7, 0.0));
    CHECK(ep.state_array("gripper_position").values == std::vector<double>(3, 0.0));
    REQUIRE(ep.warnings.size() == 2);
    CHECK(contains(ep.warnings[0], "joint_position.npy"));
    CHECK(contains(ep.warnings[1], "gripper_position.npy"));
}

TEST_CASE("episode reader names the missing camera file") {
    test::TempDir dir;
    write_episode(dir / "ep", {});
    fs::remove(dir / "ep" / "exterior_image_2_left.npy");
    const std::string msg = read_error(dir / "ep");
    CHECK(contains(msg, (dir / "ep").string()));
    CHECK(contains(msg, "missing camera file exterior_image_2_left"));

    // A camera override in episode.yaml that points nowhere names that file.
    write_episode(dir / "ep2", {});
    write_text(dir / "ep2" / "episode.yaml", "prompt: go\ncameras:\n  wrist_image_left: wrist_cam.mp4\n");
    const std::string msg2 = read_error(dir / "ep2");
    CHECK(contains(msg2, "wrist_cam.mp4"));
    CHECK(contains(msg2, "missing camera file for wrist_image_left"));
}

TEST_CASE("an input that is a dangling symlink, a device or a directory is refused, never read as absent") {
    // NOTE: before, a state file like these was warned about and replaced by zeros, with exit 0
    test::TempDir dir;
    struct Case {
        const char* file;
        std::function<void(const fs::path&)> make;
        const char* found;
    };
    const Case cases[] = {
        {"gripper_position.npy", [](const fs::path& p) { fs::create_symlink("nowhere.npy", p); },
         "found a dangling symlink to nowhere.npy"},
        {"joint_position.npy", [](const fs::path& p) { fs::create_symlink("/dev/zero", p); },
         "found a symlink to /dev/zero (a character device)"},
        {"actions.npy", [](const fs::path& p) { fs::create_directory(p); }, "found a directory"},
        {"wrist_image_left.npy", [](const fs::path& p) { fs::create_directory(p); }, "found a directory"},
        {"episode.yaml", [](const fs::path& p) { fs::create_directory(p); }, "found a directory"},
    };
    for (const auto& c : cases) {
        CAPTURE(c.file);
        const fs::path ep = dir / (std::string("ep_") + c.file);
        write_episode(ep, {});
        fs::remove(ep / c.file);
        c.make(ep / c.file);
        const std::string msg = read_error(ep);
        CHECK(contains(msg, (ep / c.file).string() + ": expected a regular file, " + c.found));
    }
}

TEST_CASE("episode.yaml with a key given twice is refused, naming the key and both lines") {
    test::TempDir dir;
    write_episode(dir / "ep", {});
    write_text(dir / "ep" / "episode.yaml", "prompt: go left\nfps: 15\nprompt: go right\n");
    const std::string msg = read_error(dir / "ep");
    CHECK(contains(msg, "episode.yaml: line 3: key 'prompt' given twice (first on line 1)"));
}

TEST_CASE("episode reader follows camera-file overrides in episode.yaml") {
    test::TempDir dir;
    write_episode(dir / "ep", {});
    fs::rename(dir / "ep" / "wrist_image_left.npy", dir / "ep" / "hand.npy");
    write_text(dir / "ep" / "episode.yaml", "prompt: go\ncameras:\n  wrist_image_left: hand.npy\n");
    const Episode ep = read_episode(dir / "ep", {});
    CHECK(ep.camera("wrist_image_left").file.filename() == "hand.npy");
    write_text(dir / "ep" / "episode.yaml", "prompt: go\ncameras:\n  top_camera: hand.npy\n");
    CHECK(contains(read_error(dir / "ep"), "unknown camera 'top_camera'"));
}

TEST_CASE("episode reader rejects cameras of different lengths unless truncation is allowed") {
    test::TempDir dir;
    write_episode(dir / "ep", {});
    write_npy(dir / "ep" / "wrist_image_left.npy", make_frames(28, 6, 8, 2));
    const std::string msg = read_error(dir / "ep");
    CHECK(contains(msg, "different frame counts"));
    CHECK(contains(msg, "wrist_image_left.npy has 28"));
    CHECK(contains(msg, "exterior_image_1_left.npy has 30"));

    EpisodeOptions opt;
    opt.allow_truncate = true;
    const Episode ep = read_episode(dir / "ep", opt);
    CHECK(ep.num_frames == 28);
    for (const auto& c : ep.cameras) CHECK(c.frames.shape()[0] == 28);
    CHECK(ep.actions.size() == 28 * 8);
    CHECK(ep.state_array("joint_position").values.size() == 28 * 7);
    bool warned = false;
    for (const auto& w : ep.warnings) warned = warned || contains(w, "truncated to 28");
    CHECK(warned);
    // The truncated frames are the first 28 of each file.
    CHECK(ep.cameras[0].frames.ptr<uint8_t>()[0] == make_frames(30, 6, 8, 0).ptr<uint8_t>()[0]);
}

TEST_CASE("episode reader rejects state and action arrays whose length disagrees with the videos") {
    test::TempDir dir;
    write_episode(dir / "ep", {});
    write_npy_f64(dir / "ep" / "joint_position.npy", {29, 7}, ramp(29, 7, 1.0));
    const std::string msg = read_error(dir / "ep");
    CHECK(contains(msg, (dir / "ep" / "joint_position.npy").string()));
    CHECK(contains(msg, "29 rows, but the videos have 30 frames"));

    write_episode(dir / "ep2", {});
    write_npy_f32(dir / "ep2" / "actions.npy", {31, 8}, std::vector<float>(31 * 8, 0.f));
    CHECK(contains(read_error(dir / "ep2"), "actions.npy: 31 rows"));

    EpisodeOptions opt;
    opt.allow_truncate = true;
    const Episode ep = read_episode(dir / "ep", opt);
    CHECK(ep.num_frames == 29);
    CHECK(ep.cameras[1].frames.shape()[0] == 29);
}

TEST_CASE("episode reader checks state shapes, dtypes and values") {
    test::TempDir dir;
    write_episode(dir / "ep", {});
    write_npy_f64(dir / "ep" / "joint_position.npy", {30, 6}, ramp(30, 6, 1.0));
    CHECK(contains(read_error(dir / "ep"), "joint_position.npy: expected shape [T, 7], found float64 [30, 6]"));

    write_episode(dir / "ep2", {});
    write_npy_f64(dir / "ep2" / "gripper_position.npy", {30}, ramp(30, 1, 0.1));  // [T] is fine
    CHECK(read_episode(dir / "ep2", {}).state_at(2)[7] == doctest::Approx(0.2));
    NpyArray ints(NpyDType::I4, {30, 1});
    write_npy(dir / "ep2" / "gripper_position.npy", ints);
    CHECK(contains(read_error(dir / "ep2"), "expected a float array"));

    write_episode(dir / "ep3", {});
    std::vector<float> a(30 * 8, 1.f);
    a[8 * 12 + 5] = NAN;
    write_npy_f32(dir / "ep3" / "actions.npy", {30, 8}, a);
    CHECK(contains(read_error(dir / "ep3"), "actions.npy: row 12, column 5 is nan"));
}

TEST_CASE("episode reader rejects camera arrays that are not uint8 [T, H, W, 3]") {
    test::TempDir dir;
    write_episode(dir / "ep", {});
    write_npy_f32(dir / "ep" / "exterior_image_1_left.npy", {30, 6, 8, 3}, std::vector<float>(30 * 6 * 8 * 3));
    const std::string msg = read_error(dir / "ep");
    CHECK(contains(msg, "exterior_image_1_left.npy: camera frames must be uint8 [T, H, W, 3], found float32"));
    write_npy(dir / "ep" / "exterior_image_1_left.npy", NpyArray(NpyDType::U1, {30, 6, 8, 4}));
    CHECK(contains(read_error(dir / "ep"), "found uint8 [30, 6, 8, 4]"));
    // A corrupt camera .npy is reported by the npy reader, naming the file.
    write_text(dir / "ep" / "exterior_image_1_left.npy", "not numpy");
    CHECK(contains(read_error(dir / "ep"), "exterior_image_1_left.npy: not an NPY file"));
}

TEST_CASE("episode reader rejects too few frames for one call") {
    test::TempDir dir;
    EpisodeFiles f;
    f.frames = 10;
    write_episode(dir / "ep", f);
    EpisodeOptions opt;
    opt.min_frames = 24;
    const std::string msg = read_error(dir / "ep", opt);
    CHECK(contains(msg, (dir / "ep").string()));
    CHECK(contains(msg, "10 frames, but one call needs at least 24"));
    opt.min_frames = 10;
    CHECK(read_episode(dir / "ep", opt).num_frames == 10);
}

TEST_CASE("episode reader rejects non-UTF-8, empty and missing prompts") {
    test::TempDir dir;
    EpisodeFiles f;
    f.yaml = "prompt: \"caf\xe9 au lait\"\n";  // Latin-1 e-acute: not UTF-8
    write_episode(dir / "ep", f);
    std::string msg = read_error(dir / "ep");
    CHECK(contains(msg, (dir / "ep" / "episode.yaml").string()));
    CHECK(contains(msg, "not valid UTF-8"));
    CHECK(contains(msg, "0xe9"));

    write_text(dir / "ep" / "episode.yaml", "prompt: \"  \"\n");
    msg = read_error(dir / "ep");
    CHECK(contains(msg, "episode.yaml: the prompt is empty"));
    write_text(dir / "ep" / "episode.yaml", "prompt: \"\"\n");
    CHECK(contains(read_error(dir / "ep"), "the prompt is empty"));
    write_text(dir / "ep" / "episode.yaml", "fps: 15\n");
    CHECK(contains(read_error(dir / "ep"), "no prompt"));
    fs::remove(dir / "ep" / "episode.yaml");
    CHECK(contains(read_error(dir / "ep"), "no prompt"));

    // --prompt replaces the file's prompt and is checked the same way.
    EpisodeOptions opt;
    opt.prompt = "wipe the table \xc3\xa9";  // valid UTF-8
    CHECK(read_episode(dir / "ep", opt).prompt == "wipe the table \xc3\xa9");
    opt.prompt = std::string("bad \xc3");
    CHECK(contains(read_error(dir / "ep", opt), "--prompt: the prompt is not valid UTF-8"));
    opt.prompt = "";
    CHECK(contains(read_error(dir / "ep", opt), "--prompt: the prompt is empty"));
}

TEST_CASE("episode reader reports malformed episode.yaml with the line") {
    test::TempDir dir;
    EpisodeFiles f;
    f.yaml = "prompt: go\nfps: [15\n";
    write_episode(dir / "ep", f);
    std::string msg = read_error(dir / "ep");
    CHECK(contains(msg, "episode.yaml: invalid YAML at line"));
    write_text(dir / "ep" / "episode.yaml", "prompt: go\nfps: fast\n");
    CHECK(contains(read_error(dir / "ep"), "'fps' must be a number, found 'fast'"));
    write_text(dir / "ep" / "episode.yaml", "prompt: go\nfps: -3\n");
    CHECK(contains(read_error(dir / "ep"), "'fps' must be positive"));
    write_text(dir / "ep" / "episode.yaml", "- a list\n");
    CHECK(contains(read_error(dir / "ep"), "expected a mapping"));
    write_text(dir / "ep" / "episode.yaml", "prompt: go\ncolour: blue\n");
    CHECK(contains(read_error(dir / "ep"), "episode.yaml: unknown key 'colour'"));
}

TEST_CASE("episode reader rejects per-frame values that are finite in float64 but not in float32") {
    test::TempDir dir;
    write_episode(dir / "ep", {});
    const NpyArray a = read_npy(dir / "ep" / "joint_position.npy");
    std::vector<double> v = a.to_f64();
    v[16] = 1e300;  // row 2, column 2
    write_npy_f64(dir / "ep" / "joint_position.npy", a.shape(), v);
    CHECK(contains(read_error(dir / "ep"), "joint_position.npy: row 2, column 2 is 1e+300, beyond the float32 range"));
}

TEST_CASE("episode reader rejects a quoted prompt left open that swallows the next keys") {
    test::TempDir dir;
    EpisodeFiles f;
    // NOTE: yaml-cpp reads a double quote left open up to the end of the file without an error.
    f.yaml = "prompt: \"pick up the red cup\nfps: 15\ncameras:\n  wrist_image_left: w.npy\n";
    write_episode(dir / "ep", f);
    const std::string msg = read_error(dir / "ep");
    CHECK(contains(msg, "episode.yaml: line 1: the quoted prompt is not closed on its line"));
    CHECK(contains(msg, "'fps', 'cameras', 'wrist_image_left'"));
    // single quotes, and a key swallowed up to the end of the file
    write_text(dir / "ep" / "episode.yaml", "prompt: 'pick it''s cup\nfps: 15'\n");
    CHECK(contains(read_error(dir / "ep"), "swallows the line starting with 'fps'"));
    // a quoted prompt folded over lines that hold no key stays valid
    write_text(dir / "ep" / "episode.yaml", "prompt: \"pick up the red cup\n  and put it down\"\nfps: 15\n");
    CHECK(read_episode(dir / "ep", {}).prompt == "pick up the red cup and put it down");
}

TEST_CASE("episode reader checks video frame rates and reports video decoding errors") {
    test::TempDir dir;
    write_episode(dir / "ep", {});
    for (auto cam : kCameraNames) {
        fs::remove(dir / "ep" / (std::string(cam) + ".npy"));
        write_text(dir / "ep" / (std::string(cam) + ".mp4"), "stand-in");
    }
    EpisodeOptions opt;
    // Without a decoder, .mp4 cameras are an error that asks for .npy frames.
    CHECK(contains(read_error(dir / "ep", opt), "provide the frames as exterior_image_1_left.npy"));

    // The fake decoder gives the wrist camera twice the frame rate of the others.
    opt.open_video = fake_opener(30, 15.0);
    write_text(dir / "ep" / "episode.yaml", "prompt: go\n");
    std::string msg = read_error(dir / "ep", opt);
    CHECK(contains(msg, "wrist_image_left.mp4: 30 fps, but"));
    CHECK(contains(msg, "exterior_image_1_left.mp4 is 15 fps"));
    // episode.yaml's fps must match the containers.
    write_text(dir / "ep" / "episode.yaml", "prompt: go\nfps: 10\n");
    CHECK(contains(read_error(dir / "ep", opt), "exterior_image_1_left.mp4: 15 fps, but"));
    // Same rates everywhere: the fps comes from the containers.
    fs::remove(dir / "ep" / "wrist_image_left.mp4");
    write_npy(dir / "ep" / "wrist_image_left.npy", make_frames(30, 6, 8));
    write_text(dir / "ep" / "episode.yaml", "prompt: go\n");
    CHECK(read_episode(dir / "ep", opt).fps == 15.0);
    // A decoding failure propagates with the file and frame.
    write_text(dir / "ep" / "episode.yaml", "prompt: go\ncameras:\n  exterior_image_2_left: broken.mp4\n");
    write_text(dir / "ep" / "broken.mp4", "x");
    CHECK(contains(read_error(dir / "ep", opt), "broken.mp4: frame 3 cannot be decoded"));
}

TEST_CASE("video reader decodes what the mp4 writer encoded, or explains that the build has no video support") {
    test::TempDir dir;
    NpyArray frames(NpyDType::U1, {20, 48, 64, 3});
    auto* p = frames.ptr<uint8_t>();
    // Smooth content that moves: a bright square over a gradient.
    for (int64_t t = 0; t < 20; ++t)
        for (int64_t y = 0; y < 48; ++y)
            for (int64_t x = 0; x < 64; ++x) {
                const bool sq = x >= 2 * t && x < 2 * t + 16 && y >= 16 && y < 32;
                uint8_t* px = p + ((t * 48 + y) * 64 + x) * 3;
                px[0] = sq ? 240 : uint8_t(x * 3);
                px[1] = sq ? 40 : uint8_t(y * 4);
                px[2] = sq ? 60 : 128;
            }
    const fs::path mp4 = dir / "clip.mp4";
    if (!video_io_available()) {
        CHECK_THROWS_WITH_AS(write_video_mp4(mp4, frames.to_tensor(), 15.0), doctest::Contains(".npy"), Error);
        CHECK_THROWS_WITH_AS(open_video(mp4), doctest::Contains("provide the camera frames as .npy"), Error);
        return;
    }
    const std::string codec = write_video_mp4(mp4, frames.to_tensor(), 15.0);
    CHECK((codec == "avc1" || codec == "mp4v"));
    auto reader = open_video(mp4);
    CHECK(reader->info().width == 64);
    CHECK(reader->info().height == 48);
    CHECK(reader->info().fps == doctest::Approx(15.0));
    const Tensor back = reader->read_all();
    REQUIRE(back.shape() == Shape{20, 48, 64, 3});
    // Lossy codec: compare the mean absolute error and one pixel inside the square (RGB order kept).
    double err = 0;
    for (int64_t i = 0; i < back.numel(); ++i) err += std::abs(int(back.ptr<uint8_t>()[i]) - int(p[i]));
    CHECK(err / double(back.numel()) < 6.0);
    const uint8_t* px = back.ptr<uint8_t>() + ((10 * 48 + 24) * 64 + 28) * 3;
    CHECK(px[0] > 200);
    CHECK(px[1] < 90);
    CHECK(px[2] < 110);
}

TEST_CASE("video reader rejects unreadable and truncated videos naming the file and the frame") {
    if (!video_io_available()) return;
    test::TempDir dir;
    NpyArray frames(NpyDType::U1, {30, 64, 96, 3});
    for (int64_t i = 0; i < frames.numel(); ++i) frames.ptr<uint8_t>()[i] = uint8_t((i * 2654435761u) >> 24);
    const fs::path good = dir / "good.mp4";
    write_video_mp4(good, frames.to_tensor(), 15.0);

    write_text(dir / "garbage.mp4", std::string(4000, 'z'));
    CHECK_THROWS_WITH_AS(open_video(dir / "garbage.mp4"), doctest::Contains("garbage.mp4: unreadable video"), Error);
    CHECK_THROWS_WITH_AS(open_video(dir / "absent.mp4"), doctest::Contains("absent.mp4: no such file"), Error);

    // With the index at the front, a file cut short still declares 30 frames but runs out of data.
    const std::string fast = faststart(slurp(good));
    write_text(dir / "fast.mp4", fast);
    CHECK(open_video(dir / "fast.mp4")->read_all().shape()[0] == 30);
    write_text(dir / "cut.mp4", fast.substr(0, fast.size() * 3 / 4));
    auto reader = open_video(dir / "cut.mp4");
    CHECK(reader->info().frame_count == 30);
    std::string msg;
    try {
        reader->read_all();
    } catch (const Error& e) {
        msg = e.what();
    }
    CHECK(contains(msg, (dir / "cut.mp4").string()));
    CHECK(contains(msg, "truncated or damaged video: frame "));
    CHECK(contains(msg, "declares 30 frames"));

    // The index at the end (as OpenCV writes it): a cut file has no index and cannot be opened.
    const std::string plain = slurp(good);
    write_text(dir / "cut2.mp4", plain.substr(0, plain.size() / 2));
    CHECK_THROWS_WITH_AS(open_video(dir / "cut2.mp4"), doctest::Contains("cut2.mp4: unreadable video"), Error);
}

TEST_CASE("episode list resolves a parent directory and a list file") {
    test::TempDir dir;
    write_episode(dir / "all" / "b_ep", {});
    write_episode(dir / "all" / "a_ep", {});
    fs::create_directories(dir / "all" / "notes");  // not an episode: skipped
    auto eps = list_episodes(dir / "all");
    REQUIRE(eps.size() == 2);
    CHECK(eps[0].filename() == "a_ep");
    CHECK(eps[1].filename() == "b_ep");
    // An episode directory is itself a list of one.
    CHECK(list_episodes(dir / "all" / "b_ep") == std::vector<fs::path>{dir / "all" / "b_ep"});

    write_text(dir / "list.txt", "# episodes to run\nall/b_ep\n\n  all/a_ep  \n" + (dir / "all" / "b_ep").string() + "\n");
    eps = list_episodes(dir / "list.txt");
    REQUIRE(eps.size() == 3);
    CHECK(eps[0] == dir / "all" / "b_ep");
    CHECK(eps[1] == dir / "all" / "a_ep");
    CHECK(unique_episode_names(list_episode_refs(dir / "list.txt", {}, {}, {})) ==
          std::vector<std::string>{"b_ep", "a_ep", "b_ep_2"});

    write_text(dir / "bad_list.txt", "all/a_ep\nall/zzz\n");
    CHECK_THROWS_WITH_AS(list_episodes(dir / "bad_list.txt"), doctest::Contains("bad_list.txt: line 2"), Error);
    write_text(dir / "empty_list.txt", "# nothing\n");
    CHECK_THROWS_WITH_AS(list_episodes(dir / "empty_list.txt"), doctest::Contains("list is empty"), Error);
    CHECK_THROWS_WITH_AS(list_episodes(dir / "all" / "notes"), doctest::Contains("no episodes found"), Error);
    CHECK_THROWS_WITH_AS(list_episodes(dir / "nowhere"), doctest::Contains("no such episode directory"), Error);
}

TEST_CASE("utf-8 validation rejects overlong forms, surrogates and truncated sequences") {
    CHECK_FALSE(find_invalid_utf8("plain ascii").has_value());
    CHECK_FALSE(find_invalid_utf8("\xc3\xa9\xe2\x82\xac\xf0\x9f\xa4\x96").has_value());  // e-acute, euro, robot
    CHECK(find_invalid_utf8("ab\xc0\xafz") == size_t(2));        // overlong '/'
    CHECK(find_invalid_utf8("\xed\xa0\x80") == size_t(0));        // surrogate U+D800
    CHECK(find_invalid_utf8("x\xf4\x90\x80\x80") == size_t(1));   // past U+10FFFF
    CHECK(find_invalid_utf8("abc\xe2\x82") == size_t(3));         // cut short
    CHECK(find_invalid_utf8("\x80") == size_t(0));                // lone continuation
    CHECK(find_invalid_utf8("\xff") == size_t(0));
}

TEST_CASE("synthetic episode is deterministic, valid and moves between calls") {
    test::TempDir dir;
    io::SynthOptions opt;
    opt.frames = 48;
    opt.seed = 7;
    opt.width = 64;
    opt.height = 36;
    const auto files = write_synth_episode(dir / "syn", opt);
    CHECK(files.size() == 3 + 4);
    EpisodeOptions eo;
    eo.min_frames = rollout::FrameSchedule().min_frames();
    const Episode ep = read_episode(dir / "syn", eo);
    CHECK(ep.num_frames == 48);
    CHECK(ep.has_actions());
    CHECK(ep.state_array("joint_position").present);
    CHECK_FALSE(ep.prompt.empty());
    CHECK(ep.cameras[2].frames.shape() == Shape{48, 36, 64, 3});

    // Same options, same bytes; another seed, other trajectories.
    const SynthEpisode a = make_synth_episode(opt);
    const SynthEpisode b = make_synth_episode(opt);
    CHECK(a.state[0] == b.state[0]);  // joint_position
    CHECK(std::memcmp(a.views[0].data(), b.views[0].data(), a.views[0].nbytes()) == 0);
    CHECK(a.state[0] == ep.state_array("joint_position").values);
    opt.seed = 8;
    CHECK(make_synth_episode(opt).state[0] != a.state[0]);

    // Ground-truth action t is the state at t + 1 (the last row repeats the last state).
    for (int64_t t = 0; t < 48; ++t) {
        const auto next = ep.state_at(std::min<int64_t>(t + 1, 47));
        for (int d = 0; d < 8; ++d) CHECK(ep.actions[size_t(t * 8 + d)] == next[size_t(d)]);
    }
    // Joints stay near a plausible pose and the gripper in [0, 1].
    for (int64_t t = 0; t < 48; ++t) {
        const auto s = ep.state_at(t);
        for (int j = 0; j < 7; ++j) CHECK(std::abs(s[size_t(j)]) < 3.2);
        CHECK(s[7] >= 0.0);
        CHECK(s[7] <= 1.0);
    }
    // Every view changes between the frames of consecutive calls (anchors 0, 23, 47).
    const size_t fb = 36 * 64 * 3;
    for (const auto& cam : ep.cameras) {
        const auto* p = cam.frames.ptr<uint8_t>();
        CHECK(std::memcmp(p, p + 23 * fb, fb) != 0);
        CHECK(std::memcmp(p + 23 * fb, p + 47 * fb, fb) != 0);
    }
}

TEST_CASE("dzr episode inspect exits non-zero with one line naming the bad file") {
    const char* bin = std::getenv("DZR_BIN");
    if (!bin || !fs::exists(bin)) {
        MESSAGE("DZR_BIN not built; skipping the command-line checks");
        return;
    }
    test::TempDir dir;
    write_episode(dir / "ep", {});
    auto run = [&](const std::string& args) {
        const fs::path err = dir / "stderr.txt";
        const std::string cmd = std::string(bin) + " episode inspect " + args + " > /dev/null 2> " + err.string();
        const int rc = std::system(cmd.c_str());
        return std::make_pair(WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, slurp(err));
    };
    auto [rc_ok, err_ok] = run((dir / "ep").string());
    CHECK(rc_ok == 0);

    fs::remove(dir / "ep" / "wrist_image_left.npy");
    auto [rc, err] = run((dir / "ep").string());
    CHECK(rc == 1);
    CHECK(contains(err, "missing camera file wrist_image_left"));
    CHECK(std::count(err.begin(), err.end(), '\n') == 1);

    write_npy(dir / "ep" / "wrist_image_left.npy", make_frames(30, 6, 8));
    write_npy_f64(dir / "ep" / "gripper_position.npy", {12, 1}, ramp(12, 1, 1.0));
    std::tie(rc, err) = run((dir / "ep").string());
    CHECK(rc == 1);
    CHECK(contains(err, "gripper_position.npy: 12 rows, but the videos have 30 frames"));

    // Too few frames for one 4-frame call (the default schedule needs 24).
    write_episode(dir / "short", EpisodeFiles{.frames = 20});
    std::tie(rc, err) = run((dir / "short").string());
    CHECK(rc == 1);
    CHECK(contains(err, "20 frames, but one call needs at least 24"));
}
