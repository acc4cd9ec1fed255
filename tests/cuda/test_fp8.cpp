// FP8 (E4M3) on the GPU against the CPU path: the device conversion against the host's f32_to_f8e4m3 over a wide
// sweep of f32 bit patterns; the quantize kernel bit for bit against the CPU's (bf16 and f32 rows, DreamZero sizes);
// the FP8 GEMM through cuBLASLt with outer-vector scales (which must be what runs at DreamZero's shapes on Hopper)
// and through the plain kernel; a Linear with FP8 weights on both backends; the FP8 KV pool's scatter (bit for bit)
// and dequantizing paged attention; the refusal of FP8 before sm_89.
#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_paged_attention.h"
#include "backend/cuda/cuda_backend.h"
#include "core/convert.h"
#include "core/error.h"
#include "core/fp8.h"
#include "core/half.h"
#include "model/layers.h"
#include "policy/engine.h"
#include "support/map_weight_source.h"
#include "support/test_support.h"
#include "weights/fp8_weights.h"

DZR_TEST_REQUIRES_GPU()

using namespace dzr;

namespace {

CudaBackend& gpu() {
    static std::unique_ptr<Backend> be = make_cuda_backend(0, size_t(2) << 30);
    return dynamic_cast<CudaBackend&>(*be);
}

Backend& cpu() {
    static std::unique_ptr<Backend> be = make_cpu_backend(size_t(1) << 30);
    return *be;
}

bool fp8_gpu() { return gpu().capabilities().fp8; }

Tensor bf16_values(Shape s, uint64_t seed, float lo, float hi) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> dist(lo, hi);
    Tensor x = Tensor::host(s, DType::F32);
    for (int64_t i = 0; i < x.numel(); ++i) x.ptr<float>()[i] = bf16_to_f32(f32_to_bf16(dist(rng)));
    return x;
}

Tensor upload(const Tensor& host, DType dtype) {
    Tensor d = gpu().alloc(host.shape(), dtype);
    gpu().upload(host, d);
    return d;
}

Tensor download(const TensorView& dev, DType dtype) {
    Tensor h = Tensor::host(dev.shape, dtype);
    gpu().download(dev, h);
    return h;
}

/// rel-L2 and the worst |a - b| / (|b| + rms(b)).
struct Diff {
    double rel_l2 = 0, worst = 0;
};
Diff diff(const Tensor& got, const Tensor& ref) {
    double e = 0, n = 0;
    for (int64_t i = 0; i < ref.numel(); ++i) n += double(ref.ptr<float>()[i]) * ref.ptr<float>()[i];
    const double rms = std::sqrt(n / double(std::max<int64_t>(ref.numel(), 1)));
    Diff d;
    for (int64_t i = 0; i < ref.numel(); ++i) {
        const double a = got.ptr<float>()[i], b = ref.ptr<float>()[i], x = std::fabs(a - b);
        e += x * x;
        d.worst = std::max(d.worst, std::isnan(x) ? INFINITY : x / (std::fabs(b) + rms));
    }
    d.rel_l2 = std::sqrt(e / n);
    return d;
}

/// Quantizes `x` (host f32 values) on both backends; checks codes and scales are identical.
void check_quantize(const Tensor& x, DType device_dtype) {
    const int64_t rows = x.shape()[0], cols = x.shape()[1];
    Tensor q = Tensor::host({rows, cols}, DType::F8_E4M3), s = Tensor::host({rows}, DType::F32);
    // NOTE: the device quantizes x as stored in device_dtype: the CPU must see the same values (a bf16 upload rounds
    // the f32 ones the mixed case writes, e.g. 3e4 and the 1e-20 multiples)
    Tensor xs = Tensor::host(x.shape(), DType::F32);
    convert_copy_host(x, xs);
    if (device_dtype == DType::BF16) {
        Tensor xb = Tensor::host(x.shape(), DType::BF16);
        convert_copy_host(x, xb);
        convert_copy_host(xb, xs);
    }
    cpu().quantize_fp8(xs, q, s);
    Tensor xd = upload(x, device_dtype), qd = gpu().alloc({rows, cols}, DType::F8_E4M3),
           sd = gpu().alloc({rows}, DType::F32);
    gpu().quantize_fp8(xd, qd, sd);
    const Tensor qh = download(qd, DType::F8_E4M3), sh = download(sd, DType::F32);
    int64_t bad_codes = 0, bad_scales = 0;
    for (int64_t i = 0; i < q.numel(); ++i) bad_codes += q.ptr<uint8_t>()[i] != qh.ptr<uint8_t>()[i];
    for (int64_t r = 0; r < rows; ++r) bad_scales += std::memcmp(s.ptr<float>() + r, sh.ptr<float>() + r, 4) != 0;
    CHECK_MESSAGE(bad_codes == 0, bad_codes << " of " << q.numel() << " codes differ");
    CHECK_MESSAGE(bad_scales == 0, bad_scales << " of " << rows << " scales differ");
}

}  // namespace

TEST_CASE("the GPU's e4m3 conversion equals the host's over a sweep of f32 bit patterns") {
    if (!fp8_gpu()) {
        MESSAGE("no FP8 on " << gpu().name() << ": skipped");
        return;
    }
    // NOTE: rows whose maximum is 448 quantize with the multiplier 448 / 448 = 1 exactly, so each code is the plain
    // conversion of its value: every 7th positive f32 pattern up to 448 (and its negative) goes through the kernel.
    constexpr int64_t kCols = 4096, kRowsPerChunk = 8192, kStride = 7;
    const uint32_t top = 0x43e00000u;  // 448.0f
    Tensor x = Tensor::host({kRowsPerChunk, kCols}, DType::F32);
    Tensor xd = gpu().alloc(x.shape(), DType::F32), qd = gpu().alloc(x.shape(), DType::F8_E4M3),
           sd = gpu().alloc({kRowsPerChunk}, DType::F32);
    Tensor qh = Tensor::host(x.shape(), DType::F8_E4M3);
    uint64_t checked = 0, bad = 0;
    uint64_t pattern = 0;
    const unsigned threads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
    while (pattern <= top) {
        float* px = x.ptr<float>();
        for (int64_t r = 0; r < kRowsPerChunk; ++r) {
            px[r * kCols] = 448.0f;
            for (int64_t c = 1; c < kCols; ++c) {
                const uint32_t u = uint32_t(std::min<uint64_t>(pattern, top)) | ((c & 1) ? 0x80000000u : 0u);
                std::memcpy(px + r * kCols + c, &u, 4);
                pattern += (c & 1) ? 0 : kStride;
            }
        }
        gpu().upload(x, xd);
        gpu().quantize_fp8(xd, qd, sd);
        gpu().download(qd, qh);
        std::vector<uint64_t> bad_t(threads, 0);
        std::vector<std::thread> pool;
        for (unsigned t = 0; t < threads; ++t)
            pool.emplace_back([&, t] {
                for (int64_t i = t; i < x.numel(); i += threads)
                    bad_t[t] += qh.ptr<uint8_t>()[i] != f32_to_f8e4m3(px[i]);
            });
        for (auto& th : pool) th.join();
        for (uint64_t b : bad_t) bad += b;
        checked += uint64_t(x.numel());
    }
    MESSAGE("checked " << checked << " conversions, " << bad << " differ");
    CHECK(bad == 0);
}

TEST_CASE("the quantize kernel writes the CPU's codes and scales bit for bit") {
    for (DType dt : {DType::BF16, DType::F32}) {
        CAPTURE(dtype_name(dt));
        check_quantize(bf16_values({1, 7}, 1, -1.f, 1.f), dt);
        check_quantize(bf16_values({33, 128}, 2, -40.f, 40.f), dt);
        check_quantize(bf16_values({1785, 5120}, 3, -4.f, 4.f), dt);   // DreamZero's Linear inputs
        check_quantize(bf16_values({1785, 13824}, 4, -4.f, 4.f), dt);  // the FFN's second GEMM
        Tensor mixed = bf16_values({64, 512}, 5, -1.f, 1.f);
        for (int64_t c = 0; c < 512; ++c) mixed.ptr<float>()[c] = 0.0f;                           // all zero
        for (int64_t c = 0; c < 512; ++c) mixed.ptr<float>()[512 + c] *= 1e-20f;                   // below the floor
        mixed.ptr<float>()[2 * 512] = 3e4f;                                                        // one outlier
        for (int64_t c = 0; c < 512; ++c) mixed.ptr<float>()[3 * 512 + c] *= c % 2 ? 1e-4f : 1.f;  // subnormal codes
        check_quantize(mixed, dt);
    }
}

/// The codes and scales of two device quantizations are the same bits.
void check_same_codes(const Tensor& q1, const Tensor& s1, const Tensor& q2, const Tensor& s2) {
    const Tensor a = download(q1, DType::F8_E4M3), b = download(q2, DType::F8_E4M3);
    const Tensor sa = download(s1, DType::F32), sb = download(s2, DType::F32);
    int64_t bad = 0;
    for (int64_t i = 0; i < a.numel(); ++i) bad += a.ptr<uint8_t>()[i] != b.ptr<uint8_t>()[i];
    CHECK_MESSAGE(bad == 0, bad << " of " << a.numel() << " codes differ");
    CHECK(std::memcmp(sa.data(), sb.data(), sa.nbytes()) == 0);
}

/// The GPU backend's row kernels (CudaBackendOptions::row_kernels).
void set_row_kernels(RowKernels k) {
    CudaBackendOptions o = gpu().cuda_options();
    o.row_kernels = k;
    gpu().set_cuda_options(o);
}

TEST_CASE("the fused norm and GELU quantizations write the codes of the two ops they replace, bit for bit") {
    if (!fp8_gpu()) {
        MESSAGE("no FP8 on " << gpu().name() << ": skipped");
        return;
    }
    struct NormCase {
        int64_t L, C, split, period;
        bool affine, mod;
    };
    // every bf16 bit pattern (NaN and infinities included) as GELU input, 8 consecutive patterns a row
    Tensor patterns = Tensor::host({8192, 8}, DType::BF16);
    for (int i = 0; i < 65536; ++i) static_cast<uint16_t*>(patterns.data())[i] = uint16_t(i);
    const Tensor all_bf16 = upload(patterns, DType::BF16);
    for (RowKernels impl : {RowKernels::Stream, RowKernels::Warp}) {
        CAPTURE(impl == RowKernels::Stream ? "streamed row kernels" : "warp row kernels");
        set_row_kernels(impl);
        // the DiT's three norms at one and both CFG branches' rows, ragged row counts, the widest rows, small shapes,
        // and one the fused kernels do not take
        for (const NormCase& n :
             {NormCase{3570, 5120, 1760, 1785, false, true}, NormCase{3570, 5120, INT64_MAX, 1785, true, false},
              NormCase{1785, 5120, 1760, INT64_MAX, false, true}, NormCase{1001, 5120, 480, 500, true, true},
              NormCase{5, 6144, 1, 2, true, true}, NormCase{1, 5120, 0, INT64_MAX, false, true},
              NormCase{37, 40, 30, INT64_MAX, true, true}, NormCase{6, 36, 2, 3, false, true}}) {
            CAPTURE(n.L);
            CAPTURE(n.C);
            const Tensor x = upload(bf16_values({n.L, n.C}, 41, -3.f, 3.f), DType::BF16);
            const Tensor w = upload(bf16_values({n.C}, 42, 0.5f, 1.5f), DType::BF16);
            const Tensor b = upload(bf16_values({n.C}, 43, -0.5f, 0.5f), DType::BF16);
            const Tensor mod = upload(bf16_values({2, 6, n.C}, 44, -0.5f, 0.5f), DType::BF16);
            const auto vecs = [&](int i) {
                return TensorView(static_cast<char*>(mod.data()) + size_t(i) * size_t(n.C) * 2, DType::BF16,
                                  Shape{2, n.C}, Shape{6 * n.C, 1}, mod.device());
            };
            const FusedRowParams p{1e-6f, n.split, n.period};
            const TensorView wv = n.affine ? w.view() : TensorView{}, bv = n.affine ? b.view() : TensorView{};
            const TensorView sc = n.mod ? vecs(1) : TensorView{}, sh = n.mod ? vecs(0) : TensorView{};
            Tensor h = gpu().alloc({n.L, n.C}, DType::BF16);
            Tensor q1 = gpu().alloc({n.L, n.C}, DType::F8_E4M3), s1 = gpu().alloc({n.L}, DType::F32);
            Tensor q2 = gpu().alloc({n.L, n.C}, DType::F8_E4M3), s2 = gpu().alloc({n.L}, DType::F32);
            gpu().ada_layer_norm(p, x, wv, bv, sc, sh, h);
            gpu().quantize_fp8(h, q1, s1);
            gpu().ada_layer_norm_fp8(p, x, wv, bv, sc, sh, q2, s2);
            check_same_codes(q1, s1, q2, s2);
        }
        const auto check_gelu = [&](const TensorView& x) {
            const int64_t L = x.dim(0), F = x.dim(1);
            CAPTURE(L);
            CAPTURE(F);
            Tensor a = gpu().alloc({L, F}, DType::BF16);
            Tensor q1 = gpu().alloc({L, F}, DType::F8_E4M3), s1 = gpu().alloc({L}, DType::F32);
            Tensor q2 = gpu().alloc({L, F}, DType::F8_E4M3), s2 = gpu().alloc({L}, DType::F32);
            gpu().activation({Activation::GeluTanh}, x, a);
            gpu().quantize_fp8(a, q1, s1);
            gpu().activation_quantize_fp8({Activation::GeluTanh}, x, q2, s2);
            check_same_codes(q1, s1, q2, s2);
        };
        for (const auto& [L, F] : {std::pair<int64_t, int64_t>{3570, 13824}, {1785, 13824}, {5, 16384}, {7, 24}, {3, 20}})
            check_gelu(upload(bf16_values({L, F}, 45, -6.f, 6.f), DType::BF16));
        check_gelu(all_bf16);
    }
    set_row_kernels(RowKernels::Stream);
}

TEST_CASE("the streamed row kernels write the same bits at 16 warps, bf16 vectors staged, as at 8 with f32 staging") {
    // RowKernels::Stream (16 warps a block, bf16 vectors staged as they are) against Stream8 (the old shape: 8 warps,
    // f32 staging) and the warp kernels: every norm and RoPE output, and the E4M3 codes, bit for bit
    struct Case {
        int64_t L, C, split, period;
        bool affine, mod, f32_mod;
    };
    const auto run_all = [&](const std::function<Tensor()>& op) {
        std::vector<Tensor> outs;
        for (RowKernels k : {RowKernels::Stream, RowKernels::Stream8, RowKernels::Warp}) {
            set_row_kernels(k);
            outs.push_back(op());
        }
        set_row_kernels(RowKernels::Stream);
        for (size_t i = 1; i < outs.size(); ++i) {
            CAPTURE(i);
            REQUIRE(outs[i].nbytes() == outs[0].nbytes());
            const auto* a = static_cast<const uint8_t*>(outs[0].data());
            const auto* b = static_cast<const uint8_t*>(outs[i].data());
            int64_t bad = 0;
            for (size_t j = 0; j < outs[0].nbytes(); ++j) bad += a[j] != b[j];
            CHECK_MESSAGE(bad == 0, bad << " of " << outs[0].nbytes() << " bytes differ");
        }
    };
    for (const Case& n :
         {Case{3570, 5120, 1760, 1785, false, true, false}, Case{3570, 5120, INT64_MAX, 1785, true, false, false},
          Case{3570, 5120, 1760, 1785, true, true, true}, Case{1785, 5120, 1760, INT64_MAX, false, true, false},
          Case{1001, 5120, 480, 500, true, true, false}, Case{5, 6144, 1, 2, true, true, true},
          Case{37, 40, 30, INT64_MAX, true, true, false}}) {
        CAPTURE(n.L);
        CAPTURE(n.C);
        CAPTURE(n.f32_mod);
        const Tensor x = upload(bf16_values({n.L, n.C}, 51, -3.f, 3.f), DType::BF16);
        const Tensor w = upload(bf16_values({n.C}, 52, 0.5f, 1.5f), DType::BF16);
        const Tensor b = upload(bf16_values({n.C}, 53, -0.5f, 0.5f), DType::BF16);
        const DType tm = n.f32_mod ? DType::F32 : DType::BF16;
        const Tensor mod = upload(bf16_values({2, 6, n.C}, 54, -0.5f, 0.5f), tm);
        const auto vecs = [&](int i) {
            return TensorView(static_cast<char*>(mod.data()) + size_t(i) * size_t(n.C) * dtype_size(tm), tm,
                              Shape{2, n.C}, Shape{6 * n.C, 1}, mod.device());
        };
        const FusedRowParams p{1e-6f, n.split, n.period};
        const TensorView wv = n.affine ? w.view() : TensorView{}, bv = n.affine ? b.view() : TensorView{};
        const TensorView sc = n.mod ? vecs(1) : TensorView{}, sh = n.mod ? vecs(0) : TensorView{};
        run_all([&] {
            Tensor h = gpu().alloc({n.L, n.C}, DType::BF16);
            gpu().ada_layer_norm(p, x, wv, bv, sc, sh, h);
            return download(h, DType::BF16);
        });
        if (fp8_gpu()) {
            run_all([&] {
                Tensor q = gpu().alloc({n.L, n.C}, DType::F8_E4M3), s = gpu().alloc({n.L}, DType::F32);
                gpu().ada_layer_norm_fp8(p, x, wv, bv, sc, sh, q, s);
                const Tensor qh = download(q, DType::F8_E4M3), sh2 = download(s, DType::F32);
                Tensor both = Tensor::host({qh.numel() + 4 * sh2.numel()}, DType::F8_E4M3);
                std::memcpy(both.data(), qh.data(), qh.nbytes());
                std::memcpy(static_cast<char*>(both.data()) + qh.nbytes(), sh2.data(), sh2.nbytes());
                return both;
            });
        }
    }
    // RMSNorm + RoPE: the DiT's q/k (two tables of 64 pairs a head), the cross q (no table), smaller shapes
    // (entry 4: the double-float tables fast numerics rotate with; entry 2: (cos, sin) pairs)
    struct RopeCase {
        int64_t L, H, D, split, period, pairs, entry;
    };
    for (const RopeCase& r :
         {RopeCase{3570, 40, 128, 1760, 1785, 64, 4}, RopeCase{3570, 40, 128, 1760, 1785, 64, 2},
          RopeCase{3570, 40, 128, INT64_MAX, INT64_MAX, 0, 2}, RopeCase{1785, 40, 128, 1760, INT64_MAX, 64, 4},
          RopeCase{301, 4, 64, 100, 150, 16, 2}}) {
        CAPTURE(r.L);
        CAPTURE(r.pairs);
        CAPTURE(r.entry);
        const Tensor x = upload(bf16_values({r.L, r.H * r.D}, 61, -2.f, 2.f), DType::BF16);
        const Tensor w = upload(bf16_values({r.H * r.D}, 62, 0.5f, 1.5f), DType::BF16);
        const int64_t P = std::min(r.L, r.period), s = std::min(r.split, P);
        const Tensor ta = r.pairs ? upload(bf16_values({s, r.pairs, r.entry}, 63, -1.f, 1.f), DType::F32) : Tensor();
        const Tensor tb =
            r.pairs && s < P ? upload(bf16_values({P - s, r.pairs, r.entry}, 64, -1.f, 1.f), DType::F32) : Tensor();
        const FusedRowParams p{1e-6f, r.split, r.period};
        run_all([&] {
            Tensor out = gpu().alloc({r.L, r.H, r.D}, DType::BF16);
            const TensorView tav = ta.defined() ? ta.view() : TensorView{};
            const TensorView tbv = tb.defined() ? tb.view() : TensorView{};
            gpu().rms_norm_rope(p, x, w, tav, tbv, out);
            return download(out, DType::BF16);
        });
    }
}

TEST_CASE("the FP8 GEMM runs through cuBLASLt at DreamZero's shapes and matches the CPU's") {
    if (!fp8_gpu()) {
        MESSAGE("no FP8 on " << gpu().name() << ": skipped");
        return;
    }
    struct Case {
        int64_t M, N, K;
        bool bias;
        bool expect_lt;  // cuBLASLt must take it (Hopper, cuBLAS 12.9+); the small ones are reported only
    };
    // DreamZero-DROID's per-forward GEMMs at one CFG branch (1785 tokens) and the tiny config's
    const Case cases[] = {{1785, 15360, 5120, true, true}, {1785, 5120, 5120, true, true},
                          {1785, 13824, 5120, true, true}, {1785, 5120, 13824, true, true},
                          {470, 256, 128, true, false},    {470, 128, 256, false, false},
                          {7, 48, 32, true, false}};
    for (const Case& c : cases) {
        CAPTURE(c.M);
        CAPTURE(c.N);
        CAPTURE(c.K);
        const Tensor x = bf16_values({c.M, c.K}, 10, -3.f, 3.f), w = bf16_values({c.N, c.K}, 11, -0.05f, 0.05f);
        const Tensor b = bf16_values({c.N}, 12, -0.5f, 0.5f);
        Tensor xq = Tensor::host({c.M, c.K}, DType::F8_E4M3), xs = Tensor::host({c.M}, DType::F32);
        cpu().quantize_fp8(x, xq, xs);
        const Fp8Weight wq = quantize_weight_fp8(w, "w");
        Tensor ref = Tensor::host({c.M, c.N}, DType::F32);
        cpu().gemm_fp8(xq, xs, wq.q, wq.scale, c.bias ? b.view() : TensorView{}, ref);
        for (int64_t i = 0; i < ref.numel(); ++i) ref.ptr<float>()[i] = bf16_to_f32(f32_to_bf16(ref.ptr<float>()[i]));
        const Tensor xqd = upload(xq, DType::F8_E4M3), xsd = upload(xs, DType::F32), wqd = upload(wq.q, DType::F8_E4M3),
                     wsd = upload(wq.scale, DType::F32), bd = upload(b, DType::BF16);
        for (bool plain : {false, true}) {
            if (plain && c.M * c.N * c.K > (int64_t(1) << 33)) continue;  // the plain kernel is slow at full size
            CAPTURE(plain);
            Tensor od = gpu().alloc({c.M, c.N}, DType::BF16);
            gpu().set_fallback_only(plain);
            gpu().gemm_fp8(xqd, xsd, wqd, wsd, c.bias ? bd.view() : TensorView{}, od);
            gpu().set_fallback_only(false);
            if (!plain && c.expect_lt) CHECK(gpu().last_fp8_gemm_used_cublaslt());
            if (plain) CHECK_FALSE(gpu().last_fp8_gemm_used_cublaslt());
            const Diff d = diff(download(od, DType::F32), ref);
            MESSAGE((plain ? "plain" : (gpu().last_fp8_gemm_used_cublaslt() ? "cuBLASLt" : "plain (no algo)"))
                    << " M" << c.M << " N" << c.N << " K" << c.K << ": rel-L2 " << d.rel_l2 << ", worst " << d.worst);
            // NOTE: the same exact E4M3 products in f32 sums of another order (the tensor cores' partial sums are
            // promoted to f32 in blocks), then bf16: a bf16 ulp (2^-8 relative) of the row's magnitude and a little
            CHECK(d.rel_l2 < 4e-3);
            CHECK(d.worst < 1.6e-2);
        }
    }
}

TEST_CASE("a Linear with FP8 weights gives the same result on the GPU as on the CPU") {
    if (!fp8_gpu()) {
        MESSAGE("no FP8 on " << gpu().name() << ": skipped");
        return;
    }
    const int64_t M = 300, K = 512, N = 640;
    test::MapSource src;
    src.tensors["m.weight"] = bf16_values({N, K}, 21, -0.06f, 0.06f);
    src.tensors["m.bias"] = bf16_values({N}, 22, -0.2f, 0.2f);
    const Fp8Weight q = quantize_weight_fp8(src.tensors.at("m.weight"), "m.weight");
    src.tensors["m.weight"] = q.q;
    src.tensors["m.weight_scale"] = q.scale;
    Linear on_cpu, on_gpu;
    for (auto [lin, be] : {std::pair{&on_cpu, &cpu()}, std::pair{&on_gpu, static_cast<Backend*>(&gpu())}}) {
        WeightLoader loader(src, *be);
        loader.set_precision(Precision::Fp8);
        lin->load(loader, "m", K, N);
        REQUIRE(lin->fp8());
    }
    const Tensor x = bf16_values({M, K}, 23, -2.f, 2.f);
    Tensor ref = Tensor::host({M, N}, DType::F32);
    on_cpu.forward(cpu(), x, ref);
    for (int64_t i = 0; i < ref.numel(); ++i) ref.ptr<float>()[i] = bf16_to_f32(f32_to_bf16(ref.ptr<float>()[i]));
    const Tensor xd = upload(x, DType::BF16);
    Tensor od = gpu().alloc({M, N}, DType::BF16);
    on_gpu.forward(gpu(), xd, od);
    const Diff d = diff(download(od, DType::F32), ref);
    MESSAGE("FP8 Linear GPU vs CPU: rel-L2 " << d.rel_l2 << ", worst " << d.worst);
    CHECK(d.rel_l2 < 4e-3);
    CHECK(d.worst < 1.6e-2);
}

TEST_CASE("the FP8 pool's scatter writes the CPU's codes and scales, and paged attention matches the CPU's") {
    const int H = 4, D = 128, bs = 16, ids = 6;
    const int64_t row = int64_t(H) * D, slots_total = int64_t(ids) * bs;
    const std::vector<BlockId> table = {4, 1, 3, kNullBlockId};
    const int64_t hist = 40, cur = 25, lq = 31;
    const Tensor hk = bf16_values({hist, H, D}, 31, -3.f, 3.f), hv = bf16_values({hist, H, D}, 32, -1.f, 1.f);
    std::vector<int64_t> slots;
    for (int64_t t = 0; t < hist; ++t) slots.push_back(int64_t(table[size_t(t / bs)]) * bs + t % bs);
    Tensor slots_host = Tensor::host({hist}, DType::I64);
    std::copy(slots.begin(), slots.end(), slots_host.ptr<int64_t>());

    // CPU pool
    Tensor kp = Tensor::host({slots_total, H, D}, DType::F8_E4M3), vp = Tensor::host(kp.shape(), DType::F8_E4M3);
    Tensor ks = Tensor::host({slots_total, H}, DType::F32), vs = Tensor::host(ks.shape(), DType::F32);
    PagedKvView view{kp.data(), vp.data(), DType::F8_E4M3, H, D, bs, 0, bs * row, row, D, table.data(),
                     int32_t(table.size()), int32_t((hist + bs - 1) / bs), hist, ks.data(), vs.data()};
    cpu().scatter_kv(view, 0, slots_host, hk, hv, slots_total);

    // GPU pool
    Tensor kpd = gpu().alloc(kp.shape(), DType::F8_E4M3), vpd = gpu().alloc(kp.shape(), DType::F8_E4M3);
    Tensor ksd = gpu().alloc(ks.shape(), DType::F32), vsd = gpu().alloc(ks.shape(), DType::F32);
    const Tensor slots_dev = upload(slots_host, DType::I64);
    Tensor table_host = Tensor::host({int64_t(table.size())}, DType::I32);
    std::copy(table.begin(), table.end(), table_host.ptr<int32_t>());
    const Tensor table_dev = upload(table_host, DType::I32);
    PagedKvView dview = view;
    dview.k_base = kpd.data(), dview.v_base = vpd.data(), dview.k_scale = ksd.data(), dview.v_scale = vsd.data();
    dview.block_table = table_dev.ptr<const BlockId>();
    gpu().scatter_kv(dview, 0, slots_dev, upload(hk, DType::BF16), upload(hv, DType::BF16), slots_total);
    for (const auto& [h, d] : {std::pair{&kp, &kpd}, std::pair{&vp, &vpd}, std::pair{&ks, &ksd}, std::pair{&vs, &vsd}})
        CHECK(std::memcmp(h->data(), download(*d, h->dtype()).data(), h->nbytes()) == 0);

    // attention over [history | current]
    const Tensor q = bf16_values({lq, H, D}, 33, -2.f, 2.f), k = bf16_values({cur, H, D}, 34, -2.f, 2.f),
                 v = bf16_values({cur, H, D}, 35, -1.f, 1.f);
    Tensor ref = Tensor::host({lq, H, D}, DType::F32);
    const float scale = 1.0f / std::sqrt(float(D));
    cpu().paged_attention({scale}, q, view, 0, k, v, ref);
    for (int64_t i = 0; i < ref.numel(); ++i) ref.ptr<float>()[i] = bf16_to_f32(f32_to_bf16(ref.ptr<float>()[i]));
    Tensor od = gpu().alloc({lq, H, D}, DType::BF16);
    gpu().paged_attention({scale}, upload(q, DType::BF16), dview, 0, upload(k, DType::BF16), upload(v, DType::BF16),
                          od);
    CHECK(gpu().last_paged_attention_impl() == PagedAttentionImpl::Gather);
    const Diff d = diff(download(od, DType::F32), ref);
    MESSAGE("FP8 pool paged attention GPU vs CPU: rel-L2 " << d.rel_l2 << ", worst " << d.worst);
    // NOTE: the same dequantized rows (the GPU rounds them to bf16 before its bf16 attention): bf16 tolerance
    CHECK(d.rel_l2 < 1e-2);
    CHECK(d.worst < 3e-2);
    CHECK(gpu().paged_attention_workspace_bytes(dview, upload(k, DType::BF16)) >=
          size_t(2) * size_t(hist + cur) * size_t(row) * 2);
    gpu().synchronize();
}

TEST_CASE("FP8 is refused before any weight is loaded on a GPU without it, and allowed with it") {
    Placement p;
    p.backends = {&gpu()};
    const std::string e = [&] {
        try {
            check_fp8_support(p, Precision::Fp8, Precision::Bf16);
        } catch (const Error& err) {
            return std::string(err.what());
        }
        return std::string();
    }();
    if (fp8_gpu()) {
        CHECK(e.empty());
    } else {
        CHECK(e.find("precision fp8 needs FP8") != std::string::npos);
        CHECK(e.find("8.9") != std::string::npos);
    }
    CHECK_NOTHROW(check_fp8_support(p, Precision::Bf16, Precision::Bf16));
}
