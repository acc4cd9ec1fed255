// Block tables, sessions and cross caches: the allocate -> slot mapping -> write -> attend -> commit protocol,
// window policies, failure handling, resets and leak checks (the paged-kv-design.md §5 checklist).
#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "kv/kv_cache_manager.h"
#include "support/test_support.h"
#include "config/model_config.h"

using namespace dzr;

namespace {

constexpr int kPos = KvSession::kPositive;
constexpr int kNeg = KvSession::kNegative;

/// 2 layers, 2 heads of 4, 3 tokens per frame, DreamZero's frame counts (prefill 1, chunk 2, 2 register).
KvGeometry tiny(int branches = 2) {
    KvGeometry g;
    g.num_layers = 2;
    g.num_kv_heads = 2;
    g.head_dim = 4;
    g.tokens_per_frame = 3;
    g.chunk_frames = 2;
    g.prefill_frames = 1;
    g.register_tokens = 2;
    g.text_tokens = 5;
    g.image_tokens = 4;
    g.num_branches = branches;
    g.dtype = DType::F32;
    return g;
}

KvConfig sliding(int sink, int window) {
    KvConfig c;
    c.reset_at_boundary = false;
    c.sink_frames = sink;
    c.window_frames = window;
    return c;
}

size_t session_budget(const KvGeometry& g, const KvConfig& c) { return kv_session_bytes(g, c); }

/// One DreamZero call on every branch: a committing forward (prefill or commit), then `steps` denoise forwards.
void run_call(KvSession& s, bool prefill, int steps = 2) {
    const KvGeometry& g = s.geometry();
    for (int b = 0; b < s.num_branches(); ++b) {
        s.begin_forward(b, prefill ? KvForwardSpec::prefill(g) : KvForwardSpec::commit_chunk(g));
        s.commit(b);
    }
    for (int i = 0; i < steps; ++i) {
        for (int b = 0; b < s.num_branches(); ++b) {
            s.begin_forward(b, KvForwardSpec::denoise(g));
            s.commit(b);
        }
    }
}

std::vector<float> iota_values(size_t n, float start) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = start + float(i);
    return v;
}

}  // namespace

TEST_CASE("a DreamZero cycle reads 1, 3, 5, 7 frames of history and the window reset returns every block") {
    const KvGeometry g = tiny();
    const KvConfig c;
    KvCacheManager m(g, c, session_budget(g, c));
    CHECK(m.pool().num_blocks() == 14);  // 7 per branch
    auto s = m.open_session("episode");
    const int64_t tpf = g.tokens_per_frame;
    // csf at denoise time per call, and the blocks each branch holds after the call
    const int expect_csf[] = {1, 3, 5, 7};
    int call = 0;
    for (int csf : expect_csf) {
        const bool prefill = call == 0;
        const KvForwardSpec spec = prefill ? KvForwardSpec::prefill(g) : KvForwardSpec::commit_chunk(g);
        for (int b : {kPos, kNeg}) {
            s->begin_forward(b, spec);
            const BlockTable& t = s->table(b);
            // a committing forward sees the history before it: 0 (prefill) or csf - 2 frames
            CHECK(t.seq_len() == (prefill ? 0 : (csf - 2) * tpf));
            CHECK(t.num_tokens() == t.seq_len());  // nothing committed yet
            s->commit(b);
            CHECK(t.num_tokens() == csf * tpf);
        }
        for (int b : {kPos, kNeg}) {
            s->begin_forward(b, KvForwardSpec::denoise(g));
            const BlockTable& t = s->table(b);
            CHECK(t.seq_len() == csf * tpf);  // KV length = csf * frame tokens (reference §1.5)
            CHECK(t.num_table_blocks() == csf);
            CHECK(t.padded_table().size() == 7);
            CHECK(t.pending_blocks().empty());
            s->commit(b);
            CHECK(t.num_tokens() == csf * tpf);  // denoise commits nothing
        }
        CHECK(m.pool().num_free() == 14 - 2 * csf);
        ++call;
    }
    // call 5: csf = 9 >= local_attn_size -> window reset, then prefill again
    s->reset_window();
    CHECK(m.pool().num_free() == 14);
    run_call(*s, true);
    CHECK(s->table(kPos).num_tokens() == tpf);
    CHECK(m.pool().num_free() == 12);
}

TEST_CASE("the same DreamZero rollout at DROID geometry cycles the free count 12, 8, 4, 0 of 14 blocks") {
    const KvGeometry g = KvGeometry::from_model(ModelConfig{}, DType::BF16, 2);
    const KvConfig c;
    KvCacheManager m(g, c, kv_session_bytes(g, c));  // bookkeeping only: no 10 GiB allocation
    auto s = m.open_session("droid");
    std::vector<int> free_after;
    for (int window = 0; window < 3; ++window) {
        if (window > 0) s->reset_window();
        for (int call = 0; call < 4; ++call) {
            run_call(*s, call == 0, 8);
            free_after.push_back(m.pool().num_free());
        }
    }
    CHECK(free_after == std::vector<int>{12, 8, 4, 0, 12, 8, 4, 0, 12, 8, 4, 0});
    s->close();
    CHECK(m.pool().num_free() == 14);
}

TEST_CASE("mirrored lanes keep both branches' history and current rows in consecutive slots over DreamZero's cycle") {
    KvGeometry g = KvGeometry::from_model(ModelConfig{}, DType::BF16, 2);
    g.lanes = true;
    const KvConfig c;
    KvCacheManager m(g, c, kv_session_bytes(g, c));  // bookkeeping only
    // [null | branch 0: ids 1..7 | middle: 8..11 | branch 1: 12..18 | tail 19]; the middle and the tail reserved
    REQUIRE(m.limits().lane_blocks == 7);
    REQUIRE(m.limits().middle_blocks == 4);
    REQUIRE(m.limits().shift_rows == 2 * 1785 - 4 * 880);
    CHECK(m.pool().num_ids() == 19);
    CHECK(m.pool().num_blocks() == 14);
    CHECK(m.row_shift(0) == 0);
    CHECK(m.row_shift(1) == 50);
    auto s = m.open_session("lanes");
    const int64_t bs = 880, middle = 8 * bs;
    std::vector<int64_t> history_seen;
    for (int window = 0; window < 2; ++window) {
        if (window > 0) s->reset_window();
        for (int call = 0; call < 4; ++call) {
            for (int b = 0; b < 2; ++b) {
                // the committing forward: its rows at their slots, next to the history in the branch's lane
                s->begin_forward(b, call == 0 ? KvForwardSpec::prefill(g) : KvForwardSpec::commit_chunk(g));
                const BlockTable& t = s->table(b);
                const BlockTable::InPlace at = t.in_place();
                REQUIRE(at.current >= 0);
                for (size_t i = 0; i < t.slot_mapping().size(); ++i)
                    CHECK(t.slot_mapping()[i] == at.current + int64_t(i));
                s->commit(b);
            }
            for (int b = 0; b < 2; ++b) {
                s->begin_forward(b, KvForwardSpec::denoise(g));
                const BlockTable& t = s->table(b);
                const BlockTable::InPlace at = t.in_place();
                const int64_t n = int64_t(t.resident().size());
                std::vector<BlockId> ids = t.resident();
                std::sort(ids.begin(), ids.end());
                if (b == 0) {
                    // branch 0: its history in runs growing down from id 7, its 1785 current rows at the middle's start
                    CHECK(t.lane_descending());
                    CHECK(ids.front() == 8 - n);
                    CHECK(ids.back() == 7);
                    CHECK(at.first == (8 - n) * bs);
                    CHECK(at.current == middle);
                    history_seen.push_back(t.seq_len());
                } else {
                    // branch 1: its current rows end where its lane (id 12, its slots shifted 50 rows) begins, right
                    // after branch 0's in the middle
                    CHECK(ids.front() == 12);
                    CHECK(ids.back() == 11 + n);
                    CHECK(at.first == 12 * bs - 1785);
                    CHECK(at.current == at.first);
                    CHECK(at.current + m.row_shift(1) == middle + 1785);
                }
                s->commit(b);
            }
        }
    }
    CHECK(history_seen == std::vector<int64_t>{880, 2640, 4400, 6160, 880, 2640, 4400, 6160});
    s->close();
    CHECK(m.pool().num_free() == 14);
    // the reserved ids are never handed out or freed
    CHECK(m.pool().owner_of(8) != 0);
    CHECK_THROWS_WITH_AS(m.pool().free(8, 1), doctest::Contains("reserved"), Error);
}

TEST_CASE("a one-branch lane whose room another owner holds, or a table without lanes, is not read in place") {
    KvGeometry g = KvGeometry::from_model(ModelConfig{}, DType::BF16, 1);
    const KvConfig c;
    {
        KvCacheManager m(g, c, kv_session_bytes(g, c));
        auto s = m.open_session("fifo");
        s->begin_forward(kPos, KvForwardSpec::prefill(g));
        CHECK(s->table(kPos).in_place().first == -1);
        CHECK(s->table(kPos).lane_first() == kNullBlockId);
        s->commit(kPos);
    }
    g.lanes = true;
    KvCacheManager m(g, c, kv_session_bytes(g, c));
    REQUIRE(m.limits().lane_blocks == 10);  // 7 frames of history + 1785 current rows
    CHECK(m.pool().num_blocks() == 10);
    auto s = m.open_session("taken");
    s->begin_forward(kPos, KvForwardSpec::prefill(g));
    s->commit(kPos);
    s->begin_forward(kPos, KvForwardSpec::denoise(g));
    CHECK(s->table(kPos).in_place().first == 880);
    CHECK(s->table(kPos).in_place().current == 2 * 880);
    s->commit(kPos);
    // block 3 (lane rows 1760..2639: the denoising forward's rows after the 880-row history) taken by someone else
    std::vector<BlockId> stolen;
    const uint32_t other = m.pool().new_owner();
    REQUIRE(m.pool().allocate_run(3, 1, other, stolen));
    s->begin_forward(kPos, KvForwardSpec::denoise(g));
    CHECK(s->table(kPos).in_place().first == -1);
    s->commit(kPos);
    // a commit whose lane run is taken falls back to the free queue: its history is no longer consecutive
    s->begin_forward(kPos, KvForwardSpec::commit_chunk(g));
    CHECK(s->table(kPos).pending_blocks().size() == 2);
    CHECK(s->table(kPos).in_place().first == -1);
    s->commit(kPos);
    m.pool().free(3, other);
    s->close();
    CHECK(m.pool().num_free() == 10);
}

TEST_CASE("a mirrored lane whose next run is taken falls back to the free queue and is not read in place") {
    KvGeometry g = KvGeometry::from_model(ModelConfig{}, DType::BF16, 2);
    g.lanes = true;
    const KvConfig c;
    KvCacheManager m(g, c, kv_session_bytes(g, c));
    auto s = m.open_session("taken");
    s->begin_forward(kPos, KvForwardSpec::prefill(g));
    CHECK(s->table(kPos).pending_blocks() == std::vector<BlockId>{7});
    s->commit(kPos);
    std::vector<BlockId> stolen;
    const uint32_t other = m.pool().new_owner();
    REQUIRE(m.pool().allocate_run(6, 1, other, stolen));  // where branch 0's first commit run (5, 6) would go
    s->begin_forward(kPos, KvForwardSpec::commit_chunk(g));
    CHECK(s->table(kPos).pending_blocks() != std::vector<BlockId>{5, 6});
    CHECK(s->table(kPos).in_place().first == -1);
    s->commit(kPos);
    s->begin_forward(kPos, KvForwardSpec::denoise(g));
    CHECK(s->table(kPos).in_place().first == -1);
    s->commit(kPos);
    m.pool().free(6, other);
    s->close();
    CHECK(m.pool().num_free() == 14);
}

TEST_CASE("slot mapping sends each video token to its block and offset and register tokens nowhere") {
    const KvGeometry g = tiny();
    KvConfig c;
    KvCacheManager m(g, c, session_budget(g, c));
    auto s = m.open_session("slots");
    run_call(*s, true);
    s->begin_forward(kPos, KvForwardSpec::commit_chunk(g));
    const BlockTable& t = s->table(kPos);
    const int64_t bs = t.block_tokens();
    REQUIRE(t.pending_blocks().size() == 2);
    const std::vector<int64_t>& slots = t.slot_mapping();
    REQUIRE(slots.size() == 6);
    for (int64_t i = 0; i < 6; ++i) {
        const BlockId block = t.pending_blocks()[size_t(i / bs)];
        CHECK(slots[size_t(i)] == block * bs + i % bs);
    }
    s->commit(kPos);
    s->begin_forward(kPos, KvForwardSpec::denoise(g));
    CHECK(t.slot_mapping().size() == 6 + 2);
    for (int64_t slot : t.slot_mapping()) CHECK(slot == kPadSlot);
    s->commit(kPos);
}

TEST_CASE("two-frame blocks fill the prefill's half block before taking a new one") {
    const KvGeometry g = tiny();
    KvConfig c;
    c.frames_per_block = 2;
    KvCacheManager m(g, c, session_budget(g, c));
    CHECK(m.limits().max_blocks_per_branch == 4);
    auto s = m.open_session("fpb2");
    s->begin_forward(kPos, KvForwardSpec::prefill(g));
    const BlockTable& t = s->table(kPos);
    REQUIRE(t.pending_blocks().size() == 1);
    const BlockId first = t.pending_blocks()[0];
    s->commit(kPos);
    s->begin_forward(kPos, KvForwardSpec::commit_chunk(g));  // tokens 3..8: 3..5 in `first`, 6..8 in a new block
    REQUIRE(t.pending_blocks().size() == 1);
    const BlockId second = t.pending_blocks()[0];
    const std::vector<int64_t>& slots = t.slot_mapping();
    for (int i = 0; i < 3; ++i) CHECK(slots[size_t(i)] == first * 6 + 3 + i);
    for (int i = 3; i < 6; ++i) CHECK(slots[size_t(i)] == second * 6 + (i - 3));
    CHECK(t.seq_len() == 3);              // the half-filled block is visible up to its real length
    CHECK(t.num_table_blocks() == 1);
    s->commit(kPos);
    s->begin_forward(kPos, KvForwardSpec::denoise(g));
    CHECK(t.seq_len() == 9);
    CHECK(t.num_table_blocks() == 2);
    CHECK(t.padded_table()[0] == first);
    CHECK(t.padded_table()[1] == second);
    s->commit(kPos);
}

TEST_CASE("a second begin before commit or abort is refused and changes nothing") {
    const KvGeometry g = tiny();
    const KvConfig c;
    KvCacheManager m(g, c, session_budget(g, c));
    auto s = m.open_session("guard");
    s->begin_forward(kPos, KvForwardSpec::prefill(g));
    const int free_before = m.pool().num_free();
    CHECK_THROWS_WITH_AS(s->begin_forward(kPos, KvForwardSpec::denoise(g)),
                         doctest::Contains("neither committed nor aborted"), Error);
    CHECK(m.pool().num_free() == free_before);
    CHECK(s->table(kPos).committing());
    // the other branch is not affected by the guard
    CHECK_NOTHROW(s->begin_forward(kNeg, KvForwardSpec::prefill(g)));
    s->commit(kPos);
    s->commit(kNeg);
    CHECK_THROWS_WITH_AS(s->commit(kPos), doctest::Contains("without an open forward"), Error);
    s->begin_forward(kPos, KvForwardSpec::denoise(g));
    CHECK_THROWS_AS(s->begin_forward(kPos, KvForwardSpec::denoise(g)), Error);
}

TEST_CASE("reset_at_boundary refuses a commit past window minus chunk and a read past the window") {
    const KvGeometry g = tiny();
    const KvConfig c;
    KvCacheManager m(g, c, session_budget(g, c));
    auto s = m.open_session("full");
    run_call(*s, true);
    for (int i = 0; i < 3; ++i) run_call(*s, false);  // 7 frames committed: csf would be 9
    const int free_before = m.pool().num_free();
    CHECK(free_before == 0);
    CHECK_THROWS_WITH_AS(s->begin_forward(kPos, KvForwardSpec::commit_chunk(g)),
                         doctest::Contains("window must be reset"), Error);
    CHECK_FALSE(s->table(kPos).in_forward());
    CHECK(m.pool().num_free() == free_before);
    // a denoise reading 7 + 2 frames is exactly the window
    CHECK_NOTHROW(s->begin_forward(kPos, KvForwardSpec::denoise(g)));
    s->commit(kPos);
    s->reset_window();
    CHECK_NOTHROW(run_call(*s, true));
}

TEST_CASE("sliding eviction frees the oldest blocks first and the free count plateaus once the window is full") {
    const KvGeometry g = tiny(1);
    const KvConfig c = sliding(0, 4);
    KvCacheManager m(g, c, session_budget(g, c));
    CHECK(m.pool().num_blocks() == 4);  // sink + window blocks, evicted before allocating
    auto s = m.open_session("slide");
    const BlockTable& t = s->table(0);
    std::vector<BlockId> order;  // every block ever resident, in position order
    std::vector<int> free_counts;
    for (int chunk = 0; chunk < 10; ++chunk) {
        const std::vector<BlockId> before = t.resident();
        s->begin_forward(0, chunk == 0 ? KvForwardSpec::prefill(g) : KvForwardSpec::commit_chunk(g));
        // the blocks gone from the resident list are exactly the oldest ones
        const std::vector<BlockId>& after = t.resident();
        const size_t evicted = before.size() - after.size();
        CHECK(std::vector<BlockId>(before.begin() + long(evicted), before.end()) == after);
        order.insert(order.end(), t.pending_blocks().begin(), t.pending_blocks().end());
        s->commit(0);
        CHECK(int(t.resident().size()) <= 4);
        // the resident blocks are the newest ones, in position order
        CHECK(std::vector<BlockId>(order.end() - long(t.resident().size()), order.end()) == t.resident());
        s->begin_forward(0, KvForwardSpec::denoise(g));
        // a 2-frame forward sees the newest 2 frames at most
        CHECK(t.seq_len() == std::min<int64_t>(t.num_tokens(), 2 * 3));
        s->commit(0);
        free_counts.push_back(m.pool().num_free());
    }
    // frames 1, 3, 5, ... committed; 4 blocks resident from the 3rd chunk on
    CHECK(free_counts == std::vector<int>{3, 1, 0, 0, 0, 0, 0, 0, 0, 0});
    CHECK(t.num_tokens() == 19 * 3);
    s->close();
    CHECK(m.pool().num_free() == 4);
}

TEST_CASE("sink blocks survive sliding eviction and lead the block table") {
    const KvGeometry g = tiny(1);
    const KvConfig c = sliding(1, 4);
    KvCacheManager m(g, c, session_budget(g, c));
    CHECK(m.limits().max_blocks_per_branch == 5);
    auto s = m.open_session("sink");
    s->begin_forward(0, KvForwardSpec::prefill(g));
    const BlockId sink = s->table(0).pending_blocks()[0];
    s->commit(0);
    for (int i = 0; i < 6; ++i) {
        s->begin_forward(0, KvForwardSpec::commit_chunk(g));
        s->commit(0);
    }
    const BlockTable& t = s->table(0);
    CHECK(t.resident().front() == sink);
    CHECK(t.resident().size() == 5);
    s->begin_forward(0, KvForwardSpec::denoise(g));
    // sink + window - 2 current frames = 3 visible: the sink, then the 2 newest
    CHECK(t.num_table_blocks() == 3);
    CHECK(t.seq_len() == 9);
    CHECK(t.padded_table()[0] == sink);
    CHECK(t.padded_table()[1] == t.resident()[3]);
    CHECK(t.padded_table()[2] == t.resident()[4]);
    s->commit(0);
}

TEST_CASE("the padded block table keeps one width across window growth and seq_len stays real") {
    const KvGeometry g = tiny(1);
    for (const KvConfig& c : {KvConfig{}, sliding(0, 5)}) {
        KvCacheManager m(g, c, session_budget(g, c));
        auto s = m.open_session("width");
        const BlockTable& t = s->table(0);
        const size_t width = t.padded_table().size();
        CHECK(width == size_t(m.limits().table_width));
        int64_t committed = 0;
        for (int chunk = 0; chunk < 4; ++chunk) {
            const KvForwardSpec spec = chunk == 0 ? KvForwardSpec::prefill(g) : KvForwardSpec::commit_chunk(g);
            s->begin_forward(0, spec);
            s->commit(0);
            committed += spec.video_frames * 3;
            s->begin_forward(0, KvForwardSpec::denoise(g));
            CHECK(t.padded_table().size() == width);
            const int64_t visible = c.reset_at_boundary ? committed : std::min<int64_t>(committed, (5 - 2) * 3);
            CHECK(t.seq_len() == visible);
            CHECK(t.num_table_blocks() == int((visible + 2) / 3));
            for (size_t j = size_t(t.num_table_blocks()); j < width; ++j) CHECK(t.padded_table()[j] == kNullBlockId);
            for (int j = 0; j < t.num_table_blocks(); ++j) CHECK(t.padded_table()[size_t(j)] != kNullBlockId);
            s->commit(0);
        }
    }
}

TEST_CASE("a frame-misaligned forward is refused") {
    const KvGeometry g = tiny(1);
    BlockPool pool(7, 1);
    BlockTable t(pool, g, KvConfig{}, "direct");
    CHECK_THROWS_WITH_AS(t.begin(4, 0, true), doctest::Contains("whole number of 3-token frames"), Error);
    CHECK_THROWS_WITH_AS(t.begin(9, 0, true), doctest::Contains("exceeds the scratch"), Error);
    CHECK_FALSE(t.in_forward());
    CHECK(pool.num_free() == 7);
}

TEST_CASE("branches are independent: one branch's forwards allocate nothing for the other") {
    const KvGeometry g = tiny();
    const KvConfig c;
    KvCacheManager m(g, c, session_budget(g, c));
    auto s = m.open_session("branches");
    s->begin_forward(kPos, KvForwardSpec::prefill(g));
    s->commit(kPos);
    s->begin_forward(kPos, KvForwardSpec::commit_chunk(g));
    s->commit(kPos);
    CHECK(s->table(kPos).num_tokens() == 9);
    CHECK(s->table(kNeg).num_tokens() == 0);
    CHECK(s->table(kNeg).resident().empty());
    CHECK(m.pool().num_free() == 14 - 3);
    s->begin_forward(kNeg, KvForwardSpec::prefill(g));
    CHECK(s->table(kNeg).seq_len() == 0);
    for (BlockId id : s->table(kNeg).pending_blocks())
        for (BlockId p : s->table(kPos).resident()) CHECK(id != p);
    s->commit(kNeg);
}

TEST_CASE("an injected failure mid-forward restores the free count and the session is usable after reset") {
    const KvGeometry g = tiny();
    const KvConfig c;
    KvCacheManager m(g, c, session_budget(g, c));
    auto s = m.open_session("failing");
    run_call(*s, true);
    run_call(*s, false);
    const std::vector<float> ctx = iota_values(size_t(g.text_tokens) * 2 * 4, 0.f);
    const TensorView kv(const_cast<float*>(ctx.data()), DType::F32, Shape{g.text_tokens, 2, 4});
    const LayerKv layers[] = {{kv, kv}, {kv, kv}};
    s->populate_cross(kPos, CrossKind::Text, layers);
    try {
        s->begin_forward(kPos, KvForwardSpec::commit_chunk(g));
        throw Error("injected: layer 1 failed");  // what a failing DiT forward does
    } catch (const Error&) {
        s->abort();
    }
    CHECK(m.pool().num_free() == m.pool().num_blocks());
    CHECK(s->failed());
    CHECK_FALSE(s->table(kPos).in_forward());
    CHECK(s->table(kPos).num_tokens() == 0);
    CHECK_FALSE(s->cross(kPos, CrossKind::Text).populated());
    CHECK_THROWS_WITH_AS(s->begin_forward(kPos, KvForwardSpec::prefill(g)), doctest::Contains("reset it"), Error);
    CHECK_THROWS_AS(s->populate_cross(kPos, CrossKind::Text, layers), Error);
    s->reset();
    CHECK_FALSE(s->failed());
    run_call(*s, true);
    CHECK(s->table(kPos).num_tokens() == 3);
    CHECK(m.pool().num_free() == m.pool().num_blocks() - 2);
}

TEST_CASE("pool exhaustion names the bytes and leaves no forward open") {
    const KvGeometry g = tiny(1);
    const KvConfig c;
    KvMemoryPlan plan = plan_kv_memory(g, c, session_budget(g, c));
    plan.num_blocks = 2;  // deliberately smaller than one session
    KvCacheManager m(g, c, plan);
    auto s = m.open_session("small");
    run_call(*s, true);
    std::string msg;
    try {
        s->begin_forward(0, KvForwardSpec::commit_chunk(g));
    } catch (const Error& e) {
        msg = e.what();
    }
    CHECK(msg.find("exhausted") != std::string::npos);
    CHECK(msg.find(std::to_string(2 * plan.block_bytes) + " bytes") != std::string::npos);
    CHECK(msg.find(std::to_string(plan.block_bytes) + " bytes") != std::string::npos);
    CHECK_FALSE(s->table(0).in_forward());
    CHECK(s->table(0).num_tokens() == 3);
    CHECK(m.pool().num_free() == 1);
}

TEST_CASE("a window reset keeps the text cross cache, a full reset drops it, and both leave the pool whole") {
    const KvGeometry g = tiny();
    const KvConfig c;
    auto be = make_cpu_backend(size_t(1) << 20);
    KvCacheManager m(g, c, session_budget(g, c), be.get());
    auto s = m.open_session("resets");
    const std::vector<float> text = test::random_floats(size_t(g.text_tokens) * 8, 11);
    const std::vector<float> image = test::random_floats(size_t(g.image_tokens) * 8, 12);
    const TensorView tv(const_cast<float*>(text.data()), DType::F32, Shape{g.text_tokens, 2, 4});
    const TensorView iv(const_cast<float*>(image.data()), DType::F32, Shape{g.image_tokens, 2, 4});
    const LayerKv text_layers[] = {{tv, tv}, {tv, tv}};
    const LayerKv image_layers[] = {{iv, iv}, {iv, iv}};
    for (int b : {kPos, kNeg}) {
        s->populate_cross(b, CrossKind::Text, text_layers);
        s->populate_cross(b, CrossKind::Image, image_layers);
    }
    run_call(*s, true);
    run_call(*s, false);
    s->reset_window();
    CHECK(m.pool().num_free() == 14);
    for (int b : {kPos, kNeg}) {
        CHECK(s->cross(b, CrossKind::Text).populated());
        CHECK_FALSE(s->cross(b, CrossKind::Image).populated());
        CHECK(to_f32_vector(s->cross(b, CrossKind::Text).k(1)) == text);
        CHECK_THROWS_WITH_AS(s->cross(b, CrossKind::Image).k(0), doctest::Contains("before it was populated"), Error);
    }
    run_call(*s, true);  // reusable after the reset
    CHECK(s->table(kPos).num_tokens() == 3);
    s->reset();
    CHECK(m.pool().num_free() == 14);
    CHECK_FALSE(s->cross(kPos, CrossKind::Text).populated());
    CHECK_FALSE(s->cross(kNeg, CrossKind::Text).populated());
    run_call(*s, true);
    CHECK(m.pool().num_free() == 12);
}

TEST_CASE("cross cache population is transactional and reads return the exact tensors") {
    const KvGeometry g = tiny();
    const KvConfig c;
    auto be = make_cpu_backend(size_t(1) << 20);
    KvCacheManager m(g, c, session_budget(g, c), be.get());
    auto s = m.open_session("cross");
    CHECK_THROWS_WITH_AS(s->cross(kPos, CrossKind::Text).v(0), doctest::Contains("before it was populated"), Error);
    const size_t n = size_t(g.text_tokens) * 8;
    std::vector<std::vector<float>> vals;
    for (int i = 0; i < 4; ++i) vals.push_back(test::random_floats(n, 100 + uint64_t(i)));
    auto view = [&](int i) {
        return TensorView(vals[size_t(i)].data(), DType::F32, Shape{g.text_tokens, 2, 4});
    };
    const LayerKv good[] = {{view(0), view(1)}, {view(2), view(3)}};
    s->populate_cross(kPos, CrossKind::Text, good);
    const CrossAttentionCache& cache = s->cross(kPos, CrossKind::Text);
    CHECK(cache.generation() == 1);
    CHECK(to_f32_vector(cache.k(0)) == vals[0]);
    CHECK(to_f32_vector(cache.v(0)) == vals[1]);
    CHECK(to_f32_vector(cache.k(1)) == vals[2]);
    CHECK(to_f32_vector(cache.v(1)) == vals[3]);

    // a wrong layer count leaves the old cache intact
    std::vector<float> other = test::random_floats(n, 7);
    const TensorView ov(other.data(), DType::F32, Shape{g.text_tokens, 2, 4});
    const LayerKv one_layer[] = {{ov, ov}};
    CHECK_THROWS_WITH_AS(s->populate_cross(kPos, CrossKind::Text, one_layer),
                         doctest::Contains("got 1 layers of K/V, expected 2"), Error);
    // a wrong shape in the last layer leaves every layer intact
    std::vector<float> short_vals(size_t(g.text_tokens - 1) * 8, 1.f);
    const TensorView bad(short_vals.data(), DType::F32, Shape{g.text_tokens - 1, 2, 4});
    const LayerKv bad_shape[] = {{ov, ov}, {ov, bad}};
    CHECK_THROWS_WITH_AS(s->populate_cross(kPos, CrossKind::Text, bad_shape), doctest::Contains("layer 1 v"), Error);
    const LayerKv missing[] = {{ov, ov}, {ov, TensorView{}}};
    CHECK_THROWS_WITH_AS(s->populate_cross(kPos, CrossKind::Text, missing), doctest::Contains("absent"), Error);
    CHECK(cache.populated());
    CHECK(cache.generation() == 1);
    CHECK(to_f32_vector(cache.k(0)) == vals[0]);
    CHECK(to_f32_vector(cache.v(1)) == vals[3]);
    // the other branch and the other kind are separate caches
    CHECK_FALSE(s->cross(kNeg, CrossKind::Text).populated());
    CHECK_FALSE(s->cross(kPos, CrossKind::Image).populated());
    // a valid repopulation replaces every layer
    const LayerKv again[] = {{ov, ov}, {ov, ov}};
    s->populate_cross(kPos, CrossKind::Text, again);
    CHECK(cache.generation() == 2);
    CHECK(to_f32_vector(cache.k(0)) == other);
    CHECK(to_f32_vector(cache.v(1)) == other);
    // a closed session cannot repopulate or read
    s->close();
    CHECK_THROWS_WITH_AS(s->populate_cross(kPos, CrossKind::Text, again), doctest::Contains("closed"), Error);
    CHECK_THROWS_WITH_AS(s->cross(kPos, CrossKind::Text), doctest::Contains("closed"), Error);
}

TEST_CASE("the branches of one device share one image cache, and a cache can be written in place") {
    const KvGeometry g = tiny();
    const KvConfig c;
    auto be = make_cpu_backend(size_t(1) << 20);
    KvCacheManager m(g, c, session_budget(g, c), be.get());
    auto s = m.open_session("in place");
    // one image cache for both branches (the same image context), a text cache each
    CHECK(&s->cross(kPos, CrossKind::Image) == &s->cross(kNeg, CrossKind::Image));
    CHECK(&s->cross(kPos, CrossKind::Text) != &s->cross(kNeg, CrossKind::Text));
    // a single branch on its device keeps its own image cache (and the sizing counts it once either way)
    CHECK(plan_kv_memory(g, c, session_budget(g, c)).cross_bytes ==
          size_t(2 * g.text_tokens + g.image_tokens) * g.token_bytes());
    CHECK(plan_kv_memory(tiny(1), c, session_budget(tiny(1), c)).cross_bytes ==
          size_t(g.text_tokens + g.image_tokens) * g.token_bytes());

    // in place: the views are the cache's own storage; the cache reads as empty until the commit
    const size_t n = size_t(g.image_tokens) * 8;
    std::vector<LayerKv> views = s->begin_cross_write(kPos, CrossKind::Image);
    REQUIRE(views.size() == 2);
    CHECK_THROWS_WITH_AS(s->cross(kNeg, CrossKind::Image).k(0), doctest::Contains("before it was populated"), Error);
    std::vector<std::vector<float>> vals;
    for (int i = 0; i < 4; ++i) {
        vals.push_back(test::random_floats(n, 200 + uint64_t(i)));
        const TensorView& dst = i % 2 == 0 ? views[size_t(i / 2)].k : views[size_t(i / 2)].v;
        REQUIRE(dst.shape == Shape{g.image_tokens, 2, 4});
        be->copy(TensorView(vals.back().data(), DType::F32, dst.shape), dst);
    }
    const uint64_t generation = s->cross(kPos, CrossKind::Image).generation();
    s->commit_cross(kPos, CrossKind::Image);
    CHECK(s->cross(kNeg, CrossKind::Image).generation() == generation + 1);
    CHECK(to_f32_vector(s->cross(kNeg, CrossKind::Image).k(0)) == vals[0]);
    CHECK(to_f32_vector(s->cross(kNeg, CrossKind::Image).v(1)) == vals[3]);
    // a commit needs a write begun; a reset in between leaves the cache empty
    CHECK_THROWS_WITH_AS(s->commit_cross(kPos, CrossKind::Image), doctest::Contains("without begin_write"), Error);
    s->begin_cross_write(kNeg, CrossKind::Image);
    s->reset_window();
    CHECK_THROWS_WITH_AS(s->commit_cross(kNeg, CrossKind::Image), doctest::Contains("without begin_write"), Error);
    CHECK_FALSE(s->cross(kPos, CrossKind::Image).populated());
    // without storage there is nothing to write into
    KvCacheManager bookkeeping(g, c, session_budget(g, c));
    auto b = bookkeeping.open_session("bookkeeping");
    CHECK_THROWS_WITH_AS(b->begin_cross_write(kPos, CrossKind::Text), doctest::Contains("needs storage"), Error);
}

TEST_CASE("the pool is whole after every session, a warm-up session included, and one session is open at a time") {
    const KvGeometry g = tiny();
    const KvConfig c;
    auto be = make_cpu_backend(size_t(1) << 20);
    KvCacheManager m(g, c, session_budget(g, c), be.get());
    const int total = m.pool().num_blocks();
    {
        auto warmup = m.open_session("warmup");
        CHECK_THROWS_WITH_AS(m.open_session("episode"), doctest::Contains("while session 'warmup' is open"), Error);
        run_call(*warmup, true);
        run_call(*warmup, false);
        warmup->begin_forward(kPos, KvForwardSpec::commit_chunk(g));  // left open: close must return it too
    }  // destroyed: closes itself
    CHECK(m.pool().num_free() == total);
    CHECK_FALSE(m.session_open());
    for (int episode = 0; episode < 3; ++episode) {
        auto s = m.open_session("episode " + std::to_string(episode));
        for (int call = 0; call < 6; ++call) {
            if (call == 4) s->reset_window();
            run_call(*s, call % 4 == 0);
        }
        s->close();
        s->close();  // idempotent
        CHECK(s->closed());
        CHECK_THROWS_WITH_AS(s->begin_forward(kPos, KvForwardSpec::prefill(g)), doctest::Contains("is closed"),
                             Error);
        CHECK(m.pool().num_free() == total);
    }
}

TEST_CASE("a session left open when its manager goes away is closed first") {
    const KvGeometry g = tiny();
    const KvConfig c;
    std::unique_ptr<KvSession> s;
    {
        KvCacheManager m(g, c, session_budget(g, c));
        s = m.open_session("orphan");
        run_call(*s, true);
    }
    CHECK(s->closed());
    s.reset();  // must not touch the destroyed pool
}

TEST_CASE("a forward scope left by an exception fails the session closed; a committed scope keeps history") {
    const KvGeometry g = tiny();
    const KvConfig c;
    KvCacheManager m(g, c, session_budget(g, c));
    auto s = m.open_session("scoped");
    {
        KvForwardScope fwd(*s, kPos, KvForwardSpec::prefill(g));
        fwd.commit();
    }
    CHECK(s->table(kPos).num_tokens() == 3);
    CHECK_FALSE(s->failed());
    try {
        KvForwardScope fwd(*s, kPos, KvForwardSpec::commit_chunk(g));
        CHECK(m.pool().num_free() == 14 - 3);
        throw Error("injected: the DiT forward failed");
    } catch (const Error&) {
    }
    CHECK(s->failed());
    CHECK(m.pool().num_free() == 14);
    CHECK(s->table(kPos).num_tokens() == 0);
    // a scope whose begin is refused does not abort anything
    s->reset();
    s->begin_forward(kNeg, KvForwardSpec::prefill(g));
    CHECK_THROWS_AS(KvForwardScope(*s, kNeg, KvForwardSpec::prefill(g)), Error);
    CHECK_FALSE(s->failed());
    CHECK(s->table(kNeg).in_forward());
}

TEST_CASE("a cache for two sessions holds both at once in disjoint blocks and cross caches, and refuses a third") {
    KvGeometry g = tiny();
    g.sessions = 2;
    const KvConfig c;
    auto be = make_cpu_backend(size_t(1) << 20);
    // NOTE: each session its blocks and cross caches; the scratch and the null block serve the forward that runs
    const size_t one = kv_session_bytes(tiny(), c);
    const KvMemoryPlan single = plan_kv_memory(tiny(), c, one);
    CHECK(kv_sessions_bytes(g, c) == 2 * one - single.scratch_bytes - single.block_bytes);
    KvCacheManager m(g, c, kv_sessions_bytes(g, c), be.get());
    CHECK(m.pool().num_blocks() == 28);  // 7 per branch and session
    CHECK(m.plan().cross_bytes == 2 * single.cross_bytes);
    CHECK(m.plan().scratch_bytes == single.scratch_bytes);
    const int total = m.pool().num_blocks();
    auto a = m.open_session("a");
    auto b = m.open_session("b");
    CHECK_THROWS_WITH_AS(m.open_session("c"), doctest::Contains("the cache holds 2 sessions"), Error);
    for (int call = 0; call < 4; ++call) {  // interleaved: a's call, b's call
        run_call(*a, call == 0);
        run_call(*b, call == 0);
    }
    CHECK(m.pool().num_free() == 0);  // both windows full: every block is held
    std::vector<BlockId> held;
    for (KvSession* s : {a.get(), b.get()})
        for (int br = 0; br < s->num_branches(); ++br)
            held.insert(held.end(), s->table(br).resident().begin(), s->table(br).resident().end());
    std::sort(held.begin(), held.end());
    CHECK(held.size() == 28);
    CHECK(std::adjacent_find(held.begin(), held.end()) == held.end());
    for (int br = 0; br < 2; ++br)
        for (CrossKind kind : {CrossKind::Text, CrossKind::Image}) {
            CHECK(&a->cross(br, kind) != &b->cross(br, kind));
            CHECK(a->begin_cross_write(br, kind).at(0).k.data != b->begin_cross_write(br, kind).at(0).k.data);
        }
    // a filled cross cache of one session is not the other's
    a->commit_cross(kPos, CrossKind::Text);
    CHECK(a->cross(kPos, CrossKind::Text).populated());
    CHECK_FALSE(b->cross(kPos, CrossKind::Text).populated());
    b->close();
    CHECK(m.pool().num_free() == 14);
    CHECK(m.session_open());
    auto c2 = m.open_session("c");  // b's place
    run_call(*c2, true);
    c2.reset();
    a.reset();
    CHECK(m.pool().num_free() == total);
    CHECK_FALSE(m.session_open());
}
