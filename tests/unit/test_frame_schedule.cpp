#include <doctest/doctest.h>

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "rollout/frame_schedule.h"

using namespace dzr;
using namespace dzr::rollout;

namespace {

using Frames = std::vector<int64_t>;

/// The official client's loop (test_client_AR.py build_frame_schedule), written out directly:
/// anchors start at 23 and advance by 24; indices below 0 clamp to 0; stop at the first chunk whose
/// last index is past the video.
std::vector<Frames> client_chunks(int64_t total, int64_t num_chunks) {
    std::vector<Frames> chunks;
    int64_t current = 23;
    for (int64_t i = 0; i < num_chunks; ++i) {
        Frames idx;
        for (int64_t off : {-23, -16, -8, 0}) idx.push_back(std::max<int64_t>(current + off, 0));
        if (idx.back() >= total) break;
        chunks.push_back(idx);
        current += 24;
    }
    return chunks;
}

}  // namespace

TEST_CASE("frame schedule of a 419-frame DROID episode is frame 0 then 17 four-frame calls") {
    const FrameSchedule s;
    const auto calls = s.calls(419);
    REQUIRE(calls.size() == 18);
    CHECK(s.num_calls(419) == 18);
    CHECK(calls[0].first());
    CHECK(calls[0].frames == Frames{0});
    CHECK(calls[0].anchor == 0);
    CHECK(calls[1].frames == Frames{0, 7, 15, 23});
    CHECK(calls[1].anchor == 23);
    CHECK(calls[2].frames == Frames{24, 31, 39, 47});
    CHECK(calls[2].anchor == 47);
    CHECK(calls[3].frames == Frames{48, 55, 63, 71});
    CHECK(calls[17].frames == Frames{384, 391, 399, 407});
    CHECK(calls[17].anchor == 407);
    for (size_t i = 0; i < calls.size(); ++i) CHECK(calls[i].index == int64_t(i));
}

TEST_CASE("frame schedule matches the official client's loop for every episode length") {
    const FrameSchedule s;
    for (int64_t total = 1; total <= 300; ++total) {
        const auto calls = s.calls(total);
        const auto expected = client_chunks(total, 1000);
        REQUIRE(calls.size() == expected.size() + 1);
        CHECK(s.num_calls(total) == int64_t(calls.size()));
        for (size_t i = 0; i < expected.size(); ++i) CHECK(calls[i + 1].frames == expected[i]);
    }
    CHECK(s.num_calls(0) == 0);
    CHECK(s.calls(0).empty());
    // 23 frames hold only the first call; frame 23 completes the first chunk.
    CHECK(s.num_calls(23) == 1);
    CHECK(s.num_calls(24) == 2);
    CHECK(s.num_calls(47) == 2);
    CHECK(s.num_calls(48) == 3);
    CHECK(s.min_frames() == 24);
}

TEST_CASE("frame schedule honours max chunks as the client's num_chunks") {
    FrameScheduleConfig c;
    c.max_chunks = 15;  // the client's default
    const FrameSchedule s(c);
    CHECK(s.num_calls(419) == 16);
    const auto calls = s.calls(419);
    REQUIRE(calls.size() == 16);
    const auto expected = client_chunks(419, 15);
    for (size_t i = 0; i < expected.size(); ++i) CHECK(calls[i + 1].frames == expected[i]);
    c.max_chunks = 0;
    const FrameSchedule first_only(c);
    CHECK(first_only.num_calls(419) == 1);
    CHECK(first_only.min_frames() == 1);
}

TEST_CASE("frame schedule with a start frame clamps early offsets to it") {
    FrameScheduleConfig c;
    c.start_frame = 10;
    const FrameSchedule s(c);
    const auto calls = s.calls(100);
    REQUIRE(calls.size() == 4);  // anchors 33, 57, 81 fit in 100 frames; 105 does not
    CHECK(calls[0].frames == Frames{10});
    CHECK(calls[0].anchor == 10);
    CHECK(calls[1].frames == Frames{10, 17, 25, 33});
    CHECK(calls[3].frames == Frames{58, 65, 73, 81});
    CHECK(s.num_calls(100) == 4);
    CHECK(s.num_calls(10) == 0);
    CHECK(s.num_calls(11) == 1);
    CHECK(s.min_frames() == 34);
}

TEST_CASE("frame schedule takes other strides, offsets and first anchors") {
    FrameScheduleConfig c;
    c.first_anchor = 8;
    c.stride = 8;
    c.offsets = {-6, -3, 0};
    const FrameSchedule s(c);
    const auto calls = s.calls(30);
    // anchors 8, 16, 24 (32 is past 30 frames)
    REQUIRE(calls.size() == 4);
    CHECK(calls[1].frames == Frames{2, 5, 8});
    CHECK(calls[3].frames == Frames{18, 21, 24});
    CHECK(s.num_calls(30) == 4);
    CHECK(s.num_calls(25) == 4);
    CHECK(s.num_calls(24) == 3);

    // A positive offset looks past the anchor: that frame must exist too.
    c.offsets = {-2, 0, 2};
    const FrameSchedule ahead(c);
    CHECK(ahead.calls(11).size() == 2);  // anchor 8 needs frame 10
    CHECK(ahead.calls(10).size() == 1);
    CHECK(ahead.num_calls(10) == 1);
    CHECK(ahead.min_frames() == 11);
    // Closed form and the explicit list agree everywhere.
    for (int64_t t = 0; t < 120; ++t) CHECK(ahead.num_calls(t) == int64_t(ahead.calls(t).size()));
}

TEST_CASE("frame schedule rejects invalid settings") {
    auto make = [](auto edit) {
        FrameScheduleConfig c;
        edit(c);
        return FrameSchedule(c);
    };
    CHECK_THROWS_WITH_AS(make([](auto& c) { c.stride = 0; }), doctest::Contains("stride must be positive"), Error);
    CHECK_THROWS_WITH_AS(make([](auto& c) { c.offsets = {}; }), doctest::Contains("at least one"), Error);
    CHECK_THROWS_WITH_AS(make([](auto& c) { c.offsets = {0, -8}; }), doctest::Contains("strictly increasing"), Error);
    CHECK_THROWS_WITH_AS(make([](auto& c) { c.start_frame = -1; }), doctest::Contains("start frame"), Error);
    CHECK_THROWS_WITH_AS(make([](auto& c) { c.first_anchor = -1; }), doctest::Contains("first anchor"), Error);
    CHECK_THROWS_WITH_AS(make([](auto& c) { c.max_chunks = -2; }), doctest::Contains("max chunks"), Error);
}

TEST_CASE("frame schedule describes itself") {
    CHECK(FrameSchedule().describe() == "frame [0]; then [a-23, a-16, a-8, a+0] for a = 23, 47, ... (stride 24)");
}
