#pragma once
/// The block pool (vLLM's vocabulary): host-side bookkeeping of which KV blocks are free. One block holds
/// K and V of frames_per_block latent frames in every layer; its storage lives in the pool tensors owned
/// by KvCacheManager. Block 0 is the null block: never handed out, it pads block tables.
///
/// The free-block queue is a FIFO ring: allocate pops the front, free appends at the back, both O(1). So
/// blocks are reused in the order they were freed (the least recently freed first), and a fresh pool hands
/// out ids 1, 2, 3, ... Every allocated block records its owner (a block table), so a double free or a free
/// by the wrong table is caught.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/kv_view.h"

namespace dzr {

class BlockPool {
public:
    /// `num_blocks` allocatable blocks (ids 1..num_blocks) of `block_bytes` each (for messages).
    BlockPool(int num_blocks, size_t block_bytes);

    /// A fresh owner tag for a block table (never 0).
    uint32_t new_owner();

    /// Pops `n` blocks for `owner` and appends them to `out`; all or nothing. Throws dzr::Error
    /// ("pool exhausted: need ... bytes, ... free") when fewer than n are free.
    void allocate(int n, uint32_t owner, std::vector<BlockId>& out);
    BlockId allocate(uint32_t owner);
    /// Takes the `n` consecutive ids first .. first + n - 1 for `owner` (appended to `out`) when every one lies in the
    /// pool and is free; otherwise changes nothing and returns false. The lanes' allocation (KvGeometry::lanes).
    bool allocate_run(BlockId first, int n, uint32_t owner, std::vector<BlockId>& out);

    /// Takes the free ids first .. first + n - 1 out of the pool for good (the lanes' middle rows, KvCacheManager): they
    /// are never handed out, freed or counted in num_blocks(). Throws when one is not free.
    void reserve(BlockId first, int n);

    /// Returns `id` to the back of the free queue. Throws for the null block, an id outside the pool, a
    /// block that is already free, or a block owned by another table.
    void free(BlockId id, uint32_t owner);

    /// Blocks that can be handed out (the reserved ones not counted).
    int num_blocks() const { return num_blocks_ - reserved_; }
    int num_free() const { return count_; }
    int num_used() const { return num_blocks() - count_; }
    int num_reserved() const { return reserved_; }
    /// Block ids 1..num_ids() (the reserved ones included).
    int num_ids() const { return num_blocks_; }
    size_t block_bytes() const { return block_bytes_; }
    bool is_free(BlockId id) const;
    /// Owner tag of an allocated block, 0 when free.
    uint32_t owner_of(BlockId id) const;

private:
    void check_id(BlockId id, const char* what) const;

    int num_blocks_ = 0;
    size_t block_bytes_ = 0;
    std::vector<BlockId> ring_;     // free queue: count_ ids starting at head_
    int head_ = 0;
    int count_ = 0;
    std::vector<uint32_t> owner_;   // per block id; 0 = free (index 0 = null block, unused)
    uint32_t next_owner_ = 1;
    int reserved_ = 0;
};

}  // namespace dzr
