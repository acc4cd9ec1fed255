// Memory-bound row ops of a batched DiT step at [3570, 5120] bf16: how close the streamed LayerNorm
// (kernels/dit_rows.cu) runs to what the H200's memory gives, and what its time and energy become with other
// launch shapes. Each variant is timed back to back over rotating buffer sets (the 50 MB L2 does not hold the
// inputs) and run sustained for about 300 ms with NVML's energy counter read around it, so the energy per op
// is measured too. Every LayerNorm variant must give the streamed kernel's bits (checked; a mismatch is
// printed and the exit is 1).
//
//   OLD_REV=<commit> bash scripts/bench/rows_bw.sh   (builds and runs it; see there)
// With -DROWS_BW_OLD and an object of another revision's kernels (out/old/old_rows.cu, which rows_bw.sh
// makes, compiled with -Ddzr=dzr_old) it also compares the two revisions' row ops bit for bit and times both.
// (NVML through the driver's libnvidia-ml.so.1, opened at run time as lib/backend/gpu_telemetry.cpp does)
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/dit_rows.cuh"
#include "kernels/warp_rows.cuh"
#include "lt_check.cuh"

using namespace dzr::kernels;

#ifdef ROWS_BW_OLD
// Another build's streamed kernels (out/old/old_rows.cu: the committed kernels/dit_rows.cu renamed), for a
// bit comparison of the working tree's against them.
extern "C" cudaError_t old_ada_layer_norm(const void* args, cudaStream_t stream);
extern "C" cudaError_t old_rms_norm_rope(const void* args, cudaStream_t stream);
#endif

namespace {

constexpr int64_t kRows = 3570, kCols = 5120, kPeriod = 1785, kSplit = 1760;
constexpr int kSets = 4, kReps = 20;

__global__ void copy_kernel(const uint4* __restrict__ x, uint4* __restrict__ out, int64_t n) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += int64_t(gridDim.x) * blockDim.x)
        out[i] = x[i];
}

__global__ void add_kernel(const uint4* __restrict__ a, const uint4* __restrict__ b, uint4* __restrict__ out,
                           int64_t n) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += int64_t(gridDim.x) * blockDim.x) {
        float x[8], y[8];
        unpack8(a[i], x);
        unpack8(b[i], y);
#pragma unroll
        for (int k = 0; k < 8; ++k) x[k] += y[k];
        out[i] = pack8(x);
    }
}

__device__ __forceinline__ uint4 ldg16(const void* p) {
    return __ldg(reinterpret_cast<const uint4*>(p));
}

/// A chunk's normalized and modulated values, o = (o - mean) · rstd · (1 + scale) + shift, rounded as dzr's
/// streamed kernel rounds them: no contraction into an FMA (it multiplies and adds in separate conditional
/// blocks).
__device__ __forceinline__ void modulate8(float (&o)[8], float mean, float rstd, const float (&sc)[8],
                                          const float (&sh)[8]) {
#pragma unroll
    for (int i = 0; i < 8; ++i) o[i] = __fadd_rn(__fmul_rn((o[i] - mean) * rstd, sc[i] + 1.f), sh[i]);
}

/// One row per warp, the row loaded straight into registers; scale and shift (bf16, rows `mstride` apart)
/// read through the read-only path per chunk. The arithmetic of the streamed kernel (ada_apply): the same
/// bits.
template <int N, int kWarps, int kMinBlocks>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks)
    ln_direct_kernel(const bf16* __restrict__ x, bf16* __restrict__ out, const bf16* __restrict__ scale,
                     const bf16* __restrict__ shift, int64_t mstride, int64_t rows, int cols, float eps) {
    const int lane = threadIdx.x % 32;
    const int64_t r = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
    if (r >= rows) return;
    const int chunks = cols / 8;
    const uint4* src = reinterpret_cast<const uint4*>(x + r * cols);
    uint4 raw[N];
#pragma unroll
    for (int k = 0; k < N; ++k)
        if (k * 32 + lane < chunks) raw[k] = __ldcs(src + k * 32 + lane);
    const float mean = warp_row_sum(raw, chunks, lane, [](float v) { return v; }) / float(cols);
    const float var = warp_row_sum(raw, chunks, lane,
                                   [mean](float v) {
                                       const float d = v - mean;
                                       return d * d;
                                   }) /
                      float(cols);
    const float rstd = rsqrtf(var + eps);
    const int64_t g = r % kPeriod < kSplit ? 0 : 1;
    const bf16* sc = scale + g * mstride;
    const bf16* sh = shift + g * mstride;
    uint4* orow = reinterpret_cast<uint4*>(out + r * cols);
#pragma unroll
    for (int k = 0; k < N; ++k) {
        const int ch = k * 32 + lane;
        if (ch < chunks) {
            float o[8], s[8], h[8];
            unpack8(raw[k], o);
            unpack8(ldg16(sc + ch * 8), s);
            unpack8(ldg16(sh + ch * 8), h);
            modulate8(o, mean, rstd, s, h);
            __stcs(orow + ch, pack8(o));
        }
    }
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    const unsigned sa = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sa), "l"(gmem) : "memory");
}

/// The streamed kernel's scheme (persistent blocks, a warp's next row copied into its shared buffer by
/// cp.async while the current one is normalized) with W warps a block and the 4 modulation vectors either
/// staged once per block as bf16 (kStage; 40 KB instead of 80 KB of f32) or read per chunk through the
/// read-only path. (1 + scale) is formed in f32 per element, the value the f32 staging holds: the same bits.
template <int N, int W, bool kStage, bool kDeep>
__global__ void __launch_bounds__(W * 32, 1)
    ln_stream_kernel(const bf16* __restrict__ x, bf16* __restrict__ out, const bf16* __restrict__ scale,
                     const bf16* __restrict__ shift, int64_t mstride, int64_t rows, int cols, float eps) {
    extern __shared__ uint4 sm[];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int chunks = cols / 8;
    uint4* vec = sm;  // [4][chunks]: scale g0, scale g1, shift g0, shift g1
    uint4* buf = sm + (kStage ? 4 * chunks : 0) + warp * chunks;  // this warp's row
    const int64_t step = int64_t(gridDim.x) * W;
    int64_t r = int64_t(blockIdx.x) * W + warp;
    const auto issue = [&](int64_t row) {
        const uint4* src = reinterpret_cast<const uint4*>(x + row * cols);
#pragma unroll
        for (int k = 0; k < N; ++k)
            if (k * 32 + lane < chunks) cp_async16(buf + k * 32 + lane, src + k * 32 + lane);
        asm volatile("cp.async.commit_group;\n" ::: "memory");
    };
    uint4 raw[N];
    if constexpr (kDeep) {
        // the first row straight into registers, the second into the buffer: two rows in flight from the
        // start
        if (r < rows) {
            const uint4* src = reinterpret_cast<const uint4*>(x + r * cols);
#pragma unroll
            for (int k = 0; k < N; ++k)
                if (k * 32 + lane < chunks) raw[k] = src[k * 32 + lane];
        }
        if (r + step < rows) issue(r + step);
    } else {
        if (r < rows) issue(r);
    }
    if constexpr (kStage) {
        for (int c = threadIdx.x; c < 4 * chunks; c += blockDim.x) {
            const int v = c / chunks, ch = c % chunks;
            const bf16* src = (v < 2 ? scale : shift) + (v % 2) * mstride;
            vec[c] = ldg16(src + ch * 8);
        }
        __syncthreads();
    }
    for (bool first = true; r < rows; r += step, first = false) {
        if (!kDeep || !first) {
            asm volatile("cp.async.wait_group 0;\n" ::: "memory");
#pragma unroll
            for (int k = 0; k < N; ++k)
                if (k * 32 + lane < chunks) raw[k] = buf[k * 32 + lane];
        }
        const float mean = warp_row_sum(raw, chunks, lane, [](float v) { return v; }) / float(cols);
        const int64_t next = kDeep ? (first ? -1 : r + step) : r + step;
        if (next >= 0 && next < rows) issue(next);
        const float var = warp_row_sum(raw, chunks, lane,
                                       [mean](float v) {
                                           const float d = v - mean;
                                           return d * d;
                                       }) /
                          float(cols);
        const float rstd = rsqrtf(var + eps);
        const int g = r % kPeriod < kSplit ? 0 : 1;
        uint4* orow = reinterpret_cast<uint4*>(out + r * cols);
#pragma unroll
        for (int k = 0; k < N; ++k) {
            const int ch = k * 32 + lane;
            if (ch < chunks) {
                float o[8], sc[8], sh[8];
                unpack8(raw[k], o);
                if constexpr (kStage) {
                    unpack8(vec[g * chunks + ch], sc);
                    unpack8(vec[(2 + g) * chunks + ch], sh);
                } else {
                    unpack8(ldg16(scale + g * mstride + ch * 8), sc);
                    unpack8(ldg16(shift + g * mstride + ch * 8), sh);
                }
                modulate8(o, mean, rstd, sc, sh);
                orow[ch] = pack8(o);
            }
        }
    }
}

/// A warp reads its row into registers and writes it out again: the access pattern's own speed.
template <int N, int kWarps>
__global__ void __launch_bounds__(kWarps * 32)
    row_copy_kernel(const bf16* __restrict__ x, bf16* __restrict__ out, int64_t rows, int cols) {
    const int lane = threadIdx.x % 32;
    const int64_t r = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
    if (r >= rows) return;
    const int chunks = cols / 8;
    const uint4* src = reinterpret_cast<const uint4*>(x + r * cols);
    uint4* dst = reinterpret_cast<uint4*>(out + r * cols);
    uint4 raw[N];
#pragma unroll
    for (int k = 0; k < N; ++k)
        if (k * 32 + lane < chunks) raw[k] = src[k * 32 + lane];
#pragma unroll
    for (int k = 0; k < N; ++k)
        if (k * 32 + lane < chunks) dst[k * 32 + lane] = raw[k];
}

struct Bufs {
    std::vector<bf16*> x, y, out;
    bf16* mod = nullptr;  // [2, 6, C]
};

// NVML's C entry points (nvml.h), resolved from the driver's library
using NvmlDevice = void*;
int (*nvml_init)() = nullptr;
int (*nvml_handle)(unsigned, NvmlDevice*) = nullptr;
int (*nvml_energy)(NvmlDevice, unsigned long long*) = nullptr;
int (*nvml_clock)(NvmlDevice, int, unsigned*) = nullptr;
NvmlDevice g_nvml{};
bool g_have_nvml = false;

void open_nvml() {
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!lib) return;
    nvml_init = reinterpret_cast<int (*)()>(dlsym(lib, "nvmlInit_v2"));
    nvml_handle =
        reinterpret_cast<int (*)(unsigned, NvmlDevice*)>(dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
    nvml_energy = reinterpret_cast<int (*)(NvmlDevice, unsigned long long*)>(
        dlsym(lib, "nvmlDeviceGetTotalEnergyConsumption"));
    nvml_clock = reinterpret_cast<int (*)(NvmlDevice, int, unsigned*)>(dlsym(lib, "nvmlDeviceGetClockInfo"));
    g_have_nvml = nvml_init && nvml_handle && nvml_energy && nvml_clock && nvml_init() == 0 &&
                  nvml_handle(0, &g_nvml) == 0;
}

/// Median over 9 runs of kReps back-to-back calls (rotating sets), then ~300 ms sustained with NVML's energy.
void bench(const char* name, double bytes, const std::function<void(int)>& op) {
    cudaEvent_t a, b;
    CHECK_CUDA(cudaEventCreate(&a));
    CHECK_CUDA(cudaEventCreate(&b));
    for (int i = 0; i < 3 * kReps; ++i) op(i % kSets);
    std::vector<float> ms;
    for (int it = 0; it < 9; ++it) {
        CHECK_CUDA(cudaEventRecord(a));
        for (int i = 0; i < kReps; ++i) op(i % kSets);
        CHECK_CUDA(cudaEventRecord(b));
        CHECK_CUDA(cudaEventSynchronize(b));
        float t = 0;
        CHECK_CUDA(cudaEventElapsedTime(&t, a, b));
        ms.push_back(t / kReps);
    }
    std::sort(ms.begin(), ms.end());
    const double us = ms[ms.size() / 2] * 1e3;
    // sustained: enough calls for ~300 ms
    const int n = std::max(100, int(300e3 / us));
    unsigned long long e0 = 0, e1 = 0;
    CHECK_CUDA(cudaDeviceSynchronize());
    if (g_have_nvml) nvml_energy(g_nvml, &e0);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) op(i % kSets);
    CHECK_CUDA(cudaDeviceSynchronize());
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (g_have_nvml) nvml_energy(g_nvml, &e1);
    unsigned clk = 0;
    if (g_have_nvml) nvml_clock(g_nvml, 1, &clk);  // NVML_CLOCK_SM
    const double joules = double(e1 - e0) * 1e-3;
    std::printf("%-58s %8.2f us %7.0f GB/s | sustained %8.2f us/op %6.0f W %8.2f mJ/op %5u MHz\n", name, us,
                bytes / (us * 1e-6) / 1e9, sec / n * 1e6, joules / sec, joules / n * 1e3, clk);
    std::fflush(stdout);
}

}  // namespace

int main() {
    open_nvml();
    const int64_t n = kRows * kCols;
    const double T = 2.0 * double(n);  // bytes of one tensor
    Bufs B;
    std::vector<uint16_t> host(static_cast<size_t>(n));
    uint32_t s = 12345;
    const auto rnd = [&]() {
        s = s * 1664525u + 1013904223u;
        return (float(s >> 8) / float(1 << 24) - 0.5f) * 4.f;
    };
    const auto to_bf16 = [](float f) {
        uint32_t u;
        std::memcpy(&u, &f, 4);
        return uint16_t((u + 0x7fff + ((u >> 16) & 1)) >> 16);
    };
    for (int i = 0; i < kSets; ++i) {
        bf16 *x, *y, *o;
        CHECK_CUDA(cudaMalloc(&x, size_t(n) * 2));
        CHECK_CUDA(cudaMalloc(&y, size_t(n) * 2));
        CHECK_CUDA(cudaMalloc(&o, size_t(n) * 2));
        for (auto& h : host) h = to_bf16(rnd());
        CHECK_CUDA(cudaMemcpy(x, host.data(), size_t(n) * 2, cudaMemcpyHostToDevice));
        CHECK_CUDA(cudaMemcpy(y, host.data(), size_t(n) * 2, cudaMemcpyHostToDevice));
        B.x.push_back(x), B.y.push_back(y), B.out.push_back(o);
    }
    std::vector<uint16_t> mh(size_t(2 * 6 * kCols));
    for (auto& h : mh) h = to_bf16(rnd() * 0.25f);
    CHECK_CUDA(cudaMalloc(&B.mod, mh.size() * 2));
    CHECK_CUDA(cudaMemcpy(B.mod, mh.data(), mh.size() * 2, cudaMemcpyHostToDevice));
    const int64_t mstride = 6 * kCols;
    const bf16* scale = B.mod + 1 * kCols;  // vector 1 of group 0 (group 1: + 6·C)
    const bf16* shift = B.mod + 0 * kCols;

    int sms = 0;
    CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    std::printf("rows_bw: [%lld, %lld] bf16, %d SMs, %d sets x %d back-to-back calls\n", (long long)kRows,
                (long long)kCols, sms, kSets, kReps);

    const int64_t v16 = n / 8;
    for (int per_sm : {4, 8, 16}) {
        const unsigned grid = unsigned(sms * per_sm);
        bench(("copy, grid-stride, " + std::to_string(per_sm) + " x 256 threads per SM").c_str(), 2 * T,
              [&](int i) { copy_kernel<<<grid, 256>>>((const uint4*)B.x[i], (uint4*)B.out[i], v16); });
    }
    bench("copy, one 16-byte chunk per thread", 2 * T, [&](int i) {
        copy_kernel<<<unsigned((v16 + 255) / 256), 256>>>((const uint4*)B.x[i], (uint4*)B.out[i], v16);
    });
    bench("add (the cross-attention's o_txt + o_img), 8 x 256 per SM", 3 * T, [&](int i) {
        add_kernel<<<unsigned(sms * 8), 256>>>((const uint4*)B.x[i], (const uint4*)B.y[i], (uint4*)B.out[i],
                                               v16);
    });
    bench("cudaMemcpyAsync device to device", 2 * T, [&](int i) {
        CHECK_CUDA(cudaMemcpyAsync(B.out[i], B.x[i], size_t(n) * 2, cudaMemcpyDeviceToDevice));
    });

    rows::NormArgs na;
    na.rows = kRows;
    na.cols = int(kCols);
    na.eps = 1e-6f;
    na.scale = Vec8Ptr{scale, true};
    na.shift = Vec8Ptr{shift, true};
    na.mod_stride = mstride;
    na.split = kSplit;
    na.period = kPeriod;
    const auto streamed = [&](int i) {
        rows::NormArgs a = na;
        a.x = B.x[i];
        a.out = B.out[i];
        CHECK_CUDA(rows::ada_layer_norm(a, 0));
    };
    bench("ada_layer_norm modulated 2 groups: this build's streamed kernel", 2 * T, streamed);
    // NOTE: every variant below is checked against this kernel's bits
    CHECK_CUDA(cudaDeviceSynchronize());
    std::vector<uint16_t> want(static_cast<size_t>(n)), got(static_cast<size_t>(n));
    streamed(0);
    CHECK_CUDA(cudaMemcpy(want.data(), B.out[0], size_t(n) * 2, cudaMemcpyDeviceToHost));

    int bad = 0;
    const auto check = [&](const char* name) {
        CHECK_CUDA(cudaMemset(B.out[0], 0, size_t(n) * 2));
        CHECK_CUDA(cudaDeviceSynchronize());
        return name;
    };
    const auto verify = [&](const char* name) {
        CHECK_CUDA(cudaDeviceSynchronize());
        CHECK_CUDA(cudaMemcpy(got.data(), B.out[0], size_t(n) * 2, cudaMemcpyDeviceToHost));
        int64_t diff = 0;
        for (int64_t i = 0; i < n; ++i) diff += got[size_t(i)] != want[size_t(i)];
        if (diff) {
            std::printf("  MISMATCH %s: %lld elements differ from the streamed kernel\n", name,
                        (long long)diff);
            ++bad;
        }
    };
    const auto direct = [&](auto warps_c, auto min_c) {
        constexpr int W = decltype(warps_c)::value, M = decltype(min_c)::value;
        const std::string name = "ada_layer_norm: direct, " + std::to_string(W) + " warps x " +
                                 std::to_string(M) + " blocks an SM at least";
        const auto op = [&](int i) {
            ln_direct_kernel<20, W, M><<<unsigned((kRows + W - 1) / W), W * 32>>>(
                B.x[i], B.out[i], scale, shift, mstride, kRows, int(kCols), 1e-6f);
        };
        check(name.c_str());
        op(0);
        verify(name.c_str());
        bench(name.c_str(), 2 * T, op);
    };
    using std::integral_constant;
    direct(integral_constant<int, 4>{}, integral_constant<int, 1>{});  // ~177 registers: 11 warps an SM
    direct(integral_constant<int, 4>{}, integral_constant<int, 4>{});  // <= 128 registers: 16 warps

    bench("row copy: a warp a row, 4 warps a block", 2 * T, [&](int i) {
        row_copy_kernel<20, 4><<<unsigned((kRows + 3) / 4), 128>>>(B.x[i], B.out[i], kRows, int(kCols));
    });
    const auto stream = [&](auto warps_c, auto stage_c, auto sms_c, auto deep_c) {
        constexpr int W = decltype(warps_c)::value, PerSm = decltype(sms_c)::value;
        constexpr bool S = decltype(stage_c)::value, Dp = decltype(deep_c)::value;
        const size_t smem = size_t(S ? 4 : 0) * size_t(kCols) * 2 + size_t(W) * size_t(kCols) * 2;
        CHECK_CUDA(cudaFuncSetAttribute(ln_stream_kernel<20, W, S, Dp>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
        const unsigned grid = unsigned(std::min<int64_t>(int64_t(sms) * PerSm, (kRows + W - 1) / W));
        const std::string name =
            "ada_layer_norm: streamed, " + std::to_string(W) + " warps x " + std::to_string(PerSm) +
            (S ? " an SM, bf16 vectors staged" : " an SM, vectors by ldg") + (Dp ? ", 2 rows in flight" : "");
        const auto op = [&, grid, smem](int i) {
            ln_stream_kernel<20, W, S, Dp>
                <<<grid, W * 32, smem>>>(B.x[i], B.out[i], scale, shift, mstride, kRows, int(kCols), 1e-6f);
        };
        check(name.c_str());
        op(0);
        verify(name.c_str());
        bench(name.c_str(), 2 * T, op);
    };
    using F = std::false_type;
    using Tt = std::true_type;
    stream(integral_constant<int, 8>{}, Tt{}, integral_constant<int, 1>{}, F{});
    stream(integral_constant<int, 16>{}, Tt{}, integral_constant<int, 1>{}, F{});
    stream(integral_constant<int, 8>{}, Tt{}, integral_constant<int, 1>{}, Tt{});
    stream(integral_constant<int, 12>{}, Tt{}, integral_constant<int, 1>{}, Tt{});
    stream(integral_constant<int, 16>{}, Tt{}, integral_constant<int, 1>{}, Tt{});
    stream(integral_constant<int, 16>{}, F{}, integral_constant<int, 1>{}, Tt{});

#ifdef ROWS_BW_OLD
    {
        // the DiT's row ops of a batched step, this build's kernels against the other build's
        bf16* wb = nullptr;  // norm weight and bias, [2, C]
        CHECK_CUDA(cudaMalloc(&wb, size_t(2 * kCols) * 2));
        std::vector<uint16_t> wh(size_t(2 * kCols));
        for (auto& h : wh) h = to_bf16(1.f + rnd() * 0.1f);
        CHECK_CUDA(cudaMemcpy(wb, wh.data(), wh.size() * 2, cudaMemcpyHostToDevice));
        constexpr int kPairs = 64, kR = 25;
        float *ta = nullptr, *tb = nullptr;
        CHECK_CUDA(cudaMalloc(&ta, size_t(kSplit) * kPairs * 4 * 4));  // room for 4 floats an entry
        CHECK_CUDA(cudaMalloc(&tb, size_t(kR) * kPairs * 4 * 4));
        std::vector<float> th(size_t(kSplit) * kPairs * 4);
        for (size_t i = 0; i < th.size(); i += 2) {
            const float t = rnd() * 3.f;
            th[i] = std::cos(t), th[i + 1] = std::sin(t);
        }
        CHECK_CUDA(cudaMemcpy(ta, th.data(), size_t(kSplit) * kPairs * 4 * 4, cudaMemcpyHostToDevice));
        CHECK_CUDA(cudaMemcpy(tb, th.data(), size_t(kR) * kPairs * 4 * 4, cudaMemcpyHostToDevice));
        uint8_t* q = nullptr;
        float* qs = nullptr;
        CHECK_CUDA(cudaMalloc(&q, size_t(n)));
        CHECK_CUDA(cudaMalloc(&qs, size_t(kRows) * 4));
        std::vector<uint8_t> qa(static_cast<size_t>(n)), qb(static_cast<size_t>(n));
        std::vector<float> sa(static_cast<size_t>(kRows)), sb(static_cast<size_t>(kRows));

        struct Case {
            std::string name;
            std::function<cudaError_t(int, bool)> run;  // set i, old build?
            bool fp8 = false;
        };
        std::vector<Case> cases;
        const auto norm_case = [&](const std::string& name, bool modulated, bool affine, bool fp8) {
            cases.push_back({name,
                             [=, &B](int i, bool old_build) {
                                 rows::NormArgs a = na;
                                 a.x = B.x[i];
                                 a.out = B.out[i];
                                 if (!modulated)
                                     a.scale = a.shift = Vec8Ptr{}, a.split = a.period = INT64_MAX;
                                 if (affine) a.weight = Vec8Ptr{wb, true}, a.bias = Vec8Ptr{wb + kCols, true};
                                 if (fp8) a.q = q, a.q_scales = qs;
                                 return old_build ? old_ada_layer_norm(&a, 0) : rows::ada_layer_norm(a, 0);
                             },
                             fp8});
        };
        norm_case("ada_layer_norm, modulated, 2 groups", true, false, false);
        norm_case("ada_layer_norm, affine (norm3)", false, true, false);
        norm_case("ada_layer_norm_fp8, modulated", true, false, true);
        norm_case("ada_layer_norm_fp8, affine", false, true, true);
        const auto rope_case = [&](const std::string& name, bool tables, int entry) {
            cases.push_back({name,
                             [=, &B](int i, bool old_build) {
                                 rows::RopeArgs a;
                                 a.x = B.x[i];
                                 a.out = B.out[i];
                                 a.rows = kRows;
                                 a.cols = int(kCols);
                                 a.head_dim = 128;
                                 a.eps = 1e-6f;
                                 a.weight = Vec8Ptr{wb, true};
                                 if (tables) {
                                     a.table_a = ta, a.table_b = tb, a.pairs = kPairs, a.entry = entry;
                                     a.split = kSplit, a.period = kPeriod;
                                 }
                                 return old_build ? old_rms_norm_rope(&a, 0) : rows::rms_norm_rope(a, 0);
                             },
                             false});
        };
        rope_case("rms_norm_rope, 2 tables of (cos, sin)", true, 2);
        rope_case("rms_norm_rope, 2 double-float tables (fast numerics')", true, 4);
        rope_case("rms_norm_rope, no table (cross q)", false, 2);
        for (const Case& c : cases) {
            for (const bool old_build : {true, false}) {
                CHECK_CUDA(cudaMemset(B.out[0], 0, size_t(n) * 2));
                CHECK_CUDA(cudaMemset(q, 0, size_t(n)));
                CHECK_CUDA(c.run(0, old_build));
                CHECK_CUDA(cudaDeviceSynchronize());
                if (c.fp8) {
                    CHECK_CUDA(
                        cudaMemcpy((old_build ? qa : qb).data(), q, size_t(n), cudaMemcpyDeviceToHost));
                    CHECK_CUDA(cudaMemcpy((old_build ? sa : sb).data(), qs, size_t(kRows) * 4,
                                          cudaMemcpyDeviceToHost));
                } else {
                    CHECK_CUDA(cudaMemcpy((old_build ? want : got).data(), B.out[0], size_t(n) * 2,
                                          cudaMemcpyDeviceToHost));
                }
            }
            int64_t diff = 0;
            if (c.fp8) {
                for (int64_t i = 0; i < n; ++i) diff += qa[size_t(i)] != qb[size_t(i)];
                for (int64_t i = 0; i < kRows; ++i)
                    diff += std::memcmp(&sa[size_t(i)], &sb[size_t(i)], 4) != 0;
            } else {
                for (int64_t i = 0; i < n; ++i) diff += want[size_t(i)] != got[size_t(i)];
            }
            std::printf("%s: this build against the other: %s\n", c.name.c_str(),
                        diff ? (std::to_string(diff) + " values differ").c_str() : "bit-identical");
            bad += diff != 0;
            const double bytes = c.fp8 ? T + double(n) + 4.0 * kRows : 2 * T;
            bench((c.name + " (other build)").c_str(), bytes, [&](int i) { CHECK_CUDA(c.run(i, true)); });
            bench((c.name + " (this build)").c_str(), bytes, [&](int i) { CHECK_CUDA(c.run(i, false)); });
        }
    }
#endif
    std::printf("%s\n", bad ? "rows_bw: some variant's bits differ" : "rows_bw: every variant bit-identical");
    return bad ? 1 : 0;
}
