// Paged attention without the gather (PagedAttentionImpl::CudnnPaged, a forced choice; Auto gathers): the history
// is read by cuDNN SDPA straight from the KV pool through the device block table, the current rows by a dense
// cuDNN SDPA, and the two outputs are merged by their log-sum-exps.
//
// NOTE: two calls and a merge instead of scratch blocks for the current rows in the pool (one paged call):
// the current rows of a denoising forward are not in the pool, and writing them there would need scratch
// blocks in every session's table and a copy per layer, i.e. lib/kv owning a backend detail. The split keeps
// lib/kv as it is; it costs a second SDPA launch over the current rows (which the gathered call computes
// anyway) and one pass over the [Lq, H, D] output, against the gather's read and write of every history and
// current row.
//
// The paged graphs follow cudnn-frontend's lowering of its SDPA node with page tables (read, not copied):
//  - Unified (cuDNN >= 9.15 at build and run time): the SDPA node with the containers as K and V, the
//    page tables, the sequence lengths and the stats output.
//  - Composite (cuDNN >= 9.5): K^T and V loaded by paged cache load operations, S = Q K^T with its M and N
//    read from the sequence lengths, S *= scale, the padding mask (row < seq_q and col < seq_kv, else -inf),
//    softmax with the stats M + log Z as an output, O = P V with its M and K read from the sequence lengths.
//    cuDNN takes paged caches only with the padding mask and both sequence lengths.
// Containers are the pool as it lies: [blocks, H, block_size, D] with strides (block, head, token, 1); the
// page table is [1, 1, pages, 1] int32 with pages = ceil(history / block_size), the first entries of the
// device table.
#include "backend/cuda/cuda_paged_sdpa.h"

#include <algorithm>
#include <initializer_list>
#include <limits>
#include <vector>

#include "backend/cuda/cuda_graph.h"
#include "backend/cuda/cuda_internal.h"
#include "backend/cuda/cuda_sdpa_builder.h"
#include "core/log.h"
#include "kernels/attention_merge.cuh"

namespace dzr {

namespace cuda_detail {

namespace {

constexpr int64_t kUidQ = 1, kUidK = 2, kUidV = 3, kUidO = 4, kUidScale = 5, kUidStats = 6, kUidTableK = 7,
                  kUidTableV = 8, kUidSeqQ = 9, kUidSeqKv = 10, kUidNegInf = 11;

cudnnDataType_t io_type(DType t) {
    return t == DType::F16 ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16;
}

/// [L, H, D] with (token, head) strides as a cuDNN [1, H, L, D] tensor's strides.
std::array<int64_t, 4> rows_strides(int64_t len, int64_t heads, int64_t tok, int64_t head) {
    return {std::max({len * tok, heads * head, int64_t(1)}), head, tok, 1};
}

/// The masked logits' fill: -inf, or the lowest finite float before cuDNN 9.10 (cudnn-frontend's choice).
float masked_logit() {
    return cudnnGetVersion() < 91000 ? std::numeric_limits<float>::lowest()
                                     : -std::numeric_limits<float>::infinity();
}

/// The operations of one paged graph kind, in execution order.
std::vector<cudnnBackendDescriptor_t> paged_operations(SdpaBuilder& b, const PagedSdpaCall& c, SdpaGraph g) {
    const cudnnDataType_t io = io_type(c.dtype), f32 = CUDNN_DATA_FLOAT, i32 = CUDNN_DATA_INT32;
    const int64_t H = c.heads, Lq = c.lq, S = c.hist, D = c.d, P = c.pages;
    const std::array<int64_t, 4> one{1, 1, 1, 1};
    const auto q = b.tensor(kUidQ, io, {1, H, Lq, D}, rows_strides(Lq, H, c.q_tok, c.q_head), false);
    const auto o = b.tensor(kUidO, io, {1, H, Lq, D}, rows_strides(Lq, H, c.o_tok, c.o_head), false);
    const std::array<int64_t, 4> pool_dims{c.num_blocks, H, c.block_size, D};
    const std::array<int64_t, 4> pool_strides{c.block_stride, c.head_stride, c.token_stride, 1};
    const auto kc = b.tensor(kUidK, io, pool_dims, pool_strides, false);
    const auto vc = b.tensor(kUidV, io, pool_dims, pool_strides, false);
    const auto scale = b.tensor(kUidScale, f32, one, one, false, true);
    const std::array<int64_t, 4> r_dims{1, H, Lq, 1}, r_strides{H * Lq, Lq, 1, 1};
    const auto stats = b.tensor(kUidStats, f32, r_dims, r_strides, false);
    const auto table_k = b.tensor(kUidTableK, i32, {1, 1, P, 1}, {P, P, 1, 1}, false);
    const auto table_v = b.tensor(kUidTableV, i32, {1, 1, P, 1}, {P, P, 1, 1}, false);
    const auto seq_q = b.tensor(kUidSeqQ, i32, one, one, false);
    const auto seq_kv = b.tensor(kUidSeqKv, i32, one, one, false);

    if (g == SdpaGraph::Unified) {
#if CUDNN_VERSION >= 91500
        if (cudnnGetVersion() < 91500)
            throw CudnnFailure{
                fmt::format("page tables on the unified SDPA node need cuDNN >= 9.15 at run time, "
                            "this is {}",
                            cudnnGetVersion())};
        const char* stage = "paged sdpa_fwd operation";
        cudnnBackendDescriptor_t op = b.make(CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR, stage);
        SdpaBuilder::set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC, q, stage);
        SdpaBuilder::set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC, kc, stage);
        SdpaBuilder::set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC, vc, stage);
        SdpaBuilder::set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC, o, stage);
        SdpaBuilder::set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_STATSDESC, stats, stage);
        SdpaBuilder::set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC, scale, stage);
        SdpaBuilder::set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_PAGE_TABLE_KDESC, table_k, stage);
        SdpaBuilder::set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_PAGE_TABLE_VDESC, table_v, stage);
        SdpaBuilder::set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_SEQ_LEN_QDESC, seq_q, stage);
        SdpaBuilder::set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_SEQ_LEN_KVDESC, seq_kv, stage);
        SdpaBuilder::finalize(op, stage);
        return {op};
#else
        throw CudnnFailure{
            fmt::format("page tables on the unified SDPA node need cuDNN >= 9.15 headers (built with "
                        "{})",
                        CUDNN_VERSION)};
#endif
    }

#if CUDNN_VERSION >= 90500
    if (cudnnGetVersion() < 90500)
        throw CudnnFailure{
            fmt::format("paged cache loads need cuDNN >= 9.5 at run time, this is {}", cudnnGetVersion())};
    int64_t uid = 100;
    const std::array<int64_t, 4> s_dims{1, H, Lq, S}, s_strides{H * Lq * S, Lq * S, S, 1};
    const auto logits = [&](cudnnDataType_t t) { return b.tensor(uid++, t, s_dims, s_strides, true); };
    const auto rows = [&] { return b.tensor(uid++, f32, r_dims, r_strides, true); };
    const auto neg_inf = b.tensor(kUidNegInf, f32, one, one, false, true);
    std::vector<cudnnBackendDescriptor_t> ops;
    // K^T [1, H, D, S] and V [1, H, S, D], loaded from the pool through the table
    const auto kt = b.tensor(uid++, io, {1, H, D, S}, {D * S * H, D * S, 1, D}, true);
    ops.push_back(b.paged_cache_load(kc, table_k, seq_kv, kt));
    const auto s = logits(f32), s_scaled = logits(f32);
    ops.push_back(b.matmul(q, kt, s, MatmulOverrides{seq_q, seq_kv, nullptr}));  // S = Q K^T
    ops.push_back(b.pointwise(CUDNN_POINTWISE_MUL, s, scale, s_scaled));         // S *= scale
    // padding mask: keep row < seq_q and col < seq_kv, else the masked fill
    const auto row = logits(i32), col = logits(i32);
    ops.push_back(
        b.pointwise(CUDNN_POINTWISE_GEN_INDEX, s_scaled, nullptr, row, PointwiseExtras{i32, nullptr, 2}));
    ops.push_back(
        b.pointwise(CUDNN_POINTWISE_GEN_INDEX, s_scaled, nullptr, col, PointwiseExtras{i32, nullptr, 3}));
    const auto row_ok = logits(CUDNN_DATA_BOOLEAN), col_ok = logits(CUDNN_DATA_BOOLEAN);
    const auto keep = logits(CUDNN_DATA_BOOLEAN);
    const PointwiseExtras boolean{CUDNN_DATA_BOOLEAN, nullptr, -1};
    ops.push_back(b.pointwise(CUDNN_POINTWISE_CMP_LT, row, seq_q, row_ok, boolean));
    ops.push_back(b.pointwise(CUDNN_POINTWISE_CMP_LT, col, seq_kv, col_ok, boolean));
    ops.push_back(b.pointwise(CUDNN_POINTWISE_LOGICAL_AND, row_ok, col_ok, keep, boolean));
    const auto masked = logits(f32);
    ops.push_back(b.pointwise(CUDNN_POINTWISE_BINARY_SELECT, s_scaled, neg_inf, masked,
                              PointwiseExtras{f32, keep, -1}));
    // softmax with the stats M + log Z as an output
    const auto m = rows();
    ops.push_back(b.reduction(CUDNN_REDUCE_TENSOR_MAX, masked, m));
    const auto centered = logits(f32), e = logits(f32);
    ops.push_back(b.pointwise(CUDNN_POINTWISE_SUB, masked, m, centered));
    ops.push_back(b.pointwise(CUDNN_POINTWISE_EXP, centered, nullptr, e));
    const auto z = rows();
    ops.push_back(b.reduction(CUDNN_REDUCE_TENSOR_ADD, e, z));
    const auto log_z = rows();
    ops.push_back(b.pointwise(CUDNN_POINTWISE_LOG, z, nullptr, log_z));
    ops.push_back(b.pointwise(CUDNN_POINTWISE_ADD, m, log_z, stats));
    const auto p = logits(io);
    ops.push_back(b.pointwise(CUDNN_POINTWISE_DIV, e, z, p));
    const auto vv = b.tensor(uid++, io, {1, H, S, D}, {D * S * H, D * S, D, 1}, true);
    ops.push_back(b.paged_cache_load(vc, table_v, seq_kv, vv));
    ops.push_back(b.matmul(p, vv, o, MatmulOverrides{seq_q, nullptr, seq_kv}));  // O = P V
    return ops;
#else
    throw CudnnFailure{
        fmt::format("paged cache loads need cuDNN >= 9.5 headers (built with {})", CUDNN_VERSION)};
#endif
}

}  // namespace

PagedSdpaKey paged_sdpa_key(const PagedSdpaCall& c, SdpaGraph g) {
    return {int64_t(c.dtype), c.lq,          c.hist,   c.heads,      c.d,          c.q_tok,
            c.q_head,         c.o_tok,       c.o_head, c.num_blocks, c.block_size, c.block_stride,
            c.token_stride,   c.head_stride, c.pages,  int64_t(g)};
}

PagedSdpaPlan::~PagedSdpaPlan() {
    if (seq_lens) cudaFree(seq_lens);
}

std::unique_ptr<PagedSdpaPlan> build_paged_sdpa_plan(cudnnHandle_t handle, const PagedSdpaCall& c,
                                                     SdpaGraph g) {
    auto plan = std::make_unique<PagedSdpaPlan>();
    plan->graph = g;
    try {
        SdpaBuilder b(plan->sdpa.keep);
        finalize_sdpa_plan(handle, b, paged_operations(b, c, g), plan->sdpa);
    } catch (const CudnnFailure& f) {
        plan->sdpa.ok = false;
        plan->sdpa.error = f.what;
        return plan;
    }
    // NOTE: written once, synchronously, before any replay can read them; 16 bytes apart (the descriptors
    // declare 16-byte alignment)
    const int32_t lens[8] = {int32_t(c.lq), 0, 0, 0, int32_t(c.hist), 0, 0, 0};
    DZR_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&plan->seq_lens), sizeof(lens)));
    DZR_CUDA_CHECK(cudaMemcpy(plan->seq_lens, lens, sizeof(lens), cudaMemcpyHostToDevice));
    return plan;
}

cudnnStatus_t run_paged_sdpa_plan(cudnnHandle_t handle, const PagedSdpaPlan& plan, const PagedSdpaCall& c,
                                  void* workspace) {
    float scale = c.scale, neg_inf = masked_logit();
    const int64_t uids[11] = {kUidQ,      kUidK,      kUidV,    kUidO,     kUidScale, kUidStats,
                              kUidTableK, kUidTableV, kUidSeqQ, kUidSeqKv, kUidNegInf};
    void* table = const_cast<int32_t*>(c.table);
    void* ptrs[11] = {const_cast<void*>(c.q),
                      const_cast<void*>(c.k_pool),
                      const_cast<void*>(c.v_pool),
                      c.out,
                      &scale,
                      c.stats,
                      table,
                      table,
                      plan.seq_lens,
                      plan.seq_lens + 4,
                      &neg_inf};
    // NOTE: the unified node has no masked-fill operand
    const int64_t n = plan.graph == SdpaGraph::Unified ? 10 : 11;
    return execute_sdpa_plan(handle, plan.sdpa, n, uids, ptrs, workspace);
}

namespace {

/// The paged call of `layer`'s history; empty, or why cuDNN cannot take it.
std::string paged_sdpa_call(const AttentionParams& p, const TensorView& q, const PagedKvView& history, int layer,
                            const TensorView& k_cur, const TensorView& v_cur, const TensorView& out,
                            PagedSdpaCall& c) {
    // NOTE: the container's block count: the view's layers lie one after another, layer_stride apart
    if (history.layer_stride <= 0 || history.block_stride <= 0 || history.layer_stride % history.block_stride != 0)
        return fmt::format("the pool view's layer stride {} is not a whole number of blocks of {} elements",
                           history.layer_stride, history.block_stride);
    const int64_t hist = history.seq_len, lq = q.dim(0);
    const int64_t layer_off = int64_t(layer) * history.layer_stride * int64_t(dtype_size(history.dtype));
    c.dtype = history.dtype;
    c.lq = lq, c.hist = hist, c.heads = history.num_heads, c.d = history.head_dim;
    c.q = q.data, c.out = out.data;
    c.q_tok = q.strides[0], c.q_head = q.strides[1], c.o_tok = out.strides[0], c.o_head = out.strides[1];
    c.k_pool = static_cast<const char*>(history.k_base) + layer_off;
    c.v_pool = static_cast<const char*>(history.v_base) + layer_off;
    c.num_blocks = history.layer_stride / history.block_stride;
    c.block_size = history.block_size, c.block_stride = history.block_stride;
    c.token_stride = history.token_stride, c.head_stride = history.head_stride;
    c.table = history.block_table;
    c.pages = (hist + history.block_size - 1) / history.block_size;
    c.scale = p.scale;
    for (const void* ptr :
         std::initializer_list<const void*>{c.q, c.out, c.k_pool, c.v_pool, k_cur.data, v_cur.data, c.table})
        if (pointer_alignment(ptr) < 16) return "an operand is not 16-byte aligned";
    if (lq > INT32_MAX || hist > INT32_MAX) return "a length exceeds int32";
    return {};
}

/// The history's plan: the first graph kind of `graphs` cuDNN takes (built on first use, never inside a capture);
/// null with `why` when none.
const PagedSdpaPlan* paged_sdpa_plan_for(PagedSdpaState& state, cudnnHandle_t handle, const PagedSdpaCall& c,
                                         const std::vector<SdpaGraph>& graphs, bool capturing, std::string& why) {
    std::string refusals;
    for (SdpaGraph g : graphs) {
        const PagedSdpaKey key = paged_sdpa_key(c, g);
        auto it = state.plans.find(key);
        if (it == state.plans.end()) {
            // NOTE: building allocates and writes the sequence lengths synchronously, so not inside a capture
            // (the graph runner runs every shape eagerly before capturing it)
            if (capturing) {
                why = "a capture began before this shape's paged plan was built";
                return nullptr;
            }
            auto plan = build_paged_sdpa_plan(handle, c, g);
            if (plan->sdpa.ok)
                log()->debug("cuDNN paged SDPA {} plan for Lq {} history {} H {} D {} block {} ({}): {}, workspace {} B",
                             sdpa_graph_name(g), c.lq, c.hist, c.heads, c.d, c.block_size, dtype_name(c.dtype),
                             plan->sdpa.engine, plan->sdpa.workspace);
            else
                log()->debug("cuDNN paged SDPA {} graph refused for Lq {} history {} H {} D {} block {} ({}): {}",
                             sdpa_graph_name(g), c.lq, c.hist, c.heads, c.d, c.block_size, dtype_name(c.dtype),
                             plan->sdpa.error);
            it = state.plans.emplace(key, std::move(plan)).first;
        }
        if (it->second->sdpa.ok) return it->second.get();
        refusals += fmt::format(" {}: {};", sdpa_graph_name(g), it->second->sdpa.error);
    }
    why = "cuDNN refused every paged graph:" + refusals;
    return nullptr;
}

}  // namespace

}  // namespace cuda_detail

using cuda_detail::AttentionCall;
using cuda_detail::PagedSdpaCall;
using cuda_detail::PagedSdpaPlan;
using cuda_detail::SdpaGraph;
using cuda_detail::SdpaPlan;

bool CudaBackend::try_paged_sdpa(const AttentionParams& p, const TensorView& q, const PagedKvView& history,
                                 int layer, const TensorView& k_cur, const TensorView& v_cur,
                                 const TensorView& out, std::string& why) {
    if (!paged_sdpa_) paged_sdpa_ = std::make_unique<cuda_detail::PagedSdpaState>();
    cuda_detail::PagedSdpaState& state = *paged_sdpa_;
    const int64_t H = history.num_heads, D = history.head_dim, hist = history.seq_len, cur = k_cur.dim(0),
                  lq = q.dim(0);
    // NOTE: only a forced CudnnPaged gets here (Auto gathers: cuda_paged_attention.cpp); the caller throws `why`
    const auto refuse = [&](const std::string& reason) {
        why = reason;
        log()->debug("cuda backend: paged attention Lq {} history {} current {}: cuDNN paged SDPA refused: {}", lq,
                     hist, cur, reason);
        return false;
    };
    std::vector<SdpaGraph> graphs;
    if (options_.attention == AttentionImpl::Auto || options_.attention == AttentionImpl::CudnnUnified)
        graphs.push_back(SdpaGraph::Unified);
    if (options_.attention == AttentionImpl::Auto || options_.attention == AttentionImpl::CudnnComposite)
        graphs.push_back(SdpaGraph::Composite);
    if (graphs.empty())
        return refuse(
            fmt::format("the attention implementation is {}", attention_impl_name(options_.attention)));
    PagedSdpaCall c;
    if (std::string reason = cuda_detail::paged_sdpa_call(p, q, history, layer, k_cur, v_cur, out, c); !reason.empty())
        return refuse(reason);
    const bool capturing = cuda_detail::is_capturing(stream_);
    std::string reason;
    const PagedSdpaPlan* paged = cuda_detail::paged_sdpa_plan_for(state, cudnn(), c, graphs, capturing, reason);
    if (!paged) return refuse(reason);
    const size_t es = dtype_size(history.dtype);

    // scratch: both parts' stats and the current rows' output
    ArenaScope scope(arena_);
    const auto aligned = [](int64_t b) {
        return (size_t(b) + Arena::kAlign - 1) / Arena::kAlign * Arena::kAlign;
    };
    const auto room = [&] { return arena_.capacity() - arena_.used(); };
    const auto take = [&](int64_t bytes) { return bytes > 0 ? arena_.alloc(size_t(bytes)) : nullptr; };
    const int64_t rows_bytes = lq * H * D * int64_t(es), stats_bytes = H * lq * int64_t(sizeof(float));
    const size_t scratch = 2 * aligned(stats_bytes) + (cur > 0 ? aligned(rows_bytes) : 0);
    if (room() < scratch)
        return refuse(
            fmt::format("the workspace arena has {} bytes left, the split attention needs {} of scratch",
                        room(), scratch));
    c.stats = static_cast<float*>(take(stats_bytes));
    AttentionCall dense;
    dense.dtype = c.dtype;
    dense.lq = lq, dense.lk = cur, dense.heads = H, dense.d = D, dense.dv = D;
    dense.q = q.data, dense.k = k_cur.data, dense.v = v_cur.data;
    dense.q_tok = q.strides[0], dense.q_head = q.strides[1];
    dense.k_tok = k_cur.strides[0], dense.k_head = k_cur.strides[1];
    dense.v_tok = v_cur.strides[0], dense.v_head = v_cur.strides[1];
    dense.o_tok = H * D, dense.o_head = D;
    dense.scale = p.scale;
    dense.out = cur > 0 ? take(rows_bytes) : nullptr;
    dense.stats = static_cast<float*>(take(stats_bytes));

    // the current rows' plan: dense, with stats
    const SdpaPlan* current = nullptr;
    SdpaGraph current_graph = SdpaGraph::Unified;
    if (cur > 0) {
        for (SdpaGraph g : graphs) {
            if (capturing && !sdpa_plans_.count(cuda_detail::sdpa_key(dense, g)))
                return refuse("a capture began before this shape's dense plan was built");
            const SdpaPlan* plan = sdpa_plan(dense, g);
            if (plan->ok) {
                current = plan;
                current_graph = g;
                break;
            }
        }
        if (!current) return refuse("cuDNN refused the current rows' dense graph with stats (see the log)");
    }
    const size_t workspaces = aligned(paged->sdpa.workspace) + (current ? aligned(current->workspace) : 0);
    if (room() < workspaces)
        return refuse(fmt::format("the workspace arena has {} bytes left, the cuDNN plans need {}", room(),
                                  workspaces));

    cudnnStatus_t st = cuda_detail::run_paged_sdpa_plan(cudnn(), *paged, c, take(paged->sdpa.workspace));
    if (st != CUDNN_STATUS_SUCCESS) {
        // NOTE: a plan that finalized but does not execute is dropped for good (the gather runs the call)
        const std::string reason =
            fmt::format("executing the paged {} plan: {}", cuda_detail::sdpa_graph_name(paged->graph),
                        cudnnGetErrorString(st));
        cuda_detail::SdpaPlan& failed = state.plans.at(cuda_detail::paged_sdpa_key(c, paged->graph))->sdpa;
        failed.ok = false;
        failed.error = reason;
        return refuse(reason);
    }
    last_attention_impl_ =
        paged->graph == SdpaGraph::Unified ? AttentionImpl::CudnnUnified : AttentionImpl::CudnnComposite;
    if (!current) return true;  // no current rows: the history's attention is the answer

    st = cuda_detail::try_run_sdpa_plan(cudnn(), *current, dense, take(current->workspace));
    if (st != CUDNN_STATUS_SUCCESS)
        return refuse(fmt::format("executing the current rows' dense {} plan: {}",
                                  cuda_detail::sdpa_graph_name(current_graph), cudnnGetErrorString(st)));
    kernels::AttentionMergeArgs merge;
    merge.dtype = c.dtype;
    merge.lq = lq, merge.heads = int(H), merge.head_dim = int(D);
    merge.out = out.data, merge.o_tok = out.strides[0], merge.o_head = out.strides[1];
    merge.other = dense.out, merge.b_tok = H * D, merge.b_head = D;
    merge.lse_a = c.stats, merge.lse_b = dense.stats;
    DZR_CUDA_CHECK(kernels::attention_merge(merge, stream_));
    return true;
}

}  // namespace dzr
