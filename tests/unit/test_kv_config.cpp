// KvConfig parsing and validation, the window policy's fixed sizes, and memory sizing (DROID numbers).
#include <doctest/doctest.h>
#include <yaml-cpp/yaml.h>

#include <string>

#include "core/error.h"
#include "config/kv_config.h"
#include "kv/kv_sizing.h"
#include "config/model_config.h"

using namespace dzr;

namespace {

constexpr uint64_t kMiB = 1024ull * 1024ull;
constexpr uint64_t kGiB = 1024ull * kMiB;

KvConfig parse(const std::string& text) { return parse_kv_config(YAML::Load(text)); }

std::string error_of(const auto& fn) {
    try {
        fn();
    } catch (const Error& e) {
        return e.what();
    }
    return "<no error>";
}

KvGeometry droid() { return KvGeometry::from_model(ModelConfig{}, DType::BF16, 2); }

}  // namespace

TEST_CASE("kv config defaults are DreamZero's window of 9 frames reset at the boundary") {
    const KvConfig c;
    CHECK(c.window_frames == 9);
    CHECK(c.sink_frames == 0);
    CHECK(c.frames_per_block == 1);
    CHECK(c.reset_at_boundary);
    CHECK(c.memory_budget.kind == KvBudgetKind::Auto);
    CHECK_NOTHROW(c.validate(droid()));
}

TEST_CASE("kv geometry from the DROID model config has 880-token frames and 25 register tokens") {
    const KvGeometry g = droid();
    CHECK(g.num_layers == 40);
    CHECK(g.num_kv_heads == 40);
    CHECK(g.head_dim == 128);
    CHECK(g.tokens_per_frame == 880);
    CHECK(g.chunk_frames == 2);
    CHECK(g.prefill_frames == 1);
    CHECK(g.register_tokens == 25);
    CHECK(g.text_tokens == 512);
    CHECK(g.image_tokens == 257);
    CHECK(g.row_bytes() == 40u * 128u * 2u);
}

TEST_CASE("kv config reads every key of a kv: section") {
    const KvConfig c = parse(
        "window_frames: 6\nsink_frames: 2\nframes_per_block: 2\nmemory_budget: 12.5GiB\nreset_at_boundary: false\n");
    CHECK(c.window_frames == 6);
    CHECK(c.sink_frames == 2);
    CHECK(c.frames_per_block == 2);
    CHECK_FALSE(c.reset_at_boundary);
    CHECK(c.memory_budget.kind == KvBudgetKind::Bytes);
    CHECK(c.memory_budget.bytes == 12 * kGiB + kGiB / 2);
}

TEST_CASE("kv config keeps defaults for absent keys and for an empty section") {
    const KvConfig a = parse("window_frames: 11\n");
    CHECK(a.window_frames == 11);
    CHECK(a.sink_frames == 0);
    CHECK(a.reset_at_boundary);
    const KvConfig b = parse_kv_config(YAML::Node());
    CHECK(b.window_frames == 9);
}

TEST_CASE("kv memory budget accepts auto, byte counts with units and fractions of free memory") {
    CHECK(parse_kv_budget("auto").kind == KvBudgetKind::Auto);
    CHECK(parse_kv_budget(" AUTO ").kind == KvBudgetKind::Auto);
    CHECK(parse_kv_budget("13421772800").bytes == 13421772800ull);
    CHECK(parse_kv_budget("800 MiB").bytes == 800 * kMiB);
    CHECK(parse_kv_budget("2GB").bytes == 2000000000ull);
    CHECK(parse_kv_budget("512B").bytes == 512);
    const KvBudget pct = parse_kv_budget("40%");
    CHECK(pct.kind == KvBudgetKind::Fraction);
    CHECK(pct.fraction == doctest::Approx(0.4));
    const KvBudget dec = parse_kv_budget("0.25");
    CHECK(dec.kind == KvBudgetKind::Fraction);
    CHECK(dec.fraction == doctest::Approx(0.25));
}

TEST_CASE("kv memory budget rejects text that is not a size") {
    for (const char* bad : {"", "lots", "12 parsecs", "-5GiB", "0", "150%", "1.5", "GiB", "0%", "nan"})
        CHECK_THROWS_WITH_AS(parse_kv_budget(bad), doctest::Contains("kv.memory_budget"), Error);
    CHECK(error_of([] { parse_kv_budget("lots"); }).find("'lots'") != std::string::npos);
}

TEST_CASE("kv config rejects unknown keys, wrong types and a non-map section") {
    CHECK_THROWS_WITH_AS(parse("window: 9\n"), doctest::Contains("kv.window: unknown key"), Error);
    CHECK_THROWS_WITH_AS(parse("window_frames: nine\n"), doctest::Contains("kv.window_frames: cannot read 'nine'"),
                         Error);
    CHECK_THROWS_WITH_AS(parse("reset_at_boundary: maybe\n"), doctest::Contains("true/false"), Error);
    CHECK_THROWS_WITH_AS(parse("window_frames: [1, 2]\n"), doctest::Contains("kv.window_frames"), Error);
    CHECK_THROWS_WITH_AS(parse("memory_budget: {a: 1}\n"), doctest::Contains("kv.memory_budget"), Error);
    CHECK_THROWS_WITH_AS(parse("- 1\n- 2\n"), doctest::Contains("expected a map"), Error);
    CHECK_THROWS_WITH_AS(parse("memory_budget: huge\n"), doctest::Contains("'huge'"), Error);
}

TEST_CASE("kv config validation names the key and the rule it breaks") {
    const KvGeometry g = droid();
    auto with = [](auto edit) {
        KvConfig c;
        edit(c);
        return c;
    };
    CHECK_THROWS_WITH_AS(with([](KvConfig& c) { c.window_frames = 0; }).validate(g),
                         doctest::Contains("kv.window_frames: must lie in [1, 1024], got 0"), Error);
    CHECK_THROWS_WITH_AS(with([](KvConfig& c) { c.frames_per_block = 0; }).validate(g),
                         doctest::Contains("kv.frames_per_block"), Error);
    CHECK_THROWS_WITH_AS(with([](KvConfig& c) {
                             c.reset_at_boundary = false;
                             c.sink_frames = 9;
                         }).validate(g),
                         doctest::Contains("kv.sink_frames"), Error);
    CHECK_THROWS_WITH_AS(with([](KvConfig& c) { c.sink_frames = -1; }).validate(g),
                         doctest::Contains("kv.sink_frames"), Error);
    // a sink needs sliding eviction
    CHECK_THROWS_WITH_AS(with([](KvConfig& c) { c.sink_frames = 1; }).validate(g),
                         doctest::Contains("reset_at_boundary: false"), Error);
    // window 2 leaves no room for the 1-frame prefill plus a 2-frame chunk
    CHECK_THROWS_WITH_AS(with([](KvConfig& c) { c.window_frames = 2; }).validate(g),
                         doctest::Contains("kv.window_frames"), Error);
    CHECK_NOTHROW(with([](KvConfig& c) { c.window_frames = 3; }).validate(g));
    // sliding eviction needs whole blocks: the 1-frame prefill does not fill a 2-frame block
    CHECK_THROWS_WITH_AS(with([](KvConfig& c) {
                             c.reset_at_boundary = false;
                             c.frames_per_block = 2;
                             c.window_frames = 8;
                         }).validate(g),
                         doctest::Contains("prefill frames"), Error);
    KvGeometry bad = g;
    bad.tokens_per_frame = 0;
    CHECK_THROWS_WITH_AS(KvConfig{}.validate(bad), doctest::Contains("tokens_per_frame"), Error);
}

TEST_CASE("kv limits at DROID geometry: 7 blocks per branch, a 7-wide table and 1785 scratch rows") {
    const KvLimits l = kv_limits(droid(), KvConfig{});
    CHECK(l.block_tokens == 880);
    CHECK(l.max_committed_tokens == 7 * 880);  // the KV length cycle 880/2640/4400/6160, then reset
    CHECK(l.max_blocks_per_branch == 7);
    CHECK(l.table_width == 7);
    CHECK(l.max_history_tokens == 6160);
    CHECK(l.scratch_tokens == 1760 + 25);
}

TEST_CASE("kv.in_place reads auto, true and false, and lanes hold the longest history plus one forward's rows") {
    CHECK(KvConfig{}.in_place == KvInPlace::Auto);
    CHECK(parse("in_place: true").in_place == KvInPlace::On);
    CHECK(parse("in_place: false").in_place == KvInPlace::Off);
    CHECK(parse("in_place: auto").in_place == KvInPlace::Auto);
    CHECK(parse("in_place: off").in_place == KvInPlace::Off);
    CHECK_THROWS_WITH_AS(parse("in_place: sometimes"), doctest::Contains("kv.in_place: expected auto, true or false"),
                         Error);
    CHECK_THROWS_WITH_AS(parse("in_place: [1]"), doctest::Contains("kv.in_place"), Error);

    KvGeometry g = droid();
    CHECK(kv_limits(g, KvConfig{}).lane_blocks == 0);
    CHECK_FALSE(kv_limits(g, KvConfig{}).mirrored());
    g.lanes = true;
    // DROID, two branches (mirrored): lanes of 7 blocks (the longest history with a commit's blocks), a middle of the
    // two branches' 1785 current rows (4 blocks of 880 and 50 rows, which shift branch 1's lane), one tail id
    const KvLimits l = kv_limits(g, KvConfig{});
    CHECK(l.mirrored());
    CHECK(l.lane_blocks == 7);
    CHECK(l.middle_blocks == 4);
    CHECK(l.shift_rows == 50);
    CHECK(l.lane_ids == 19);
    CHECK(kv_session_bytes(g, KvConfig{}) - kv_session_bytes(droid(), KvConfig{}) == 5 * 880 * g.token_bytes());
    // one branch (CFG across two devices): one lane of 7 frames of history + 2 frames + 25 register rows = 7945 rows
    // = 9.03 blocks of 880 -> 10
    KvGeometry one = KvGeometry::from_model(ModelConfig{}, DType::BF16, 1);
    one.lanes = true;
    const KvLimits l1 = kv_limits(one, KvConfig{});
    CHECK_FALSE(l1.mirrored());
    CHECK(l1.lane_blocks == 10);
    CHECK(l1.lane_ids == 10);
    // docs/KV_CACHE.md's "Other settings" rows
    CHECK(kv_session_bytes(g, KvConfig{}) == 15'540'428'800ull);
    CHECK(kv_session_bytes(one, KvConfig{}) == 8'596'377'600ull);
    // three branches on one device: no lanes
    KvGeometry three = KvGeometry::from_model(ModelConfig{}, DType::BF16, 3);
    three.lanes = true;
    CHECK_THROWS_WITH_AS(kv_limits(three, KvConfig{}), doctest::Contains("one or two CFG branches"), Error);
    // sliding eviction moves the history's first block: no lanes
    KvConfig slide;
    slide.reset_at_boundary = false;
    CHECK_THROWS_WITH_AS(kv_limits(g, slide), doctest::Contains("kv.in_place"), Error);

    // auto: lanes where the attention reads them in place (a GPU in fast numerics) with a bf16 pool
    KvConfig c;
    const KvGeometry bf16 = droid();
    CHECK(resolve_kv_lanes(c, bf16, true));
    CHECK_FALSE(resolve_kv_lanes(c, bf16, false));
    KvGeometry fp8 = droid();
    fp8.fp8_pool = fp8.fp8_cross = true;
    CHECK_FALSE(resolve_kv_lanes(c, fp8, true));
    CHECK_FALSE(resolve_kv_lanes(slide, bf16, true));
    CHECK_FALSE(resolve_kv_lanes(c, KvGeometry::from_model(ModelConfig{}, DType::BF16, 3), true));
    c.in_place = KvInPlace::Off;
    CHECK_FALSE(resolve_kv_lanes(c, bf16, true));
    // true: wherever they can hold, an error naming the key where they cannot
    c.in_place = KvInPlace::On;
    CHECK(resolve_kv_lanes(c, bf16, false));
    CHECK_THROWS_WITH_AS(resolve_kv_lanes(c, fp8, true), doctest::Contains("kv.in_place: true needs a bf16 pool"),
                         Error);
    slide.in_place = KvInPlace::On;
    CHECK_THROWS_WITH_AS(resolve_kv_lanes(slide, bf16, true), doctest::Contains("kv.reset_at_boundary"), Error);
}

TEST_CASE("kv limits with sliding eviction hold sink plus window blocks") {
    KvConfig c;
    c.reset_at_boundary = false;
    c.sink_frames = 1;
    c.window_frames = 9;
    const KvLimits l = kv_limits(droid(), c);
    CHECK(l.sink_blocks == 1);
    CHECK(l.max_blocks_per_branch == 10);
    // a 1-frame forward sees sink + window - 1 frames of history
    CHECK(l.table_width == 9);
    CHECK(l.max_history_tokens == 9 * 880);
}

TEST_CASE("kv limits refuse an invalid config instead of dividing by zero") {
    KvConfig c;
    c.frames_per_block = 0;
    CHECK_THROWS_WITH_AS(kv_limits(droid(), c), doctest::Contains("kv.frames_per_block"), Error);
    CHECK_THROWS_AS(kv_session_bytes(droid(), c), Error);
}

TEST_CASE("kv limits count partial blocks when a block holds two frames") {
    KvConfig c;
    c.frames_per_block = 2;
    const KvLimits l = kv_limits(droid(), c);
    CHECK(l.block_tokens == 1760);
    CHECK(l.max_blocks_per_branch == 4);  // 7 frames = 3.5 blocks
    CHECK(l.table_width == 4);
}

TEST_CASE("kv sizing at DROID geometry in bf16 fits one session with both CFG branches in 12.5 GiB") {
    const KvGeometry g = droid();
    const KvConfig c;
    const size_t session = kv_session_bytes(g, c);
    const KvMemoryPlan p = plan_kv_memory(g, c, session);
    // one block: 880 tokens x (K, V) x 40 heads x 128 x 2 bytes x 40 layers
    CHECK(p.block_bytes == 880ull * 2 * 40 * 128 * 2 * 40);
    CHECK(p.block_bytes == 720896000ull);  // 687.5 MiB
    CHECK(format_bytes(p.block_bytes) == "687.5 MiB");
    CHECK(p.blocks_per_branch == 7);
    CHECK(p.session_blocks == 14);
    CHECK(p.num_blocks == 14);
    // cross caches: (512 text tokens x 2 branches + 257 image tokens, shared) x (K, V) x 5120 x 2 bytes x 40 layers
    CHECK(p.cross_bytes == (512ull * 2 + 257) * 2 * 5120 * 2 * 40);
    CHECK(p.cross_bytes == 1049395200ull);
    // scratch: 1785 rows x (K, V) x 5120 x 2 bytes x 2 branches, one layer at a time
    CHECK(p.scratch_bytes == 1785ull * 2 * 5120 * 2 * 2);
    CHECK(p.scratch_bytes == 73113600ull);
    // 14 blocks + the null block + cross + scratch
    CHECK(p.session_bytes == 15ull * 720896000ull + 1049395200ull + 73113600ull);
    CHECK(p.session_bytes == 11935948800ull);
    CHECK(p.total_bytes == p.session_bytes);
    CHECK(p.session_bytes <= 12 * kGiB + kGiB / 2);
    // the self-attention part alone (blocks, null block, scratch)
    CHECK(p.pool_bytes + p.scratch_bytes == 10886553600ull);
    MESSAGE("DROID bf16, one session, 2 CFG branches: " << p.summary());
    // vllm-omni's floor for the same session: 2 * (9 + 2) + 2 = 24 blocks
    CHECK(24ull * p.block_bytes == 17301504000ull);
    CHECK(24ull * p.block_bytes > p.session_bytes);
}

TEST_CASE("kv sizing pays cross caches and scratch first and spends the rest on whole blocks") {
    const KvGeometry g = droid();
    const KvConfig c;
    const size_t session = kv_session_bytes(g, c);
    const KvMemoryPlan p = plan_kv_memory(g, c, session + 3 * 720896000ull + 100);
    CHECK(p.num_blocks == 17);
    CHECK(p.total_bytes == session + 3 * 720896000ull);
    CHECK(p.budget_bytes - p.total_bytes == 100);
}

TEST_CASE("kv sizing for one CFG-parallel branch halves blocks, text caches and scratch, and keeps its own image cache") {
    const KvGeometry g = KvGeometry::from_model(ModelConfig{}, DType::BF16, 1);
    const KvMemoryPlan p = plan_kv_memory(g, KvConfig{}, kv_session_bytes(g, KvConfig{}));
    CHECK(p.session_blocks == 7);
    CHECK(p.session_bytes == 8ull * 720896000ull + 1259929600ull / 2 + 73113600ull / 2);
}

TEST_CASE("kv sizing fails with the bytes one session needs and the budget available") {
    const KvGeometry g = droid();
    const KvConfig c;
    const size_t session = kv_session_bytes(g, c);
    const std::string msg = error_of([&] { plan_kv_memory(g, c, session - 1); });
    CHECK(msg.find("11935948800") != std::string::npos);
    CHECK(msg.find(std::to_string(session - 1)) != std::string::npos);
    CHECK(msg.find("budget") != std::string::npos);
    // a budget that covers the cross caches and scratch but no blocks
    CHECK_THROWS_AS(plan_kv_memory(g, c, 1049395200ull + 73113600ull), Error);
}

TEST_CASE("kv budget resolves auto to one session and fractions against free memory") {
    const KvGeometry g = droid();
    KvConfig c;
    const size_t session = kv_session_bytes(g, c);
    CHECK(resolve_kv_budget(g, c, 0) == session);
    CHECK(resolve_kv_budget(g, c, 100 * kGiB) == session);
    CHECK_THROWS_WITH_AS(resolve_kv_budget(g, c, 4 * kGiB), doctest::Contains("free memory"), Error);
    c.memory_budget = parse_kv_budget("25%");
    CHECK(resolve_kv_budget(g, c, 100 * kGiB) == 25 * kGiB);
    CHECK_THROWS_WITH_AS(resolve_kv_budget(g, c, 0), doctest::Contains("unknown"), Error);
    c.memory_budget = parse_kv_budget("20GiB");
    CHECK(resolve_kv_budget(g, c, 0) == 20 * kGiB);
    CHECK_THROWS_AS(resolve_kv_budget(g, c, 16 * kGiB), Error);
}

TEST_CASE("format_bytes prints binary units with at most two decimals") {
    CHECK(format_bytes(512) == "512 B");
    CHECK(format_bytes(1024) == "1 KiB");
    CHECK(format_bytes(1536) == "1.5 KiB");
    CHECK(format_bytes(12146483200ull) == "11.31 GiB");
}
