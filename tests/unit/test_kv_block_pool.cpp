// BlockPool: the FIFO free queue, counts, the null block, and misuse detection.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "kv/block_pool.h"

using namespace dzr;

TEST_CASE("block pool hands out ids 1..n in order and never the null block") {
    BlockPool pool(5, 100);
    const uint32_t owner = pool.new_owner();
    CHECK(pool.num_blocks() == 5);
    CHECK(pool.num_free() == 5);
    std::vector<BlockId> got;
    pool.allocate(5, owner, got);
    CHECK(got == std::vector<BlockId>{1, 2, 3, 4, 5});
    CHECK(pool.num_free() == 0);
    CHECK(pool.num_used() == 5);
    for (BlockId id : got) CHECK(id != kNullBlockId);
}

TEST_CASE("block pool reuses freed blocks in the order they were freed") {
    BlockPool pool(6, 100);
    const uint32_t owner = pool.new_owner();
    std::vector<BlockId> a;
    pool.allocate(4, owner, a);  // 1 2 3 4; free queue: 5 6
    pool.free(3, owner);
    pool.free(1, owner);
    pool.free(4, owner);         // free queue: 5 6 3 1 4
    std::vector<BlockId> b;
    pool.allocate(5, owner, b);
    CHECK(b == std::vector<BlockId>{5, 6, 3, 1, 4});
    CHECK(pool.num_free() == 0);
}

TEST_CASE("block pool free queue wraps around many times without losing blocks") {
    BlockPool pool(3, 8);
    const uint32_t owner = pool.new_owner();
    std::vector<BlockId> seen;
    for (int round = 0; round < 10; ++round) {
        std::vector<BlockId> got;
        pool.allocate(2, owner, got);
        for (BlockId id : got) pool.free(id, owner);
        seen.insert(seen.end(), got.begin(), got.end());
        CHECK(pool.num_free() == 3);
    }
    // FIFO over 3 blocks taking 2 at a time: 1 2 | 3 1 | 2 3 | 1 2 | ...
    CHECK(std::vector<BlockId>(seen.begin(), seen.begin() + 6) == std::vector<BlockId>{1, 2, 3, 1, 2, 3});
}

TEST_CASE("block pool detects double free, the null block, foreign ids and the wrong owner") {
    BlockPool pool(4, 100);
    const uint32_t a = pool.new_owner(), b = pool.new_owner();
    CHECK(a != b);
    const BlockId id = pool.allocate(a);
    CHECK(pool.owner_of(id) == a);
    CHECK_THROWS_WITH_AS(pool.free(id, b), doctest::Contains("belongs to block table"), Error);
    CHECK(pool.num_free() == 3);  // the refused free changed nothing
    pool.free(id, a);
    CHECK(pool.is_free(id));
    CHECK_THROWS_WITH_AS(pool.free(id, a), doctest::Contains("freed twice"), Error);
    CHECK_THROWS_WITH_AS(pool.free(kNullBlockId, a), doctest::Contains("null block"), Error);
    CHECK_THROWS_WITH_AS(pool.free(5, a), doctest::Contains("not in this pool"), Error);
    CHECK_THROWS_WITH_AS(pool.free(-2, a), doctest::Contains("not in this pool"), Error);
    CHECK(pool.num_free() == 4);
}

TEST_CASE("block pool exhaustion is all or nothing and names bytes needed and available") {
    BlockPool pool(3, 1048576);
    const uint32_t owner = pool.new_owner();
    std::vector<BlockId> got;
    pool.allocate(2, owner, got);
    std::vector<BlockId> more;
    std::string msg;
    try {
        pool.allocate(2, owner, more);
    } catch (const Error& e) {
        msg = e.what();
    }
    CHECK(msg.find("exhausted") != std::string::npos);
    CHECK(msg.find("2097152 bytes") != std::string::npos);  // needed
    CHECK(msg.find("1048576 bytes") != std::string::npos);  // available
    CHECK(more.empty());
    CHECK(pool.num_free() == 1);
}

TEST_CASE("block pool needs at least one block") { CHECK_THROWS_AS(BlockPool(0, 100), Error); }

TEST_CASE("block pool takes a run of given ids all or nothing and keeps the rest in their free order") {
    BlockPool pool(8, 100);
    const uint32_t a = pool.new_owner(), b = pool.new_owner();
    std::vector<BlockId> out;
    REQUIRE(pool.allocate_run(3, 2, a, out));
    CHECK(out == std::vector<BlockId>{3, 4});
    CHECK(pool.num_free() == 6);
    CHECK(pool.owner_of(3) == a);
    CHECK(pool.owner_of(4) == a);
    // a run over a taken id, past the pool or at the null block changes nothing
    out.clear();
    CHECK_FALSE(pool.allocate_run(2, 2, b, out));
    CHECK_FALSE(pool.allocate_run(7, 3, b, out));
    CHECK_FALSE(pool.allocate_run(0, 1, b, out));
    CHECK(out.empty());
    CHECK(pool.num_free() == 6);
    CHECK(pool.is_free(2));
    // the free queue keeps its order without the taken ids: 1, 2, 5, 6, 7, 8
    pool.allocate(6, b, out);
    CHECK(out == std::vector<BlockId>{1, 2, 5, 6, 7, 8});
    // freed blocks queue up behind, and a run can take from the middle of the queue
    for (BlockId id : {1, 2, 5, 6}) pool.free(id, b);
    out.clear();
    REQUIRE(pool.allocate_run(5, 2, a, out));
    CHECK(out == std::vector<BlockId>{5, 6});
    out.clear();
    pool.allocate(2, b, out);
    CHECK(out == std::vector<BlockId>{1, 2});
    CHECK(pool.num_free() == 0);
    // an empty run always succeeds
    CHECK(pool.allocate_run(1, 0, a, out));
}
