// Paged KV-cache ops of the CUDA backend: attention over [history through a device block table | current
// rows], either directly in the flash kernel, by gathering the rows into the workspace and running the
// dense fused attention, or (fast numerics, forced) through cuDNN's paged SDPA (cuda_paged_sdpa.cpp); the CFG
// branches' attention as one batched cuDNN SDPA over their gathered rows (paged_attention_batched); and the scatter of
// committed rows into their pool slots. All read the block table and slot mapping from device memory (uploaded by the
// cache's owner before the forward), so a forward captured into a CUDA graph stays valid when the table's contents
// change.
#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "backend/cuda/cuda_attention.h"
#include "backend/cuda/cuda_internal.h"
#include "core/log.h"
#include "kernels/attention.cuh"
#include "kernels/kv_scatter.cuh"

namespace dzr {

using cuda_detail::AttentionCall;
using cuda_detail::DeviceGuard;
using cuda_detail::SdpaGraph;

namespace {

void check_rows(const TensorView& t, int heads, int head_dim, DType dtype, const char* op, const char* what) {
    DZR_CHECK(
        t.rank() == 3 && t.dim(1) == heads && t.dim(2) == head_dim && t.strides[2] == 1 && t.dtype == dtype,
        "cuda backend: {} {} {} must be {} [L, {}, {}] with a unit head-dim stride", op, what, t.str(),
        dtype_name(dtype), heads, head_dim);
}

kernels::KvPoolLayer pool_layer(const PagedKvView& pool, int layer) {
    const size_t es = dtype_size(pool.dtype);
    const int64_t off = int64_t(layer) * pool.layer_stride * int64_t(es);
    kernels::KvPoolLayer p;
    p.k = static_cast<char*>(pool.k_base) + off;
    p.v = static_cast<char*>(pool.v_base) + off;
    p.token_stride = pool.token_stride;
    p.head_stride = pool.head_stride;
    p.block_size = pool.block_size;
    return p;
}

/// Whether `h`'s [history | current] rows can be read where they lie (PagedKvView::in_place_slot): a bf16/f16 pool of
/// the rows' dtype with a history.
bool in_place_rows(const PagedKvView& h, DType dt) {
    return h.in_place_slot >= 0 && h.in_place_current >= 0 && h.seq_len > 0 && !h.fp8() && h.dtype == dt && h.k_base &&
           h.v_base;
}

/// The address of `h`'s in-place slot `slot` in `layer`'s K (or V) rows.
char* in_place_row(const PagedKvView& h, int layer, int64_t slot, bool v) {
    const kernels::KvPoolLayer pool = pool_layer(h, layer);
    return static_cast<char*>(v ? pool.v : pool.k) + size_t(slot * h.token_stride) * dtype_size(h.dtype);
}

/// Writes the current rows a committing forward's scatter did not (from h.in_place_stored on) to their in-place slots
/// of `layer` (rows the DiT wrote there already stay: kv::current_rows_in_place); k and v are [cur, H, D] rows with
/// a unit head-dim stride and head stride D (token strides of their own).
void write_in_place(const PagedKvView& h, int layer, const TensorView& k, const TensorView& v, cudaStream_t stream) {
    const int64_t cur = k.dim(0), from = std::clamp<int64_t>(h.in_place_stored, 0, cur);
    if (from == cur) return;
    const size_t es = dtype_size(h.dtype), row = size_t(h.token_stride) * es;
    for (const bool is_v : {false, true}) {
        const TensorView& src = is_v ? v : k;
        const char* from_row = static_cast<const char*>(src.data) + size_t(from * src.strides[0]) * es;
        char* to = in_place_row(h, layer, h.in_place_current + from, is_v);
        if (from_row == to) continue;
        DZR_CUDA_CHECK(cudaMemcpy2DAsync(to, row, from_row, size_t(src.strides[0]) * es, row, size_t(cur - from),
                                         cudaMemcpyDeviceToDevice, stream));
    }
}

}  // namespace

void CudaBackend::do_paged_attention(const AttentionParams& p, const TensorView& q,
                                     const PagedKvView& history, int layer, const TensorView& k_cur,
                                     const TensorView& v_cur, const TensorView& out) {
    if (history.fp8()) return paged_attention_fp8(p, q, history, layer, k_cur, v_cur, out);  // cuda_fp8.cpp
    const char* op = "paged_attention";
    for (const auto& [t, what] :
         {std::pair{&q, "q"}, std::pair{&k_cur, "k"}, std::pair{&v_cur, "v"}, std::pair{&out, "out"}})
        check_device_tensor(*t, op, what);
    const int H = history.num_heads, D = history.head_dim;
    const DType dt = history.dtype;
    DZR_CHECK(dt == DType::BF16 || dt == DType::F16, "cuda backend: {} needs a bf16 or f16 pool, got {}", op,
              dtype_name(dt));
    check_rows(q, H, D, dt, op, "q");
    check_rows(out, H, D, dt, op, "out");
    check_rows(k_cur, H, D, dt, op, "k");
    check_rows(v_cur, H, D, dt, op, "v");
    DZR_CHECK(q.dim(0) == out.dim(0) && k_cur.dim(0) == v_cur.dim(0),
              "cuda backend: {} lengths disagree: q {} out {} k {} v {}", op, q.str(), out.str(), k_cur.str(),
              v_cur.str());
    const int64_t hist = history.seq_len, cur = k_cur.dim(0), lq = q.dim(0), lk = hist + cur;
    DZR_CHECK(hist >= 0 && hist <= int64_t(history.num_table_blocks) * history.block_size &&
                  history.num_table_blocks <= history.table_width &&
                  (hist == 0 || history.block_table != nullptr),
              "cuda backend: {}: seq_len {} needs {} table entries, the table has {} of width {}", op, hist,
              (hist + history.block_size - 1) / std::max(history.block_size, 1), history.num_table_blocks,
              history.table_width);
    DZR_CHECK(hist == 0 || (history.k_base && history.v_base), "cuda backend: {}: the pool has no storage",
              op);
    DeviceGuard guard(index_);
    if (lq == 0) return;
    const size_t es = dtype_size(dt);
    if (lk == 0) {
        // no keys at all: zeros, as the CPU reference
        for (int64_t h = 0; h < H; ++h)
            DZR_CUDA_CHECK(cudaMemset2DAsync(static_cast<char*>(out.data) + h * out.strides[1] * int64_t(es),
                                             size_t(out.strides[0]) * es, 0, size_t(D) * es, size_t(lq),
                                             stream_));
        return;
    }
    const kernels::KvPoolLayer pool = pool_layer(history, layer);

    kernels::FlashAttentionArgs direct;
    direct.dtype = dt;
    direct.head_dim = D;
    direct.heads = H;
    direct.lq = lq;
    direct.scale = p.scale;
    direct.q = q.data, direct.q_tok = q.strides[0], direct.q_head = q.strides[1];
    direct.out = out.data, direct.o_tok = out.strides[0], direct.o_head = out.strides[1];
    direct.hist_k = pool.k, direct.hist_v = pool.v;
    direct.hist_tok = pool.token_stride, direct.hist_head = pool.head_stride;
    direct.block_size = pool.block_size;
    direct.table = history.block_table;
    direct.hist_len = hist;
    direct.k = k_cur.data, direct.k_tok = k_cur.strides[0], direct.k_head = k_cur.strides[1];
    direct.v = v_cur.data, direct.v_tok = v_cur.strides[0], direct.v_head = v_cur.strides[1];
    direct.cur_len = cur;
    const bool direct_ok =
        options_.attention != AttentionImpl::Gemm && kernels::flash_attention_supported(direct);

    // The gathered call: contiguous [lk, H, D] K and V in the workspace.
    AttentionCall gathered;
    gathered.dtype = dt;
    gathered.lq = lq, gathered.lk = lk, gathered.heads = H, gathered.d = D, gathered.dv = D;
    gathered.q = q.data, gathered.out = out.data;
    gathered.q_tok = q.strides[0], gathered.q_head = q.strides[1];
    gathered.o_tok = out.strides[0], gathered.o_head = out.strides[1];
    gathered.k_tok = gathered.v_tok = int64_t(H) * D;
    gathered.k_head = gathered.v_head = D;
    gathered.scale = p.scale;

    const bool cudnn_allowed = options_.attention == AttentionImpl::Auto ||
                               options_.attention == AttentionImpl::CudnnUnified ||
                               options_.attention == AttentionImpl::CudnnComposite;
    PagedAttentionImpl how = options_.paged_attention;
    // NOTE: fast numerics with no history attend to the current rows where they lie (nothing to gather). Auto never
    // picks CudnnPaged: on the H200 with cuDNN 9.14 it is refused at the DiT's 880-token blocks (paged cache loads
    // need power-of-2 blocks) and ran 1.75x slower than the gathered call at 16-token blocks (docs/PERF.md, "Open
    // headroom"); the unified node's page tables (cuDNN >= 9.15) have not been measured. It stays a forced choice.
    if (how == PagedAttentionImpl::Auto && numerics() == Numerics::Fast && cudnn_allowed && hist == 0) {
        last_paged_impl_ = PagedAttentionImpl::Gather;
        return attention(p, q, k_cur, v_cur, TensorView{}, out);
    }
    // NOTE: fast numerics over a lane (kv.in_place): the current rows go to their slots next to the history (unless
    // the DiT wrote them there) and cuDNN's SDPA reads the branch's rows where they lie, the rows the gather would copy
    if (how == PagedAttentionImpl::Auto && numerics() == Numerics::Fast && cudnn_allowed && in_place_rows(history, dt) &&
        k_cur.strides[1] == D && v_cur.strides[1] == D) {
        write_in_place(history, layer, k_cur, v_cur, stream_);
        const TensorView kall(in_place_row(history, layer, history.in_place_slot, false), dt, Shape{lk, H, D}, q.device);
        const TensorView vall(in_place_row(history, layer, history.in_place_slot, true), dt, Shape{lk, H, D}, q.device);
        last_paged_impl_ = PagedAttentionImpl::Gather;
        ++in_place_calls_;
        return attention(p, q, kall, vall, TensorView{}, out);
    }
    if (how == PagedAttentionImpl::CudnnPaged) {
        last_paged_impl_ = PagedAttentionImpl::CudnnPaged;
        if (hist == 0) return attention(p, q, k_cur, v_cur, TensorView{}, out);
        std::string why;
        if (try_paged_sdpa(p, q, history, layer, k_cur, v_cur, out, why)) return;
        DZR_THROW("cuda backend: {} implementation cudnn-paged cannot run q {} k {} over a history of {}: {}", op,
                 q.str(), k_cur.str(), hist, why);
    }
    if (how == PagedAttentionImpl::Auto) {
        // NOTE: the gather costs one read and write of every key row; it pays only when cuDNN's SDPA runs the
        // dense call (dzr's flash kernel reads the table directly at no extra cost).
        bool cudnn_ok = false;
        if (cudnn_allowed) {
            // plans depend on shapes and strides only; the gathered buffers' addresses do not matter here
            for (SdpaGraph g : {SdpaGraph::Unified, SdpaGraph::Composite}) {
                if (options_.attention == AttentionImpl::CudnnUnified && g != SdpaGraph::Unified) continue;
                if (options_.attention == AttentionImpl::CudnnComposite && g == SdpaGraph::Unified) continue;
                if (sdpa_plan(gathered, g)->ok) {
                    cudnn_ok = true;
                    break;
                }
            }
        }
        how = cudnn_ok || !direct_ok ? PagedAttentionImpl::Gather : PagedAttentionImpl::Direct;
    }
    last_paged_impl_ = how;
    if (how == PagedAttentionImpl::Direct) {
        DZR_CHECK(
            direct_ok,
            "cuda backend: {} cannot run directly (the flash kernel needs bf16/f16, head_dim 64 or 128 and "
            "16-byte aligned rows): q {} k {} pool head_dim {}",
            op, q.str(), k_cur.str(), D);
        DZR_CUDA_CHECK(kernels::flash_attention(direct, stream_));
        last_attention_impl_ = AttentionImpl::Flash;
        return;
    }

    ArenaScope scope(arena_);
    // [history | current] keys and values, gathered: [lk, H, D]
    const TensorView kall = arena_.alloc_view(Shape{lk, H, D}, dt);
    const TensorView vall = arena_.alloc_view(Shape{lk, H, D}, dt);
    const kernels::KvRows rows{k_cur.data, v_cur.data, k_cur.strides[0], k_cur.strides[1]};
    DZR_CHECK(k_cur.strides == v_cur.strides, "cuda backend: {} gathers k {} and v {} with one stride set",
              op, k_cur.str(), v_cur.str());
    DZR_CUDA_CHECK(kernels::gather_kv(pool, history.block_table, hist, rows, cur, kall.data, vall.data, H, D,
                                      dt, stream_));
    attention(p, q, kall, vall, TensorView{}, out);
}

size_t CudaBackend::paged_attention_workspace_bytes(const PagedKvView& history, const TensorView& k_cur) {
    // NOTE: the gathered path's [history | current] K and V rows, whichever path the call then takes. The cuDNN
    // paged path takes less where Lq <= the current rows (the DiT's self-attention): the current rows' output and
    // two f32 stats rows per query row and head, plus its plans' workspaces (reported by no query, as the dense
    // SDPA's); it falls back to the gather where the arena lacks room.
    const auto aligned = [](size_t b) { return (b + Arena::kAlign - 1) / Arena::kAlign * Arena::kAlign; };
    // NOTE: an f8_e4m3 pool is gathered (dequantized) into the compute dtype of the current rows
    const size_t rows = size_t(history.seq_len + k_cur.dim(0)) * size_t(history.num_heads) * size_t(history.head_dim) *
                        dtype_size(history.fp8() ? k_cur.dtype : history.dtype);
    return 2 * aligned(rows);
}

void CudaBackend::do_scatter_kv(const PagedKvView& pool, int layer, const TensorView& slots,
                                const TensorView& k, const TensorView& v, int64_t num_slots) {
    if (pool.fp8()) return scatter_kv_fp8(pool, layer, slots, k, v, num_slots);  // cuda_fp8.cpp
    const char* op = "scatter_kv";
    for (const auto& [t, what] : {std::pair{&slots, "slots"}, std::pair{&k, "k"}, std::pair{&v, "v"}})
        check_device_tensor(*t, op, what);
    DZR_CHECK(slots.dtype == DType::I64 && slots.is_contiguous(),
              "cuda backend: {} slots {} must be contiguous i64", op, slots.str());
    const int64_t n = slots.numel();
    check_rows(k, pool.num_heads, pool.head_dim, pool.dtype, op, "k");
    check_rows(v, pool.num_heads, pool.head_dim, pool.dtype, op, "v");
    DZR_CHECK(k.dim(0) >= n && v.dim(0) >= n && k.strides == v.strides,
              "cuda backend: {} needs at least {} rows of k {} and v {} with one stride set", op, n, k.str(),
              v.str());
    DZR_CHECK(pool.k_base && pool.v_base, "cuda backend: {}: the pool has no storage", op);
    DeviceGuard guard(index_);
    const kernels::KvRows rows{k.data, v.data, k.strides[0], k.strides[1]};
    DZR_CUDA_CHECK(kernels::scatter_kv(rows, pool_layer(pool, layer), slots.ptr<const int64_t>(), n,
                                       num_slots, pool.num_heads, pool.head_dim, pool.dtype, stream_));
}

std::string CudaBackend::batched_attention_refusal(std::span<const PagedKvView> histories, const TensorView& q,
                                                   const TensorView& k_cur, const TensorView& v_cur,
                                                   const TensorView& out) {
    const int64_t B = int64_t(histories.size());
    if (B < 2) return "one branch";
    // NOTE: reference numerics keep PyTorch's one SDPA per branch (cuDNN may pick another engine for a batch)
    if (numerics() != Numerics::Fast) return "reference numerics";
    if (!options_.batched_attention) return "batched attention off (DZR_BATCHED_ATTENTION)";
    if (options_.paged_attention != PagedAttentionImpl::Auto) return "a forced paged attention implementation";
    if (options_.attention != AttentionImpl::Auto && options_.attention != AttentionImpl::CudnnUnified &&
        options_.attention != AttentionImpl::CudnnComposite)
        return "a forced non-cuDNN attention";
    const PagedKvView& h0 = histories[0];
    for (const PagedKvView& h : histories) {
        if (h.seq_len != h0.seq_len) return "histories of different lengths";
        if (h.dtype != h0.dtype || h.num_heads != h0.num_heads || h.head_dim != h0.head_dim)
            return "pools of different layouts";
        if (h.seq_len < 0 || h.seq_len > int64_t(h.num_table_blocks) * h.block_size ||
            h.num_table_blocks > h.table_width || (h.seq_len > 0 && (!h.block_table || !h.k_base || !h.v_base)))
            return "a history its table does not cover";
    }
    const DType dt = q.dtype;
    if (dt != DType::BF16 && dt != DType::F16) return "not bf16/f16 rows";
    if (!h0.fp8() && h0.dtype != dt) return "a pool of another dtype than the rows";
    for (const TensorView* t : {&q, &k_cur, &v_cur, &out})
        if (t->rank() != 3 || t->dim(1) != h0.num_heads || t->dim(2) != h0.head_dim || t->strides[2] != 1 ||
            t->dtype != dt || t->dim(0) % B != 0 || t->strides[1] != h0.head_dim ||
            t->strides[0] != int64_t(h0.num_heads) * h0.head_dim)
            return fmt::format("{} is not [B * L, {}, {}] rows of {}", t->str(), h0.num_heads, h0.head_dim,
                               dtype_name(dt));
    if (q.dim(0) != out.dim(0) || k_cur.dim(0) != v_cur.dim(0)) return "lengths disagree";
    return {};
}

size_t CudaBackend::paged_attention_batched_workspace_bytes(std::span<const PagedKvView> histories,
                                                            const TensorView& k_cur) {
    // NOTE: the batched call gathers every branch at once: the sum of the branches' gathers (an upper bound of the
    // per-branch fallback, which takes one branch's at a time)
    const int64_t B = int64_t(histories.size());
    if (B < 2 || k_cur.dim(0) % B != 0) return Backend::paged_attention_batched_workspace_bytes(histories, k_cur);
    const int64_t cur = k_cur.dim(0) / B;
    size_t sum = 0;
    for (int64_t b = 0; b < B; ++b)
        sum += paged_attention_workspace_bytes(histories[size_t(b)], k_cur.slice(0, b * cur, cur));
    return sum;
}

void CudaBackend::do_paged_attention_batched(const AttentionParams& p, const TensorView& q,
                                             std::span<const PagedKvView> histories, int layer,
                                             const TensorView& k_cur, const TensorView& v_cur,
                                             const TensorView& out) {
    const char* op = "paged_attention_batched";
    for (const auto& [t, what] :
         {std::pair{&q, "q"}, std::pair{&k_cur, "k"}, std::pair{&v_cur, "v"}, std::pair{&out, "out"}})
        check_device_tensor(*t, op, what);
    const std::string refusal = batched_attention_refusal(histories, q, k_cur, v_cur, out);
    // NOTE: the first fallback of a backend is logged (a run's attention then takes the per-branch time)
    const auto note_fallback = [&](const std::string& why) {
        if (histories.size() > 1 && batched_fallbacks_++ == 0)
            log()->info("cuda backend: {} runs its {} branches one by one: {}", op, histories.size(), why);
    };
    const auto per_branch = [&](const std::string& why) {
        note_fallback(why);
        Backend::do_paged_attention_batched(p, q, histories, layer, k_cur, v_cur, out);
    };
    if (!refusal.empty()) return per_branch(refusal);

    DeviceGuard guard(index_);
    const int64_t B = int64_t(histories.size()), H = histories[0].num_heads, D = histories[0].head_dim;
    const int64_t lq = q.dim(0) / B, cur = k_cur.dim(0) / B, hist = histories[0].seq_len, lk = hist + cur;
    const DType dt = q.dtype;
    if (lq == 0 || lk == 0) return per_branch("no queries or no keys");
    const int64_t row = H * D;  // elements per token row

    AttentionCall c;
    c.dtype = dt;
    c.batch = B;
    c.lq = lq, c.lk = lk, c.heads = H, c.d = D, c.dv = D;
    c.q = q.data, c.out = out.data;
    c.q_tok = c.o_tok = c.k_tok = c.v_tok = row;
    c.q_head = c.o_head = c.k_head = c.v_head = D;
    c.q_batch = c.o_batch = lq * row;
    c.scale = p.scale;

    ArenaScope scope(arena_);
    TensorView kall, vall;
    // NOTE: every branch over its lane (kv.in_place): the current rows go to their slots (unless the DiT wrote them
    // there: the mirrored lanes' middle) and one SDPA reads every branch's [history | current] rows where they lie,
    // the branch stride being the distance of their first rows (the rows the gather would copy)
    bool in_place = hist > 0;
    for (const PagedKvView& h : histories) in_place = in_place && in_place_rows(h, dt);
    // NOTE: one element stride between consecutive branches' first rows, K and V alike, and no overlap
    const auto first_row = [&](int64_t b, bool v) {
        return in_place_row(histories[size_t(b)], layer, histories[size_t(b)].in_place_slot, v);
    };
    const int64_t row_bytes = row * int64_t(dtype_size(dt));
    const int64_t branch_bytes = in_place ? first_row(1, false) - first_row(0, false) : 0;
    in_place = in_place && branch_bytes >= lk * row_bytes && branch_bytes % row_bytes == 0;
    for (int64_t b = 1; b < B && in_place; ++b)
        in_place = first_row(b, false) - first_row(b - 1, false) == branch_bytes &&
                   first_row(b, true) - first_row(b - 1, true) == branch_bytes;
    const int64_t branch_stride = branch_bytes / row_bytes * row;  // elements
    if (in_place) {
        for (int64_t b = 0; b < B; ++b)
            write_in_place(histories[size_t(b)], layer, k_cur.slice(0, b * cur, cur), v_cur.slice(0, b * cur, cur),
                           stream_);
        c.k = first_row(0, false), c.v = first_row(0, true);
        c.k_batch = c.v_batch = branch_stride;
        ++in_place_calls_;
    } else if (hist == 0) {
        // NOTE: no history (the prefill): the current rows are the keys where they lie, as paged_attention does
        c.k = k_cur.data, c.v = v_cur.data;
        c.k_batch = c.v_batch = cur * row;
    } else {
        const size_t bytes = 2 * ((size_t(B * lk * row) * dtype_size(dt) + Arena::kAlign - 1) / Arena::kAlign *
                                  Arena::kAlign);
        if (arena_.capacity() - arena_.used() < bytes)
            return per_branch(fmt::format("the workspace lacks room for the batched gather ({:.1f} MiB)",
                                          double(bytes) / double(1 << 20)));
        kall = arena_.alloc_view(Shape{B * lk, H, D}, dt);
        vall = arena_.alloc_view(Shape{B * lk, H, D}, dt);
        for (int64_t b = 0; b < B; ++b) {
            const PagedKvView& h = histories[size_t(b)];
            const TensorView kb = k_cur.slice(0, b * cur, cur), vb = v_cur.slice(0, b * cur, cur);
            char* ko = static_cast<char*>(kall.data) + size_t(b * lk * row) * dtype_size(dt);
            char* vo = static_cast<char*>(vall.data) + size_t(b * lk * row) * dtype_size(dt);
            if (h.fp8()) {
                gather_paged_rows_fp8(h, layer, kb, vb, ko, vo);
                continue;
            }
            const kernels::KvRows rows{kb.data, vb.data, kb.strides[0], kb.strides[1]};
            DZR_CUDA_CHECK(kernels::gather_kv(pool_layer(h, layer), h.block_table, hist, rows, cur, ko, vo, int(H),
                                              int(D), dt, stream_));
        }
        c.k = kall.data, c.v = vall.data;
        c.k_batch = c.v_batch = lk * row;
    }
    last_paged_impl_ = PagedAttentionImpl::Gather;
    const bool unified_ok = options_.attention != AttentionImpl::CudnnComposite;
    const bool composite_ok = options_.attention != AttentionImpl::CudnnUnified;
    if (unified_ok && try_sdpa(c, SdpaGraph::Unified)) {
        last_attention_impl_ = AttentionImpl::CudnnUnified;
        ++batched_calls_;
        return;
    }
    if (composite_ok && try_sdpa(c, SdpaGraph::Composite)) {
        last_attention_impl_ = AttentionImpl::CudnnComposite;
        ++batched_calls_;
        return;
    }
    // cuDNN refused the batch: one dense call per branch over the rows already gathered
    note_fallback("cuDNN refused the batched SDPA");
    for (int64_t b = 0; b < B; ++b) {
        const TensorView qb = q.slice(0, b * lq, lq), ob = out.slice(0, b * lq, lq);
        if (in_place) {
            const char* kb = static_cast<const char*>(c.k) + size_t(b * branch_stride) * dtype_size(dt);
            const char* vb = static_cast<const char*>(c.v) + size_t(b * branch_stride) * dtype_size(dt);
            attention(p, qb, TensorView(const_cast<char*>(kb), dt, Shape{lk, H, D}, q.device),
                      TensorView(const_cast<char*>(vb), dt, Shape{lk, H, D}, q.device), TensorView{}, ob);
        } else if (hist == 0)
            attention(p, qb, k_cur.slice(0, b * cur, cur), v_cur.slice(0, b * cur, cur), TensorView{}, ob);
        else
            attention(p, qb, kall.slice(0, b * lk, lk), vall.slice(0, b * lk, lk), TensorView{}, ob);
    }
}

}  // namespace dzr
