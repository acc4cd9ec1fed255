#include "kv/paged_self_attention_cache.h"

#include <algorithm>

#include "core/error.h"
#include "kv/paged_attention.h"

namespace dzr {

PagedSelfAttentionCache::PagedSelfAttentionCache(KvSession& session, int branch, PagedAttentionPath path)
    : session_(session), branch_(branch), path_(path) {
    (void)session_.table(branch_);  // checks the branch index
}

size_t PagedSelfAttentionCache::attend_workspace_bytes(const KvGeometry& geometry, const KvConfig& config,
                                                       DType compute_dtype) {
    const KvLimits l = kv_limits(geometry, config);
    const size_t rows = size_t(l.max_history_tokens + l.scratch_tokens);
    const size_t one = rows * size_t(geometry.num_kv_heads) * size_t(geometry.head_dim) * dtype_size(compute_dtype);
    const size_t aligned = (one + Arena::kAlign - 1) / Arena::kAlign * Arena::kAlign;
    return 2 * aligned;
}

int64_t PagedSelfAttentionCache::history_tokens() const {
    const BlockTable& t = session_.table(branch_);
    DZR_CHECK(t.in_forward(), "kv {}: history_tokens() outside a forward (call begin first)", t.name());
    return t.seq_len();
}

void PagedSelfAttentionCache::attend(Backend& be, int layer, const TensorView& q, const TensorView& k,
                                     const TensorView& v, int64_t video_tokens, float scale, const TensorView& out) {
    KvCacheManager& m = session_.manager();
    const KvGeometry& g = m.geometry();
    const BlockTable& t = session_.table(branch_);
    DZR_CHECK(t.in_forward(), "kv {}: attend (layer {}) outside a forward (call begin first)", t.name(), layer);
    DZR_CHECK(!session_.failed() && !session_.closed(), "kv {}: attend on a {} session", t.name(),
              session_.closed() ? "closed" : "failed");
    DZR_CHECK(m.has_storage(), "kv {}: the cache was built without storage (bookkeeping only)", t.name());
    DZR_CHECK(layer >= 0 && layer < g.num_layers, "kv {}: layer {} out of range [0, {})", t.name(), layer,
              g.num_layers);
    const int64_t cur = t.current_video_tokens() + t.current_register_tokens();
    const Shape want{cur, g.num_kv_heads, g.head_dim};
    DZR_CHECK(video_tokens == t.current_video_tokens() && k.shape == want && v.shape == want,
              "kv {}: layer {}: k {} and v {} with {} video tokens do not match the forward's {} video + {} register "
              "tokens of {} heads x {}",
              t.name(), layer, k.str(), v.str(), video_tokens, t.current_video_tokens(), t.current_register_tokens(),
              g.num_kv_heads, g.head_dim);

    ArenaScope scope(be.workspace());
    // 1. write: current rows -> the branch scratch (one layer at a time)
    const TensorView sk = m.scratch_k(branch_).slice(0, 0, cur);
    const TensorView sv = m.scratch_v(branch_).slice(0, 0, cur);
    be.copy(k, sk);
    be.copy(v, sv);

    // 2. committing forward: video rows -> their pool slots (consecutive slots are consecutive rows)
    const TensorView pk = m.pool_k(layer), pv = m.pool_v(layer);
    if (t.committing()) {
        const std::vector<int64_t>& slots = t.slot_mapping();
        if (path_ == PagedAttentionPath::Kernel) {
            scatter_kv_cpu(session_.history_view(branch_), layer, slots.data(), video_tokens, pk.dim(0), k, v);
        } else {
            for (int64_t i = 0; i < video_tokens;) {
                int64_t n = 1;
                while (i + n < video_tokens && slots[size_t(i + n)] == slots[size_t(i)] + n) ++n;
                be.copy(k.slice(0, i, n), pk.slice(0, slots[size_t(i)], n));
                be.copy(v.slice(0, i, n), pv.slice(0, slots[size_t(i)], n));
                i += n;
            }
        }
    }

    // 3. attend over [visible history | current]
    if (path_ == PagedAttentionPath::Kernel) {
        DZR_CHECK(be.device().is_cpu(), "kv {}: the paged attention kernel path exists on the CPU only (backend {})",
                  t.name(), be.name());
        paged_attention_cpu(q, session_.history_view(branch_), session_.scratch_view(branch_, cur), layer, scale, out);
        return;
    }
    const int64_t hist = t.seq_len(), bs = t.block_tokens();
    // [history | current] keys and values, gathered: [hist + cur, H, D]
    const TensorView kall = be.scratch(Shape{hist + cur, g.num_kv_heads, g.head_dim});
    const TensorView vall = be.scratch(Shape{hist + cur, g.num_kv_heads, g.head_dim});
    const std::vector<BlockId>& table = t.padded_table();
    for (int j = 0; j < t.num_table_blocks(); ++j) {
        const int64_t start = int64_t(j) * bs, n = std::min(bs, hist - start);
        const int64_t row = int64_t(table[size_t(j)]) * bs;
        be.copy(pk.slice(0, row, n), kall.slice(0, start, n));
        be.copy(pv.slice(0, row, n), vall.slice(0, start, n));
    }
    be.copy(sk, kall.slice(0, hist, cur));
    be.copy(sv, vall.slice(0, hist, cur));
    be.attention(AttentionParams{scale}, q, kall, vall, TensorView{}, out);
}

}  // namespace dzr
