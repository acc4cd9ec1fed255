#pragma once
/// SelfAttentionCache over the paged KV cache: one CFG branch of a KvSession. The owner (the policy)
/// brackets each DiT forward with begin(spec) ... commit() (abort() on failure); the DiT calls attend()
/// once per layer, which
///   1. writes the current K/V rows (video, then register tokens) to the branch's scratch,
///   2. on a committing forward, also writes the video rows to their pool slots (slot mapping),
///   3. attends q over [visible history through the block table | current rows].
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kv/kv_cache_manager.h"
#include "kv/self_attention_cache.h"

namespace dzr {

enum class PagedAttentionPath : uint8_t {
    /// Copy the visible blocks and the current rows into one workspace buffer, then Backend::attention.
    /// Works on every backend and is bit-exact with DenseSelfAttentionCache on the same backend.
    Gather,
    /// Backend::paged_attention over the PagedKvView and the current rows, and Backend::scatter_kv for the
    /// committed rows: the CPU reference (f32) or the CUDA kernels (bf16/f16). On a device backend the
    /// padded block table and the slot mapping are mirrored into device memory by begin() (one upload per
    /// forward, outside the layers), so every layer's attend() is free of host data and capture-safe.
    Kernel,
};

class PagedSelfAttentionCache final : public SelfAttentionCache {
public:
    PagedSelfAttentionCache(KvSession& session, int branch, PagedAttentionPath path = PagedAttentionPath::Gather);

    /// Forward control for the owner (see KvSession). abort() fails the whole session closed: every
    /// branch's blocks and cross caches are released and the session needs reset() before the next forward.
    /// On the kernel path with device storage, begin() also uploads the padded table and slot mapping.
    void begin(const KvForwardSpec& spec);
    void commit() { session_.commit(branch_); }
    void abort() noexcept { session_.abort(); }

    /// The most workspace one attend() on `path` takes on `be` (the [history | current] K and V buffers of the
    /// gather path, and what be's paged_attention takes on the kernel path), for planning the backend's arena:
    /// kv_fill_walk run on a MeasuringBackend over `be` (measure_workspace).
    static size_t attend_workspace_bytes(const KvGeometry& geometry, const KvConfig& config, PagedAttentionPath path,
                                         Backend& be);

    int branch() const { return branch_; }
    KvSession& session() { return session_; }
    PagedAttentionPath path() const { return path_; }
    /// The device mirror of the padded block table (i32 [table_width]); undefined on the host paths.
    TensorView device_table() const { return dev_table_.view(); }
    /// The device mirror of the slot mapping (i64 [scratch_tokens], the open forward's first entries valid).
    TensorView device_slots() const { return dev_slots_.view(); }

    /// Visible history tokens of the open forward.
    int64_t history_tokens() const override;
    bool committing() const override;
    /// The kernel path's BlockTable::in_place_slot of the open forward (-1 on the gather path): what
    /// prepare_kernel_attend puts in the history view, and part of a captured forward's key.
    int64_t in_place_slot() const;
    void attend(Backend& be, int layer, const TensorView& q, const TensorView& k, const TensorView& v,
                int64_t video_tokens, float scale, const TensorView& out) override;
    void store(Backend& be, int layer, const TensorView& k, const TensorView& v, int64_t video_tokens) override;
    /// The kernel path's attend() up to the attention: checks the rows, scatters a committing forward's video rows
    /// to their pool slots, and returns the history view `be` reads (the device table when `be` is the storage's
    /// device). attend_branches() runs the attention of several branches' views in one call.
    PagedKvView prepare_kernel_attend(Backend& be, int layer, const TensorView& k, const TensorView& v,
                                      int64_t video_tokens);

private:
    /// The gather path's store of a committing forward's video rows into their pool slots.
    void store_committed(Backend& be, int layer, const TensorView& k, const TensorView& v, int64_t video_tokens);

    KvSession& session_;
    int branch_ = 0;
    PagedAttentionPath path_ = PagedAttentionPath::Gather;
    Tensor dev_table_;  // kernel path on a device backend: the padded table and slot mapping, uploaded at begin()
    Tensor dev_slots_;
    std::vector<BlockId> uploaded_table_;  // what the mirrors hold (begin() skips an upload of the same contents)
    std::vector<int64_t> uploaded_slots_;
};

}  // namespace dzr
