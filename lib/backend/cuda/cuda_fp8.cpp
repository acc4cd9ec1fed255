// FP8 (E4M3) ops of the CUDA backend: per-row quantization and its inverse (kernels/fp8.cu), the FP8 Linear GEMM
// through cuBLASLt, and the FP8 KV pool's scatter and dequantizing gather before the dense attention.
//
// The GEMM: out[M, N] = x_scales[m] w_scales[n] (xq[M, K] · wq[N, K]ᵀ) + bias. cuBLASLt is column-major, so (as in
// cuda_gemm.cpp) it computes outᵀ [N, M] = wq · xqᵀ: its A is wq, stored [N, K] row-major = K x N column-major and
// used transposed, its B is xq, K x M column-major, not transposed. That is the TN layout FP8 matmuls require on
// Hopper. The two scale vectors go in as outer-vector scales (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F, cuBLAS
// 12.9+): A's vector has one f32 per row of cuBLASLt's m = N (the weight's output channels), B's one per column of its
// n = M (the tokens), and element (i, j) of A·B is multiplied by both, in the f32 epilogue with the bias, before the
// one rounding to bf16. So no extra pass over the output is needed. If cuBLASLt has no algorithm with a bias
// epilogue for these scales, the matmul runs without it and a small kernel adds the bias (one more rounding); where
// it offers no algorithm at all for a shape (or the GPU/cuBLAS lacks outer-vector scaling), the plain kernel of
// kernels/fp8.cu runs the same math (slow). Both say so in a warning, once per shape.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Warray-bounds"
#pragma GCC diagnostic ignored "-Wstringop-overflow"
#include <fmt/format.h>

#include <algorithm>
#pragma GCC diagnostic pop

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_internal.h"
#include "core/log.h"
#include "kernels/elementwise.cuh"
#include "kernels/fp8.cuh"

namespace dzr {

using cuda_detail::DeviceGuard;
using cuda_detail::GemmPlan;
using cuda_detail::pointer_alignment;

namespace {

void require(bool ok, const char* op, const char* what, const TensorView& t, const char* expected) {
    DZR_CHECK(ok, "cuda backend: {} needs {} {}, got {}", op, what, expected, t.str());
}

/// Largest power of two (<= 256) dividing both the pointer and the leading dimension in bytes.
int64_t alignment(const void* p, int64_t ld_bytes) {
    int64_t a = pointer_alignment(p);
    while (a > 1 && ld_bytes % a != 0) a /= 2;
    return a;
}

cublasLtMatrixLayout_t make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld) {
    cublasLtMatrixLayout_t layout = nullptr;
    DZR_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout, type, uint64_t(rows), uint64_t(cols), ld));
    return layout;
}

kernels::Fp8KvPoolLayer fp8_pool_layer(const PagedKvView& pool, int layer) {
    const int64_t off = int64_t(layer) * pool.layer_stride;  // elements = bytes for E4M3
    kernels::Fp8KvPoolLayer p;
    p.k = static_cast<uint8_t*>(pool.k_base) + off;
    p.v = static_cast<uint8_t*>(pool.v_base) + off;
    p.k_scale = static_cast<float*>(pool.k_scale) + off / pool.head_dim;
    p.v_scale = static_cast<float*>(pool.v_scale) + off / pool.head_dim;
    p.token_stride = pool.token_stride;
    p.head_stride = pool.head_stride;
    p.block_size = pool.block_size;
    return p;
}

void check_fp8_pool(const PagedKvView& pool, const char* op) {
    DZR_CHECK(pool.k_base && pool.v_base && pool.k_scale && pool.v_scale && pool.head_stride == pool.head_dim &&
                  pool.layer_stride % pool.head_dim == 0 && pool.token_stride % pool.head_dim == 0,
              "cuda backend: {}: an f8_e4m3 pool needs its storage and K/V scales (head stride = head_dim {})", op,
              pool.head_dim);
}

}  // namespace

void CudaBackend::do_quantize_fp8(const TensorView& x, const TensorView& q, const TensorView& scales) {
    const char* op = "quantize_fp8";
    check_device_tensor(x, op, "x");
    check_device_tensor(q, op, "q");
    check_device_tensor(scales, op, "scales");
    require(cuda_detail::is_float_act(x.dtype) && x.rank() == 2 && (x.strides[1] == 1 || x.dim(1) <= 1), op, "x", x,
            "an f32 or bf16 [rows, cols] with a unit last stride");
    const int64_t rows = x.dim(0), cols = x.dim(1);
    require(q.dtype == DType::F8_E4M3 && q.is_contiguous() && q.shape == x.shape, op, "q", q,
            "a contiguous f8_e4m3 tensor of x's shape");
    require(scales.dtype == DType::F32 && scales.is_contiguous() && scales.numel() == rows, op, "scales", scales,
            "a contiguous f32 vector of x's rows");
    DeviceGuard guard(index_);
    DZR_CUDA_CHECK(kernels::quantize_fp8_rows(x.data, x.dtype, rows, cols, std::max<int64_t>(x.strides[0], cols),
                                              q.ptr<uint8_t>(), scales.ptr<float>(), stream_));
}

void CudaBackend::do_activation_quantize_fp8(const ActivationParams& p, const TensorView& x,
                                             const TensorView& q, const TensorView& scales) {
    const char* op = "activation_quantize_fp8";
    check_device_tensor(x, op, "x");
    check_device_tensor(q, op, "q");
    check_device_tensor(scales, op, "scales");
    if (p.kind == Activation::GeluTanh && x.dtype == DType::BF16 && x.rank() == 2 && x.is_contiguous() &&
        q.dtype == DType::F8_E4M3 && q.is_contiguous() && q.shape == x.shape && scales.dtype == DType::F32 &&
        scales.is_contiguous() && scales.numel() == x.dim(0)) {
        DeviceGuard guard(index_);
        const cudaError_t e =
            kernels::gelu_quantize_fp8_rows(x.data, x.dtype, x.dim(0), x.dim(1), q.ptr<uint8_t>(), scales.ptr<float>(),
                                            stream_, cuda_detail::row_impl(options_));
        if (e != cudaErrorNotSupported) {
            DZR_CUDA_CHECK(e);
            return;
        }
    }
    // NOTE: other activations, dtypes and shapes: the activation kernel, then the quantization (the same codes)
    Backend::do_activation_quantize_fp8(p, x, q, scales);
}

void CudaBackend::do_dequantize_fp8(const TensorView& q, const TensorView& scales, const TensorView& out) {
    const char* op = "dequantize_fp8";
    check_device_tensor(q, op, "q");
    check_device_tensor(scales, op, "scales");
    check_device_tensor(out, op, "out");
    require(q.dtype == DType::F8_E4M3 && q.is_contiguous(), op, "q", q, "a contiguous f8_e4m3 tensor");
    require(cuda_detail::is_float_act(out.dtype) && out.is_contiguous() && out.shape == q.shape, op, "out", out,
            "a contiguous f32 or bf16 tensor of q's shape");
    require(scales.dtype == DType::F32 && scales.is_contiguous() && scales.numel() == q.rows(), op, "scales", scales,
            "a contiguous f32 vector of q's rows");
    DeviceGuard guard(index_);
    DZR_CUDA_CHECK(kernels::dequantize_fp8_rows(q.ptr<const uint8_t>(), scales.ptr<const float>(), q.rows(), q.cols(),
                                                out.data, out.dtype, stream_));
}

namespace {

/// A cuBLASLt FP8 matmul for one shape, with the bias in the epilogue or without; has_algo false when cuBLASLt
/// offers none (`why` says what it answered).
std::unique_ptr<GemmPlan> make_fp8_plan(cublasLtHandle_t handle, int64_t M, int64_t N, int64_t K, int64_t ldc,
                                        DType out_dtype, const void* xq, const void* wq, const void* out,
                                        const void* bias, const void* w_scales, const void* x_scales, bool fast_accum,
                                        size_t workspace, std::string& why) {
    auto plan = std::make_unique<GemmPlan>();
    const cudaDataType_t out_type = out_dtype == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F;
    DZR_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t op_a = CUBLAS_OP_T, op_b = CUBLAS_OP_N;  // TN: A = wq (transposed), B = xq
    DZR_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
    DZR_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
    const int32_t outer = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    cublasStatus_t st =
        cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &outer, sizeof(outer));
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &outer, sizeof(outer));
    // NOTE: the scale vectors must be set before the heuristic: with outer-vector modes and no pointers cuBLASLt
    // answers "unsupported value" (measured on the H200, cuBLASLt 13.1; scripts/bench/fp8_lt_probe.cu sets them
    // first and gets an algorithm at every DiT shape). Each matmul sets its own pointers again.
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scales,
                                            sizeof(w_scales));
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scales,
                                            sizeof(x_scales));
    // NOTE: fast accumulation skips the periodic promotion of the tensor cores' partial sums to f32: faster, less
    // exact (CudaBackendOptions::fp8_fast_accum, off by default)
    // (left at cuBLASLt's default, off, unless asked: the probe's outer-vector algorithms were found that way)
    const int8_t fast = 1;
    if (st == CUBLAS_STATUS_SUCCESS && fast_accum)
        st = cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast));
    plan->bias_in_epilogue = bias != nullptr;
    if (st == CUBLAS_STATUS_SUCCESS && bias) {
        const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        const int32_t bias_type = out_type;
        st = cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi));
        if (st == CUBLAS_STATUS_SUCCESS)
            st = cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                sizeof(bias_type));
        if (st == CUBLAS_STATUS_SUCCESS)
            st = cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias));
    }
    plan->layout_a = make_layout(CUDA_R_8F_E4M3, K, N, K);  // wq [N, K] row-major
    plan->layout_b = make_layout(CUDA_R_8F_E4M3, K, M, K);  // xq [M, K] row-major
    plan->layout_c = make_layout(out_type, N, M, ldc);      // out [M, N] row-major, row stride ldc

    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    if (st == CUBLAS_STATUS_SUCCESS) {
        cublasLtMatmulPreference_t pref = nullptr;
        DZR_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
        const uint64_t ws = workspace;
        const uint32_t align_a = uint32_t(alignment(wq, K)), align_b = uint32_t(alignment(xq, K)),
                       align_c = uint32_t(alignment(out, ldc * int64_t(dtype_size(out_dtype))));
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
        if (st == CUBLAS_STATUS_SUCCESS)
            st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                                      sizeof(align_a));
        if (st == CUBLAS_STATUS_SUCCESS)
            st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b,
                                                      sizeof(align_b));
        if (st == CUBLAS_STATUS_SUCCESS)
            st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c,
                                                      sizeof(align_c));
        if (st == CUBLAS_STATUS_SUCCESS)
            st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c,
                                                      sizeof(align_c));
        if (st == CUBLAS_STATUS_SUCCESS)
            st = cublasLtMatmulAlgoGetHeuristic(handle, plan->desc, plan->layout_a, plan->layout_b, plan->layout_c,
                                                plan->layout_c, pref, 1, &result, &found);
        cublasLtMatmulPreferenceDestroy(pref);
    }
    plan->has_algo = st == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS;
    if (plan->has_algo)
        plan->algo = result.algo;
    else
        why = st == CUBLAS_STATUS_SUCCESS ? "no result" : cublasLtGetStatusString(st);
    return plan;
}

}  // namespace

GemmPlan& CudaBackend::fp8_gemm_plan(int64_t M, int64_t N, int64_t K, int64_t ldc, DType out_dtype, const void* xq,
                                     const void* wq, const void* out, const void* bias, const void* w_scales,
                                     const void* x_scales) {
    const Fp8GemmKey key = {M, N, K, ldc, int64_t(out_dtype), alignment(xq, K), alignment(wq, K),
                            alignment(out, ldc * int64_t(dtype_size(out_dtype))), bias != nullptr,
                            bias ? pointer_alignment(bias) : 0, options_.fp8_fast_accum};
    auto it = fp8_gemm_plans_.find(key);
    if (it != fp8_gemm_plans_.end()) return *it->second;
    std::string why;
    // NOTE: not timed as the bf16 plans are in fast numerics (CudaBackendOptions::gemm_tune): on the H200 the FP8
    // rollout ran 1.1305 s/call with its candidates timed and 1.1335 without, within noise (docs/PERF.md, "Open
    // headroom"), so the heuristic's first result stays, as the FP8 gates measured it
    auto plan = make_fp8_plan(cublas_, M, N, K, ldc, out_dtype, xq, wq, out, bias, w_scales, x_scales,
                              options_.fp8_fast_accum, kCublasWorkspaceBytes, why);
    if (!plan->has_algo && bias) {
        // NOTE: without a bias epilogue for these scales, the matmul writes the scaled product and a kernel adds the
        // bias (one more rounding to the output dtype)
        std::string why_plain;
        auto plain = make_fp8_plan(cublas_, M, N, K, ldc, out_dtype, xq, wq, out, nullptr, w_scales, x_scales,
                                   options_.fp8_fast_accum, kCublasWorkspaceBytes, why_plain);
        if (plain->has_algo) {
            log()->warn("cuBLASLt has no FP8 algorithm with outer-vector scales and a bias epilogue for {} x {} x {} "
                        "({}); the bias is added by a separate kernel",
                        M, N, K, why);
            plan = std::move(plain);
        }
    }
    if (!plan->has_algo)
        log()->warn("cuBLASLt has no FP8 algorithm with per-channel and per-token scales for {} x {} x {} (-> {}, ldc "
                    "{}): {}; using the plain FP8 kernel (slow)",
                    M, N, K, dtype_name(out_dtype), ldc, why);
    return *fp8_gemm_plans_.emplace(key, std::move(plan)).first->second;
}

void CudaBackend::do_gemm_fp8(const TensorView& xq, const TensorView& x_scales, const TensorView& wq,
                              const TensorView& w_scales, const TensorView& bias, const TensorView& out) {
    const char* op = "gemm_fp8";
    for (const auto& [t, what] : {std::pair{&xq, "xq"}, std::pair{&x_scales, "x_scales"}, std::pair{&wq, "wq"},
                                  std::pair{&w_scales, "w_scales"}, std::pair{&out, "out"}})
        check_device_tensor(*t, op, what);
    DZR_CHECK(device_.capabilities().fp8,
              "cuda backend: gemm_fp8 needs an FP8 GPU (compute capability 8.9 or later); {} is {}.{}",
              device().str(), device_.capabilities().compute_capability / 10,
              device_.capabilities().compute_capability % 10);
    require(xq.dtype == DType::F8_E4M3 && xq.rank() == 2 && xq.is_contiguous(), op, "xq", xq,
            "a contiguous f8_e4m3 [M, K]");
    require(wq.dtype == DType::F8_E4M3 && wq.rank() == 2 && wq.is_contiguous() && wq.dim(1) == xq.dim(1), op, "wq",
            wq, "a contiguous f8_e4m3 [N, K] with xq's K");
    const int64_t M = xq.dim(0), K = xq.dim(1), N = wq.dim(0);
    require(cuda_detail::is_float_act(out.dtype) && out.rank() == 2 && out.dim(0) == M && out.dim(1) == N &&
                (out.strides[1] == 1 || N <= 1),
            op, "out", out, "an f32 or bf16 [M, N] with a unit last stride");
    require(x_scales.dtype == DType::F32 && x_scales.is_contiguous() && x_scales.numel() == M, op, "x_scales", x_scales,
            "a contiguous f32 [M]");
    require(w_scales.dtype == DType::F32 && w_scales.is_contiguous() && w_scales.numel() == N, op, "w_scales", w_scales,
            "a contiguous f32 [N]");
    if (bias.defined()) {
        check_device_tensor(bias, op, "bias");
        require(cuda_detail::is_float_act(bias.dtype) && bias.is_contiguous() && bias.numel() == N, op, "bias", bias,
                "a contiguous f32 or bf16 [N]");
    }
    DeviceGuard guard(index_);
    if (M == 0 || N == 0) return;
    const int64_t ldc = std::max<int64_t>(out.strides[0], N);
    kernels::Fp8GemmArgs plain;
    plain.xq = xq.ptr<const uint8_t>(), plain.x_scales = x_scales.ptr<const float>();
    plain.wq = wq.ptr<const uint8_t>(), plain.w_scales = w_scales.ptr<const float>();
    plain.bias = bias.defined() ? bias.data : nullptr, plain.bias_dtype = bias.dtype;
    plain.out = out.data, plain.out_dtype = out.dtype;
    plain.M = M, plain.N = N, plain.K = K, plain.ldc = ldc;
    // NOTE: cuBLASLt's bias epilogue takes the output's dtype; another bias dtype (and K = 0) goes to the plain kernel
    const bool lt_bias_ok = !bias.defined() || bias.dtype == out.dtype;
    const GemmPlan* plan =
        options_.fallback_only || K == 0 || !lt_bias_ok
            ? nullptr
            : &fp8_gemm_plan(M, N, K, ldc, out.dtype, xq.data, wq.data, out.data, bias.defined() ? bias.data : nullptr,
                             w_scales.data, x_scales.data);
    last_fp8_gemm_lt_ = plan && plan->has_algo;
    if (!last_fp8_gemm_lt_) {
        DZR_CUDA_CHECK(kernels::gemm_fp8_fallback(plain, stream_));
        return;
    }
    const void* a_scale = w_scales.data;  // cuBLASLt's A is the weight: one scale per output channel
    const void* b_scale = x_scales.data;  // its B the activations: one scale per token
    DZR_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale, sizeof(a_scale)));
    DZR_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale, sizeof(b_scale)));
    if (plan->bias_in_epilogue)
        DZR_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias.data,
                                                        sizeof(bias.data)));
    const float alpha = 1.0f, beta = 0.0f;
    DZR_CUBLAS_CHECK(cublasLtMatmul(cublas_, plan->desc, &alpha, wq.data, plan->layout_a, xq.data, plan->layout_b, &beta,
                                    out.data, plan->layout_c, out.data, plan->layout_c, &plan->algo, cublas_workspace_,
                                    kCublasWorkspaceBytes, stream_));
    if (bias.defined() && !plan->bias_in_epilogue)
        DZR_CUDA_CHECK(kernels::rows_epilogue(out.data, out.dtype, 1, M, N, ldc, 0, false, 0.f, bias.data, bias.dtype,
                                              stream_));
}

void CudaBackend::paged_attention_fp8(const AttentionParams& p, const TensorView& q, const PagedKvView& history,
                                      int layer, const TensorView& k_cur, const TensorView& v_cur,
                                      const TensorView& out) {
    const char* op = "paged_attention (f8_e4m3 pool)";
    for (const auto& [t, what] :
         {std::pair{&q, "q"}, std::pair{&k_cur, "k"}, std::pair{&v_cur, "v"}, std::pair{&out, "out"}})
        check_device_tensor(*t, op, what);
    const int H = history.num_heads, D = history.head_dim;
    const DType dt = k_cur.dtype;
    for (const TensorView* t : {&q, &k_cur, &v_cur, &out})
        DZR_CHECK(t->rank() == 3 && t->dim(1) == H && t->dim(2) == D && t->strides[2] == 1 && t->dtype == dt &&
                      cuda_detail::is_float_act(dt),
                  "cuda backend: {}: {} must be an f32 or bf16 [L, {}, {}] with a unit head-dim stride, as k", op,
                  t->str(), H, D);
    DZR_CHECK(q.dim(0) == out.dim(0) && k_cur.dim(0) == v_cur.dim(0) && k_cur.strides == v_cur.strides,
              "cuda backend: {} lengths or strides disagree: q {} out {} k {} v {}", op, q.str(), out.str(),
              k_cur.str(), v_cur.str());
    const int64_t hist = history.seq_len, cur = k_cur.dim(0), lk = hist + cur;
    DZR_CHECK(hist >= 0 && hist <= int64_t(history.num_table_blocks) * history.block_size &&
                  history.num_table_blocks <= history.table_width && (hist == 0 || history.block_table != nullptr),
              "cuda backend: {}: seq_len {} does not fit the table of {} entries (width {})", op, hist,
              history.num_table_blocks, history.table_width);
    if (hist > 0) check_fp8_pool(history, op);
    DeviceGuard guard(index_);
    last_paged_impl_ = PagedAttentionImpl::Gather;
    if (q.dim(0) == 0 || lk == 0) {
        // no keys: zeros, as the CPU reference (the dense attention does the same)
        attention(p, q, k_cur, v_cur, TensorView{}, out);
        return;
    }
    // NOTE: dequantize in the gather: [history (code * scale) | current] K and V in the compute dtype, then the
    // dense attention (cuDNN SDPA or dzr's kernels); the flash kernel's direct path reads bf16 pools only
    ArenaScope scope(arena_);
    const TensorView kall = arena_.alloc_view(Shape{lk, H, D}, dt);
    const TensorView vall = arena_.alloc_view(Shape{lk, H, D}, dt);
    const kernels::KvRows rows{k_cur.data, v_cur.data, k_cur.strides[0], k_cur.strides[1]};
    DZR_CUDA_CHECK(kernels::gather_kv_fp8(hist > 0 ? fp8_pool_layer(history, layer) : kernels::Fp8KvPoolLayer{},
                                          history.block_table, hist, rows, cur, kall.data, vall.data, H, D, dt,
                                          stream_));
    attention(p, q, kall, vall, TensorView{}, out);
}

void CudaBackend::gather_paged_rows_fp8(const PagedKvView& history, int layer, const TensorView& k_cur,
                                        const TensorView& v_cur, void* k_out, void* v_out) {
    const char* op = "paged_attention_batched (f8_e4m3 pool)";
    const int64_t hist = history.seq_len, cur = k_cur.dim(0);
    if (hist > 0) check_fp8_pool(history, op);
    DZR_CHECK(k_cur.strides == v_cur.strides, "cuda backend: {} needs k {} and v {} with one stride set", op,
              k_cur.str(), v_cur.str());
    const kernels::KvRows rows{k_cur.data, v_cur.data, k_cur.strides[0], k_cur.strides[1]};
    DZR_CUDA_CHECK(kernels::gather_kv_fp8(hist > 0 ? fp8_pool_layer(history, layer) : kernels::Fp8KvPoolLayer{},
                                          history.block_table, hist, rows, cur, k_out, v_out, history.num_heads,
                                          history.head_dim, k_cur.dtype, stream_));
}

void CudaBackend::scatter_kv_fp8(const PagedKvView& pool, int layer, const TensorView& slots, const TensorView& k,
                                 const TensorView& v, int64_t num_slots) {
    const char* op = "scatter_kv (f8_e4m3 pool)";
    for (const auto& [t, what] : {std::pair{&slots, "slots"}, std::pair{&k, "k"}, std::pair{&v, "v"}})
        check_device_tensor(*t, op, what);
    DZR_CHECK(slots.dtype == DType::I64 && slots.is_contiguous(), "cuda backend: {} slots {} must be contiguous i64",
              op, slots.str());
    const int64_t n = slots.numel();
    for (const TensorView* t : {&k, &v})
        DZR_CHECK(t->rank() == 3 && t->dim(1) == pool.num_heads && t->dim(2) == pool.head_dim && t->strides[2] == 1 &&
                      cuda_detail::is_float_act(t->dtype) && t->dtype == k.dtype && t->dim(0) >= n,
                  "cuda backend: {}: {} must be f32 or bf16 [>= {}, {}, {}] with a unit head-dim stride", op, t->str(),
                  n, pool.num_heads, pool.head_dim);
    DZR_CHECK(k.strides == v.strides, "cuda backend: {} needs k {} and v {} with one stride set", op, k.str(), v.str());
    check_fp8_pool(pool, op);
    DeviceGuard guard(index_);
    const kernels::KvRows rows{k.data, v.data, k.strides[0], k.strides[1]};
    DZR_CUDA_CHECK(kernels::scatter_kv_fp8(rows, k.dtype, fp8_pool_layer(pool, layer), slots.ptr<const int64_t>(), n,
                                           num_slots, pool.num_heads, pool.head_dim, stream_));
}

}  // namespace dzr
