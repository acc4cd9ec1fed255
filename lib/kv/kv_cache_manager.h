#pragma once
/// The paged KV cache: one block pool, the pool storage (K and V per layer), a scratch per CFG branch and
/// the cross-attention caches, all allocated once at load; and the sessions that use them.
///
/// A session (one rollout, the warm-up included) has a BlockTable per CFG branch and the branch's cross caches.
/// The cache holds KvGeometry::sessions sessions at once (one by default): each takes its blocks from the one
/// pool and has cross caches of its own; they share the scratch, so their forwards run one at a time. Per forward
/// of one branch:
///
///     begin_forward(branch, spec)   allocate (committing forwards) + slot mapping + padded block table
///     attend per layer               write current K/V to the scratch (and to the slots), attend
///     commit(branch)                 the staged video K/V become history (denoise: nothing to commit)
///
/// A failed forward calls abort(): the session releases every block and cross cache it holds (fail
/// closed) and refuses further forwards until reset(). reset() drops the self-attention history, keeping
/// the cross caches it is told to keep; close() releases everything, and the session object's destructor
/// closes it. Block metadata lives on the host; kernels get plain views (kv_view.h).
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "kv/block_pool.h"
#include "kv/block_table.h"
#include "kv/cross_attention_cache.h"
#include "config/kv_config.h"
#include "kv/kv_sizing.h"
#include "backend/kv_view.h"

namespace dzr {

/// Which cross caches survive a reset. A window reset keeps the text; a full reset keeps nothing.
struct KvResetOptions {
    bool keep_text = false;
    bool keep_image = false;
};

class KvSession;

class KvCacheManager {
public:
    /// Sizes the cache for `budget_bytes` (plan_kv_memory) and, when `storage` is given, allocates the pool,
    /// scratch and cross caches on it. Without storage it keeps the bookkeeping only (views carry null data).
    KvCacheManager(const KvGeometry& geometry, const KvConfig& config, size_t budget_bytes,
                   Backend* storage = nullptr);
    /// Same with a ready plan (its num_blocks is taken as given).
    KvCacheManager(const KvGeometry& geometry, const KvConfig& config, const KvMemoryPlan& plan,
                   Backend* storage = nullptr);
    ~KvCacheManager();
    KvCacheManager(const KvCacheManager&) = delete;
    KvCacheManager& operator=(const KvCacheManager&) = delete;

    const KvGeometry& geometry() const { return geometry_; }
    const KvConfig& config() const { return config_; }
    const KvMemoryPlan& plan() const { return plan_; }
    const KvLimits& limits() const { return plan_.limits; }
    BlockPool& pool() { return pool_; }
    const BlockPool& pool() const { return pool_; }
    bool has_storage() const { return storage_ != nullptr; }
    Backend* storage_backend() const { return storage_; }

    /// Opens a session. At most geometry().sessions may be open at once (the cross caches are sized for them); the
    /// returned object closes itself when destroyed and must not outlive the manager.
    std::unique_ptr<KvSession> open_session(const std::string& name);
    /// Whether any session is open.
    bool session_open() const;

    /// Pool rows of one layer, [block ids * block_tokens, H, D]: row = slot. Null data without storage. F8_E4M3
    /// with geometry().fp8_pool, else the geometry's dtype.
    TensorView pool_k(int layer) const;
    TensorView pool_v(int layer) const;
    /// With fp8_pool: the f32 scales of one layer's pool rows, [block ids * block_tokens, H] (one per token and
    /// head); an undefined view otherwise.
    TensorView pool_k_scale(int layer) const;
    TensorView pool_v_scale(int layer) const;
    /// The rows past a slot where `branch`'s pool slots lie (slot s at pool row s + row_shift): the mirrored lanes'
    /// branch 1 (KvLimits::shift_rows); 0 otherwise.
    int64_t row_shift(int branch) const;
    /// `branch`'s view of one layer's pool rows: row s is the branch's slot s (pool_k / pool_v past row_shift).
    TensorView branch_pool_k(int branch, int layer) const;
    TensorView branch_pool_v(int branch, int layer) const;
    /// Whether the pool holds the lanes (KvGeometry::lanes, and enough ids for them).
    bool has_lanes() const { return lanes_; }
    /// The mirrored lanes' middle of `layer`: [2 * scratch_tokens, H, D] rows of K (and V) between the branches' lanes,
    /// branch 0's current rows first; undefined views without mirrored lanes or storage.
    TensorView middle_k(int layer) const;
    TensorView middle_v(int layer) const;
    /// A branch's scratch rows, [scratch_tokens, H, D] (one layer at a time).
    TensorView scratch_k(int branch) const;
    TensorView scratch_v(int branch) const;

private:
    friend class KvSession;
    void init();
    /// The cross caches of the session in `slot`: the text per branch, the image once.
    void add_cross_caches(int slot);
    TensorView layer_rows(const Tensor& t, int layer) const;
    TensorView layer_scales(const Tensor& t, int layer) const;
    TensorView branch_rows(const Tensor& t, int branch) const;
    TensorView shifted(const TensorView& rows, int branch) const;
    CrossAttentionCache& cross(int slot, int branch, CrossKind kind);

    KvGeometry geometry_;
    KvConfig config_;
    KvMemoryPlan plan_;
    Backend* storage_ = nullptr;
    BlockPool pool_;
    Tensor pool_k_, pool_v_;        // [layers, block ids, block_tokens, H, D]
    Tensor pool_k_scale_, pool_v_scale_;  // fp8_pool: f32 [layers, block ids, block_tokens, H]
    Tensor scratch_k_, scratch_v_;  // [branches, scratch_tokens, H, D]
    // NOTE: the image context is the same for both CFG branches (only the text differs), so the branches held on one
    // device share one image cache; cross_ holds every cache once, cross_of_ maps [slot][branch][text, image] to them.
    std::vector<std::unique_ptr<CrossAttentionCache>> cross_;
    std::vector<CrossAttentionCache*> cross_of_;
    std::vector<KvSession*> slots_;  // the open session in each place (null: free); geometry_.sessions places
    bool lanes_ = false;
};

class KvSession {
public:
    ~KvSession();
    KvSession(const KvSession&) = delete;
    KvSession& operator=(const KvSession&) = delete;

    static constexpr int kPositive = 0;
    static constexpr int kNegative = 1;

    const std::string& name() const { return name_; }
    int num_branches() const { return int(tables_.size()); }
    KvCacheManager& manager() { return manager_; }
    const KvGeometry& geometry() const { return manager_.geometry(); }

    // ---- forwards ------------------------------------------------------------------------------
    /// Opens a forward on `branch` (see BlockTable::begin). Throws when the session is closed or failed,
    /// when the branch already has an open forward (pending-commit guard), or when the pool is exhausted.
    void begin_forward(int branch, const KvForwardSpec& spec);
    /// Ends the branch's forward; a committing forward's video K/V become history.
    void commit(int branch);
    /// A forward failed: release every block (pending and committed) and cross cache of every branch. The
    /// session refuses forwards until reset(). Never throws.
    void abort() noexcept;
    bool failed() const { return failed_; }

    // ---- lifetime ------------------------------------------------------------------------------
    /// Drops the self-attention history of every branch (and any open forward) and the cross caches not
    /// kept; clears a failed state. The session is reusable at once.
    void reset(const KvResetOptions& options = {});
    /// DreamZero's window reset (csf >= local_attn_size): history dropped, text cross cache kept.
    void reset_window() { reset({.keep_text = true, .keep_image = false}); }
    /// Releases everything; idempotent. Later calls throw "session ... is closed".
    void close() noexcept;
    bool closed() const { return closed_; }

    // ---- cross-attention caches -----------------------------------------------------------------
    void populate_cross(int branch, CrossKind kind, std::span<const LayerKv> layers);
    /// The branch's cross cache's storage, to compute the context's projections straight into it
    /// (CrossAttentionCache::begin_write); then commit_cross(). The branches of one device share the image cache.
    std::vector<LayerKv> begin_cross_write(int branch, CrossKind kind);
    /// Between begin_cross_write and commit_cross: one layer's K and V from the caller's buffers (an FP8 cache
    /// quantizes them; CrossAttentionCache::store_layer).
    void store_cross_layer(int branch, CrossKind kind, int layer, const TensorView& k, const TensorView& v);
    void commit_cross(int branch, CrossKind kind);
    const CrossAttentionCache& cross(int branch, CrossKind kind) const;

    // ---- views for the open forward -------------------------------------------------------------
    const BlockTable& table(int branch) const;
    /// The branch's visible history through its padded block table (needs an open forward). Its
    /// slot_offset() also addresses the pool slots a committing forward writes.
    PagedKvView history_view(int branch) const;
    /// The branch's scratch holding `tokens` current rows (layer_stride 0: one layer at a time).
    ContiguousKvView scratch_view(int branch, int64_t tokens) const;
    std::string branch_name(int branch) const;

private:
    friend class KvCacheManager;
    KvSession(KvCacheManager& manager, std::string name, int slot);
    void check_usable(const char* what) const;
    void check_branch(int branch) const;

    KvCacheManager& manager_;
    std::string name_;
    int slot_ = 0;  // its place in the manager: which cross caches are its own
    std::vector<std::unique_ptr<BlockTable>> tables_;
    bool closed_ = false;
    bool failed_ = false;
};

/// One forward of one branch, failing closed: begins on construction; commit() ends it; destroyed without
/// commit (an exception left the forward) it aborts the session, releasing every block it held.
class KvForwardScope {
public:
    KvForwardScope(KvSession& session, int branch, const KvForwardSpec& spec) : session_(session), branch_(branch) {
        session_.begin_forward(branch_, spec);
    }
    ~KvForwardScope() {
        if (!done_) session_.abort();
    }
    KvForwardScope(const KvForwardScope&) = delete;
    KvForwardScope& operator=(const KvForwardScope&) = delete;

    void commit() {
        session_.commit(branch_);
        done_ = true;
    }

private:
    KvSession& session_;
    int branch_ = 0;
    bool done_ = false;
};

}  // namespace dzr
