#include "kv/kv_cache_manager.h"

#include <algorithm>

#include "core/error.h"
#include "core/log.h"

namespace dzr {

namespace {

std::string branch_label(int branch, int num_branches) {
    if (num_branches == 2) return branch == KvSession::kPositive ? "positive" : "negative";
    return fmt::format("#{}", branch);
}

/// "session 'a'", "sessions 'a', 'b'" (the open sessions, for a refusal).
std::string open_names(const std::vector<KvSession*>& slots) {
    std::string names;
    int n = 0;
    for (const KvSession* s : slots)
        if (s) names += fmt::format("{}'{}'", n++ ? ", " : "", s->name());
    return fmt::format("session{} {}", n == 1 ? "" : "s", names);
}

}  // namespace

// ---- KvCacheManager -----------------------------------------------------------------------------

KvCacheManager::KvCacheManager(const KvGeometry& geometry, const KvConfig& config, size_t budget_bytes,
                               Backend* storage)
    : KvCacheManager(geometry, config, plan_kv_memory(geometry, config, budget_bytes), storage) {}

KvCacheManager::KvCacheManager(const KvGeometry& geometry, const KvConfig& config, const KvMemoryPlan& plan,
                               Backend* storage)
    : geometry_(geometry), config_(config), plan_(plan), storage_(storage), pool_(plan.num_blocks, plan.block_bytes) {
    config_.validate(geometry_);
    DZR_CHECK(plan_.sessions == geometry_.sessions, "kv cache: a plan for {} sessions, a geometry of {}",
              plan_.sessions, geometry_.sessions);
    slots_.assign(size_t(geometry_.sessions), nullptr);
    init();
}

KvCacheManager::~KvCacheManager() {
    // NOTE: a session that outlives its manager must not free into a destroyed pool: close it now, so its
    // own destructor finds nothing left to release.
    for (KvSession* s : slots_)
        if (s) s->close();
}

bool KvCacheManager::session_open() const {
    return std::any_of(slots_.begin(), slots_.end(), [](const KvSession* s) { return s != nullptr; });
}

void KvCacheManager::init() {
    const int64_t heads = geometry_.num_kv_heads, hd = geometry_.head_dim;
    if (storage_) {
        const Shape pool_shape{geometry_.num_layers, plan_.total_block_ids(), plan_.limits.block_tokens, heads, hd};
        const DType pool_dtype = geometry_.fp8_pool ? DType::F8_E4M3 : geometry_.dtype;
        pool_k_ = storage_->alloc(pool_shape, pool_dtype);
        pool_v_ = storage_->alloc(pool_shape, pool_dtype);
        if (geometry_.fp8_pool) {
            // NOTE: zero-filled like the values, so the null block dequantizes to zeros
            const Shape scale_shape{geometry_.num_layers, plan_.total_block_ids(), plan_.limits.block_tokens, heads};
            pool_k_scale_ = storage_->alloc(scale_shape, DType::F32);
            pool_v_scale_ = storage_->alloc(scale_shape, DType::F32);
        }
        const Shape scratch_shape{geometry_.num_branches, plan_.limits.scratch_tokens, heads, hd};
        scratch_k_ = storage_->alloc(scratch_shape, geometry_.dtype);
        scratch_v_ = storage_->alloc(scratch_shape, geometry_.dtype);
    }
    // NOTE: the lanes' middle (and the tail of branch 1's shifted rows) hold rows but are never handed out
    const KvLimits& l = plan_.limits;
    lanes_ = geometry_.lanes && l.lane_ids <= pool_.num_ids();
    if (lanes_ && l.mirrored()) {
        if (l.middle_blocks > 0) pool_.reserve(BlockId(1 + l.lane_blocks), l.middle_blocks);
        if (l.shift_rows > 0) pool_.reserve(BlockId(1 + 2 * l.lane_blocks + l.middle_blocks), 1);
    }
    for (int slot = 0; slot < geometry_.sessions; ++slot) add_cross_caches(slot);
    log()->debug("{}", plan_.summary());
}

void KvCacheManager::add_cross_caches(int slot) {
    const int64_t heads = geometry_.num_kv_heads, hd = geometry_.head_dim;
    const std::string session = geometry_.sessions > 1 ? fmt::format("session {} ", slot) : std::string();
    CrossAttentionCache* image = nullptr;
    for (int b = 0; b < geometry_.num_branches; ++b) {
        cross_.push_back(std::make_unique<CrossAttentionCache>(
            fmt::format("{}{} {}", session, branch_label(b, geometry_.num_branches), cross_kind_name(CrossKind::Text)),
            geometry_.num_layers, geometry_.text_tokens, int(heads), int(hd), geometry_.dtype, storage_,
            geometry_.fp8_cross));
        cross_of_.push_back(cross_.back().get());
        if (!image) {
            const std::string owner = geometry_.num_branches > 1 ? "shared" : branch_label(b, geometry_.num_branches);
            cross_.push_back(std::make_unique<CrossAttentionCache>(
                fmt::format("{}{} {}", session, owner, cross_kind_name(CrossKind::Image)), geometry_.num_layers,
                geometry_.image_tokens, int(heads), int(hd), geometry_.dtype, storage_, geometry_.fp8_cross));
            image = cross_.back().get();
        }
        cross_of_.push_back(image);
    }
}

std::unique_ptr<KvSession> KvCacheManager::open_session(const std::string& name) {
    const auto free = std::find(slots_.begin(), slots_.end(), nullptr);
    const bool one = slots_.size() == 1;
    DZR_CHECK(free != slots_.end(),
              "kv cache: cannot open session '{}' while {} {} open (the cache holds {}; close {} first)", name,
              open_names(slots_), one ? "is" : "are",
              one ? std::string("one session") : fmt::format("{} sessions", slots_.size()), one ? "it" : "one");
    std::unique_ptr<KvSession> s(new KvSession(*this, name, int(free - slots_.begin())));
    *free = s.get();
    return s;
}

TensorView KvCacheManager::layer_rows(const Tensor& t, int layer) const {
    DZR_CHECK(layer >= 0 && layer < geometry_.num_layers, "kv cache: layer {} out of range [0, {})", layer,
              geometry_.num_layers);
    const Shape rows{int64_t(plan_.total_block_ids()) * plan_.limits.block_tokens, geometry_.num_kv_heads,
                     geometry_.head_dim};
    if (!t.defined()) return TensorView(nullptr, geometry_.fp8_pool ? DType::F8_E4M3 : geometry_.dtype, rows);
    // [layers, block ids, block_tokens, H, D] -> [block ids * block_tokens, H, D] of one layer
    return t.view().slice(0, layer, 1).reshape(rows);
}

TensorView KvCacheManager::layer_scales(const Tensor& t, int layer) const {
    DZR_CHECK(layer >= 0 && layer < geometry_.num_layers, "kv cache: layer {} out of range [0, {})", layer,
              geometry_.num_layers);
    if (!geometry_.fp8_pool) return TensorView{};
    const Shape rows{int64_t(plan_.total_block_ids()) * plan_.limits.block_tokens, geometry_.num_kv_heads};
    if (!t.defined()) return TensorView(nullptr, DType::F32, rows);
    // [layers, block ids, block_tokens, H] -> [block ids * block_tokens, H] of one layer
    return t.view().slice(0, layer, 1).reshape(rows);
}

TensorView KvCacheManager::branch_rows(const Tensor& t, int branch) const {
    DZR_CHECK(branch >= 0 && branch < geometry_.num_branches, "kv cache: branch {} out of range [0, {})", branch,
              geometry_.num_branches);
    const Shape rows{plan_.limits.scratch_tokens, geometry_.num_kv_heads, geometry_.head_dim};
    if (!t.defined()) return TensorView(nullptr, geometry_.dtype, rows);
    // [branches, scratch_tokens, H, D] -> [scratch_tokens, H, D] of one branch
    return t.view().slice(0, branch, 1).reshape(rows);
}

int64_t KvCacheManager::row_shift(int branch) const {
    return lanes_ && plan_.limits.mirrored() && branch == 1 ? plan_.limits.shift_rows : 0;
}

TensorView KvCacheManager::shifted(const TensorView& rows, int branch) const {
    const int64_t shift = row_shift(branch);
    return shift == 0 || !rows.data ? rows : rows.slice(0, shift, rows.dim(0) - shift);
}

TensorView KvCacheManager::branch_pool_k(int branch, int layer) const { return shifted(pool_k(layer), branch); }
TensorView KvCacheManager::branch_pool_v(int branch, int layer) const { return shifted(pool_v(layer), branch); }

TensorView KvCacheManager::middle_k(int layer) const {
    if (!lanes_ || !plan_.limits.mirrored() || !pool_k_.defined()) return {};
    const KvLimits& l = plan_.limits;
    return pool_k(layer).slice(0, int64_t(1 + l.lane_blocks) * l.block_tokens, 2 * l.scratch_tokens);
}

TensorView KvCacheManager::middle_v(int layer) const {
    if (!lanes_ || !plan_.limits.mirrored() || !pool_v_.defined()) return {};
    const KvLimits& l = plan_.limits;
    return pool_v(layer).slice(0, int64_t(1 + l.lane_blocks) * l.block_tokens, 2 * l.scratch_tokens);
}

TensorView KvCacheManager::pool_k(int layer) const { return layer_rows(pool_k_, layer); }
TensorView KvCacheManager::pool_v(int layer) const { return layer_rows(pool_v_, layer); }
TensorView KvCacheManager::pool_k_scale(int layer) const { return layer_scales(pool_k_scale_, layer); }
TensorView KvCacheManager::pool_v_scale(int layer) const { return layer_scales(pool_v_scale_, layer); }
TensorView KvCacheManager::scratch_k(int branch) const { return branch_rows(scratch_k_, branch); }
TensorView KvCacheManager::scratch_v(int branch) const { return branch_rows(scratch_v_, branch); }

CrossAttentionCache& KvCacheManager::cross(int slot, int branch, CrossKind kind) {
    DZR_ASSERT(slot >= 0 && slot < geometry_.sessions && branch >= 0 && branch < geometry_.num_branches);
    return *cross_of_[size_t((slot * geometry_.num_branches + branch) * 2 + (kind == CrossKind::Text ? 0 : 1))];
}

// ---- KvSession ----------------------------------------------------------------------------------

KvSession::KvSession(KvCacheManager& manager, std::string name, int slot)
    : manager_(manager), name_(std::move(name)), slot_(slot) {
    for (int b = 0; b < manager_.geometry().num_branches; ++b)
        tables_.push_back(std::make_unique<BlockTable>(manager_.pool(), manager_.geometry(), manager_.config(),
                                                       fmt::format("session '{}' branch {}", name_, branch_name(b)),
                                                       b));
}

KvSession::~KvSession() { close(); }

std::string KvSession::branch_name(int branch) const {
    return branch_label(branch, manager_.geometry().num_branches);
}

void KvSession::check_usable(const char* what) const {
    DZR_CHECK(!closed_, "kv session '{}' is closed ({})", name_, what);
    DZR_CHECK(!failed_, "kv session '{}' was aborted after a failed forward; reset it before {}", name_, what);
}

void KvSession::check_branch(int branch) const {
    DZR_CHECK(branch >= 0 && branch < num_branches(), "kv session '{}': branch {} out of range [0, {})", name_,
              branch, num_branches());
}

void KvSession::begin_forward(int branch, const KvForwardSpec& spec) {
    check_usable("begin_forward");
    check_branch(branch);
    const int64_t tpf = manager_.geometry().tokens_per_frame;
    tables_[size_t(branch)]->begin(int64_t(spec.video_frames) * tpf, spec.register_tokens, spec.commit);
}

void KvSession::commit(int branch) {
    check_usable("commit");
    check_branch(branch);
    tables_[size_t(branch)]->commit();
}

void KvSession::abort() noexcept {
    if (closed_) return;
    for (auto& t : tables_) t->release();
    for (int b = 0; b < num_branches(); ++b) {
        manager_.cross(slot_, b, CrossKind::Text).drop();
        manager_.cross(slot_, b, CrossKind::Image).drop();
    }
    failed_ = true;
}

void KvSession::reset(const KvResetOptions& options) {
    DZR_CHECK(!closed_, "kv session '{}' is closed (reset)", name_);
    for (auto& t : tables_) t->release();
    for (int b = 0; b < num_branches(); ++b) {
        if (!options.keep_text) manager_.cross(slot_, b, CrossKind::Text).drop();
        if (!options.keep_image) manager_.cross(slot_, b, CrossKind::Image).drop();
    }
    failed_ = false;
}

void KvSession::close() noexcept {
    if (closed_) return;
    for (auto& t : tables_) t->release();
    for (int b = 0; b < num_branches(); ++b) {
        manager_.cross(slot_, b, CrossKind::Text).drop();
        manager_.cross(slot_, b, CrossKind::Image).drop();
    }
    closed_ = true;
    if (manager_.slots_[size_t(slot_)] == this) manager_.slots_[size_t(slot_)] = nullptr;
}

void KvSession::populate_cross(int branch, CrossKind kind, std::span<const LayerKv> layers) {
    check_usable("populate_cross");
    check_branch(branch);
    manager_.cross(slot_, branch, kind).populate(manager_.storage_backend(), layers);
}

std::vector<LayerKv> KvSession::begin_cross_write(int branch, CrossKind kind) {
    check_usable("begin_cross_write");
    check_branch(branch);
    return manager_.cross(slot_, branch, kind).begin_write();
}

void KvSession::store_cross_layer(int branch, CrossKind kind, int layer, const TensorView& k, const TensorView& v) {
    check_usable("store_cross_layer");
    check_branch(branch);
    Backend* be = manager_.storage_backend();
    DZR_CHECK(be != nullptr, "kv session '{}': storing a cross layer needs the cache's storage", name_);
    manager_.cross(slot_, branch, kind).store_layer(*be, layer, k, v);
}

void KvSession::commit_cross(int branch, CrossKind kind) {
    check_usable("commit_cross");
    check_branch(branch);
    manager_.cross(slot_, branch, kind).commit_write();
}

const CrossAttentionCache& KvSession::cross(int branch, CrossKind kind) const {
    DZR_CHECK(!closed_, "kv session '{}' is closed (cross {})", name_, cross_kind_name(kind));
    check_branch(branch);
    return manager_.cross(slot_, branch, kind);
}

const BlockTable& KvSession::table(int branch) const {
    check_branch(branch);
    return *tables_[size_t(branch)];
}

PagedKvView KvSession::history_view(int branch) const {
    const BlockTable& t = table(branch);
    DZR_CHECK(t.in_forward(), "kv session '{}' branch {}: history_view outside a forward", name_, branch_name(branch));
    const KvGeometry& g = manager_.geometry();
    // NOTE: the branch's rows (the mirrored lanes' branch 1 sits row_shift rows further than its slots say)
    const TensorView k = manager_.branch_pool_k(branch, 0), v = manager_.branch_pool_v(branch, 0);
    PagedKvView view{};
    view.k_base = k.data;
    view.v_base = v.data;
    view.dtype = k.dtype;  // F8_E4M3 with fp8_pool
    view.num_heads = g.num_kv_heads;
    view.head_dim = g.head_dim;
    view.block_size = int32_t(t.block_tokens());
    if (g.fp8_pool) {
        view.k_scale = manager_.pool_k_scale(0).data;
        view.v_scale = manager_.pool_v_scale(0).data;
    }
    view.head_stride = g.head_dim;
    view.token_stride = int64_t(g.num_kv_heads) * g.head_dim;
    view.block_stride = view.token_stride * t.block_tokens();
    view.layer_stride = view.block_stride * manager_.plan().total_block_ids();
    view.block_table = t.padded_table().data();
    view.table_width = int32_t(t.padded_table().size());
    view.num_table_blocks = t.num_table_blocks();
    view.seq_len = t.seq_len();
    return view;
}

ContiguousKvView KvSession::scratch_view(int branch, int64_t tokens) const {
    check_branch(branch);
    const KvGeometry& g = manager_.geometry();
    DZR_CHECK(tokens >= 0 && tokens <= manager_.limits().scratch_tokens,
              "kv session '{}': {} current tokens exceed the scratch of {}", name_, tokens,
              manager_.limits().scratch_tokens);
    const TensorView k = manager_.scratch_k(branch), v = manager_.scratch_v(branch);
    ContiguousKvView view{};
    view.k_base = k.data;
    view.v_base = v.data;
    view.dtype = g.dtype;
    view.num_heads = g.num_kv_heads;
    view.head_dim = g.head_dim;
    view.layer_stride = 0;
    view.token_stride = int64_t(g.num_kv_heads) * g.head_dim;
    view.head_stride = g.head_dim;
    view.length = tokens;
    return view;
}

}  // namespace dzr
