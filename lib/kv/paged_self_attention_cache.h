#pragma once
/// SelfAttentionCache over the paged KV cache: one CFG branch of a KvSession. The owner (the policy)
/// brackets each DiT forward with begin(spec) ... commit() (abort() on failure); the DiT calls attend()
/// once per layer, which
///   1. writes the current K/V rows (video, then register tokens) to the branch's scratch,
///   2. on a committing forward, also writes the video rows to their pool slots (slot mapping),
///   3. attends q over [visible history through the block table | current rows].
#include <cstdint>

#include "kv/kv_cache_manager.h"
#include "kv/self_attention_cache.h"

namespace dzr {

enum class PagedAttentionPath : uint8_t {
    /// Copy the visible blocks and the current rows into one workspace buffer, then Backend::attention.
    /// Works on every backend and is bit-exact with DenseSelfAttentionCache on the same backend.
    Gather,
    /// paged_attention_cpu over PagedKvView + ContiguousKvView (f32 host only): the reference a CUDA paged
    /// kernel will match.
    Kernel,
};

class PagedSelfAttentionCache final : public SelfAttentionCache {
public:
    PagedSelfAttentionCache(KvSession& session, int branch, PagedAttentionPath path = PagedAttentionPath::Gather);

    /// Forward control for the owner (see KvSession). abort() fails the whole session closed: every
    /// branch's blocks and cross caches are released and the session needs reset() before the next forward.
    void begin(const KvForwardSpec& spec) { session_.begin_forward(branch_, spec); }
    void commit() { session_.commit(branch_); }
    void abort() noexcept { session_.abort(); }

    /// The most workspace one attend() takes (the gather path's [history | current] K and V buffers), for
    /// planning the backend's arena; the kernel path takes none.
    static size_t attend_workspace_bytes(const KvGeometry& geometry, const KvConfig& config, DType compute_dtype);

    int branch() const { return branch_; }
    KvSession& session() { return session_; }

    /// Visible history tokens of the open forward.
    int64_t history_tokens() const override;
    void attend(Backend& be, int layer, const TensorView& q, const TensorView& k, const TensorView& v,
                int64_t video_tokens, float scale, const TensorView& out) override;

private:
    KvSession& session_;
    int branch_ = 0;
    PagedAttentionPath path_ = PagedAttentionPath::Gather;
};

}  // namespace dzr
