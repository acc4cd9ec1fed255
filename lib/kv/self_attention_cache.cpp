#include "kv/self_attention_cache.h"

#include "core/error.h"
#include "kv/paged_self_attention_cache.h"

namespace dzr {

void attend_branches(Backend& be, int layer, std::span<SelfAttentionCache* const> caches, const TensorView& q,
                     const TensorView& k, const TensorView& v, int64_t video_tokens, float scale, const TensorView& out) {
    const int64_t B = int64_t(caches.size());
    DZR_CHECK(B >= 1 && q.rank() == 3 && q.dim(0) % B == 0 && k.rank() == 3 && k.dim(0) % B == 0 &&
                  v.shape == k.shape && out.shape == q.shape,
              "attend_branches: q {} k {} v {} out {} are not the rows of {} branches", q.str(), k.str(), v.str(),
              out.str(), B);
    const int64_t lq = q.dim(0) / B, lk = k.dim(0) / B;
    std::vector<PagedSelfAttentionCache*> paged;
    for (SelfAttentionCache* c : caches) {
        auto* p = dynamic_cast<PagedSelfAttentionCache*>(c);
        if (p && p->path() == PagedAttentionPath::Kernel) paged.push_back(p);
    }
    if (B == 1 || int64_t(paged.size()) != B) {
        for (int64_t b = 0; b < B; ++b)
            caches[size_t(b)]->attend(be, layer, q.slice(0, b * lq, lq), k.slice(0, b * lk, lk),
                                      v.slice(0, b * lk, lk), video_tokens, scale, out.slice(0, b * lq, lq));
        return;
    }
    std::vector<PagedKvView> views;
    for (int64_t b = 0; b < B; ++b)
        views.push_back(paged[size_t(b)]->prepare_kernel_attend(be, layer, k.slice(0, b * lk, lk),
                                                                v.slice(0, b * lk, lk), video_tokens));
    be.paged_attention_batched(AttentionParams{scale}, q, views, layer, k, v, out);
}

bool current_rows_in_place(const Backend& be, int layer, std::span<SelfAttentionCache* const> caches, int64_t rows,
                           TensorView& k, TensorView& v) {
    if (caches.size() != 2) return false;
    auto* p0 = dynamic_cast<PagedSelfAttentionCache*>(caches[0]);
    auto* p1 = dynamic_cast<PagedSelfAttentionCache*>(caches[1]);
    if (!p0 || !p1 || p0->path() != PagedAttentionPath::Kernel || p1->path() != PagedAttentionPath::Kernel) return false;
    KvSession& s = p0->session();
    if (&s != &p1->session() || p0->branch() != 0 || p1->branch() != 1) return false;
    const KvCacheManager& m = s.manager();
    const KvLimits& l = m.limits();
    if (!m.has_lanes() || !l.mirrored() || !m.has_storage() || m.storage_backend()->device() != be.device() ||
        rows != l.scratch_tokens)
        return false;
    const BlockTable &t0 = s.table(0), &t1 = s.table(1);
    if (!t0.in_forward() || !t1.in_forward() || t0.committing() || t1.committing() ||
        t0.current_video_tokens() + t0.current_register_tokens() != rows ||
        t1.current_video_tokens() + t1.current_register_tokens() != rows)
        return false;
    // NOTE: both in place with their current rows in the middle: branch 0's at its start, branch 1's right after
    const int64_t middle = int64_t(1 + l.lane_blocks) * l.block_tokens;
    const BlockTable::InPlace a = t0.in_place(), b = t1.in_place();
    if (a.current != middle || b.current < 0 || b.current + m.row_shift(1) != middle + rows) return false;
    k = m.middle_k(layer);
    v = m.middle_v(layer);
    return k.defined() && v.defined();
}

std::vector<KvForwardSpec> kv_fill_walk(const KvGeometry& g, const KvConfig& c) {
    const KvLimits l = kv_limits(g, c);
    const int64_t chunk = int64_t(g.chunk_frames) * g.tokens_per_frame;
    std::vector<KvForwardSpec> walk = {KvForwardSpec::prefill(g), KvForwardSpec::denoise(g)};
    int64_t committed = int64_t(g.prefill_frames) * g.tokens_per_frame;
    // NOTE: with reset_at_boundary a commit past max_committed_tokens is refused (a window reset is due by then);
    // sliding, the first commit past it evicts (and trims the dense cache), and the visible history stays the same
    while (c.reset_at_boundary ? committed + chunk <= l.max_committed_tokens : committed <= l.max_committed_tokens) {
        walk.push_back(KvForwardSpec::commit_chunk(g));
        walk.push_back(KvForwardSpec::denoise(g));
        committed += chunk;
    }
    return walk;
}

}  // namespace dzr
