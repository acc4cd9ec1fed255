#include "kv/paged_self_attention_cache.h"

#include <algorithm>

#include "backend/measuring_backend.h"
#include "core/error.h"

namespace dzr {

PagedSelfAttentionCache::PagedSelfAttentionCache(KvSession& session, int branch, PagedAttentionPath path)
    : session_(session), branch_(branch), path_(path) {
    const BlockTable& t = session_.table(branch_);  // checks the branch index
    Backend* storage = session_.manager().storage_backend();
    if (path_ == PagedAttentionPath::Kernel && storage && !storage->device().is_cpu()) {
        // NOTE: allocated once here, written by begin(): the layers only read device memory.
        dev_table_ = storage->alloc(Shape{t.limits().table_width}, DType::I32);
        dev_slots_ = storage->alloc(Shape{t.limits().scratch_tokens}, DType::I64);
    }
}

void PagedSelfAttentionCache::begin(const KvForwardSpec& spec) {
    session_.begin_forward(branch_, spec);
    if (!dev_table_.defined()) return;
    const BlockTable& t = session_.table(branch_);
    Backend& be = *session_.manager().storage_backend();
    const std::vector<BlockId>& table = t.padded_table();
    const std::vector<int64_t>& slots = t.slot_mapping();
    DZR_CHECK(int64_t(table.size()) == dev_table_.numel() && int64_t(slots.size()) <= dev_slots_.numel(),
              "kv {}: the padded table ({}) or slot mapping ({}) outgrew its device mirror ({}, {})", t.name(),
              table.size(), slots.size(), dev_table_.numel(), dev_slots_.numel());
    // NOTE: the mirrors are written only here, in stream order, so contents equal to the last upload need none (the
    // denoising forwards of a call share one table and write no slots)
    if (table != uploaded_table_) {
        be.upload(TensorView(const_cast<BlockId*>(table.data()), DType::I32, Shape{int64_t(table.size())}), dev_table_);
        uploaded_table_ = table;
    }
    if (!slots.empty() && slots != uploaded_slots_) {
        be.upload(TensorView(const_cast<int64_t*>(slots.data()), DType::I64, Shape{int64_t(slots.size())}),
                  dev_slots_.view().slice(0, 0, int64_t(slots.size())));
        uploaded_slots_ = slots;
    }
}

size_t PagedSelfAttentionCache::attend_workspace_bytes(const KvGeometry& geometry, const KvConfig& config,
                                                       PagedAttentionPath path, Backend& be) {
    return measure_workspace(be, [&](Backend& mb) {
        KvCacheManager manager(geometry, config, kv_session_bytes(geometry, config), &mb);
        const auto session = manager.open_session("workspace plan");
        PagedSelfAttentionCache cache(*session, 0, path);
        run_kv_fill_walk(mb, geometry, config, cache);
    });
}

int64_t PagedSelfAttentionCache::in_place_slot() const {
    return path_ == PagedAttentionPath::Kernel ? session_.table(branch_).in_place().first : -1;
}

bool PagedSelfAttentionCache::committing() const {
    const BlockTable& t = session_.table(branch_);
    return t.in_forward() && t.committing();
}

int64_t PagedSelfAttentionCache::history_tokens() const {
    const BlockTable& t = session_.table(branch_);
    DZR_CHECK(t.in_forward(), "kv {}: history_tokens() outside a forward (call begin first)", t.name());
    return t.seq_len();
}

namespace {

void check_attend(KvSession& session, const BlockTable& t, int layer, const TensorView& k, const TensorView& v,
                  int64_t video_tokens) {
    const KvCacheManager& m = session.manager();
    const KvGeometry& g = m.geometry();
    DZR_CHECK(t.in_forward(), "kv {}: attend (layer {}) outside a forward (call begin first)", t.name(), layer);
    DZR_CHECK(!session.failed() && !session.closed(), "kv {}: attend on a {} session", t.name(),
              session.closed() ? "closed" : "failed");
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
}

}  // namespace

PagedKvView PagedSelfAttentionCache::prepare_kernel_attend(Backend& be, int layer, const TensorView& k,
                                                           const TensorView& v, int64_t video_tokens) {
    KvCacheManager& m = session_.manager();
    const BlockTable& t = session_.table(branch_);
    DZR_CHECK(path_ == PagedAttentionPath::Kernel, "kv {}: a kernel-path attend on the gather path", t.name());
    check_attend(session_, t, layer, k, v, video_tokens);
    // committing forward: the video rows -> their pool slots (the slot mapping on the backend's device)
    PagedKvView view = session_.history_view(branch_);
    const TensorView pk = m.branch_pool_k(branch_, layer);  // the slots the scatter may address
    TensorView slots;
    // NOTE: the device mirror when `be` is the storage's device; host data for the CPU reference and for a
    // measuring backend (which reads no data)
    if (dev_table_.defined() && be.device() == dev_table_.device()) {
        view.block_table = dev_table_.ptr<const BlockId>();
        slots = dev_slots_.view().slice(0, 0, video_tokens);
    } else {
        slots = TensorView(const_cast<int64_t*>(t.slot_mapping().data()), DType::I64, Shape{video_tokens});
    }
    if (t.committing()) be.scatter_kv(view, layer, slots, k, v, pk.dim(0));
    // NOTE: [history | current] in consecutive slots of the branch's lane: the backend may attend to them where they
    // lie, writing the current rows the scatter did not (checked per layer: cheap, and after every branch's begin)
    const BlockTable::InPlace at = t.in_place();
    view.in_place_slot = at.first;
    view.in_place_current = at.current;
    view.in_place_stored = t.committing() ? video_tokens : 0;
    return view;
}

void PagedSelfAttentionCache::store_committed(Backend& be, int layer, const TensorView& k, const TensorView& v,
                                              int64_t video_tokens) {
    KvCacheManager& m = session_.manager();
    const KvGeometry& g = m.geometry();
    const BlockTable& t = session_.table(branch_);
    const TensorView pk = m.branch_pool_k(branch_, layer), pv = m.branch_pool_v(branch_, layer);
    const TensorView pks = m.pool_k_scale(layer), pvs = m.pool_v_scale(layer);
    const int64_t H = g.num_kv_heads, D = g.head_dim;
    // NOTE: an FP8 pool quantizes each (token, head) row of D values on the way in and dequantizes it on the way
    // out (core/fp8.h); [n, H, D] rows are [n * H, D] quantization rows with [n * H] scales
    const auto put = [&](const TensorView& src, const TensorView& pool, const TensorView& scales, int64_t slot,
                         int64_t n) {
        if (!g.fp8_pool) return be.copy(src, pool.slice(0, slot, n));
        be.quantize_fp8(src.reshape(Shape{n * H, D}), pool.slice(0, slot, n).reshape(Shape{n * H, D}),
                        scales.slice(0, slot, n).reshape(Shape{n * H}));
    };
    // consecutive slots are consecutive rows: one copy per run
    const std::vector<int64_t>& slots = t.slot_mapping();
    for (int64_t i = 0; i < video_tokens;) {
        int64_t n = 1;
        while (i + n < video_tokens && slots[size_t(i + n)] == slots[size_t(i)] + n) ++n;
        put(k.slice(0, i, n), pk, pks, slots[size_t(i)], n);
        put(v.slice(0, i, n), pv, pvs, slots[size_t(i)], n);
        i += n;
    }
}

void PagedSelfAttentionCache::store(Backend& be, int layer, const TensorView& k, const TensorView& v,
                                    int64_t video_tokens) {
    const BlockTable& t = session_.table(branch_);
    DZR_CHECK(t.committing(), "kv {}: store (layer {}) outside a committing forward", t.name(), layer);
    if (path_ == PagedAttentionPath::Kernel) {
        prepare_kernel_attend(be, layer, k, v, video_tokens);  // its checks and the scatter, nothing else
        return;
    }
    check_attend(session_, t, layer, k, v, video_tokens);
    store_committed(be, layer, k, v, video_tokens);
}

void PagedSelfAttentionCache::attend(Backend& be, int layer, const TensorView& q, const TensorView& k,
                                     const TensorView& v, int64_t video_tokens, float scale, const TensorView& out) {
    if (path_ == PagedAttentionPath::Kernel) {
        // the scatter of a committing forward's rows, then attention over [visible history through the table |
        // current rows]
        const PagedKvView view = prepare_kernel_attend(be, layer, k, v, video_tokens);
        be.paged_attention(AttentionParams{scale}, q, view, layer, k, v, out);
        return;
    }
    KvCacheManager& m = session_.manager();
    const KvGeometry& g = m.geometry();
    const BlockTable& t = session_.table(branch_);
    check_attend(session_, t, layer, k, v, video_tokens);
    const int64_t cur = t.current_video_tokens() + t.current_register_tokens();

    ArenaScope scope(be.workspace());
    // 1. write: current rows -> the branch scratch (one layer at a time)
    const TensorView sk = m.scratch_k(branch_).slice(0, 0, cur);
    const TensorView sv = m.scratch_v(branch_).slice(0, 0, cur);
    be.copy(k, sk);
    be.copy(v, sv);

    // 2. committing forward: video rows -> their pool slots
    if (t.committing()) store_committed(be, layer, k, v, video_tokens);

    const TensorView pk = m.branch_pool_k(branch_, layer), pv = m.branch_pool_v(branch_, layer);
    const TensorView pks = m.pool_k_scale(layer), pvs = m.pool_v_scale(layer);
    const bool fp8 = g.fp8_pool;
    const int64_t H = g.num_kv_heads, D = g.head_dim;
    const auto load = [&](const TensorView& pool, const TensorView& scales, int64_t row, int64_t n,
                          const TensorView& dst) {
        if (!fp8) return be.copy(pool.slice(0, row, n), dst);
        be.dequantize_fp8(pool.slice(0, row, n).reshape(Shape{n * H, D}), scales.slice(0, row, n).reshape(Shape{n * H}),
                          dst.reshape(Shape{n * H, D}));
    };
    // 3. attend over [visible history | current]
    const int64_t hist = t.seq_len(), bs = t.block_tokens();
    // [history | current] keys and values, gathered: [hist + cur, H, D]
    const TensorView kall = be.scratch(Shape{hist + cur, g.num_kv_heads, g.head_dim});
    const TensorView vall = be.scratch(Shape{hist + cur, g.num_kv_heads, g.head_dim});
    const std::vector<BlockId>& table = t.padded_table();
    for (int j = 0; j < t.num_table_blocks(); ++j) {
        const int64_t start = int64_t(j) * bs, n = std::min(bs, hist - start);
        const int64_t row = int64_t(table[size_t(j)]) * bs;
        load(pk, pks, row, n, kall.slice(0, start, n));
        load(pv, pvs, row, n, vall.slice(0, start, n));
    }
    be.copy(sk, kall.slice(0, hist, cur));
    be.copy(sv, vall.slice(0, hist, cur));
    be.attention(AttentionParams{scale}, q, kall, vall, TensorView{}, out);
}

}  // namespace dzr
