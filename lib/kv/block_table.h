#pragma once
/// The block table of one session's CFG branch: which pool blocks hold its committed history, in
/// position order, and the forward in flight. One forward follows the protocol
///
///     begin (evict, allocate, slot mapping, padded table) -> write -> attend -> commit | abort
///
/// A committing forward (prefill, commit) allocates blocks for its video tokens at begin; they become
/// history at commit. A denoise forward allocates nothing. abort() returns the pending blocks.
///
/// Token p of the branch's timeline lives in logical block p / block_tokens at offset p % block_tokens;
/// its slot is block_id * block_tokens + offset (kPadSlot for tokens that are not stored).
#include <cstdint>
#include <string>
#include <vector>

#include "kv/block_pool.h"
#include "config/kv_config.h"

namespace dzr {

class BlockTable {
public:
    /// `lane` >= 0 with KvGeometry::lanes: the table allocates from block ids 1 + lane * lane_blocks on, in order
    /// (first in, first out from the whole pool where its lane lacks a free run).
    BlockTable(BlockPool& pool, const KvGeometry& geometry, const KvConfig& config, std::string name, int lane = -1);
    ~BlockTable();
    BlockTable(const BlockTable&) = delete;
    BlockTable& operator=(const BlockTable&) = delete;

    const std::string& name() const { return name_; }

    // ---- committed history ----------------------------------------------------------------------
    /// Committed tokens since the last release (the model's timeline, evicted tokens included).
    int64_t num_tokens() const { return num_tokens_; }
    /// Resident blocks, oldest first (sink blocks, then the window).
    const std::vector<BlockId>& resident() const { return resident_; }

    // ---- one forward ----------------------------------------------------------------------------
    /// Opens a forward with `video_tokens` current video tokens (frame-aligned) and `register_tokens`
    /// register tokens. `commit`: the video tokens become history at commit(). Sliding eviction drops the
    /// blocks this forward cannot see before allocating. Throws (and changes nothing) when a forward is
    /// already open, the window is full under reset_at_boundary, or the pool is exhausted.
    void begin(int64_t video_tokens, int64_t register_tokens, bool commit);
    bool in_forward() const { return in_forward_; }
    bool committing() const { return in_forward_ && commit_; }
    int64_t current_video_tokens() const { return video_tokens_; }
    int64_t current_register_tokens() const { return register_tokens_; }
    /// Ends the forward; a committing one appends its pending blocks and tokens to the history.
    void commit();
    /// Ends the forward without committing: pending blocks go back to the pool. No-op when none is open.
    void abort() noexcept;
    /// Returns every block (pending and resident) to the pool and zeroes the counters.
    void release() noexcept;

    /// The visible history blocks of the open forward, padded with kNullBlockId to a fixed width.
    const std::vector<BlockId>& padded_table() const { return table_; }
    /// Real entries of padded_table() (= ceil(seq_len / block_tokens)).
    int num_table_blocks() const { return num_table_blocks_; }
    /// Visible history tokens of the open forward.
    int64_t seq_len() const { return seq_len_; }
    /// One slot per current token (video then register); kPadSlot where nothing is stored.
    const std::vector<int64_t>& slot_mapping() const { return slots_; }
    /// Blocks allocated by the open committing forward.
    const std::vector<BlockId>& pending_blocks() const { return pending_; }
    int64_t block_tokens() const { return limits_.block_tokens; }

    /// The open forward's [history | current] rows in place (KvGeometry::lanes): slots in the branch's own coordinates
    /// (KvSession::row_shift), -1 where they are not in place.
    struct InPlace {
        int64_t first = -1;    ///< the slot of the first of the hist + current rows, which lie one after the other
        int64_t current = -1;  ///< the slot of current row 0 (current row i at current + i), inside that range
    };
    /// Where the history, this forward's pending blocks and its current rows (video, then register) lie in
    /// consecutive slots: an ascending lane holds [history | current] from its first block on (current rows of a
    /// denoising forward in the free blocks after the history, or, for the mirrored lanes' branch 1, in the middle
    /// right before the lane); the mirrored lanes' branch 0 holds its history in runs growing down to the middle,
    /// where its current rows follow. {-1, -1} without a lane, outside a forward, with blocks out of order, a partial
    /// block inside the range, or too little room. Worked out once by begin() (no other table takes ids of a lane
    /// during a forward: its room past the pending blocks is checked only for a one-branch pool).
    InPlace in_place() const { return in_place_; }
    /// The first block id of the table's lane (0: none), its length, and whether its history grows down (the
    /// mirrored lanes' branch 0).
    BlockId lane_first() const { return lane_first_; }
    int lane_blocks() const { return lane_blocks_; }
    bool lane_descending() const { return descending_; }
    const KvLimits& limits() const { return limits_; }

private:
    BlockId block_of_logical(int64_t logical) const;
    InPlace find_in_place() const;
    int64_t num_logical_blocks() const;

    BlockPool& pool_;
    KvGeometry geometry_;
    KvConfig config_;
    KvLimits limits_;
    std::string name_;
    uint32_t owner_ = 0;
    BlockId lane_first_ = kNullBlockId;  // lanes: the lane's first id; kNullBlockId without one
    int lane_blocks_ = 0;
    bool descending_ = false;  // the mirrored lanes' branch 0: runs of blocks below the history, toward id lane_first_
    InPlace in_place_;         // the open forward's (find_in_place at begin); {-1, -1} outside a forward

    std::vector<BlockId> resident_;
    int64_t num_tokens_ = 0;
    int64_t window_first_logical_ = 0;  // logical block of resident_[sink_blocks]

    bool in_forward_ = false;
    bool commit_ = false;
    int64_t video_tokens_ = 0;
    int64_t register_tokens_ = 0;
    std::vector<BlockId> pending_;
    std::vector<BlockId> table_;
    int num_table_blocks_ = 0;
    int64_t seq_len_ = 0;
    std::vector<int64_t> slots_;
};

}  // namespace dzr
