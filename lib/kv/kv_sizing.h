#pragma once
/// KV-cache memory sizing: a pure function from (geometry, config, byte budget) to the number of pool
/// blocks and the bytes of every part. The budget pays, in this order: the cross-attention caches, the
/// scratch, the null block, then pool blocks. Every session the geometry holds at once (KvGeometry::sessions;
/// each with every CFG branch's largest committed window plus the chunk being committed, and its cross caches)
/// must fit with one scratch and one null block, or sizing fails naming the bytes.
#include <cstddef>
#include <cstdint>
#include <string>

#include "config/kv_config.h"

namespace dzr {

struct KvMemoryPlan {
    KvLimits limits;
    size_t block_bytes = 0;        // one block: K and V of block_tokens tokens in every layer
    int sessions = 1;              // sessions open at once (KvGeometry::sessions)
    size_t cross_bytes = 0;        // K and V, every layer: text per branch, image once (shared by the branches);
                                   // every session's
    size_t scratch_bytes = 0;      // every branch's scratch (K and V rows of one layer at a time)
    int blocks_per_branch = 0;     // one session, one branch
    int session_blocks = 0;        // one session, every branch
    size_t session_bytes = 0;      // cross + scratch + null block + session_blocks blocks
    size_t budget_bytes = 0;       // the budget the plan was made for
    int num_blocks = 0;            // pool blocks handed out (ids 1..num_blocks); block 0 is the null block
    size_t pool_bytes = 0;         // (num_blocks + 1) * block_bytes
    size_t total_bytes = 0;        // cross + scratch + pool

    /// Block ids in the pool tensors, the null block included.
    int total_block_ids() const { return num_blocks + 1; }
    /// One multi-line summary for the start-of-run log.
    std::string summary() const;
};

/// Sizes the cache for `budget_bytes`. Throws dzr::Error ("... one session needs X bytes, the budget is Y")
/// when the geometry's sessions do not fit. Validates the config against the geometry first.
KvMemoryPlan plan_kv_memory(const KvGeometry& geometry, const KvConfig& config, size_t budget_bytes);

/// Bytes one session needs alone (its blocks and cross caches, the scratch and the null block).
size_t kv_session_bytes(const KvGeometry& geometry, const KvConfig& config);
/// Bytes geometry.sessions sessions open at once need (the budget "auto" resolves to): each its blocks and cross
/// caches, one scratch and one null block. kv_session_bytes for one session.
size_t kv_sessions_bytes(const KvGeometry& geometry, const KvConfig& config);

/// The byte budget for `config.memory_budget`: auto = the geometry's sessions; a fraction of `free_device_bytes`; or
/// fixed bytes. `free_device_bytes` = 0 means unknown: a fraction then fails, auto and bytes are not
/// checked against the device. Throws when the result exceeds known free memory.
size_t resolve_kv_budget(const KvGeometry& geometry, const KvConfig& config, size_t free_device_bytes);

}  // namespace dzr
