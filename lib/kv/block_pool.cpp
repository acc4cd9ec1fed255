#include "kv/block_pool.h"

#include <algorithm>

#include "core/error.h"
#include "config/kv_config.h"

namespace dzr {

namespace {
/// The owner tag of reserved ids (BlockPool::reserve); new_owner() never reaches it.
constexpr uint32_t kReservedOwner = UINT32_MAX;
}  // namespace

BlockPool::BlockPool(int num_blocks, size_t block_bytes)
    : num_blocks_(num_blocks), block_bytes_(block_bytes), ring_(size_t(num_blocks > 0 ? num_blocks : 0)),
      count_(num_blocks), owner_(size_t(num_blocks > 0 ? num_blocks : 0) + 1, 0) {
    DZR_CHECK(num_blocks >= 1, "kv block pool: needs at least one block, got {}", num_blocks);
    for (int i = 0; i < num_blocks; ++i) ring_[size_t(i)] = BlockId(i + 1);
}

uint32_t BlockPool::new_owner() { return next_owner_++; }

void BlockPool::allocate(int n, uint32_t owner, std::vector<BlockId>& out) {
    DZR_ASSERT(owner != 0 && n >= 0);
    DZR_CHECK(n <= count_,
              "kv block pool exhausted: need {} block(s) ({} bytes = {}), but only {} of {} are free ({} bytes = {} "
              "available)",
              n, size_t(n) * block_bytes_, format_bytes(size_t(n) * block_bytes_), count_, num_blocks_,
              size_t(count_) * block_bytes_, format_bytes(size_t(count_) * block_bytes_));
    for (int i = 0; i < n; ++i) {
        const BlockId id = ring_[size_t(head_)];
        head_ = (head_ + 1) % num_blocks_;
        --count_;
        owner_[size_t(id)] = owner;
        out.push_back(id);
    }
}

BlockId BlockPool::allocate(uint32_t owner) {
    std::vector<BlockId> one;
    allocate(1, owner, one);
    return one[0];
}

void BlockPool::reserve(BlockId first, int n) {
    std::vector<BlockId> taken;
    DZR_CHECK(allocate_run(first, n, kReservedOwner, taken), "kv block pool: cannot reserve blocks {}..{}: not all free "
                                                             "in ids 1..{}", first, first + n - 1, num_blocks_);
    reserved_ += n;
}

bool BlockPool::allocate_run(BlockId first, int n, uint32_t owner, std::vector<BlockId>& out) {
    DZR_ASSERT(owner != 0 && n >= 0);
    if (first < 1 || int64_t(first) + n - 1 > num_blocks_) return false;
    for (int i = 0; i < n; ++i)
        if (owner_[size_t(first + i)] != 0) return false;
    if (n == 0) return true;
    // NOTE: the free queue keeps its order without the taken ids (O(pool) per call; pools hold tens of blocks)
    std::vector<BlockId> rest;
    rest.reserve(size_t(count_));
    for (int i = 0; i < count_; ++i) {
        const BlockId id = ring_[size_t((head_ + i) % num_blocks_)];
        if (id < first || id >= first + n) rest.push_back(id);
    }
    DZR_ASSERT(int(rest.size()) == count_ - n);
    head_ = 0;
    count_ = int(rest.size());
    std::copy(rest.begin(), rest.end(), ring_.begin());
    for (int i = 0; i < n; ++i) {
        owner_[size_t(first + i)] = owner;
        out.push_back(BlockId(first + i));
    }
    return true;
}

void BlockPool::check_id(BlockId id, const char* what) const {
    DZR_CHECK(id != kNullBlockId, "kv block pool: {} block 0, the null block, which is never allocated", what);
    DZR_CHECK(id >= 1 && id <= num_blocks_, "kv block pool: {} block {}, which is not in this pool (ids 1..{})", what,
              id, num_blocks_);
}

void BlockPool::free(BlockId id, uint32_t owner) {
    check_id(id, "freeing");
    const uint32_t held_by = owner_[size_t(id)];
    DZR_CHECK(held_by != 0, "kv block pool: block {} freed twice (it is already free)", id);
    DZR_CHECK(held_by != kReservedOwner, "kv block pool: block {} is reserved (the lanes' middle) and never freed", id);
    DZR_CHECK(held_by == owner, "kv block pool: block {} belongs to block table #{}, not to #{} which freed it", id,
              held_by, owner);
    owner_[size_t(id)] = 0;
    ring_[size_t((head_ + count_) % num_blocks_)] = id;
    ++count_;
}

bool BlockPool::is_free(BlockId id) const {
    check_id(id, "asking about");
    return owner_[size_t(id)] == 0;
}

uint32_t BlockPool::owner_of(BlockId id) const {
    check_id(id, "asking about");
    return owner_[size_t(id)];
}

}  // namespace dzr
