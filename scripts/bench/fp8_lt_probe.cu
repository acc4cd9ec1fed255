// Which FP8 (E4M3) matmul configurations cuBLASLt offers on this GPU, and how fast they run, at DreamZero's DiT
// shapes (issue #14: the FP8 GEMM's fast path). Standalone on purpose (no dzr library): it answers a question about
// the installed cuBLASLt before dzr's kernels are designed around it.
//
// Build and run on the GPU machine:
//   nvcc -std=c++17 -O2 -arch=sm_90a scripts/bench/fp8_lt_probe.cu -lcublasLt -o /tmp/fp8_lt_probe && /tmp/fp8_lt_probe
//
// Layout as in dzr (lib/backend/cuda/cuda_fp8.cpp): out[M, N] = x[M, K] · w[N, K]ᵀ, computed column-major as
// outᵀ = w · xᵀ: A = w (TN, transposed), B = x, D = N x M (rows = the weight's output channels).
// Modes:
//   bf16         bf16 A/B, bf16 D (the bf16 baseline)
//   scalar       FP8 A/B, per-tensor scale pointers (device scalars), bf16 D
//   scalar+bias  the same with the bias epilogue (bf16 bias)
//   scalar+gelu  the same with the GELU + bias epilogue
//   alphavec     FP8 A/B, alpha a device vector (one per row of D = output channel), B scale a device scalar
//   outer        FP8 A/B, outer-vector scales (per output channel and per token)
//   f32out       FP8 A/B, no scales, f32 D
//   scalar+fast  `scalar` with fast accumulation
// Each mode: whether cuBLASLt returns an algorithm, the median time of 50 runs and TFLOP/s; for the FP8 modes the
// largest relative error of D against an f32 reference of the same FP8 operands and scales (on a sample of rows).
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#define CK(x)                                                                                       \
    do {                                                                                            \
        cudaError_t e_ = (x);                                                                       \
        if (e_ != cudaSuccess) {                                                                    \
            std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            std::exit(1);                                                                           \
        }                                                                                           \
    } while (0)

namespace {

struct Shape {
    const char* name;
    int64_t M, N, K;
};

struct Mode {
    const char* name;
    bool fp8;
    int scale;  // 0 none, 1 scalar, 2 alpha vector, 3 outer vector
    cublasLtEpilogue_t epilogue;
    bool f32_out;
    bool fast_accum;
};

struct Buffers {
    void *xq, *wq, *xb, *wb, *out, *bias, *alpha_vec, *x_scale_vec, *w_scale_vec, *x_scale, *w_scale, *ws;
};

constexpr size_t kWorkspace = 32u << 20;

float bf16_to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

}  // namespace

int main() {
    cudaDeviceProp prop{};
    CK(cudaGetDeviceProperties(&prop, 0));
    std::printf("device %s, cc %d.%d, cuBLASLt %zu\n", prop.name, prop.major, prop.minor, cublasLtGetVersion());
    const Shape shapes[] = {{"o/cross-q/cross-o", 1785, 5120, 5120},
                            {"qkv fused", 1785, 15360, 5120},
                            {"ffn up", 1785, 13824, 5120},
                            {"ffn down", 1785, 5120, 13824},
                            {"o, both branches", 3570, 5120, 5120},
                            {"ffn up, both branches", 3570, 13824, 5120}};
    const Mode modes[] = {{"bf16", false, 0, CUBLASLT_EPILOGUE_DEFAULT, false, false},
                          {"scalar", true, 1, CUBLASLT_EPILOGUE_DEFAULT, false, false},
                          {"scalar+bias", true, 1, CUBLASLT_EPILOGUE_BIAS, false, false},
                          {"scalar+gelu", true, 1, CUBLASLT_EPILOGUE_GELU_BIAS, false, false},
                          {"alphavec", true, 2, CUBLASLT_EPILOGUE_DEFAULT, false, false},
                          {"alphavec+bias", true, 2, CUBLASLT_EPILOGUE_BIAS, false, false},
                          {"outer", true, 3, CUBLASLT_EPILOGUE_DEFAULT, false, false},
                          {"f32out", true, 0, CUBLASLT_EPILOGUE_DEFAULT, true, false},
                          {"scalar+fast", true, 1, CUBLASLT_EPILOGUE_DEFAULT, false, true}};
    cublasLtHandle_t lt;
    if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) return 1;
    cudaStream_t stream;
    CK(cudaStreamCreate(&stream));

    int64_t maxM = 0, maxN = 0, maxXK = 0, maxWK = 0, maxMN = 0;
    for (const Shape& s : shapes) {
        maxM = std::max(maxM, s.M), maxN = std::max(maxN, s.N);
        maxXK = std::max(maxXK, s.M * s.K), maxWK = std::max(maxWK, s.N * s.K), maxMN = std::max(maxMN, s.M * s.N);
    }
    Buffers b{};
    CK(cudaMalloc(&b.xq, maxXK));
    CK(cudaMalloc(&b.wq, maxWK));
    CK(cudaMalloc(&b.xb, maxXK * 2));
    CK(cudaMalloc(&b.wb, maxWK * 2));
    CK(cudaMalloc(&b.out, maxMN * 4));
    CK(cudaMalloc(&b.bias, maxN * 2));
    CK(cudaMalloc(&b.alpha_vec, maxN * 4));
    CK(cudaMalloc(&b.x_scale_vec, maxM * 4));
    CK(cudaMalloc(&b.w_scale_vec, maxN * 4));
    CK(cudaMalloc(&b.x_scale, 4));
    CK(cudaMalloc(&b.w_scale, 4));
    CK(cudaMalloc(&b.ws, kWorkspace));

    // random FP8 codes in [-2, 2] (no NaN), bf16 copies of the same values, scales near 1
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-2.f, 2.f), us(0.5f, 2.f);
    std::vector<__nv_fp8_e4m3> hx(maxXK), hw(maxWK);
    std::vector<__nv_bfloat16> hxb(hx.size()), hwb(hw.size()), hbias(maxN);
    for (size_t i = 0; i < hx.size(); ++i) hx[i] = __nv_fp8_e4m3(u(rng)), hxb[i] = __float2bfloat16(float(hx[i]));
    for (size_t i = 0; i < hw.size(); ++i) hw[i] = __nv_fp8_e4m3(u(rng)), hwb[i] = __float2bfloat16(float(hw[i]));
    std::vector<float> halpha(maxN), hxs(maxM), hws(maxN);
    for (auto& v : halpha) v = us(rng);
    for (auto& v : hxs) v = us(rng);
    for (auto& v : hws) v = us(rng);
    for (auto& v : hbias) v = __float2bfloat16(u(rng));
    const float xs = 0.75f, wsc = 1.25f;
    CK(cudaMemcpy(b.xq, hx.data(), hx.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b.wq, hw.data(), hw.size(), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b.xb, hxb.data(), hxb.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b.wb, hwb.data(), hwb.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b.bias, hbias.data(), hbias.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b.alpha_vec, halpha.data(), halpha.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b.x_scale_vec, hxs.data(), hxs.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b.w_scale_vec, hws.data(), hws.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b.x_scale, &xs, 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(b.w_scale, &wsc, 4, cudaMemcpyHostToDevice));

    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::printf("%-22s %-14s %-6s %10s %9s %12s  %s\n", "shape", "mode", "algos", "median ms", "TFLOP/s", "max rel err",
                "status");
    for (const Shape& s : shapes) {
        for (const Mode& m : modes) {
            const cudaDataType_t in_t = m.fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
            const cudaDataType_t out_t = m.f32_out ? CUDA_R_32F : CUDA_R_16BF;
            cublasLtMatmulDesc_t desc;
            cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
            const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
            cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
            cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
            std::string status = "ok";
            cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
            if (m.scale == 1) {
                st = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &b.w_scale,
                                                    sizeof(void*));
                if (!st) st = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b.x_scale,
                                                             sizeof(void*));
            } else if (m.scale == 2) {
                const int32_t pm = CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_ZERO;
                st = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pm, sizeof(pm));
                if (!st) st = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b.x_scale,
                                                             sizeof(void*));
            } else if (m.scale == 3) {
                const int32_t outer = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
                st = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &outer, sizeof(outer));
                if (!st) st = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &outer,
                                                             sizeof(outer));
                if (!st) st = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                                             &b.w_scale_vec, sizeof(void*));
                if (!st) st = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                             &b.x_scale_vec, sizeof(void*));
            }
            if (!st && m.fast_accum) {
                const int8_t f = 1;
                st = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &f, sizeof(f));
            }
            if (!st && m.epilogue != CUBLASLT_EPILOGUE_DEFAULT) {
                const int32_t bt = CUDA_R_16BF;
                st = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &m.epilogue,
                                                    sizeof(m.epilogue));
                if (!st) st = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt,
                                                             sizeof(bt));
                if (!st) st = cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &b.bias,
                                                             sizeof(void*));
            }
            cublasLtMatrixLayout_t la, lb, lc;
            cublasLtMatrixLayoutCreate(&la, in_t, s.K, s.N, s.K);
            cublasLtMatrixLayoutCreate(&lb, in_t, s.K, s.M, s.K);
            cublasLtMatrixLayoutCreate(&lc, out_t, s.N, s.M, s.N);
            cublasLtMatmulPreference_t pref;
            cublasLtMatmulPreferenceCreate(&pref);
            const uint64_t wsb = kWorkspace;
            cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsb, sizeof(wsb));
            cublasLtMatmulHeuristicResult_t res[8]{};
            int found = 0;
            if (!st) st = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 8, res, &found);
            double ms = NAN, err = NAN;
            if (st) {
                status = cublasLtGetStatusString(st);
            } else if (found == 0) {
                status = "no algorithm";
            } else {
                const float one = 1.f, zero = 0.f;
                const void* alpha = m.scale == 2 ? b.alpha_vec : static_cast<const void*>(&one);
                const void* A = m.fp8 ? b.wq : b.wb;
                const void* B = m.fp8 ? b.xq : b.xb;
                auto launch = [&] {
                    return cublasLtMatmul(lt, desc, alpha, A, la, B, lb, &zero, b.out, lc, b.out, lc, &res[0].algo,
                                          b.ws, kWorkspace, stream);
                };
                st = launch();
                if (st) {
                    status = std::string("matmul: ") + cublasLtGetStatusString(st);
                } else {
                    CK(cudaStreamSynchronize(stream));
                    std::vector<float> times;
                    for (int r = 0; r < 50; ++r) {
                        CK(cudaEventRecord(e0, stream));
                        launch();
                        CK(cudaEventRecord(e1, stream));
                        CK(cudaEventSynchronize(e1));
                        float t = 0;
                        CK(cudaEventElapsedTime(&t, e0, e1));
                        times.push_back(t);
                    }
                    std::sort(times.begin(), times.end());
                    ms = times[times.size() / 2];
                    // error on 8 sampled tokens x every channel, against f32 sums of the same operands
                    const size_t esz = m.f32_out ? 4 : 2;
                    std::vector<char> hout(size_t(s.M) * s.N * esz);
                    CK(cudaMemcpy(hout.data(), b.out, hout.size(), cudaMemcpyDeviceToHost));
                    double worst = 0;
                    for (int t = 0; t < 8; ++t) {
                        const int64_t i = (t * 977) % s.M;
                        for (int64_t n = 0; n < s.N; n += 7) {
                            double acc = 0, mag = 0;
                            for (int64_t k = 0; k < s.K; ++k) {
                                const double p = double(float(hx[i * s.K + k])) * double(float(hw[n * s.K + k]));
                                acc += p, mag += std::fabs(p);
                            }
                            double sc = 1;
                            if (m.scale == 1) sc = double(xs) * wsc;
                            if (m.scale == 2) sc = double(halpha[n]) * xs;
                            if (m.scale == 3) sc = double(hxs[i]) * hws[n];
                            double ref = acc * sc;
                            if (m.epilogue == CUBLASLT_EPILOGUE_BIAS || m.epilogue == CUBLASLT_EPILOGUE_GELU_BIAS)
                                ref += bf16_to_float(hbias[n]);
                            if (m.epilogue == CUBLASLT_EPILOGUE_GELU_BIAS)
                                ref = 0.5 * ref * (1 + std::tanh(0.7978845608028654 * (ref + 0.044715 * ref * ref * ref)));
                            const size_t idx = size_t(i) * s.N + n;
                            const double got =
                                m.f32_out ? double(reinterpret_cast<float*>(hout.data())[idx])
                                          : double(bf16_to_float(reinterpret_cast<__nv_bfloat16*>(hout.data())[idx]));
                            worst = std::max(worst, std::fabs(got - ref) / (mag * sc + 1e-30));
                        }
                    }
                    err = worst;
                }
            }
            const double tflops = std::isnan(ms) ? NAN : 2.0 * s.M * s.N * s.K / (ms * 1e-3) / 1e12;
            std::printf("%-22s %-14s %-6d %10.4f %9.1f %12.3e  %s\n", s.name, m.name, found, ms, tflops, err,
                        status.c_str());
            std::fflush(stdout);
            cublasLtMatmulPreferenceDestroy(pref);
            cublasLtMatrixLayoutDestroy(la);
            cublasLtMatrixLayoutDestroy(lb);
            cublasLtMatrixLayoutDestroy(lc);
            cublasLtMatmulDescDestroy(desc);
        }
    }
    std::printf("max rel err: |D - f32 reference| / (sum |products| x scale) on 8 tokens x every 7th channel\n");
    return 0;
}
