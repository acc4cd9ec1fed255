// A wider search than lt_algos.cu: does any cuBLASLt configuration beat the heuristic's first at the DiT's GEMM
// shapes when the GPU runs them back to back for a while (as a rollout does, at the power cap)?
//
// For every shape: the heuristic's top 32 results plus split-K (2, 3, 4) and CTA-swizzle variants of its top 8,
// each checked by cublasLtMatmulAlgoCheck and timed briefly (median of 15 runs); then the 6 fastest and the
// heuristic's first are timed sustained, interleaved (rounds of 300 ms of back-to-back runs each, 3 rounds), which is
// what a replayed forward sees. Also the fused projections: q and k as one GEMM (N = 10240) and q, k, v as one
// (N = 15360) against the same work as separate GEMMs. Random bf16 data (activations ~U(-2, 2), weights
// ~U(-0.03, 0.03)), bf16 bias epilogue (GELU + bias for ffn1), f32 accumulation; row-major out[M, N] = a[M, K] ·
// w[N, K]^T as dzr runs a Linear. Build and run on a GPU machine:
//   nvcc -O2 -std=c++17 -arch=sm_90a scripts/bench/lt_search.cu -lcublasLt -o /tmp/lt_search && /tmp/lt_search
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "lt_check.cuh"

namespace {

__global__ void fill_uniform(__nv_bfloat16* p, size_t n, float scale, unsigned seed) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        unsigned h = unsigned(i) * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13, h *= 3266489917u, h ^= h >> 16;
        p[i] = __float2bfloat16(scale * (float(h) / 4294967296.0f * 2.0f - 1.0f));
    }
}

struct Shape {
    const char* name;
    int64_t m, n, k;
    bool gelu;
};

struct Candidate {
    cublasLtMatmulAlgo_t algo;
    size_t workspace;
    char label[160];
    float brief_ms = -1;
    double sustained_ms = 0;
};

const size_t kWorkspace = size_t(32) << 20;

struct Gemm {
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    __nv_bfloat16 *a, *w, *out, *bias;
    void* ws;
    cudaStream_t stream;
    bool run(const cublasLtMatmulAlgo_t& algo) const {
        const float alpha = 1.f, beta = 0.f;
        return cublasLtMatmul(lt, desc, &alpha, w, la, a, lb, &beta, out, lc, out, lc, &algo, ws, kWorkspace,
                              stream) == CUBLAS_STATUS_SUCCESS;
    }
};

void describe(const cublasLtMatmulAlgo_t& algo, char* buf, size_t n, const char* origin) {
    int id = 0, tile = 0, stages = 0, splitk = 0, red = 0, swz = 0, cluster = 0;
    size_t got = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), &got);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), &got);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof(stages), &got);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk), &got);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, sizeof(red), &got);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swz, sizeof(swz), &got);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof(cluster), &got);
    std::snprintf(buf, n, "%s: algo %d tile %d stages %d splitk %d red %d swizzle %d cluster %d", origin, id, tile,
                  stages, splitk, red, swz, cluster);
}

float brief(const Gemm& g, const cublasLtMatmulAlgo_t& algo, cudaEvent_t e0, cudaEvent_t e1) {
    for (int r = 0; r < 3; ++r)
        if (!g.run(algo)) return -1;
    std::vector<float> ms;
    for (int r = 0; r < 15; ++r) {
        CHECK_CUDA(cudaEventRecord(e0, g.stream));
        g.run(algo);
        CHECK_CUDA(cudaEventRecord(e1, g.stream));
        CHECK_CUDA(cudaEventSynchronize(e1));
        float t = 0;
        CHECK_CUDA(cudaEventElapsedTime(&t, e0, e1));
        ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

// ms per GEMM over ~300 ms of back-to-back runs (the first 50 ms dropped)
double sustained(const Gemm& g, const cublasLtMatmulAlgo_t& algo, float per_run_ms, cudaEvent_t e0, cudaEvent_t e1) {
    const int warm = std::max(1, int(50.0f / per_run_ms)), reps = std::max(10, int(300.0f / per_run_ms));
    for (int r = 0; r < warm; ++r) g.run(algo);
    CHECK_CUDA(cudaEventRecord(e0, g.stream));
    for (int r = 0; r < reps; ++r) g.run(algo);
    CHECK_CUDA(cudaEventRecord(e1, g.stream));
    CHECK_CUDA(cudaEventSynchronize(e1));
    float t = 0;
    CHECK_CUDA(cudaEventElapsedTime(&t, e0, e1));
    return double(t) / reps;
}

}  // namespace

int main() {
    const Shape shapes[] = {
        {"q/k/v/o, cross q/o", 3570, 5120, 5120, false}, {"q+k fused", 3570, 10240, 5120, false},
        {"q+k+v fused", 3570, 15360, 5120, false},       {"ffn1 (GELU)", 3570, 13824, 5120, true},
        {"ffn2", 3570, 5120, 13824, false},              {"q/k/v/o (commit)", 3520, 5120, 5120, false},
        {"ffn2 (commit)", 3520, 5120, 13824, false},
    };
    cublasLtHandle_t lt;
    CHECK_LT(cublasLtCreate(&lt));
    void* ws;
    CHECK_CUDA(cudaMalloc(&ws, kWorkspace));
    cudaStream_t stream;
    CHECK_CUDA(cudaStreamCreate(&stream));
    cudaEvent_t e0, e1;
    CHECK_CUDA(cudaEventCreate(&e0));
    CHECK_CUDA(cudaEventCreate(&e1));
    std::printf("cuBLASLt %zu\n", cublasLtGetVersion());
    for (const Shape& s : shapes) {
        Gemm g{};
        g.lt = lt, g.ws = ws, g.stream = stream;
        CHECK_CUDA(cudaMalloc(&g.a, size_t(s.m * s.k) * 2));
        CHECK_CUDA(cudaMalloc(&g.w, size_t(s.n * s.k) * 2));
        CHECK_CUDA(cudaMalloc(&g.out, size_t(s.m * s.n) * 2));
        CHECK_CUDA(cudaMalloc(&g.bias, size_t(s.n) * 2));
        fill_uniform<<<1024, 256, 0, stream>>>(g.a, size_t(s.m * s.k), 2.0f, 17u);
        fill_uniform<<<1024, 256, 0, stream>>>(g.w, size_t(s.n * s.k), 0.03f, 29u);
        fill_uniform<<<64, 256, 0, stream>>>(g.bias, size_t(s.n), 0.1f, 31u);
        CHECK_LT(cublasLtMatmulDescCreate(&g.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
        CHECK_LT(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
        CHECK_LT(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
        const cublasLtEpilogue_t epi = s.gelu ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
        CHECK_LT(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
        const cudaDataType_t bt = CUDA_R_16BF;
        CHECK_LT(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
        CHECK_LT(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias)));
        CHECK_LT(cublasLtMatrixLayoutCreate(&g.la, CUDA_R_16BF, uint64_t(s.k), uint64_t(s.n), s.k));  // w^T
        CHECK_LT(cublasLtMatrixLayoutCreate(&g.lb, CUDA_R_16BF, uint64_t(s.k), uint64_t(s.m), s.k));  // a
        CHECK_LT(cublasLtMatrixLayoutCreate(&g.lc, CUDA_R_16BF, uint64_t(s.n), uint64_t(s.m), s.n));
        cublasLtMatmulPreference_t pref;
        CHECK_LT(cublasLtMatmulPreferenceCreate(&pref));
        CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kWorkspace,
                                                      sizeof(kWorkspace)));
        std::vector<cublasLtMatmulHeuristicResult_t> res(32);
        int found = 0;
        CHECK_LT(cublasLtMatmulAlgoGetHeuristic(lt, g.desc, g.la, g.lb, g.lc, g.lc, pref, 32, res.data(), &found));
        std::vector<Candidate> cands;
        for (int i = 0; i < found; ++i) {
            if (res[size_t(i)].state != CUBLAS_STATUS_SUCCESS) continue;
            Candidate c;
            c.algo = res[size_t(i)].algo;
            c.workspace = res[size_t(i)].workspaceSize;
            char origin[32];
            std::snprintf(origin, sizeof(origin), "heuristic #%d", i);
            describe(c.algo, c.label, sizeof(c.label), origin);
            cands.push_back(c);
        }
        const size_t heuristic = cands.size();
        for (size_t i = 0; i < std::min<size_t>(8, heuristic); ++i) {
            for (int splitk : {1, 2, 3, 4}) {
                for (int swz : {0, 1}) {
                    for (int red : {int(CUBLASLT_REDUCTION_SCHEME_NONE), int(CUBLASLT_REDUCTION_SCHEME_INPLACE),
                                    int(CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE)}) {
                        if ((splitk == 1) != (red == int(CUBLASLT_REDUCTION_SCHEME_NONE))) continue;
                        Candidate c = cands[i];
                        const uint32_t r = uint32_t(red);
                        if (cublasLtMatmulAlgoConfigSetAttribute(&c.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk,
                                                                 sizeof(splitk)) != CUBLAS_STATUS_SUCCESS ||
                            cublasLtMatmulAlgoConfigSetAttribute(&c.algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swz,
                                                                 sizeof(swz)) != CUBLAS_STATUS_SUCCESS ||
                            cublasLtMatmulAlgoConfigSetAttribute(&c.algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &r,
                                                                 sizeof(r)) != CUBLAS_STATUS_SUCCESS)
                            continue;
                        cublasLtMatmulHeuristicResult_t check{};
                        if (cublasLtMatmulAlgoCheck(lt, g.desc, g.la, g.lb, g.lc, g.lc, &c.algo, &check) !=
                                CUBLAS_STATUS_SUCCESS ||
                            check.workspaceSize > kWorkspace)
                            continue;
                        c.workspace = check.workspaceSize;
                        char origin[48];
                        std::snprintf(origin, sizeof(origin), "variant of #%zu", i);
                        describe(c.algo, c.label, sizeof(c.label), origin);
                        bool dup = false;
                        for (const Candidate& o : cands) dup = dup || std::strcmp(o.label + std::strcspn(o.label, ":"),
                                                                                   c.label + std::strcspn(c.label, ":")) == 0;
                        if (!dup) cands.push_back(c);
                    }
                }
            }
        }
        const double flop = 2.0 * double(s.m) * double(s.n) * double(s.k);
        std::printf("\n%s [%lld x %lld x %lld]: %zu heuristic results, %zu candidates\n", s.name, (long long)s.m,
                    (long long)s.n, (long long)s.k, heuristic, cands.size());
        for (Candidate& c : cands) c.brief_ms = brief(g, c.algo, e0, e1);
        std::vector<size_t> order;
        for (size_t i = 0; i < cands.size(); ++i)
            if (cands[i].brief_ms > 0) order.push_back(i);
        std::sort(order.begin(), order.end(), [&](size_t x, size_t y) { return cands[x].brief_ms < cands[y].brief_ms; });
        std::vector<size_t> finalists;
        if (!cands.empty() && cands[0].brief_ms > 0) finalists.push_back(0);
        for (size_t i : order)
            if (finalists.size() < 7 && i != 0) finalists.push_back(i);
        for (int round = 0; round < 3; ++round)
            for (size_t i : finalists) cands[i].sustained_ms += sustained(g, cands[i].algo, cands[i].brief_ms, e0, e1) / 3;
        std::printf("  brief (median of 15), the 10 fastest:\n");
        for (size_t j = 0; j < std::min<size_t>(10, order.size()); ++j) {
            const Candidate& c = cands[order[j]];
            std::printf("    %.4f ms %6.1f TFLOP/s  %s (ws %zu)\n", c.brief_ms, flop / c.brief_ms / 1e9, c.label,
                        c.workspace);
        }
        std::printf("  sustained (3 rounds of ~300 ms each, interleaved):\n");
        for (size_t i : finalists) {
            const Candidate& c = cands[i];
            std::printf("    %.4f ms %6.1f TFLOP/s %+5.1f%% vs heuristic #0  %s\n", c.sustained_ms,
                        flop / c.sustained_ms / 1e9, 100.0 * (cands[0].sustained_ms / c.sustained_ms - 1.0), c.label);
        }
        cudaFree(g.a), cudaFree(g.w), cudaFree(g.out), cudaFree(g.bias);
        cublasLtMatmulPreferenceDestroy(pref);
        cublasLtMatrixLayoutDestroy(g.la), cublasLtMatrixLayoutDestroy(g.lb), cublasLtMatrixLayoutDestroy(g.lc);
        cublasLtMatmulDescDestroy(g.desc);
    }
    return 0;
}
