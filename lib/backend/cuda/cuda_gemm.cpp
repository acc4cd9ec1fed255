// GEMM through cuBLASLt and the attention built on it (the f32 / bias / fallback path; the fused paths are in
// cuda_attention.cpp).
//
// Row-major to column-major: cuBLASLt is column-major, and a row-major [R, C] matrix with leading
// dimension ld is the column-major [C, R] matrix with the same ld. So out = op(a) op(b) (row-major
// [M, N]) is computed as out^T = op(b)^T op(a)^T (column-major [N, M]): cuBLASLt's A is our b, its B
// is our a, m = N, n = M, and the transposes carry over unchanged.
//
// NOTE: g++ 13 -O3 with fmt 9.1 reports false -Warray-bounds / -Wstringop-overflow warnings inside fmt's
// format_dragon (through std::copy in stl_algobase.h) for this file, so the system headers it reaches
// first are included with those two warnings off.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Warray-bounds"
#pragma GCC diagnostic ignored "-Wstringop-overflow"
#include <fmt/format.h>

#include <algorithm>
#include <vector>
#pragma GCC diagnostic pop

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_internal.h"
#include "core/log.h"
#include "kernels/activation.cuh"
#include "kernels/elementwise.cuh"
#include "kernels/gemm_fallback.cuh"
#include "kernels/softmax.cuh"

namespace dzr {

using cuda_detail::DeviceGuard;
using cuda_detail::GemmCall;
using cuda_detail::GemmKey;
using cuda_detail::GemmPlan;
using cuda_detail::pointer_alignment;

namespace {

cudaDataType_t cuda_type(DType t) { return t == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F; }

/// The alignment cuBLASLt may assume for an operand: its base pointer, its row stride and (batched)
/// its batch stride in bytes, whichever is least aligned.
int64_t operand_alignment(const void* p, int64_t ld, int64_t batch_stride, int64_t batch, DType t) {
    const int64_t es = int64_t(dtype_size(t));
    int64_t align = pointer_alignment(p);
    const auto pow2_dividing = [](int64_t bytes) {
        int64_t a = 256;
        while (a > 1 && bytes % a != 0) a /= 2;
        return a;
    };
    align = std::min(align, pow2_dividing(ld * es));
    if (batch > 1 && batch_stride != 0) align = std::min(align, pow2_dividing(batch_stride * es));
    return align;
}

// NOTE: LtAlignment::Torch: the base pointers' alignments only, as PyTorch passes them (CUDABlas.cpp _getAlignment)
int64_t align_a(const GemmCall& c, LtAlignment r = LtAlignment::Dzr) {
    return r == LtAlignment::Torch ? pointer_alignment(c.a)
                                   : operand_alignment(c.a, c.lda, c.stride_a, c.batch, c.ab_dtype);
}
int64_t align_b(const GemmCall& c, LtAlignment r = LtAlignment::Dzr) {
    return r == LtAlignment::Torch ? pointer_alignment(c.b)
                                   : operand_alignment(c.b, c.ldb, c.stride_b, c.batch, c.ab_dtype);
}
int64_t align_c(const GemmCall& c, LtAlignment r = LtAlignment::Dzr) {
    return r == LtAlignment::Torch ? pointer_alignment(c.out)
                                   : operand_alignment(c.out, c.ldc, c.stride_c, c.batch, c.out_dtype);
}

GemmKey gemm_key(const GemmCall& c, LtAlignment r, bool gelu) {
    return {int64_t(c.ab_dtype),
            int64_t(c.out_dtype),
            c.trans_a,
            c.trans_b,
            c.M,
            c.N,
            c.K,
            c.batch,
            c.lda,
            c.stride_a,
            c.ldb,
            c.stride_b,
            c.ldc,
            c.stride_c,
            align_a(c, r),
            align_b(c, r),
            align_c(c, r),
            c.bias != nullptr,
            int64_t(c.bias_dtype),
            c.bias ? pointer_alignment(c.bias) : 0,
            c.beta != 0.f,
            gelu ? 1 : 0,
            0,
            0};
}

/// Column-major layout of a stored row-major operand with `rows_rm` rows of `cols_rm` elements.
cublasLtMatrixLayout_t make_layout(DType t, int64_t rows_rm, int64_t cols_rm, int64_t ld, int64_t batch,
                                   int64_t batch_stride) {
    cublasLtMatrixLayout_t layout = nullptr;
    // NOTE: a row-major matrix with one row may carry any row stride; cuBLASLt wants ld >= its rows.
    const int64_t ld_ok = rows_rm <= 1 ? std::max(ld, cols_rm) : ld;
    DZR_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout, cuda_type(t), uint64_t(cols_rm), uint64_t(rows_rm), ld_ok));
    if (batch > 1) {
        const int32_t count = int32_t(batch);
        DZR_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                          sizeof(count)));
        DZR_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                          &batch_stride, sizeof(batch_stride)));
    }
    return layout;
}

}  // namespace

GemmPlan& CudaBackend::gemm_plan(const GemmCall& c, bool gelu) {
    const LtAlignment rule = options_.lt_alignment;
    const GemmKey key = gemm_key(c, rule, gelu);
    auto it = gemm_plans_.find(key);
    if (it != gemm_plans_.end()) return *it->second;

    auto plan = std::make_unique<GemmPlan>();
    plan->bias_in_epilogue = c.bias != nullptr && c.bias_dtype == c.out_dtype;
    DZR_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t op_a = c.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's A is our b
    const cublasOperation_t op_b = c.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    DZR_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
    DZR_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
    if (plan->bias_in_epilogue || gelu) {
        // NOTE: cuBLASLt's GELU is the tanh form (Activation::GeluTanh), applied after the bias
        const cublasLtEpilogue_t epi = !gelu                  ? CUBLASLT_EPILOGUE_BIAS
                                       : plan->bias_in_epilogue ? CUBLASLT_EPILOGUE_GELU_BIAS
                                                                : CUBLASLT_EPILOGUE_GELU;
        DZR_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    }
    if (plan->bias_in_epilogue) {
        const int32_t bias_type = cuda_type(c.bias_dtype);
        DZR_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                        sizeof(bias_type)));
        // The heuristic reads the bias pointer's alignment (its value, not its contents).
        DZR_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &c.bias,
                                                        sizeof(c.bias)));
    }
    // Stored row-major shapes: b is [K, N] ([N, K] when trans_b), a is [M, K] ([K, M] when trans_a).
    plan->layout_a = make_layout(c.ab_dtype, c.trans_b ? c.N : c.K, c.trans_b ? c.K : c.N, c.ldb, c.batch, c.stride_b);
    plan->layout_b = make_layout(c.ab_dtype, c.trans_a ? c.K : c.M, c.trans_a ? c.M : c.K, c.lda, c.batch, c.stride_a);
    plan->layout_c = make_layout(c.out_dtype, c.M, c.N, c.ldc, c.batch, c.stride_c);

    cublasLtMatmulPreference_t pref = nullptr;
    DZR_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const uint64_t ws = options_.lt_workspace_bytes;
    // cuBLASLt's A is our b and its B our a. D: C's (Dzr), or as PyTorch's gemm_and_bias the bias pointer's
    // (Torch; without a bias epilogue PyTorch leaves it at cuBLASLt's default, 256).
    const uint32_t lt_align_a = uint32_t(align_b(c, rule)), lt_align_b = uint32_t(align_a(c, rule)),
                   lt_align_c = uint32_t(align_c(c, rule));
    const uint32_t lt_align_d = rule == LtAlignment::Dzr ? lt_align_c
                                : plan->bias_in_epilogue ? uint32_t(pointer_alignment(c.bias))
                                                         : 256u;
    cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &lt_align_a, sizeof(lt_align_a));
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &lt_align_b, sizeof(lt_align_b));
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &lt_align_c, sizeof(lt_align_c));
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &lt_align_d, sizeof(lt_align_d));
    // NOTE: reference numerics take the heuristic's first result, as PyTorch does; fast numerics may time a few
    constexpr int kTuneCandidates = 6;
    const bool tune = numerics() == Numerics::Fast && options_.gemm_tune;
    cublasLtMatmulHeuristicResult_t results[kTuneCandidates]{};
    int found = 0;
    if (st == CUBLAS_STATUS_SUCCESS)
        st = cublasLtMatmulAlgoGetHeuristic(cublas_, plan->desc, plan->layout_a, plan->layout_b, plan->layout_c,
                                            plan->layout_c, pref, tune ? kTuneCandidates : 1, results, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    const cublasLtMatmulHeuristicResult_t& result = results[0];
    plan->has_algo = st == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS;
    if (plan->has_algo) {
        plan->algo = result.algo;
        if (tune && found > 1) tune_gemm_plan(*plan, c, results, found);
    } else {
        log()->warn("cuBLASLt has no algorithm for gemm{} {} x {} x {} (batch {}, {} -> {}, lda {} ldb {} ldc {}): {}; "
                    "{}",
                    gelu ? " with the GELU epilogue" : "", c.M, c.N, c.K, c.batch, dtype_name(c.ab_dtype),
                    dtype_name(c.out_dtype), c.lda, c.ldb, c.ldc,
                    st == CUBLAS_STATUS_SUCCESS ? "no result" : cublasLtGetStatusString(st),
                    gelu ? "running the GEMM, then the GELU kernel" : "using the plain kernel");
    }
    return *gemm_plans_.emplace(key, std::move(plan)).first->second;
}

void CudaBackend::tune_gemm_plan(GemmPlan& plan, const GemmCall& c, const cublasLtMatmulHeuristicResult_t* candidates,
                                 int count) {
    constexpr double kMinFlops = 2e10;  // the DiT's projections and FFNs; smaller GEMMs keep the heuristic's pick
    constexpr int kReps = 5;
    if (2.0 * double(c.M) * double(c.N) * double(c.K) * double(c.batch) < kMinFlops) return;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    DZR_CUDA_CHECK(cudaStreamIsCapturing(stream_, &capture));
    if (capture != cudaStreamCaptureStatusNone) return;
    // NOTE: the candidates write a scratch output (the call's own may be an accumulation target, beta = 1)
    const size_t out_elems = size_t((c.batch - 1) * c.stride_c + (c.M - 1) * c.ldc + c.N);
    const size_t need = (out_elems * dtype_size(c.out_dtype) + Arena::kAlign - 1) / Arena::kAlign * Arena::kAlign;
    if (arena_.capacity() - arena_.used() < need) return;
    ArenaScope scope(arena_);
    void* scratch = arena_.alloc(out_elems * dtype_size(c.out_dtype));
    if (plan.bias_in_epilogue)
        DZR_CUBLAS_CHECK(
            cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &c.bias, sizeof(c.bias)));
    cudaEvent_t start = nullptr, stop = nullptr;
    DZR_CUDA_CHECK(cudaEventCreate(&start));
    DZR_CUDA_CHECK(cudaEventCreate(&stop));
    const float beta = 0.0f;
    const auto run = [&](const cublasLtMatmulAlgo_t& algo) {
        return cublasLtMatmul(cublas_, plan.desc, &c.alpha, c.b, plan.layout_a, c.a, plan.layout_b, &beta, scratch,
                              plan.layout_c, scratch, plan.layout_c, &algo, cublas_workspace_,
                              options_.lt_workspace_bytes, stream_) == CUBLAS_STATUS_SUCCESS;
    };
    std::vector<float> ms(size_t(count), -1.0f);
    for (int i = 0; i < count; ++i) {
        if (candidates[i].state != CUBLAS_STATUS_SUCCESS) continue;
        if (candidates[i].workspaceSize > options_.lt_workspace_bytes || !run(candidates[i].algo)) continue;
        DZR_CUDA_CHECK(cudaEventRecord(start, stream_));
        bool ok = true;
        for (int r = 0; r < kReps && ok; ++r) ok = run(candidates[i].algo);
        DZR_CUDA_CHECK(cudaEventRecord(stop, stream_));
        DZR_CUDA_CHECK(cudaEventSynchronize(stop));
        if (ok) DZR_CUDA_CHECK(cudaEventElapsedTime(&ms[size_t(i)], start, stop));
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    int best = 0;
    for (int i = 1; i < count; ++i)
        if (ms[size_t(i)] > 0 && (ms[size_t(best)] <= 0 || ms[size_t(i)] < ms[size_t(best)])) best = i;
    if (best != 0 && ms[0] > 0 && ms[size_t(best)] > 0.98f * ms[0]) best = 0;  // within 2%: the heuristic's pick
    if (best != 0) plan.algo = candidates[best].algo;
    log()->debug("cuBLASLt gemm {} x {} x {} (batch {}): candidate {} of {} ({:.4f} ms against the first's {:.4f})",
                 c.M, c.N, c.K, c.batch, best, count, ms[size_t(best)] / kReps, ms[0] / kReps);
}

void CudaBackend::set_plain_gemm_impl(PlainGemmImpl impl) {
    if (impl == PlainGemmImpl::Cublas) {
        DeviceGuard guard(index_);
        blas();
    }
    options_.plain_gemm = impl;
}

void CudaBackend::set_cuda_options(const CudaBackendOptions& o) {
    DZR_CHECK(o.lt_workspace_bytes <= kCublasWorkspaceBytes,
              "cuda backend: cuBLASLt workspace {} bytes exceeds the {} allocated", o.lt_workspace_bytes,
              kCublasWorkspaceBytes);
    // NOTE: the cached cuBLASLt plans were chosen for the former workspace and alignment rule
    if (o.lt_workspace_bytes != options_.lt_workspace_bytes || o.lt_alignment != options_.lt_alignment)
        gemm_plans_.clear();
    options_ = o;
    set_plain_gemm_impl(o.plain_gemm);
}

cublasHandle_t CudaBackend::blas() {
    if (!blas_) {
        DZR_CUBLAS_CHECK(cublasCreate(&blas_));
        DZR_CUBLAS_CHECK(cublasSetStream(blas_, stream_));
        // NOTE: the same 32 MiB as cuBLASLt's (both run in stream order) and the default math mode, as
        // PyTorch's handle for bf16 (reduced-precision reductions allowed).
        DZR_CUBLAS_CHECK(cublasSetWorkspace(blas_, cublas_workspace_, kCublasWorkspaceBytes));
        DZR_CUBLAS_CHECK(cublasSetMathMode(blas_, CUBLAS_DEFAULT_MATH));
    }
    return blas_;
}

bool CudaBackend::run_gemm_cublas(const GemmCall& c) {
    // NOTE: bf16 in and out with an f32 compute type and no bias, as PyTorch runs torch.mm / torch.bmm.
    if (c.ab_dtype != DType::BF16 || c.out_dtype != DType::BF16 || c.bias) return false;
    const auto fits = [](int64_t v) { return v <= int64_t(INT32_MAX); };
    if (!fits(c.M) || !fits(c.N) || !fits(c.K) || !fits(c.batch) || !fits(c.lda) || !fits(c.ldb) || !fits(c.ldc))
        return false;
    // Row-major out[M, N] = a · b is column-major out^T[N, M] = b^T · a^T: cuBLAS's A is our b, its B our a,
    // m = N, n = M.
    const cublasOperation_t op_a = c.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = c.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int64_t m = c.N, n = c.M, k = c.K;
    int64_t lda = c.ldb, ldb = c.lda, ldc = c.ldc;
    // NOTE: PyTorch's leading-dimension adjustment for degenerate shapes (_cublasAdjustLdLevel3), so that the
    // call cuBLAS sees (and the kernel it picks) is the same.
    if (n <= 1) ldc = std::max<int64_t>(m, 1);
    if (op_a == CUBLAS_OP_T) {
        if (m <= 1) lda = std::max<int64_t>(k, 1);
    } else if (k <= 1) {
        lda = std::max<int64_t>(m, 1);
    }
    if (op_b == CUBLAS_OP_T) {
        if (k <= 1) ldb = std::max<int64_t>(n, 1);
    } else if (n <= 1) {
        ldb = std::max<int64_t>(k, 1);
    }
    const float alpha = c.alpha, beta = c.beta;
    if (c.batch == 1) {
        // NOTE: torch.bmm with one batch calls the single-matrix GEMM (baddbmm_out_cuda_impl), as torch.mm does.
        DZR_CUBLAS_CHECK(cublasGemmEx(blas(), op_a, op_b, int(m), int(n), int(k), &alpha, c.b, CUDA_R_16BF, int(lda),
                                      c.a, CUDA_R_16BF, int(ldb), &beta, c.out, CUDA_R_16BF, int(ldc),
                                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT_TENSOR_OP));
        return true;
    }
    DZR_CUBLAS_CHECK(cublasGemmStridedBatchedEx(blas(), op_a, op_b, int(m), int(n), int(k), &alpha, c.b, CUDA_R_16BF,
                                                int(lda), c.stride_b, c.a, CUDA_R_16BF, int(ldb), c.stride_a, &beta,
                                                c.out, CUDA_R_16BF, int(ldc), c.stride_c, int(c.batch),
                                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT_TENSOR_OP));
    return true;
}

void CudaBackend::launch_lt(const GemmPlan& plan, const GemmCall& c) {
    if (plan.bias_in_epilogue)
        DZR_CUBLAS_CHECK(
            cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &c.bias, sizeof(c.bias)));
    DZR_CUBLAS_CHECK(cublasLtMatmul(cublas_, plan.desc, &c.alpha, c.b, plan.layout_a, c.a, plan.layout_b, &c.beta,
                                    c.out, plan.layout_c, c.out, plan.layout_c, &plan.algo, cublas_workspace_,
                                    options_.lt_workspace_bytes, stream_));
}

void CudaBackend::run_gemm(const GemmCall& c) {
    if (c.M == 0 || c.N == 0 || c.batch == 0) return;
    if (c.K == 0) {
        // Nothing to multiply: out = beta * out (+ bias).
        DZR_CUDA_CHECK(kernels::rows_epilogue(c.out, c.out_dtype, c.batch, c.M, c.N, c.ldc, c.stride_c, true, c.beta,
                                              c.bias, c.bias_dtype, stream_));
        return;
    }
    if (options_.plain_gemm == PlainGemmImpl::Cublas && !options_.fallback_only && run_gemm_cublas(c)) return;
    const GemmPlan* plan = options_.fallback_only ? nullptr : &gemm_plan(c);
    if (!plan || !plan->has_algo) {
        DZR_CUDA_CHECK(kernels::gemm_fallback(c, stream_));
        return;
    }
    launch_lt(*plan, c);
    if (c.bias && !plan->bias_in_epilogue)
        DZR_CUDA_CHECK(kernels::rows_epilogue(c.out, c.out_dtype, c.batch, c.M, c.N, c.ldc, c.stride_c, false, 0.f,
                                              c.bias, c.bias_dtype, stream_));
}

GemmCall CudaBackend::make_gemm_call(const GemmParams& p, const TensorView& a, const TensorView& b,
                                     const TensorView& bias, const TensorView& out) const {
    check_device_tensor(a, "gemm", "a");
    check_device_tensor(b, "gemm", "b");
    check_device_tensor(out, "gemm", "out");
    const int r = out.rank();
    DZR_CHECK(r == 2 || r == 3, "cuda backend: gemm output must be rank 2 or 3, got {}", out.str());
    DZR_CHECK(a.rank() == r && b.rank() == r, "cuda backend: gemm operand ranks differ: a {} b {} out {}", a.str(),
              b.str(), out.str());
    DZR_CHECK(a.dtype == b.dtype && cuda_detail::is_float_act(a.dtype),
              "cuda backend: gemm needs a and b of one dtype, f32 or bf16: a {} b {}", a.str(), b.str());
    DZR_CHECK(out.dtype == a.dtype || (a.dtype == DType::BF16 && out.dtype == DType::F32),
              "cuda backend: gemm {} inputs cannot write {} (bf16 -> bf16 or f32, f32 -> f32)", dtype_name(a.dtype),
              out.str());
    const int64_t M = out.dim(-2), N = out.dim(-1), K = p.trans_a ? a.dim(-2) : a.dim(-1);
    DZR_CHECK((p.trans_a ? a.dim(-1) : a.dim(-2)) == M, "cuda backend: gemm a {} does not give M={} (trans_a={})",
              a.str(), M, p.trans_a);
    DZR_CHECK((p.trans_b ? b.dim(-1) : b.dim(-2)) == K && (p.trans_b ? b.dim(-2) : b.dim(-1)) == N,
              "cuda backend: gemm b {} does not match K={} N={} (trans_b={})", b.str(), K, N, p.trans_b);
    for (const TensorView* t : {&a, &b, &out})
        DZR_CHECK(t->strides[-1] == 1 || t->dim(-1) == 1, "cuda backend: gemm needs a unit last stride: {}", t->str());
    const int64_t batch = r == 3 ? out.dim(0) : 1;
    for (const TensorView* t : {&a, &b})
        DZR_CHECK(r == 2 || t->dim(0) == batch || t->dim(0) == 1,
                  "cuda backend: gemm operand {} does not match the batch of {} ({})", t->str(), batch, out.str());
    if (bias.defined()) {
        check_device_tensor(bias, "gemm", "bias");
        DZR_CHECK(cuda_detail::is_float_act(bias.dtype) && bias.is_contiguous() && bias.numel() == N,
                  "cuda backend: gemm bias {} must be a contiguous f32 or bf16 vector of N={}", bias.str(), N);
    }
    const auto batch_stride = [&](const TensorView& t) { return r == 3 && t.dim(0) > 1 ? t.strides[0] : 0; };
    GemmCall c;
    c.ab_dtype = a.dtype;
    c.out_dtype = out.dtype;
    c.trans_a = p.trans_a;
    c.trans_b = p.trans_b;
    c.M = M, c.N = N, c.K = K, c.batch = batch;
    c.batched = r == 3;
    c.a = a.data, c.lda = std::max<int64_t>(a.strides[-2], 1), c.stride_a = batch_stride(a);
    c.b = b.data, c.ldb = std::max<int64_t>(b.strides[-2], 1), c.stride_b = batch_stride(b);
    c.out = out.data, c.ldc = std::max<int64_t>(out.strides[-2], 1), c.stride_c = batch_stride(out);
    c.alpha = p.alpha;
    c.beta = p.beta;
    c.bias = bias.defined() ? bias.data : nullptr;
    c.bias_dtype = bias.dtype;
    return c;
}

void CudaBackend::do_gemm(const GemmParams& p, const TensorView& a, const TensorView& b,
                          const TensorView& bias, const TensorView& out) {
    const GemmCall c = make_gemm_call(p, a, b, bias, out);
    DeviceGuard guard(index_);
    run_gemm(c);
}

void CudaBackend::run_gemm_gelu(const GemmCall& c) {
    // NOTE: a bias of another dtype than the output is added by a separate kernel, after the epilogue: not fusable
    const bool fusable = !options_.fallback_only && c.M > 0 && c.N > 0 && c.K > 0 && c.batch > 0 &&
                         (!c.bias || c.bias_dtype == c.out_dtype);
    if (fusable) {
        GemmPlan& plan = gemm_plan(c, true);
        if (plan.has_algo) {
            launch_lt(plan, c);
            last_gemm_gelu_fused_ = true;
            return;
        }
    }
    last_gemm_gelu_fused_ = false;
    run_gemm(c);
    DZR_CUDA_CHECK(kernels::activation(kernels::ActKind::GeluTanh, c.out, c.out_dtype, c.out, c.out_dtype,
                                       c.batch * c.M * c.N, stream_));
}

void CudaBackend::do_gemm_gelu(const GemmParams& p, const TensorView& a, const TensorView& b,
                               const TensorView& bias, const TensorView& out) {
    const GemmCall c = make_gemm_call(p, a, b, bias, out);
    DZR_CHECK(out.is_contiguous(), "cuda backend: gemm_gelu needs a contiguous output, got {}", out.str());
    DeviceGuard guard(index_);
    run_gemm_gelu(c);
}

void CudaBackend::attention_gemm(const AttentionParams& p, const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& bias, const TensorView& out) {
    for (const auto& [t, what] : {std::pair{&q, "q"}, std::pair{&k, "k"}, std::pair{&v, "v"}, std::pair{&out, "out"}})
        check_device_tensor(*t, "attention", what);
    DZR_CHECK(q.rank() == 3 && k.rank() == 3 && v.rank() == 3 && out.rank() == 3,
              "cuda backend: attention needs [L, H, D] operands: q {} k {} v {} out {}", q.str(), k.str(), v.str(),
              out.str());
    const int64_t Lq = q.dim(0), H = q.dim(1), D = q.dim(2), Lk = k.dim(0), Dv = v.dim(2);
    DZR_CHECK(k.dim(1) == H && v.dim(1) == H && k.dim(2) == D && v.dim(0) == Lk && out.dim(0) == Lq &&
                  out.dim(1) == H && out.dim(2) == Dv,
              "cuda backend: attention shapes disagree: q {} k {} v {} out {}", q.str(), k.str(), v.str(), out.str());
    DZR_CHECK(cuda_detail::is_float_act(q.dtype) && k.dtype == q.dtype && v.dtype == q.dtype && out.dtype == q.dtype,
              "cuda backend: attention needs q, k, v, out of one dtype (f32 or bf16): {} {} {} {}", q.str(), k.str(),
              v.str(), out.str());
    for (const TensorView* t : {&q, &k, &v, &out})
        DZR_CHECK(t->strides[2] == 1, "cuda backend: attention needs a unit head-dim stride: {}", t->str());
    if (bias.defined()) {
        check_device_tensor(bias, "attention", "bias");
        DZR_CHECK(bias.dtype == DType::F32 && bias.is_contiguous() && bias.numel() == H * Lq * Lk,
                  "cuda backend: attention bias {} must be a contiguous f32 [H={}, Lq={}, Lk={}]", bias.str(), H, Lq,
                  Lk);
    }
    DeviceGuard guard(index_);
    const size_t esize = dtype_size(q.dtype);
    if (Lq == 0 || H == 0 || Dv == 0) return;
    if (Lk == 0) {
        // Softmax over nothing: the CPU reference writes zeros.
        for (int64_t h = 0; h < H; ++h)
            DZR_CUDA_CHECK(cudaMemset2DAsync(static_cast<char*>(out.data) + h * out.strides[1] * int64_t(esize),
                                             size_t(out.strides[0]) * esize, 0, size_t(Dv) * esize, size_t(Lq), stream_));
        return;
    }
    // Logits for a group of heads: f32 [g, Lq, Lk]; for bf16 the probabilities are rounded to bf16 into
    // a second buffer so the second GEMM runs bf16 x bf16 with f32 accumulation.
    const bool bf16 = q.dtype == DType::BF16;
    const size_t per_head = size_t(Lq * Lk) * (4 + (bf16 ? 2 : 0)) + 2 * Arena::kAlign;
    int64_t group = H;
    if (!arena_.measuring()) {
        const size_t free_bytes = arena_.capacity() - arena_.used();
        group = std::clamp<int64_t>(int64_t(free_bytes / per_head), 1, H);
    }
    ArenaScope scope(arena_);
    float* logits = static_cast<float*>(arena_.alloc(size_t(group * Lq * Lk) * 4));
    void* probs = bf16 ? arena_.alloc(size_t(group * Lq * Lk) * 2) : static_cast<void*>(logits);
    for (int64_t h0 = 0; h0 < H; h0 += group) {
        const int64_t g = std::min(group, H - h0);
        if (bias.defined())
            DZR_CUDA_CHECK(cudaMemcpyAsync(logits, static_cast<const float*>(bias.data) + h0 * Lq * Lk,
                                           size_t(g * Lq * Lk) * 4, cudaMemcpyDeviceToDevice, stream_));
        // logits[h] = scale * q[:, h, :] · k[:, h, :]^T (+ bias[h]):  [Lq, D] x [Lk, D]^T -> [Lq, Lk]
        GemmCall s;
        s.ab_dtype = q.dtype;
        s.out_dtype = DType::F32;
        s.trans_a = false;
        s.trans_b = true;
        s.M = Lq, s.N = Lk, s.K = D, s.batch = g;
        s.a = static_cast<const char*>(q.data) + h0 * q.strides[1] * int64_t(esize);
        s.lda = q.strides[0], s.stride_a = q.strides[1];
        s.b = static_cast<const char*>(k.data) + h0 * k.strides[1] * int64_t(esize);
        s.ldb = k.strides[0], s.stride_b = k.strides[1];
        s.out = logits, s.ldc = Lk, s.stride_c = Lq * Lk;
        s.alpha = p.scale;
        s.beta = bias.defined() ? 1.f : 0.f;
        run_gemm(s);
        DZR_CUDA_CHECK(kernels::softmax(logits, DType::F32, probs, q.dtype, g * Lq, Lk, 1.f, stream_));
        // out[:, h, :] = probs[h] · v[:, h, :]:  [Lq, Lk] x [Lk, Dv] -> [Lq, Dv]
        GemmCall o;
        o.ab_dtype = q.dtype;
        o.out_dtype = q.dtype;
        o.trans_a = false;
        o.trans_b = false;
        o.M = Lq, o.N = Dv, o.K = Lk, o.batch = g;
        o.a = probs, o.lda = Lk, o.stride_a = Lq * Lk;
        o.b = static_cast<const char*>(v.data) + h0 * v.strides[1] * int64_t(esize);
        o.ldb = v.strides[0], o.stride_b = v.strides[1];
        o.out = static_cast<char*>(out.data) + h0 * out.strides[1] * int64_t(esize);
        o.ldc = out.strides[0], o.stride_c = out.strides[1];
        run_gemm(o);
    }
}

}  // namespace dzr
