#pragma once
/// The dense reference SelfAttentionCache (one CFG branch): history kept per layer as contiguous rows,
/// attention = Backend::attention over concat(visible history, current). It is what DreamZero's own code
/// does (cat(cache, new)[-max_attention_size:]) and the test reference for PagedSelfAttentionCache.
///
/// Window rule (the same settings as the paged cache): a forward with c current video tokens sees at most
/// (sink + window) frames of history + current: all history if it fits, else the first sink frames plus the
/// newest rows. A committing forward's video rows are staged during attend and appended at commit().
/// Storage comes from the backend once, at construction ((sink + window + one chunk) frames per layer).
#include <cstdint>

#include "backend/backend.h"
#include "config/kv_config.h"
#include "kv/self_attention_cache.h"

namespace dzr {

class DenseSelfAttentionCache final : public SelfAttentionCache {
public:
    DenseSelfAttentionCache(Backend& be, const KvGeometry& geometry, const KvConfig& config);

    /// Forward control, as PagedSelfAttentionCache (a second begin before commit/abort throws).
    void begin(const KvForwardSpec& spec);
    void commit();
    /// Drops the staged rows of the open forward (the history is kept).
    void abort() noexcept;
    /// Drops the history.
    void reset();

    /// The most workspace one attend() or commit() takes on `be` (concat buffers, the trim buffer): kv_fill_walk
    /// run on a MeasuringBackend over `be` (measure_workspace).
    static size_t workspace_bytes(const KvGeometry& geometry, const KvConfig& config, Backend& be);

    /// Committed rows kept (after the window trim).
    int64_t committed_tokens() const { return len_; }
    /// Visible history tokens of the open forward.
    int64_t history_tokens() const override;
    bool committing() const override { return in_forward_ && spec_.commit; }
    void attend(Backend& be, int layer, const TensorView& q, const TensorView& k, const TensorView& v,
                int64_t video_tokens, float scale, const TensorView& out) override;
    void store(Backend& be, int layer, const TensorView& k, const TensorView& v, int64_t video_tokens) override;

private:
    TensorView rows(const Tensor& t, int layer, int64_t start, int64_t n) const;
    /// attend()'s and store()'s operand checks (`what` names the call).
    void check_rows(const char* what, int layer, const TensorView& k, const TensorView& v, int64_t video_tokens) const;
    /// A committing forward's video rows staged right after the history; commit() makes them history.
    void stage(Backend& be, int layer, const TensorView& k, const TensorView& v, int64_t video_tokens);

    Backend& be_;
    KvGeometry geometry_;
    KvConfig config_;
    int64_t capacity_ = 0;   // rows per layer
    Tensor k_, v_;           // [layers, capacity, H, D]
    int64_t len_ = 0;

    bool in_forward_ = false;
    KvForwardSpec spec_;
    int64_t video_tokens_ = 0;
    int64_t sink_rows_ = 0;     // visible: rows [0, sink_rows_) ...
    int64_t window_start_ = 0;  // ... and rows [window_start_, len_)
};

}  // namespace dzr
