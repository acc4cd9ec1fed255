#include "kv/self_attention_cache.h"

namespace dzr {

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
