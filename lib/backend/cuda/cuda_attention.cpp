// Fused attention for the CUDA backend: cuDNN SDPA through the backend (descriptor) API, dzr's flash
// kernel, and the dispatcher that picks between them and the GEMM-softmax-GEMM path (cuda_gemm.cpp).
//
// cuDNN's graphs follow cudnn-frontend's lowering of its SDPA node (read, not copied):
//  - Unified: one CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR node with Q, K, V, O and a by-value scale
//    (cuDNN >= 9.13.1).
//  - Composite: S = Q K^T (K described transposed through its strides), S *= scale, softmax as
//    M = max(S), E = exp(S - M), Z = sum(E), P = E / Z, O = P V with P in the input dtype, plus the stats
//    branch M + log Z (virtual unless the call asks for the stats): cuDNN 9.14 offers no engine for the graph
//    without it. Intermediates are virtual f32 tensors, so the fused engine keeps them on chip.
// The descriptor builder is shared with the paged graphs (cuda_sdpa_builder.h, cuda_paged_sdpa.cpp).
// Tensors are [B, H, L, D] views of dzr's [L, H, D] layout: dims {B, H, L, D}, strides {batch, head stride, token
// stride, 1}; B is 1 but for a batched call (AttentionCall::batch: the CFG branches' self-attention).
#include <algorithm>

#include "backend/cuda/cuda_attention.h"
#include "backend/cuda/cuda_sdpa_builder.h"
#include "backend/cuda/cuda_internal.h"
#include "core/log.h"
#include "kernels/attention.cuh"
#include "kernels/attention_memeff.cuh"

namespace dzr {

namespace cuda_detail {

namespace {

constexpr int64_t kUidQ = 1, kUidK = 2, kUidV = 3, kUidO = 4, kUidScale = 5, kUidStats = 6;

using Builder = SdpaBuilder;

cudnnDataType_t cudnn_type(DType t) {
    return t == DType::F16 ? CUDNN_DATA_HALF : CUDNN_DATA_BFLOAT16;
}

/// [L, H, D] with (token, head) strides as a cuDNN [B, H, L, D] tensor's strides (`batch`: the stride between the
/// B attentions, unused with B = 1).
std::array<int64_t, 4> bhsd_strides(int64_t len, int64_t heads, int64_t tok, int64_t head, int64_t batch) {
    if (batch <= 0) batch = std::max({len * tok, heads * head, int64_t(1)});
    return {batch, head, tok, 1};
}

/// The operations of one graph kind; returns them in execution order.
std::vector<cudnnBackendDescriptor_t> sdpa_operations(Builder& b, const AttentionCall& c, SdpaGraph g) {
    const cudnnDataType_t io = cudnn_type(c.dtype), f32 = CUDNN_DATA_FLOAT;
    const int64_t B = c.batch, H = c.heads, Lq = c.lq, Lk = c.lk, D = c.d, Dv = c.dv;
    const auto q = b.tensor(kUidQ, io, {B, H, Lq, D}, bhsd_strides(Lq, H, c.q_tok, c.q_head, c.q_batch), false);
    const auto v = b.tensor(kUidV, io, {B, H, Lk, Dv}, bhsd_strides(Lk, H, c.v_tok, c.v_head, c.v_batch), false);
    const auto o = b.tensor(kUidO, io, {B, H, Lq, Dv}, bhsd_strides(Lq, H, c.o_tok, c.o_head, c.o_batch), false);
    const auto scale = b.tensor(kUidScale, f32, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true);
    const auto ks = bhsd_strides(Lk, H, c.k_tok, c.k_head, c.k_batch);

    if (g == SdpaGraph::Unified) {
#if CUDNN_VERSION >= 91301
        const char* stage = "sdpa_fwd operation";
        const auto k = b.tensor(kUidK, io, {B, H, Lk, D}, ks, false);
        cudnnBackendDescriptor_t op = b.make(CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR, stage);
        Builder::set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC, q, stage);
        Builder::set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC, k, stage);
        Builder::set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC, v, stage);
        Builder::set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC, o, stage);
        Builder::set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC, scale, stage);
        if (c.stats)
            Builder::set_desc(op, CUDNN_ATTR_OPERATION_SDPA_FWD_STATSDESC,
                              b.tensor(kUidStats, f32, {B, H, Lq, 1}, {H * Lq, Lq, 1, 1}, false), stage);
        Builder::finalize(op, stage);
        return {op};
#else
        throw CudnnFailure{fmt::format("the unified SDPA node needs cuDNN >= 9.13.1 headers (built with {})",
                                       CUDNN_VERSION)};
#endif
    }

    // K^T: [B, H, D, Lk], the same memory as K with the last two strides swapped
    const auto kt = b.tensor(kUidK, io, {B, H, D, Lk}, {ks[0], ks[1], 1, ks[2]}, false);
    int64_t uid = 100;
    const std::array<int64_t, 4> s_dims{B, H, Lq, Lk}, s_strides{H * Lq * Lk, Lq * Lk, Lk, 1};
    const std::array<int64_t, 4> r_dims{B, H, Lq, 1}, r_strides{H * Lq, Lq, 1, 1};
    const auto logits = [&](cudnnDataType_t t) { return b.tensor(uid++, t, s_dims, s_strides, true); };
    const auto rows = [&] { return b.tensor(uid++, f32, r_dims, r_strides, true); };
    std::vector<cudnnBackendDescriptor_t> ops;
    const auto s = logits(f32), s_scaled = logits(f32);
    ops.push_back(b.matmul(q, kt, s));                                    // S = Q K^T
    ops.push_back(b.pointwise(CUDNN_POINTWISE_MUL, s, scale, s_scaled));  // S *= scale
    const auto m = rows();
    ops.push_back(b.reduction(CUDNN_REDUCE_TENSOR_MAX, s_scaled, m));  // M = rowmax(S)
    const auto centered = logits(f32), e = logits(f32);
    ops.push_back(b.pointwise(CUDNN_POINTWISE_SUB, s_scaled, m, centered));  // S - M
    ops.push_back(b.pointwise(CUDNN_POINTWISE_EXP, centered, nullptr, e));   // E = exp(S - M)
    const auto z = rows();
    ops.push_back(b.reduction(CUDNN_REDUCE_TENSOR_ADD, e, z));  // Z = rowsum(E)
    // NOTE: the stats are an output when the caller asks for them (a split attention merges its parts with them)
    const auto log_z = rows();
    const auto stats = c.stats ? b.tensor(kUidStats, f32, r_dims, r_strides, false) : rows();
    ops.push_back(b.pointwise(CUDNN_POINTWISE_LOG, z, nullptr, log_z));  // log Z
    ops.push_back(b.pointwise(CUDNN_POINTWISE_ADD, m, log_z, stats));    // stats = M + log Z
    const auto p = logits(io);
    ops.push_back(b.pointwise(CUDNN_POINTWISE_DIV, e, z, p));  // P = E / Z
    ops.push_back(b.matmul(p, v, o));                          // O = P V
    return ops;
}

}  // namespace

const char* sdpa_graph_name(SdpaGraph g) {
    switch (g) {
        case SdpaGraph::Unified:
            return "unified";
        case SdpaGraph::Composite:
            return "composite";
    }
    return "?";
}

SdpaPlan::~SdpaPlan() {
    // NOTE: the plan refers to the engine config and graph, so it goes first; the rest in reverse order.
    if (plan) cudnnBackendDestroyDescriptor(plan);
    for (auto it = keep.rbegin(); it != keep.rend(); ++it) cudnnBackendDestroyDescriptor(*it);
}

SdpaKey sdpa_key(const AttentionCall& c, SdpaGraph g) {
    return {int64_t(c.dtype), c.lq,      c.lk,      c.heads,   c.d,       c.dv,       c.q_tok,
            c.q_head,         c.k_tok,   c.k_head,  c.v_tok,   c.v_head,  c.o_tok,    c.o_head,
            int64_t(g),       c.stats ? 1 : 0,      c.batch,   c.q_batch, c.k_batch,  c.v_batch, c.o_batch};
}

void finalize_sdpa_plan(cudnnHandle_t handle, SdpaBuilder& b, const std::vector<cudnnBackendDescriptor_t>& ops,
                        SdpaPlan& plan) {
    const char* stage = "operation graph";
    cudnnBackendDescriptor_t graph = b.make(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, stage);
    Builder::set(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle, stage);
    Builder::set(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, int64_t(ops.size()),
                 ops.data(), stage);
    Builder::finalize(graph, stage);

    std::string refusals;
    for (const cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
        stage = "engine heuristics";
        cudnnBackendDescriptor_t heur = b.make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, stage);
        Builder::set_desc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph, stage);
        Builder::set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, stage);
        Builder::finalize(heur, stage);
        int64_t count = 0;
        cudnnStatus_t st = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                                    CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, nullptr);
        if (st != CUDNN_STATUS_SUCCESS) cudnn_fail("engine heuristics results", st);
        if (count <= 0) {
            refusals += fmt::format(" heuristics mode {} offered no engine config;", int(mode));
            continue;
        }
        std::vector<cudnnBackendDescriptor_t> cfgs;
        for (int64_t i = 0; i < count; ++i)
            cfgs.push_back(b.make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine config"));
        int64_t got = 0;
        st = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                      count, &got, cfgs.data());
        if (st != CUDNN_STATUS_SUCCESS) cudnn_fail("engine configs", st);
        for (int64_t i = 0; i < got; ++i) {
            cudnnBackendDescriptor_t p = nullptr;
            st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &p);
            if (st != CUDNN_STATUS_SUCCESS) cudnn_fail("execution plan", st);
            st = cudnnBackendSetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1,
                                          &handle);
            if (st == CUDNN_STATUS_SUCCESS)
                st = cudnnBackendSetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
                                              CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[size_t(i)]);
            if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(p);
            int64_t ws = 0;
            if (st == CUDNN_STATUS_SUCCESS)
                st = cudnnBackendGetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                              CUDNN_TYPE_INT64, 1, nullptr, &ws);
            if (st != CUDNN_STATUS_SUCCESS) {
                cudnnBackendDestroyDescriptor(p);
                refusals +=
                    fmt::format(" config {} of mode {}: {};", i, int(mode), cudnnGetErrorString(st));
                continue;
            }
            plan.plan = p;
            plan.workspace = ws;
            plan.engine = fmt::format("heuristics mode {}, config {} of {}", int(mode), i, got);
            plan.ok = true;
            return;
        }
    }
    throw CudnnFailure{"execution plan: no engine config finalized:" + refusals};
}

std::unique_ptr<SdpaPlan> build_sdpa_plan(cudnnHandle_t handle, const AttentionCall& c, SdpaGraph g) {
    auto plan = std::make_unique<SdpaPlan>();
    try {
        Builder b(plan->keep);
        finalize_sdpa_plan(handle, b, sdpa_operations(b, c, g), *plan);
    } catch (const CudnnFailure& f) {
        plan->ok = false;
        plan->error = f.what;
    }
    return plan;
}

cudnnStatus_t execute_sdpa_plan(cudnnHandle_t handle, const SdpaPlan& plan, int64_t n, const int64_t* uids,
                                void* const* ptrs, void* workspace) {
    cudnnBackendDescriptor_t pack = nullptr;
    cudnnStatus_t st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1,
                                      &workspace);
    if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(pack);
    if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendExecute(handle, plan.plan, pack);
    cudnnBackendDestroyDescriptor(pack);
    return st;
}

cudnnStatus_t try_run_sdpa_plan(cudnnHandle_t handle, const SdpaPlan& plan, const AttentionCall& c,
                                void* workspace) {
    float scale = c.scale;
    const int64_t uids[6] = {kUidQ, kUidK, kUidV, kUidO, kUidScale, kUidStats};
    void* ptrs[6] = {const_cast<void*>(c.q), const_cast<void*>(c.k), const_cast<void*>(c.v), c.out, &scale, c.stats};
    return execute_sdpa_plan(handle, plan, c.stats ? 6 : 5, uids, ptrs, workspace);
}

void run_sdpa_plan(cudnnHandle_t handle, const SdpaPlan& plan, const AttentionCall& c, void* workspace) {
    DZR_CUDNN_CHECK(try_run_sdpa_plan(handle, plan, c, workspace));
}

}  // namespace cuda_detail

using cuda_detail::AttentionCall;
using cuda_detail::DeviceGuard;
using cuda_detail::SdpaGraph;
using cuda_detail::SdpaPlan;

const SdpaPlan* CudaBackend::sdpa_plan(const AttentionCall& c, SdpaGraph g) {
    const cuda_detail::SdpaKey key = cuda_detail::sdpa_key(c, g);
    auto it = sdpa_plans_.find(key);
    if (it == sdpa_plans_.end()) {
        auto plan = cuda_detail::build_sdpa_plan(cudnn(), c, g);
        if (plan->ok)
            log()->debug("cuDNN SDPA {} plan for Lq {} Lk {} H {} D {} ({}): {}, workspace {} B",
                         cuda_detail::sdpa_graph_name(g), c.lq, c.lk, c.heads, c.d, dtype_name(c.dtype),
                         plan->engine, plan->workspace);
        else
            log()->info("cuDNN SDPA {} graph refused for Lq {} Lk {} H {} D {} ({}): {}",
                        cuda_detail::sdpa_graph_name(g), c.lq, c.lk, c.heads, c.d, dtype_name(c.dtype),
                        plan->error);
        it = sdpa_plans_.emplace(key, std::move(plan)).first;
    }
    return it->second.get();
}

bool CudaBackend::try_sdpa(const AttentionCall& c, SdpaGraph g) {
    // NOTE: cuDNN wants 16-byte aligned operands; the descriptors declare it.
    for (const void* p : {c.q, c.k, c.v, static_cast<const void*>(c.out)})
        if (cuda_detail::pointer_alignment(p) < 16) return false;
    const SdpaPlan* plan = sdpa_plan(c, g);
    if (!plan->ok) return false;
    ArenaScope scope(arena_);
    void* ws = nullptr;
    if (plan->workspace > 0) {
        // NOTE: no room left in the arena is a refusal (the flash kernel needs none), not an error
        const size_t need = (size_t(plan->workspace) + Arena::kAlign - 1) / Arena::kAlign * Arena::kAlign;
        if (arena_.capacity() - arena_.used() < need) return false;
        ws = arena_.alloc(size_t(plan->workspace));
    }
    cuda_detail::run_sdpa_plan(cudnn(), *plan, c, ws);
    return true;
}

bool CudaBackend::try_flash(const AttentionCall& c) {
    kernels::FlashAttentionArgs a;
    a.dtype = c.dtype;
    a.head_dim = int(c.d);
    a.heads = int(c.heads);
    a.lq = c.lq;
    a.scale = c.scale;
    a.q = c.q, a.q_tok = c.q_tok, a.q_head = c.q_head;
    a.out = c.out, a.o_tok = c.o_tok, a.o_head = c.o_head;
    a.k = c.k, a.k_tok = c.k_tok, a.k_head = c.k_head;
    a.v = c.v, a.v_tok = c.v_tok, a.v_head = c.v_head;
    a.cur_len = c.lk;
    if (c.batch != 1 || c.d != c.dv || !kernels::flash_attention_supported(a)) return false;
    DZR_CUDA_CHECK(kernels::flash_attention(a, stream_));
    return true;
}

bool CudaBackend::try_mem_efficient(const AttentionCall& c) {
    kernels::MemEffAttentionArgs a;
    a.dtype = c.dtype;
    a.heads = int(c.heads);
    a.lq = c.lq, a.lk = c.lk;
    a.d = int(c.d), a.dv = int(c.dv);
    a.scale = c.scale;
    a.q = c.q, a.q_tok = c.q_tok, a.q_head = c.q_head;
    a.k = c.k, a.k_tok = c.k_tok, a.k_head = c.k_head;
    a.v = c.v, a.v_tok = c.v_tok, a.v_head = c.v_head;
    a.out = c.out, a.o_tok = c.o_tok, a.o_head = c.o_head;
    if (c.batch != 1 || c.heads > 65535 || c.d > 512 || c.dv > 512 || !kernels::mem_eff_attention_supported(a)) return false;
    DZR_CUDA_CHECK(kernels::mem_eff_attention(a, stream_));
    return true;
}

AttentionImpl CudaBackend::run_fused_attention(const AttentionCall& c) {
    const AttentionImpl want = options_.attention;
    // NOTE: PyTorch's SDPA runs head dims above 256 on its memory-efficient backend (its cuDNN and flash
    // backends refuse them); dzr's cuDNN would run them in another order.
    if ((want == AttentionImpl::MemEfficient || (want == AttentionImpl::Auto && std::max(c.d, c.dv) > 256)) &&
        try_mem_efficient(c))
        return AttentionImpl::MemEfficient;
    const auto cudnn_unified = [&] { return try_sdpa(c, SdpaGraph::Unified); };
    const auto cudnn_composite = [&] { return try_sdpa(c, SdpaGraph::Composite); };
    if ((want == AttentionImpl::Auto || want == AttentionImpl::CudnnUnified) && cudnn_unified())
        return AttentionImpl::CudnnUnified;
    if ((want == AttentionImpl::Auto || want == AttentionImpl::CudnnComposite) && cudnn_composite())
        return AttentionImpl::CudnnComposite;
    if ((want == AttentionImpl::Auto || want == AttentionImpl::Flash) && try_flash(c))
        return AttentionImpl::Flash;
    return AttentionImpl::Gemm;
}

void CudaBackend::do_attention(const AttentionParams& p, const TensorView& q, const TensorView& k,
                               const TensorView& v, const TensorView& bias, const TensorView& out) {
    for (const auto& [t, what] :
         {std::pair{&q, "q"}, std::pair{&k, "k"}, std::pair{&v, "v"}, std::pair{&out, "out"}})
        check_device_tensor(*t, "attention", what);
    DZR_CHECK(q.rank() == 3 && k.rank() == 3 && v.rank() == 3 && out.rank() == 3,
              "cuda backend: attention needs [L, H, D] operands: q {} k {} v {} out {}", q.str(), k.str(),
              v.str(), out.str());
    const int64_t Lq = q.dim(0), H = q.dim(1), D = q.dim(2), Lk = k.dim(0), Dv = v.dim(2);
    DZR_CHECK(k.dim(1) == H && v.dim(1) == H && k.dim(2) == D && v.dim(0) == Lk && out.dim(0) == Lq &&
                  out.dim(1) == H && out.dim(2) == Dv,
              "cuda backend: attention shapes disagree: q {} k {} v {} out {}", q.str(), k.str(), v.str(),
              out.str());
    const bool f16 = q.dtype == DType::F16;
    DZR_CHECK((cuda_detail::is_float_act(q.dtype) || f16) && k.dtype == q.dtype && v.dtype == q.dtype &&
                  out.dtype == q.dtype,
              "cuda backend: attention needs q, k, v, out of one dtype (f32, bf16 or f16): {} {} {} {}",
              q.str(), k.str(), v.str(), out.str());
    for (const TensorView* t : {&q, &k, &v, &out})
        DZR_CHECK(t->strides[2] == 1, "cuda backend: attention needs a unit head-dim stride: {}", t->str());
    if (bias.defined()) {
        check_device_tensor(bias, "attention", "bias");
        DZR_CHECK(bias.dtype == DType::F32 && bias.is_contiguous() && bias.numel() == H * Lq * Lk,
                  "cuda backend: attention bias {} must be a contiguous f32 [H={}, Lq={}, Lk={}]", bias.str(),
                  H, Lq, Lk);
    }
    DeviceGuard guard(index_);
    // NOTE: the fused paths cover bf16/f16 without bias; f32 and biased attention (umT5's relative
    // positions) take the GEMM path, as does every shape the fused paths refuse.
    const bool fusable = !bias.defined() && q.dtype != DType::F32 && Lq > 0 && Lk > 0 && H > 0 && Dv > 0;
    AttentionImpl ran = AttentionImpl::Gemm;
    if (fusable && options_.attention != AttentionImpl::Gemm) {
        AttentionCall c;
        c.dtype = q.dtype;
        c.lq = Lq, c.lk = Lk, c.heads = H, c.d = D, c.dv = Dv;
        c.q = q.data, c.k = k.data, c.v = v.data, c.out = out.data;
        c.q_tok = q.strides[0], c.q_head = q.strides[1], c.k_tok = k.strides[0], c.k_head = k.strides[1];
        c.v_tok = v.strides[0], c.v_head = v.strides[1], c.o_tok = out.strides[0], c.o_head = out.strides[1];
        c.scale = p.scale;
        ran = run_fused_attention(c);
        if (ran == AttentionImpl::Gemm && options_.attention != AttentionImpl::Auto)
            DZR_THROW(
                "cuda backend: attention implementation {} cannot run q {} k {} v {} out {} (see the log)",
                attention_impl_name(options_.attention), q.str(), k.str(), v.str(), out.str());
    }
    last_attention_impl_ = ran;
    if (ran != AttentionImpl::Gemm) return;
    DZR_CHECK(!f16,
              "cuda backend: no attention path runs f16 q {} (fused paths: D 64/128 flash or cuDNN; the GEMM "
              "path is f32/bf16 only)",
              q.str());
    attention_gemm(p, q, k, v, bias, out);
}

}  // namespace dzr
