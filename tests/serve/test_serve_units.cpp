// lib/serve without a model: the wire encoding against openpi_client's bytes, the request validation, the
// official frame accumulation, and the recorder's episode read back through the episode reader.
#include <doctest/doctest.h>

#ifndef MSGPACK_NO_BOOST
#define MSGPACK_NO_BOOST
#endif
#include <msgpack.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/atomic_file.h"
#include "io/episode.h"
#include "io/npy.h"
#include "serve/protocol.h"
#include "serve/record.h"
#include "serve/session_frames.h"
#include "support/test_support.h"

using namespace dzr;
using namespace dzr::serve;
namespace fs = std::filesystem;

namespace {

std::string from_hex(std::string_view hex) {
    std::string out;
    for (size_t i = 0; i + 1 < hex.size(); i += 2)
        out.push_back(char(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
    return out;
}

/// A request as openpi_client packs one: str keys, arrays as {b"__ndarray__", b"data", b"dtype", b"shape"}.
struct Packed {
    msgpack::sbuffer sb;
    msgpack::packer<msgpack::sbuffer> pk{sb};

    void str(std::string_view s) {
        pk.pack_str(uint32_t(s.size()));
        pk.pack_str_body(s.data(), uint32_t(s.size()));
    }
    void bin(std::string_view s) {
        pk.pack_bin(uint32_t(s.size()));
        pk.pack_bin_body(s.data(), uint32_t(s.size()));
    }
    void array(std::string_view dtype, const std::vector<int64_t>& shape, std::string_view data) {
        pk.pack_map(4);
        bin("__ndarray__");
        pk.pack_true();
        bin("data");
        bin(data);
        bin("dtype");
        str(dtype);
        bin("shape");
        pk.pack_array(uint32_t(shape.size()));
        for (int64_t s : shape) pk.pack(s);
    }
    std::string bytes() const { return std::string(sb.data(), sb.size()); }
};

std::string f32_bytes(const std::vector<float>& v) {
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

constexpr int kH = 4, kW = 6;  // small frames (the limits say the resolution)

/// An infer request; `skip` leaves a key out, `frames` per camera, `joint` as given.
std::string infer_request(int frames, uint8_t fill, const std::string& skip = "",
                          const std::string& joint_dtype = "<f4", std::string joint = "") {
    if (joint.empty()) joint = f32_bytes({0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f, 0.7f});
    std::map<std::string, int> keys;
    Packed p;
    const int n = 7 - (skip.empty() ? 0 : 1);
    p.pk.pack_map(uint32_t(n));
    for (auto key : kCameraKeys) {
        if (key == skip) continue;
        p.str(key);
        std::vector<int64_t> shape = {kH, kW, 3};
        if (frames > 1) shape.insert(shape.begin(), frames);
        p.array("|u1", shape, std::string(size_t(frames) * kH * kW * 3, char(fill)));
    }
    if (skip != kJointKey) {
        p.str(kJointKey);
        p.array(joint_dtype, {7}, joint);
    }
    if (skip != kGripperKey) {
        p.str(kGripperKey);
        p.array("<f8", {1}, std::string("\0\0\0\0\0\0\xe0?", 8));  // 0.5
    }
    if (skip != "prompt") {
        p.str("prompt");
        p.str("pick up the cup");
    }
    if (skip != "endpoint") {
        p.str("endpoint");
        p.str("infer");
    }
    return p.bytes();
}

ProtocolLimits limits() {
    ProtocolLimits l;
    l.image_height = kH;
    l.image_width = kW;
    return l;
}

std::string decode_error(const std::string& message) {
    try {
        decode_request(message, limits());
    } catch (const ProtocolError& e) {
        return e.what();
    }
    return "";
}

}  // namespace

TEST_CASE("the server config is the bytes openpi_client's packer writes for the official config") {
    // msgpack_numpy.Packer().pack(dataclasses.asdict(PolicyServerConfig(image_resolution=(180, 320), ...)))
    const std::string python = from_hex(
        "86b0696d6167655f7265736f6c7574696f6e92ccb4cd0140b26e656564735f77726973745f63616d657261c3b26e5f657874"
        "65726e"
        "616c5f63616d6572617302b36e656564735f73746572656f5f63616d657261c2b06e656564735f73657373696f6e5f6964c3"
        "ac6163"
        "74696f6e5f7370616365ae6a6f696e745f706f736974696f6e");
    CHECK(encode_server_config(ServerConfig{}) == python);
}

TEST_CASE("an actions reply is the bytes msgpack_numpy writes for a float32 array") {
    // msgpack_numpy.Packer().pack(np.arange(6, dtype=np.float32).reshape(2, 3))
    const std::string python = from_hex(
        "84c40b5f5f6e6461727261795f5fc3c40464617461c418000000000000803f0000004000004040000080400000a040c40564"
        "7479"
        "7065a33c6634c4057368617065920203");
    CHECK(encode_float32_array(std::vector<float>{0, 1, 2, 3, 4, 5}, {2, 3}) == python);
}

TEST_CASE("a valid infer request decodes to its frames, state and prompt") {
    const std::string msg = infer_request(4, 9);
    const Request r = decode_request(msg, limits());
    CHECK(r.endpoint == Endpoint::Infer);
    for (const WireFrames& f : r.infer.cameras) {
        CHECK(f.frames == 4);
        CHECK(f.frame(3)[0] == 9);
    }
    CHECK(r.infer.joint_position[6] == double(0.7f));
    CHECK(r.infer.gripper_position == 0.5);
    CHECK(r.infer.prompt == "pick up the cup");
    CHECK_FALSE(r.infer.session_id.has_value());
    // big-endian float64 and float16 state arrays are read too
    std::string be(56, '\0');
    for (int i = 0; i < 7; ++i) {
        const double v = i + 0.25;
        uint64_t bits;
        std::memcpy(&bits, &v, 8);
        for (int b = 0; b < 8; ++b) be[size_t(i * 8 + b)] = char(bits >> (56 - 8 * b));
    }
    CHECK(decode_request(infer_request(1, 0, "", ">f8", be), limits()).infer.joint_position[3] == 3.25);
    const std::string half(reinterpret_cast<const char*>(std::vector<uint16_t>(7, 0x3c00).data()),
                           14);  // 1.0
    CHECK(decode_request(infer_request(1, 0, "", "<f2", half), limits()).infer.joint_position[0] == 1.0);
}

TEST_CASE("every malformed request is refused with a message naming the key") {
    CHECK(test::contains(decode_error(infer_request(1, 0, std::string(kCameraKeys[2]))),
                         "missing key 'observation/wrist_image_left'"));
    CHECK(test::contains(decode_error(infer_request(1, 0, std::string(kJointKey))),
                         "missing key 'observation/joint_position'"));
    CHECK(test::contains(decode_error(infer_request(1, 0, "prompt")), "missing key 'prompt'"));
    CHECK(test::contains(decode_error(infer_request(1, 0, "endpoint")), "missing key 'endpoint'"));
    CHECK(test::contains(decode_error(infer_request(1, 0, "", "<i8", std::string(56, '\0'))),
                         "expected a float array"));
    CHECK(test::contains(decode_error(infer_request(1, 0, "", "<f4", f32_bytes({1, 2, 3, 4, 5, 6, NAN}))),
                         "element 6 is nan"));
    CHECK(test::contains(decode_error(infer_request(1, 0, "", "<f4", f32_bytes({1, 2}))),
                         "needs 28 bytes, the data has 8"));
    CHECK(test::contains(decode_error("\xc1"), "not a msgpack message"));
    CHECK(test::contains(decode_error(infer_request(1, 0) + "x"), "1 bytes follow"));
    CHECK(test::contains(decode_error(infer_request(1, 0).substr(0, 50)), "not a msgpack message"));
    Packed deep;  // {"endpoint": [[[1]]]}: deeper than the protocol's three levels
    deep.pk.pack_map(1);
    deep.str("endpoint");
    deep.pk.pack_array(1);
    deep.pk.pack_array(1);
    deep.pk.pack_array(1);
    deep.pk.pack(1);
    CHECK(test::contains(decode_error(deep.bytes()), "nests deeper"));
    Packed unknown;
    unknown.pk.pack_map(1);
    unknown.str("endpoint");
    unknown.str("act");
    CHECK(test::contains(decode_error(unknown.bytes()), "unknown endpoint 'act'"));
    Packed reset;
    reset.pk.pack_map(1);
    reset.str("endpoint");
    reset.str("reset");
    CHECK(decode_request(reset.bytes(), limits()).endpoint == Endpoint::Reset);
    ProtocolLimits other = limits();
    other.image_width = kW + 1;
    CHECK_THROWS_WITH_AS(decode_request(infer_request(1, 0), other), doctest::Contains("got shape [4, 6, 3]"),
                         ProtocolError);
}

TEST_CASE("the frame accumulator picks the official server's frames") {
    // one frame per call (SERVER.py:127-149): [f0], [f0 f0 f0 f1], [f0 f0 f1 f2], [f0 f1 f2 f3], [f1 f2 f3 f4]
    std::vector<std::vector<uint8_t>> frames(5, std::vector<uint8_t>(size_t(kH * kW * 3)));
    for (size_t i = 0; i < frames.size(); ++i) frames[i].assign(frames[i].size(), uint8_t(10 + i));
    FrameAccumulator acc;
    std::vector<std::vector<uint8_t>> out;
    const std::vector<std::vector<int64_t>> expected = {
        {0}, {0, 0, 0, 1}, {0, 0, 1, 2}, {0, 1, 2, 3}, {1, 2, 3, 4}};
    for (size_t call = 0; call < frames.size(); ++call) {
        WireFrames w{frames[call].data(), 1, kH, kW};
        const std::array<WireFrames, kNumCameras> cams = {w, w, w};
        acc.append(cams);
        CHECK(acc.select(call == 0, out) == expected[call]);
        REQUIRE(out.size() == kNumCameras);
        for (size_t k = 0; k < expected[call].size(); ++k)
            CHECK(out[2][k * frames[0].size()] == uint8_t(10 + expected[call][k]));
    }
    // a stack of 4 on the first call: the first call uses the last; the next stack replaces all 4
    acc.clear();
    std::vector<uint8_t> stack;
    for (int i = 0; i < 8; ++i) stack.insert(stack.end(), size_t(kH * kW * 3), uint8_t(100 + i));
    const WireFrames a{stack.data(), 4, kH, kW}, b{stack.data() + 4 * kH * kW * 3, 4, kH, kW};
    acc.append(std::array<WireFrames, kNumCameras>{a, a, a});
    CHECK(acc.select(true, out) == std::vector<int64_t>{3});
    CHECK(out[0][0] == 103);
    acc.append(std::array<WireFrames, kNumCameras>{b, b, b});
    CHECK(acc.select(false, out) == std::vector<int64_t>{4, 5, 6, 7});
    CHECK(out[1][0] == 104);
}

TEST_CASE("a recorded session reads back with every call's frames and state where the schedule takes them") {
    test::TempDir tmp;
    RecordLayout layout;
    layout.cameras = {"exterior_image_1_left", "exterior_image_2_left", "wrist_image_left"};
    layout.height = kH;
    layout.width = kW;
    layout.state = {{"joint_position", 7}, {"gripper_position", 1}};
    const rollout::FrameSchedule schedule;
    SessionRecorder rec(tmp.path(), layout, schedule);
    rec.begin("a session/1", "a session/1");
    const size_t fb = size_t(kH * kW * 3);
    // three calls: 1 frame, then 4 and 4; frame value = 10 * call + slot, state[0] = call
    const auto call = [&](int c, int T, uint8_t first_value) {
        std::vector<std::vector<uint8_t>> views(3, std::vector<uint8_t>(size_t(T) * fb));
        for (auto& v : views)
            for (int s = 0; s < T; ++s)
                std::memset(v.data() + size_t(s) * fb, s == 0 ? first_value : 10 * c + s, fb);
        std::vector<std::span<const uint8_t>> spans(views.begin(), views.end());
        std::vector<double> state(8, 0.0);
        state[0] = c;
        std::vector<float> actions(24 * 8, float(c));
        rec.add_call(spans, T, state, "pick up the cup", true, actions);
    };
    call(0, 1, 0);
    call(1, 4, 0);  // its oldest frame equals call 0's frame (both go to frame 0)
    call(2, 4, 20);
    const auto r = rec.finish();
    REQUIRE(r.has_value());
    CHECK(r->dir.filename() == "a_session_1");
    CHECK(r->replay_exact);
    CHECK(r->frames == 48);  // the second chunk's anchor, 47, plus one

    io::EpisodeOptions eo;
    eo.log_warnings = false;
    const io::Episode ep = io::read_episode(r->dir, eo);
    REQUIRE(ep.num_frames == 48);
    const auto sched = schedule.calls(ep.num_frames);
    REQUIRE(sched.size() == 3);
    for (size_t c = 0; c < sched.size(); ++c) {
        for (size_t s = 0; s < sched[c].frames.size(); ++s) {
            const uint8_t want = s == 0 ? (c == 2 ? 20 : 0) : uint8_t(10 * c + s);
            CHECK(ep.cameras[2].frames.ptr<uint8_t>()[size_t(sched[c].frames[s]) * fb] == want);
        }
        CHECK(ep.state_at(sched[c].anchor)[0] == double(c));
    }
    CHECK(ep.prompt == "pick up the cup");
    CHECK(io::read_npy(r->dir / "served_actions.npy").shape() == std::vector<int64_t>{3, 24, 8});
    CHECK_FALSE(fs::exists(r->dir / ".spool-wrist_image_left"));

    // a second call whose oldest frame is not the first call's: both belong at frame 0, so no exact replay
    rec.begin("a session/1", "");
    call(0, 1, 0);
    call(1, 4, 99);
    const auto conflict = rec.finish();
    REQUIRE(conflict.has_value());
    CHECK(conflict->dir.filename() == "a_session_1-2");
    CHECK_FALSE(conflict->replay_exact);
    const auto json = nlohmann::json::parse(io::read_file(conflict->dir / "serve.json"));
    CHECK(json["replay_exact"] == false);
    CHECK(test::contains(json["problems"][0].get<std::string>(),
                         "differs from the frame an earlier call used"));
}
