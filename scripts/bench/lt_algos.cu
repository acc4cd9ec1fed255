// Does a cuBLASLt algorithm other than the heuristic's first beat it at the DiT's GEMM shapes?
// Times the top-N heuristic results of each shape (bf16 in and out, f32 accumulation, the Linear's bias in the
// epilogue; row-major out[M, N] = a[M, K] · w[N, K]^T as dzr runs a Linear) with CUDA events: 3 warm-up runs, then
// the median of REPS runs. Build and run on a GPU machine:
//   nvcc -O2 -std=c++17 -arch=sm_90a scripts/bench/lt_algos.cu -lcublasLt -o /tmp/lt_algos && /tmp/lt_algos [N_ALGOS]
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "lt_check.cuh"

int main(int argc, char** argv) {
    const int want = argc > 1 ? std::atoi(argv[1]) : 12;
    const int reps = 30;
    struct Shape {
        const char* name;
        int64_t m, n, k;
    };
    const Shape shapes[] = {{"q/k/v/o, cross q/o", 3570, 5120, 5120}, {"ffn1", 3570, 13824, 5120},
                            {"ffn2", 3570, 5120, 13824},         {"q/k/v/o (commit)", 3520, 5120, 5120},
                            {"ffn1 (commit)", 3520, 13824, 5120}, {"ffn2 (commit)", 3520, 5120, 13824}};
    cublasLtHandle_t lt;
    CHECK_LT(cublasLtCreate(&lt));
    const size_t ws_bytes = size_t(32) << 20;
    void* ws;
    CHECK_CUDA(cudaMalloc(&ws, ws_bytes));
    cudaStream_t stream;
    CHECK_CUDA(cudaStreamCreate(&stream));
    for (const Shape& s : shapes) {
        __nv_bfloat16 *a, *w, *out, *bias;
        CHECK_CUDA(cudaMalloc(&a, size_t(s.m * s.k) * 2));
        CHECK_CUDA(cudaMalloc(&w, size_t(s.n * s.k) * 2));
        CHECK_CUDA(cudaMalloc(&out, size_t(s.m * s.n) * 2));
        CHECK_CUDA(cudaMalloc(&bias, size_t(s.n) * 2));
        CHECK_CUDA(cudaMemset(a, 0x3c, size_t(s.m * s.k) * 2));  // small normal bf16 values
        CHECK_CUDA(cudaMemset(w, 0x3c, size_t(s.n * s.k) * 2));
        CHECK_CUDA(cudaMemset(bias, 0, size_t(s.n) * 2));
        cublasLtMatmulDesc_t desc;
        CHECK_LT(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
        CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
        CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
        const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
        const cudaDataType_t bt = CUDA_R_16BF;
        CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
        CHECK_LT(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
        cublasLtMatrixLayout_t la, lb, lc;
        CHECK_LT(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, uint64_t(s.k), uint64_t(s.n), s.k));  // w^T
        CHECK_LT(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, uint64_t(s.k), uint64_t(s.m), s.k));  // a
        CHECK_LT(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, uint64_t(s.n), uint64_t(s.m), s.n));
        cublasLtMatmulPreference_t pref;
        CHECK_LT(cublasLtMatmulPreferenceCreate(&pref));
        CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                      sizeof(ws_bytes)));
        std::vector<cublasLtMatmulHeuristicResult_t> res(static_cast<size_t>(want));
        int found = 0;
        CHECK_LT(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, want, res.data(), &found));
        const double flop = 2.0 * double(s.m) * double(s.n) * double(s.k);
        std::printf("%s [%lld x %lld x %lld]: %d algorithms\n", s.name, (long long)s.m, (long long)s.n,
                    (long long)s.k, found);
        const float alpha = 1.f, beta = 0.f;
        cudaEvent_t e0, e1;
        CHECK_CUDA(cudaEventCreate(&e0));
        CHECK_CUDA(cudaEventCreate(&e1));
        double first = 0;
        for (int i = 0; i < found; ++i) {
            if (res[size_t(i)].state != CUBLAS_STATUS_SUCCESS) continue;
            const cublasLtMatmulAlgo_t* algo = &res[size_t(i)].algo;
            bool ok = true;
            for (int r = 0; r < 3 && ok; ++r)
                ok = cublasLtMatmul(lt, desc, &alpha, w, la, a, lb, &beta, out, lc, out, lc, algo, ws, ws_bytes,
                                    stream) == CUBLAS_STATUS_SUCCESS;
            if (!ok) {
                std::printf("  #%d refused\n", i);
                continue;
            }
            std::vector<float> ms;
            for (int r = 0; r < reps; ++r) {
                CHECK_CUDA(cudaEventRecord(e0, stream));
                CHECK_LT(cublasLtMatmul(lt, desc, &alpha, w, la, a, lb, &beta, out, lc, out, lc, algo, ws, ws_bytes,
                                        stream));
                CHECK_CUDA(cudaEventRecord(e1, stream));
                CHECK_CUDA(cudaEventSynchronize(e1));
                float t = 0;
                CHECK_CUDA(cudaEventElapsedTime(&t, e0, e1));
                ms.push_back(t);
            }
            std::sort(ms.begin(), ms.end());
            const double med = ms[ms.size() / 2];
            if (i == 0) first = med;
            int tile = 0, stages = 0, splitk = 0, cluster = 0;
            size_t got = 0;
            cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), &got);
            cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof(stages), &got);
            cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk), &got);
            cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof(cluster),
                                                 &got);
            std::printf("  #%-2d %.4f ms  %6.1f TFLOP/s  %+5.1f%% vs #0  (tile %d stages %d splitk %d cluster %d, "
                        "workspace %zu)\n",
                        i, med, flop / med / 1e9, 100.0 * (first / med - 1.0), tile, stages, splitk, cluster,
                        res[size_t(i)].workspaceSize);
        }
        cudaFree(a), cudaFree(w), cudaFree(out), cudaFree(bias);
        cublasLtMatmulPreferenceDestroy(pref);
        cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb), cublasLtMatrixLayoutDestroy(lc);
        cublasLtMatmulDescDestroy(desc);
    }
    return 0;
}
