#include "kv/kv_sizing.h"

#include "core/error.h"

namespace dzr {

namespace {

struct SessionParts {
    KvLimits limits;
    size_t block_bytes = 0;
    size_t cross_bytes = 0;
    size_t scratch_bytes = 0;
    int session_blocks = 0;
    size_t session_bytes = 0;
};

SessionParts session_parts(const KvGeometry& g, const KvConfig& c) {
    SessionParts p;
    p.limits = kv_limits(g, c);
    const size_t branches = size_t(g.num_branches);
    // one block = K and V rows of block_tokens tokens in every layer (with fp8_pool: E4M3 rows and their scales)
    p.block_bytes = size_t(p.limits.block_tokens) * g.pool_token_bytes();
    // cross caches: K and V, every layer, of the text tokens per branch and of the image tokens once (the branches
    // of one device share the image cache: their image context is the same)
    p.cross_bytes = (size_t(g.text_tokens) * branches + size_t(g.image_tokens)) * g.cross_token_bytes();
    // NOTE: a forward runs its layers one after the other, so the scratch (current tokens' K and V, written
    // and attended, never committed) holds one layer at a time: scratch_tokens rows, K and V, per branch.
    p.scratch_bytes = size_t(p.limits.scratch_tokens) * 2 * g.row_bytes() * branches;
    // NOTE: with lanes every branch owns lane_blocks ids: its history and the room for a forward's current rows
    p.session_blocks = g.lanes ? p.limits.lane_ids : p.limits.max_blocks_per_branch * g.num_branches;
    // the null block (id 0) has real, zero-filled storage: a padded read stays finite
    p.session_bytes = p.cross_bytes + p.scratch_bytes + size_t(p.session_blocks + 1) * p.block_bytes;
    return p;
}

/// Bytes `sessions` sessions open at once need: each its blocks and cross caches.
/// NOTE: the scratch and the null block once: the scratch holds the running forward's rows only, forwards run one at a
/// time, and the null block is read, never written
size_t sessions_bytes(const SessionParts& p, int sessions) {
    return p.session_bytes + size_t(sessions - 1) * (p.cross_bytes + size_t(p.session_blocks) * p.block_bytes);
}

/// "one session needs", "2 sessions need" (the sizing errors' subject).
std::string sessions_need(int sessions) {
    return sessions == 1 ? std::string("one session needs") : fmt::format("{} sessions need", sessions);
}

}  // namespace

std::string KvMemoryPlan::summary() const {
    return fmt::format(
        "kv cache: {} blocks of {} tokens ({} each) + null block = {}; cross caches {}; scratch {}; "
        "total {} of budget {} (one session: {} blocks, {}{})",
        num_blocks, limits.block_tokens, format_bytes(block_bytes), format_bytes(pool_bytes),
        format_bytes(cross_bytes), format_bytes(scratch_bytes), format_bytes(total_bytes), format_bytes(budget_bytes),
        session_blocks, format_bytes(session_bytes),
        sessions > 1 ? fmt::format("; {} sessions at once", sessions) : std::string());
}

size_t kv_session_bytes(const KvGeometry& geometry, const KvConfig& config) {
    return session_parts(geometry, config).session_bytes;
}

size_t kv_sessions_bytes(const KvGeometry& geometry, const KvConfig& config) {
    return sessions_bytes(session_parts(geometry, config), geometry.sessions);
}

KvMemoryPlan plan_kv_memory(const KvGeometry& geometry, const KvConfig& config, size_t budget_bytes) {
    const SessionParts p = session_parts(geometry, config);
    const int n = geometry.sessions;
    const size_t need = sessions_bytes(p, n);
    DZR_CHECK(budget_bytes >= need,
              "kv cache: {} {} bytes ({}: {} blocks of {} for {} branch(es) + null block, cross caches {}, "
              "scratch {}), but the budget is {} bytes ({}); raise kv.memory_budget or use \"auto\"",
              sessions_need(n), need, format_bytes(need), n * p.session_blocks, format_bytes(p.block_bytes),
              geometry.num_branches, format_bytes(size_t(n) * p.cross_bytes), format_bytes(p.scratch_bytes),
              budget_bytes, format_bytes(budget_bytes));
    KvMemoryPlan plan;
    plan.limits = p.limits;
    plan.sessions = n;
    plan.block_bytes = p.block_bytes;
    plan.cross_bytes = size_t(n) * p.cross_bytes;
    plan.scratch_bytes = p.scratch_bytes;
    plan.blocks_per_branch = geometry.lanes ? p.limits.lane_blocks : p.limits.max_blocks_per_branch;
    // NOTE: the lanes' middle and tail ids hold rows but are never handed out (KvCacheManager reserves them)
    plan.session_blocks = p.session_blocks;
    plan.session_bytes = p.session_bytes;
    plan.budget_bytes = budget_bytes;
    // cross caches first, then the scratch, then the null block, then whole blocks
    const size_t for_blocks = budget_bytes - plan.cross_bytes - p.scratch_bytes - p.block_bytes;
    const size_t blocks = for_blocks / p.block_bytes;
    DZR_CHECK(blocks <= size_t(INT32_MAX - 1), "kv cache: a budget of {} gives {} blocks, more than block ids allow",
              format_bytes(budget_bytes), blocks);
    plan.num_blocks = int(blocks);
    plan.pool_bytes = size_t(plan.num_blocks + 1) * p.block_bytes;
    plan.total_bytes = plan.cross_bytes + p.scratch_bytes + plan.pool_bytes;
    return plan;
}

size_t resolve_kv_budget(const KvGeometry& geometry, const KvConfig& config, size_t free_device_bytes) {
    const size_t session = kv_sessions_bytes(geometry, config);
    size_t budget = 0;
    switch (config.memory_budget.kind) {
        case KvBudgetKind::Auto:
            budget = session;
            break;
        case KvBudgetKind::Bytes:
            budget = size_t(config.memory_budget.bytes);
            break;
        case KvBudgetKind::Fraction:
            DZR_CHECK(free_device_bytes > 0,
                      "kv.memory_budget: {} needs the device's free memory, which is unknown here",
                      config.memory_budget.str());
            budget = size_t(double(free_device_bytes) * config.memory_budget.fraction);
            break;
    }
    if (free_device_bytes > 0)
        DZR_CHECK(budget <= free_device_bytes,
                  "kv cache: the budget {} ({} bytes; {} {} bytes) exceeds the device's free memory {} ({} bytes)",
                  config.memory_budget.str(), budget, sessions_need(geometry.sessions), session,
                  format_bytes(free_device_bytes), free_device_bytes);
    return budget;
}

}  // namespace dzr
