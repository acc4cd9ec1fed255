#include "kv/block_table.h"

#include <algorithm>

#include "core/error.h"

namespace dzr {

BlockTable::BlockTable(BlockPool& pool, const KvGeometry& geometry, const KvConfig& config, std::string name,
                       int lane)
    : pool_(pool), geometry_(geometry), config_(config), limits_(kv_limits(geometry, config)), name_(std::move(name)),
      owner_(pool.new_owner()) {
    window_first_logical_ = limits_.sink_blocks;
    table_.assign(size_t(limits_.table_width), kNullBlockId);
    // NOTE: a lane the pool cannot hold (a pool smaller than one session's lanes) leaves the table without one
    const KvLimits& l = limits_;
    if (geometry.lanes && lane >= 0 && lane < geometry.num_branches && l.lane_ids <= pool.num_ids()) {
        lane_blocks_ = l.lane_blocks;
        if (!l.mirrored()) {
            lane_first_ = BlockId(1 + lane * l.lane_blocks);
        } else {
            lane_first_ = BlockId(lane == 0 ? 1 : 1 + l.lane_blocks + l.middle_blocks);
            descending_ = lane == 0;
        }
    }
}

BlockTable::InPlace BlockTable::find_in_place() const {
    const InPlace none;
    if (!in_forward_ || lane_blocks_ == 0 || seq_len_ != num_tokens_ || num_table_blocks_ != int(resident_.size()))
        return none;
    const int64_t bs = limits_.block_tokens;
    const int64_t cur = video_tokens_ + register_tokens_;
    const int64_t lane_end = int64_t(lane_first_) + lane_blocks_;
    // the resident and pending ids must be one range of the lane
    std::vector<BlockId> ids(resident_);
    ids.insert(ids.end(), pending_.begin(), pending_.end());
    const auto [lo_it, hi_it] = std::minmax_element(ids.begin(), ids.end());
    const int64_t lo = ids.empty() ? (descending_ ? lane_end : lane_first_) : *lo_it;
    const int64_t hi = ids.empty() ? lo - 1 : *hi_it;
    if (hi - lo + 1 != int64_t(ids.size()) || lo < lane_first_ || hi >= lane_end) return none;
    const bool mirrored = limits_.mirrored();
    if (descending_) {
        // [runs of history growing down | the middle]: every block full (a partial one would leave a hole), ending at
        // the lane's end; a denoising forward's rows at the middle's start, a commit's in its run at the bottom
        if (hi != lane_end - 1 && !ids.empty()) return none;
        if (num_tokens_ % bs != 0 || (commit_ && video_tokens_ % bs != 0)) return none;
        if (!commit_ && cur > limits_.scratch_tokens) return none;
        return {lo * bs, commit_ ? lo * bs : lane_end * bs};
    }
    if (!ids.empty() && lo != lane_first_) return none;
    if (mirrored && !commit_) {
        // the mirrored lanes' branch 1: its current rows in the middle's second half, right before its lane
        if (cur > limits_.scratch_tokens) return none;
        return {int64_t(lane_first_) * bs - cur, int64_t(lane_first_) * bs - cur};
    }
    // [history | current] from the lane's first block on; a denoising forward's rows in the free blocks after it
    const int64_t first = int64_t(lane_first_) * bs;
    const int64_t need = (seq_len_ + cur + bs - 1) / bs;
    if (int64_t(lane_first_) + need > lane_end) return none;
    for (int64_t j = int64_t(ids.size()); j < need; ++j)
        if (!pool_.is_free(BlockId(lane_first_ + j))) return none;
    return {first, first + seq_len_};
}

BlockTable::~BlockTable() { release(); }

int64_t BlockTable::num_logical_blocks() const { return (num_tokens_ + limits_.block_tokens - 1) / limits_.block_tokens; }

BlockId BlockTable::block_of_logical(int64_t logical) const {
    const int64_t sink = limits_.sink_blocks;
    if (logical < sink) return resident_[size_t(logical)];
    DZR_ASSERT(logical >= window_first_logical_);
    return resident_[size_t(sink + logical - window_first_logical_)];
}

void BlockTable::begin(int64_t video_tokens, int64_t register_tokens, bool commit) {
    const int64_t tpf = geometry_.tokens_per_frame;
    const int64_t bs = limits_.block_tokens;
    DZR_CHECK(!in_forward_,
              "kv {}: a new forward began while the previous {} forward ({} video tokens) was neither committed nor "
              "aborted",
              name_, commit_ ? "committing" : "denoise", video_tokens_);
    DZR_CHECK(video_tokens >= 0 && register_tokens >= 0 && video_tokens % tpf == 0,
              "kv {}: {} video tokens is not a whole number of {}-token frames (register tokens {})", name_,
              video_tokens, tpf, register_tokens);
    DZR_CHECK(video_tokens + register_tokens <= limits_.scratch_tokens &&
                  video_tokens <= geometry_.max_current_video_frames() * tpf,
              "kv {}: a forward of {} video + {} register tokens exceeds the scratch of {} tokens ({} video frames + "
              "{} register tokens)",
              name_, video_tokens, register_tokens, limits_.scratch_tokens, geometry_.max_current_video_frames(),
              geometry_.register_tokens);
    DZR_CHECK(!commit || video_tokens > 0, "kv {}: a committing forward needs video tokens", name_);

    const int64_t window_tokens = int64_t(config_.window_frames) * tpf;
    std::vector<BlockId> visible;
    int64_t visible_tokens = 0;
    int evict = 0;
    if (config_.reset_at_boundary) {
        DZR_CHECK(num_tokens_ + video_tokens <= window_tokens,
                  "kv {}: {} history + {} current tokens exceed the {}-frame window ({} tokens); with "
                  "kv.reset_at_boundary the window must be reset first",
                  name_, num_tokens_, video_tokens, config_.window_frames, window_tokens);
        DZR_CHECK(!commit || num_tokens_ + video_tokens <= limits_.max_committed_tokens,
                  "kv {}: committing {} tokens onto {} would exceed {} committed tokens (window {} - chunk {} "
                  "frames); with kv.reset_at_boundary the window must be reset first",
                  name_, video_tokens, num_tokens_, limits_.max_committed_tokens, config_.window_frames,
                  geometry_.chunk_frames);
        visible = resident_;
        visible_tokens = num_tokens_;
    } else {
        DZR_CHECK(video_tokens % bs == 0, "kv {}: {} video tokens is not a whole number of {}-token blocks", name_,
                  video_tokens, bs);
        const int64_t sink_tokens = int64_t(config_.sink_frames) * tpf;
        const int64_t limit = int64_t(config_.sink_frames) * tpf + window_tokens - video_tokens;
        if (num_tokens_ <= limit) {
            visible = resident_;
            visible_tokens = num_tokens_;
        } else {
            const int sink = limits_.sink_blocks;
            const int window_blocks = int((limit - sink_tokens) / bs);
            const int resident_window = int(resident_.size()) - sink;
            DZR_ASSERT(window_blocks <= resident_window);
            visible.assign(resident_.begin(), resident_.begin() + sink);
            visible.insert(visible.end(), resident_.end() - window_blocks, resident_.end());
            visible_tokens = int64_t(sink + window_blocks) * bs;
            // NOTE: blocks this committing forward cannot see are never visible again (later forwards see at
            // most window - 1 frames before their own), so they are evicted before allocating: oldest first.
            if (commit) evict = resident_window - window_blocks;
        }
    }
    DZR_ASSERT(int(visible.size()) <= limits_.table_width);

    const int64_t logical_now = num_logical_blocks();
    const int64_t logical_after = commit ? (num_tokens_ + video_tokens + bs - 1) / bs : logical_now;
    const int need = int(logical_after - logical_now);
    DZR_ASSERT(int(resident_.size()) - evict + need <= limits_.max_blocks_per_branch);
    // NOTE: evict before allocating, so a pool sized for one session (resident + pending <= the branch's
    // maximum) suffices. The evicted blocks are invisible to every later forward, so a failed allocation
    // below loses nothing.
    for (int i = 0; i < evict; ++i) {
        const auto it = resident_.begin() + limits_.sink_blocks;
        pool_.free(*it, owner_);
        resident_.erase(it);
        ++window_first_logical_;
    }
    std::vector<BlockId> fresh;
    // NOTE: a lane's blocks follow its history (the lane's first id after a release), so [history | current rows]
    // stay consecutive slots; the whole pool's free queue where that run is taken or past the lane
    // (a descending lane: the run right below the history, toward the lane's first id)
    BlockId next = resident_.empty() ? lane_first_ : BlockId(resident_.back() + 1);
    if (descending_)
        next = BlockId((resident_.empty() ? int64_t(lane_first_) + lane_blocks_
                                          : int64_t(*std::min_element(resident_.begin(), resident_.end()))) -
                       need);
    const bool in_lane = lane_blocks_ > 0 && need > 0 && next >= lane_first_ &&
                         int64_t(next) + need <= int64_t(lane_first_) + lane_blocks_ &&
                         pool_.allocate_run(next, need, owner_, fresh);
    if (!in_lane) pool_.allocate(need, owner_, fresh);
    pending_ = std::move(fresh);
    in_forward_ = true;
    commit_ = commit;
    video_tokens_ = video_tokens;
    register_tokens_ = register_tokens;

    std::fill(table_.begin(), table_.end(), kNullBlockId);
    std::copy(visible.begin(), visible.end(), table_.begin());
    num_table_blocks_ = int(visible.size());
    seq_len_ = visible_tokens;

    slots_.assign(size_t(video_tokens + register_tokens), kPadSlot);
    if (commit) {
        for (int64_t i = 0; i < video_tokens; ++i) {
            const int64_t p = num_tokens_ + i;
            const int64_t logical = p / bs;
            const BlockId block = logical < logical_now ? block_of_logical(logical)
                                                        : pending_[size_t(logical - logical_now)];
            slots_[size_t(i)] = int64_t(block) * bs + p % bs;
        }
    }
    in_place_ = find_in_place();
}

void BlockTable::commit() {
    DZR_CHECK(in_forward_, "kv {}: commit without an open forward", name_);
    if (commit_) {
        resident_.insert(resident_.end(), pending_.begin(), pending_.end());
        num_tokens_ += video_tokens_;
    }
    pending_.clear();
    in_forward_ = false;
    commit_ = false;
    in_place_ = {};
}

void BlockTable::abort() noexcept {
    for (BlockId id : pending_) {
        try {
            pool_.free(id, owner_);
        } catch (...) {
            // NOTE: only a corrupted pool can refuse its own pending blocks; abort must not throw.
        }
    }
    pending_.clear();
    in_forward_ = false;
    commit_ = false;
    in_place_ = {};
}

void BlockTable::release() noexcept {
    abort();
    for (BlockId id : resident_) {
        try {
            pool_.free(id, owner_);
        } catch (...) {
            // NOTE: as in abort(): release runs in destructors and failure paths and must not throw.
        }
    }
    resident_.clear();
    num_tokens_ = 0;
    window_first_logical_ = limits_.sink_blocks;
    std::fill(table_.begin(), table_.end(), kNullBlockId);
    num_table_blocks_ = 0;
    seq_len_ = 0;
    slots_.clear();
}

}  // namespace dzr
