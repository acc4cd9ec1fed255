// CPU-vs-CUDA op parity in the style of llama.cpp's test-backend-ops: a case list per op and shape,
// fresh random inputs per case, outputs poisoned with NaN before each run, and a tolerance of
// atol + rtol * |ref| with atol = rtol * rms(ref). bf16 inputs are rounded to bf16 before the CPU
// reference runs, so only the computation differs. Every case prints its max abs and max rel error
// (rel = |cuda - ref| / max(|ref|, rms(ref))).
//
// DZR_TEST_SEED=<n> reproduces a run (the seed in use is printed first); DZR_TEST_SMALL=1 skips the
// DreamZero-sized cases.
#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "core/half.h"
#include "kv/block_table.h"
#include "model/image_resize.h"
#include "support/test_support.h"

DZR_TEST_REQUIRES_GPU()

using namespace dzr;

namespace {

constexpr double kRtolF32 = 1e-5;
constexpr double kRtolBf16 = 1e-2;

struct Stats {
    double max_abs = 0, max_rel = 0, rms_ref = 0;
    int64_t bad = 0, n = 0;
};

uint64_t base_seed() {
    static const uint64_t seed = [] {
        if (const char* s = std::getenv("DZR_TEST_SEED")) return uint64_t(std::strtoull(s, nullptr, 10));
        return uint64_t(std::random_device{}()) << 32 | std::random_device{}();
    }();
    return seed;
}

CudaBackend& gpu() {
    static std::unique_ptr<Backend> be = make_cuda_backend(0, size_t(2) << 30);
    return dynamic_cast<CudaBackend&>(*be);
}

/// Fast numerics on the same device (the ops that only fast numerics run: paged_attention_batched's one SDPA). It has
/// its own stream: operands uploaded through gpu() are synchronized before it reads them.
CudaBackend& fast_gpu() {
    static std::unique_ptr<Backend> be = [] {
        BackendOptions o;
        o.numerics = Numerics::Fast;
        o.workspace_bytes = size_t(256) << 20;
        return make_cuda_backend(0, o);
    }();
    return dynamic_cast<CudaBackend&>(*be);
}

Backend& cpu() {
    static std::unique_ptr<Backend> be = make_cpu_backend();
    return *be;
}

float round_to(DType t, float v) { return t == DType::BF16 ? bf16_to_f32(f32_to_bf16(v)) : v; }

const float* fp(const Tensor& t) { return t.ptr<float>(); }

/// Per-case state: inputs on both sides, outputs, and the comparison.
class Harness {
public:
    Harness(DType dt, uint64_t seed) : dt_(dt), rng_(seed) {}

    DType dt() const { return dt_; }
    double rtol() const { return dt_ == DType::BF16 ? kRtolBf16 : kRtolF32; }

    /// Host f32 values uniform in [lo, hi), rounded to the case dtype (or `as`).
    Tensor input(Shape s, float lo = -1.f, float hi = 1.f) { return input_as(s, dt_, lo, hi); }
    Tensor input_as(Shape s, DType as, float lo = -1.f, float hi = 1.f) {
        std::uniform_real_distribution<float> dist(lo, hi);
        Tensor t = Tensor::host(s, DType::F32);
        for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = round_to(as, dist(rng_));
        return t;
    }

    /// A device copy of a host f32 tensor in dtype `t` (the case dtype by default).
    TensorView dev(const Tensor& host, DType t) {
        Tensor d = gpu().alloc(host.shape(), t);
        gpu().upload(host, d);
        keep_.push_back(d);
        return d.view();
    }
    TensorView dev(const Tensor& host) { return dev(host, dt_); }

    /// A device output filled with NaN bit patterns (0xFF bytes are NaN in f32, bf16 and f16).
    TensorView dev_out(Shape s, DType t) {
        Tensor d = gpu().alloc(s, t);
        REQUIRE(cudaMemsetAsync(d.data(), 0xFF, d.nbytes(), gpu().cuda_stream()) == cudaSuccess);
        keep_.push_back(d);
        return d.view();
    }
    TensorView dev_out(Shape s) { return dev_out(s, dt_); }

    /// A host f32 output filled with NaN.
    static Tensor cpu_out(Shape s) {
        Tensor t = Tensor::host(s, DType::F32);
        std::fill(t.ptr<float>(), t.ptr<float>() + t.numel(), NAN);
        return t;
    }

    /// Downloads `got` and compares it with the CPU result.
    Stats compare(const TensorView& got, const Tensor& ref) { return compare(got, ref, rtol()); }
    Stats compare(const TensorView& got, const Tensor& ref, double rtol) {
        gpu().synchronize();
        REQUIRE(cudaGetLastError() == cudaSuccess);
        Tensor host = Tensor::host(got.shape, DType::F32);
        gpu().download(got, host);
        REQUIRE(host.numel() == ref.numel());
        Stats s;
        s.n = ref.numel();
        double ss = 0;
        for (int64_t i = 0; i < s.n; ++i) ss += double(fp(ref)[i]) * fp(ref)[i];
        s.rms_ref = s.n ? std::sqrt(ss / double(s.n)) : 0.0;
        const double atol = rtol * s.rms_ref;
        for (int64_t i = 0; i < s.n; ++i) {
            const double r = fp(ref)[i], g = fp(host)[i], d = std::fabs(g - r);
            if (!(d <= atol + rtol * std::fabs(r))) ++s.bad;  // NaN counts as bad
            if (std::isnan(d)) {
                s.max_abs = s.max_rel = INFINITY;
                continue;
            }
            s.max_abs = std::max(s.max_abs, d);
            const double denom = std::max(std::fabs(r), s.rms_ref);
            s.max_rel = std::max(s.max_rel, denom > 0 ? d / denom : d);
        }
        return s;
    }

    std::mt19937_64& rng() { return rng_; }

private:
    DType dt_;
    std::mt19937_64 rng_;
    std::vector<Tensor> keep_;
};

struct OpCase {
    std::string op;    // the Backend method under test
    std::string name;  // shape and variant
    DType dtype;
    std::function<Stats(Harness&)> run;
    bool big = false;  // skipped under DZR_TEST_SMALL=1 (e.g. for a compute-sanitizer run)
};

// ---- case builders -------------------------------------------------------------------------------

struct GemmSpec {
    int64_t M, N, K;
    bool ta = false, tb = true;
    float alpha = 1.f, beta = 0.f;
    bool bias = false;
    DType bias_dtype = DType::F32;  // used when the case dtype is bf16
    DType out_dtype = DType::F32;   // overridden to the case dtype unless bf16 -> f32 is asked for
    bool f32_out = false;
    int64_t pad_cols = 0;           // a's rows padded by this many elements (strided rows)
    int64_t batch = 0;              // > 0: rank-3 operands
    bool broadcast_b = false;       // b's batch stride is 0
    bool fallback = false;          // dzr's plain kernel instead of cuBLASLt
    bool cublas = false;            // bias-free through cuBLAS (PlainGemmImpl::Cublas) instead of cuBLASLt
    double rtol = 0;                // > 0: the comparison's rtol instead of the dtype's
};

Stats run_gemm(Harness& h, const GemmSpec& g) {
    const DType dt = h.dt(), out_dt = g.f32_out ? DType::F32 : dt;
    const bool batched = g.batch > 0;
    const int64_t B = batched ? g.batch : 1;
    const int64_t a_rows = g.ta ? g.K : g.M, a_cols = g.ta ? g.M : g.K;
    const int64_t b_rows = g.tb ? g.N : g.K, b_cols = g.tb ? g.K : g.N;
    // a lives in a [B, a_rows, a_cols + pad] buffer; the view takes the first a_cols columns.
    Tensor a_full = h.input({B, a_rows, a_cols + g.pad_cols});
    Tensor b_full = h.input({g.broadcast_b ? 1 : B, b_rows, b_cols});
    const auto view_of = [&](const Tensor& full, int64_t rows, int64_t cols, int64_t ld, bool bcast, void* data,
                             Device dev) {
        const int64_t bs = bcast ? 0 : rows * ld;
        return batched ? TensorView(data, full.dtype(), Shape{B, rows, cols}, Shape{bs, ld, 1}, dev)
                       : TensorView(data, full.dtype(), Shape{rows, cols}, Shape{ld, 1}, dev);
    };
    const int64_t lda = a_cols + g.pad_cols;
    const TensorView a_cpu = view_of(a_full, a_rows, a_cols, lda, false, a_full.data(), Device::cpu());
    const TensorView b_cpu = view_of(b_full, b_rows, b_cols, b_cols, g.broadcast_b, b_full.data(), Device::cpu());
    const TensorView a_dev_full = h.dev(a_full), b_dev_full = h.dev(b_full);
    TensorView a_dev = view_of(a_full, a_rows, a_cols, lda, false, a_dev_full.data, a_dev_full.device);
    TensorView b_dev = view_of(b_full, b_rows, b_cols, b_cols, g.broadcast_b, b_dev_full.data, b_dev_full.device);
    a_dev.dtype = b_dev.dtype = dt;

    const DType bias_dt = dt == DType::BF16 ? g.bias_dtype : DType::F32;
    Tensor bias = g.bias ? h.input_as({g.N}, bias_dt) : Tensor();
    const TensorView bias_dev = g.bias ? h.dev(bias, bias_dt) : TensorView{};
    const Shape out_shape = batched ? Shape{B, g.M, g.N} : Shape{g.M, g.N};
    Tensor ref = g.beta != 0.f ? h.input_as(out_shape, out_dt) : Harness::cpu_out(out_shape);
    TensorView out_dev = g.beta != 0.f ? h.dev(ref, out_dt) : h.dev_out(out_shape, out_dt);

    GemmParams p;
    p.trans_a = g.ta;
    p.trans_b = g.tb;
    p.alpha = g.alpha;
    p.beta = g.beta;
    gpu().set_fallback_only(g.fallback);
    const PlainGemmImpl plain_before = gpu().plain_gemm_impl();
    gpu().set_plain_gemm_impl(g.cublas ? PlainGemmImpl::Cublas : PlainGemmImpl::Lt);
    gpu().gemm(p, a_dev, b_dev, bias_dev, out_dev);
    gpu().set_fallback_only(false);
    gpu().set_plain_gemm_impl(plain_before);
    cpu().gemm(p, a_cpu, b_cpu, g.bias ? bias.view() : TensorView{}, ref);
    return h.compare(out_dev, ref, g.rtol > 0 ? g.rtol : h.rtol());
}

Stats run_binary(Harness& h, BinaryOp op, Shape as, Shape bs, bool mixed_b, bool in_place) {
    Tensor a = h.input(as), b = mixed_b ? h.input_as(bs, DType::F32) : h.input(bs);
    const TensorView ad = h.dev(a), bd = h.dev(b, mixed_b ? DType::F32 : h.dt());
    const TensorView od = in_place ? ad : h.dev_out(as);
    Tensor ref = Harness::cpu_out(as);
    gpu().binary({op}, ad, bd, od);
    cpu().binary({op}, a, b, ref);
    return h.compare(od, ref);
}

/// A bicubic resize [C, H, W] -> [C, h, w]: the CUDA kernel against the CPU's interpolation matrices.
Stats run_resize(Harness& h, int64_t C, int H, int W, int oh, int ow) {
    Tensor x = h.input({C, H, W});
    const TensorView xd = h.dev(x), od = h.dev_out({C, oh, ow});
    Tensor ref = Harness::cpu_out({C, oh, ow});
    REQUIRE(gpu().capabilities().resize_bicubic);
    gpu().resize_bicubic(xd, od);
    BicubicResize(cpu(), H, W, oh, ow).apply(cpu(), x, ref);
    // NOTE: PyTorch's fused multiply-adds against the CPU's GEMM sums: an f32 ulp or two apart
    return h.compare(od, ref, 5e-5);
}

Stats run_unary(Harness& h, Shape s, float lo, float hi,
                const std::function<void(Backend&, const TensorView&, const TensorView&)>& op) {
    Tensor x = h.input(s, lo, hi);
    const TensorView xd = h.dev(x), od = h.dev_out(s);
    Tensor ref = Harness::cpu_out(s);
    op(gpu(), xd, od);
    op(cpu(), x, ref);
    return h.compare(od, ref);
}

Stats run_norm(Harness& h, bool layer, int64_t R, int64_t C, bool weight, bool bias, DType param_dt) {
    Tensor x = h.input({R, C}, -3.f, 5.f);
    Tensor w = weight ? h.input_as({C}, param_dt, 0.5f, 1.5f) : Tensor();
    Tensor b = bias ? h.input_as({C}, param_dt) : Tensor();
    const TensorView xd = h.dev(x), od = h.dev_out({R, C});
    const TensorView wd = weight ? h.dev(w, param_dt) : TensorView{}, bd = bias ? h.dev(b, param_dt) : TensorView{};
    Tensor ref = Harness::cpu_out({R, C});
    if (layer) {
        gpu().layer_norm({1e-6f}, xd, wd, bd, od);
        cpu().layer_norm({1e-6f}, x, weight ? w.view() : TensorView{}, bias ? b.view() : TensorView{}, ref);
    } else {
        gpu().rms_norm({1e-6f}, xd, wd, od);
        cpu().rms_norm({1e-6f}, x, weight ? w.view() : TensorView{}, ref);
    }
    return h.compare(od, ref);
}

/// The VAE's channel L2 norm (Backend::l2_norm) with a weight in the activation dtype.
Stats run_l2_norm(Harness& h, int64_t R, int64_t C, bool eager, bool silu) {
    Tensor x = h.input({R, C}, -3.f, 5.f);
    Tensor w = h.input_as({C}, h.dt(), 0.5f, 1.5f);
    const TensorView xd = h.dev(x), od = h.dev_out({R, C}), wd = h.dev(w, h.dt());
    Tensor ref = Harness::cpu_out({R, C});
    L2NormParams p;
    p.scale = float(std::sqrt(double(C)));
    p.silu = silu;
    AutocastScope autocast(gpu(), !eager);
    gpu().l2_norm(p, xd, wd, od);
    cpu().l2_norm(p, x, w.view(), ref);
    return h.compare(od, ref);
}

/// DreamZero's per-token RoPE table for one chunk: 2 latent frames of 22 x 40 video tokens (pairs split
/// 22 / 21 / 21 over time, row, column), then 24 action tokens and 1 state token (1-D over 64 pairs).
Tensor dreamzero_rope_table() {
    const int64_t L = 2 * 22 * 40 + 24 + 1, P = 64;
    Tensor t = Tensor::host({L, P, 2}, DType::F32);
    float* p = t.ptr<float>();
    const auto put = [&](int64_t l, int64_t j, double angle) {
        p[(l * P + j) * 2] = float(std::cos(angle));
        p[(l * P + j) * 2 + 1] = float(std::sin(angle));
    };
    int64_t l = 0;
    for (int64_t fi = 0; fi < 2; ++fi)
        for (int64_t hi = 0; hi < 22; ++hi)
            for (int64_t wi = 0; wi < 40; ++wi, ++l)
                for (int64_t j = 0; j < P; ++j) {
                    if (j < 22)
                        put(l, j, double(3 + fi) * std::pow(10000.0, -2.0 * double(j) / 44));
                    else if (j < 43)
                        put(l, j, double(hi) * std::pow(10000.0, -2.0 * double(j - 22) / 42));
                    else
                        put(l, j, double(wi) * std::pow(10000.0, -2.0 * double(j - 43) / 42));
                }
    for (int64_t a = 0; a < 25; ++a, ++l)
        for (int64_t j = 0; j < P; ++j) put(l, j, double(a < 24 ? 24 + a : 1) * std::pow(10000.0, -2.0 * double(j) / 128));
    return t;
}

Stats run_rope(Harness& h, int64_t L, int64_t H, int64_t D, int64_t P, bool in_place, bool dreamzero_table,
               bool double_table = false) {
    Tensor x = h.input({L, H, D}, -2.f, 2.f);
    Tensor table;
    if (dreamzero_table) {
        table = dreamzero_rope_table();
        REQUIRE(table.shape()[0] == L);
    } else if (double_table) {  // (cos_hi, cos_lo, sin_hi, sin_lo): both backends rotate in double
        table = Tensor::host({L, P, 4}, DType::F32);
        std::uniform_real_distribution<double> ang(-M_PI, M_PI);
        float* e = table.ptr<float>();
        for (int64_t i = 0; i < L * P; ++i, e += 4) {
            const double a = ang(h.rng()), c = std::cos(a), s = std::sin(a);
            e[0] = float(c), e[1] = float(c - double(e[0])), e[2] = float(s), e[3] = float(s - double(e[2]));
        }
    } else {
        table = Tensor::host({L, P, 2}, DType::F32);
        std::uniform_real_distribution<double> ang(-M_PI, M_PI);
        for (int64_t i = 0; i < L * P; ++i) {
            const double a = ang(h.rng());
            table.ptr<float>()[2 * i] = float(std::cos(a));
            table.ptr<float>()[2 * i + 1] = float(std::sin(a));
        }
    }
    const TensorView xd = h.dev(x), td = h.dev(table, DType::F32);
    const TensorView od = in_place ? xd : h.dev_out({L, H, D});
    Tensor ref = Harness::cpu_out({L, H, D});
    gpu().rope({}, xd, td, od);
    cpu().rope({}, x, table, ref);
    return h.compare(od, ref);
}

struct AttnSpec {
    int64_t Lq, Lk, H, D;
    bool bias = false;
    bool fused = false;  // q, k, v as slices of fused [L, 3, H, D] buffers
    Backend* backend = nullptr;  // another CUDA backend (small workspace) or null for the shared one
};

Stats run_attention(Harness& h, const AttnSpec& s) {
    Backend& be = s.backend ? *s.backend : static_cast<Backend&>(gpu());
    const float scale = 1.f / std::sqrt(float(s.D));
    const int64_t parts = s.fused ? 3 : 1;
    Tensor q = h.input({s.Lq, parts, s.H, s.D}, -2.f, 2.f), kv = h.input({s.Lk, parts, s.H, s.D}, -2.f, 2.f);
    Tensor k2 = s.fused ? Tensor() : h.input({s.Lk, 1, s.H, s.D}, -2.f, 2.f);
    Tensor bias = s.bias ? h.input_as({s.H, s.Lq, s.Lk}, DType::F32, -3.f, 3.f) : Tensor();
    const auto part = [&](void* base, DType t, int64_t L, int i, Device dev) {
        return TensorView(static_cast<char*>(base) + i * s.H * s.D * int64_t(dtype_size(t)), t, Shape{L, s.H, s.D},
                          Shape{parts * s.H * s.D, s.D, 1}, dev);
    };
    const auto upload_to = [&](const Tensor& host, DType t) {
        Tensor d = be.alloc(host.shape(), t);
        be.upload(host, d);
        return d;
    };
    Tensor qd = upload_to(q, h.dt()), kvd = upload_to(kv, h.dt());
    Tensor k2d = s.fused ? Tensor() : upload_to(k2, h.dt());
    Tensor bd = s.bias ? upload_to(bias, DType::F32) : Tensor();
    Tensor od = be.alloc({s.Lq, s.H, s.D}, h.dt());
    be.synchronize();  // NOTE: alloc zero-fills on the backend's stream; poison after that
    REQUIRE(cudaMemset(od.data(), 0xFF, od.nbytes()) == cudaSuccess);
    // Fused: q = part 0, k = part 1, v = part 2. Separate: k from its own buffer, v = kv.
    const TensorView qv = part(qd.data(), h.dt(), s.Lq, 0, qd.device());
    const TensorView kvv = s.fused ? part(kvd.data(), h.dt(), s.Lk, 1, kvd.device())
                                   : part(k2d.data(), h.dt(), s.Lk, 0, k2d.device());
    const TensorView vv = part(kvd.data(), h.dt(), s.Lk, s.fused ? 2 : 0, kvd.device());
    be.attention({scale}, qv, kvv, vv, s.bias ? bd.view() : TensorView{}, od);

    Tensor ref = Harness::cpu_out({s.Lq, s.H, s.D});
    const TensorView qc = part(q.data(), DType::F32, s.Lq, 0, Device::cpu());
    const TensorView kc = s.fused ? part(kv.data(), DType::F32, s.Lk, 1, Device::cpu())
                                  : part(k2.data(), DType::F32, s.Lk, 0, Device::cpu());
    const TensorView vc = part(kv.data(), DType::F32, s.Lk, s.fused ? 2 : 0, Device::cpu());
    cpu().attention({scale}, qc, kc, vc, s.bias ? bias.view() : TensorView{}, ref);
    be.synchronize();
    // Compare through the shared backend's download path.
    Tensor host = Tensor::host(od.shape(), DType::F32);
    be.download(od, host);
    Tensor back = gpu().alloc(od.shape(), DType::F32);
    gpu().upload(host, back);
    return h.compare(back, ref);
}

struct ConvSpec {
    int64_t Ci, Co, T, H, W, kt, kh, kw;
    int stride[3] = {1, 1, 1};
    int pb[3] = {0, 0, 0};
    int pa[3] = {0, 0, 0};
    bool bias = true;
    bool fallback = false;
    bool frames_2d = false, channels_last = false;
};

Stats run_conv(Harness& h, const ConvSpec& c) {
    Tensor x = h.input({c.Ci, c.T, c.H, c.W}), w = h.input({c.Co, c.Ci, c.kt, c.kh, c.kw}, -0.3f, 0.3f);
    Tensor bias = c.bias ? h.input({c.Co}) : Tensor();
    Conv3dParams p;
    p.frames_2d = c.frames_2d;
    p.channels_last = c.channels_last;
    const int64_t in[3] = {c.T, c.H, c.W}, k[3] = {c.kt, c.kh, c.kw};
    int64_t o[3];
    for (int i = 0; i < 3; ++i) {
        p.stride[i] = c.stride[i];
        p.pad_before[i] = c.pb[i];
        p.pad_after[i] = c.pa[i];
        o[i] = (in[i] + c.pb[i] + c.pa[i] - k[i]) / c.stride[i] + 1;
    }
    const Shape os{c.Co, o[0], o[1], o[2]};
    const TensorView xd = h.dev(x), wd = h.dev(w), bd = c.bias ? h.dev(bias) : TensorView{}, od = h.dev_out(os);
    Tensor ref = Harness::cpu_out(os);
    gpu().set_fallback_only(c.fallback);
    gpu().conv3d(p, xd, wd, bd, od);
    gpu().set_fallback_only(false);
    cpu().conv3d(p, x, w, c.bias ? bias.view() : TensorView{}, ref);
    return h.compare(od, ref);
}

/// copy: src built on the host as f32 (values exact in every dtype involved), viewed through
/// (shape, strides) on both sides; the result must match the CPU conversion bit for bit.
Stats run_copy(Harness& h, DType src_dt, DType dst_dt, Shape storage, Shape shape, Shape strides, int64_t offset) {
    Tensor base = h.input_as(storage, src_dt, -100.f, 100.f);
    Tensor host_src = Tensor::host(storage, src_dt);
    cpu().copy(base, host_src);  // the host storage in the source dtype
    const TensorView src_dev_full = h.dev(base, src_dt);
    const size_t es = dtype_size(src_dt);
    const TensorView src_cpu(static_cast<char*>(host_src.data()) + offset * int64_t(es), src_dt, shape, strides,
                             Device::cpu());
    const TensorView src_dev(static_cast<char*>(src_dev_full.data) + offset * int64_t(es), src_dt, shape, strides,
                             src_dev_full.device);
    const TensorView od = h.dev_out(shape, dst_dt);
    gpu().copy(src_dev, od);
    Tensor host_dst = Tensor::host(shape, dst_dt);
    cpu().copy(src_cpu, host_dst);
    Tensor ref = Tensor::host(shape, DType::F32);
    cpu().copy(host_dst, ref);
    return h.compare(od, ref, 0.0);
}

/// A small paged pool on both sides: block ids 0..5 of `bs` tokens, H heads x D. The history goes through
/// a shuffled table (blocks 4, 1, 3); every pool row it does not use is NaN.
Stats run_paged_attention(Harness& h, int64_t H, int64_t D, int64_t bs, int64_t hist, int64_t cur, int64_t lq) {
    const int64_t ids = 6, row = H * D;
    const std::vector<BlockId> table = {4, 1, 3, kNullBlockId, kNullBlockId};
    REQUIRE(hist <= 3 * bs);
    Tensor kp = Harness::cpu_out({ids * bs, H, D}), vp = Harness::cpu_out({ids * bs, H, D});
    Tensor hk = h.input({std::max<int64_t>(hist, 1), H, D}, -2.f, 2.f), hv = h.input({std::max<int64_t>(hist, 1), H, D});
    for (int64_t t = 0; t < hist; ++t) {
        const int64_t slot = int64_t(table[size_t(t / bs)]) * bs + t % bs;
        std::copy_n(fp(hk) + t * row, row, kp.ptr<float>() + slot * row);
        std::copy_n(fp(hv) + t * row, row, vp.ptr<float>() + slot * row);
    }
    Tensor q = h.input({lq, H, D}, -2.f, 2.f), k = h.input({cur, H, D}, -2.f, 2.f), v = h.input({cur, H, D});
    const int32_t width = int32_t(table.size()), used = int32_t((hist + bs - 1) / bs);
    const PagedKvView host_view{kp.data(), vp.data(), DType::F32, int32_t(H), int32_t(D), int32_t(bs), 0, bs * row,
                                row, D, table.data(), width, used, hist};
    Tensor ref = Harness::cpu_out({lq, H, D});
    const float scale = 1.f / std::sqrt(float(D));
    cpu().paged_attention({scale}, q, host_view, 0, k, v, ref);

    const TensorView kpd = h.dev(kp), vpd = h.dev(vp);  // NaN rows stay NaN in bf16
    Tensor table_host = Tensor::host({width}, DType::I32);
    std::copy(table.begin(), table.end(), table_host.ptr<int32_t>());
    Tensor table_dev = gpu().alloc({width}, DType::I32);
    gpu().upload(table_host, table_dev);
    PagedKvView dev_view = host_view;
    dev_view.k_base = kpd.data, dev_view.v_base = vpd.data, dev_view.dtype = h.dt();
    dev_view.block_table = table_dev.ptr<const BlockId>();
    const TensorView od = h.dev_out({lq, H, D});
    gpu().paged_attention({scale}, h.dev(q), dev_view, 0, h.dev(k), h.dev(v), od);
    Stats s = h.compare(od, ref);
    gpu().synchronize();  // table_dev is freed on return
    return s;
}

/// Two branches' paged attention in one call (fast numerics: one cuDNN SDPA of batch 2) against the CPU reference of
/// each branch: one pool of 7 blocks, branch 0's history through table {4, 1, 3}, branch 1's through {6, 2, 5}.
Stats run_paged_attention_batched(Harness& h, int64_t H, int64_t D, int64_t bs, int64_t hist, int64_t cur) {
    const int64_t ids = 7, row = H * D, B = 2, lq = cur;
    const std::vector<BlockId> tables[2] = {{4, 1, 3, kNullBlockId}, {6, 2, 5, kNullBlockId}};
    REQUIRE(hist <= 3 * bs);
    Tensor kp = Harness::cpu_out({ids * bs, H, D}), vp = Harness::cpu_out({ids * bs, H, D});
    for (int64_t b = 0; b < B; ++b) {
        Tensor hk = h.input({std::max<int64_t>(hist, 1), H, D}, -2.f, 2.f), hv = h.input({std::max<int64_t>(hist, 1), H, D});
        for (int64_t t = 0; t < hist; ++t) {
            const int64_t slot = int64_t(tables[b][size_t(t / bs)]) * bs + t % bs;
            std::copy_n(fp(hk) + t * row, row, kp.ptr<float>() + slot * row);
            std::copy_n(fp(hv) + t * row, row, vp.ptr<float>() + slot * row);
        }
    }
    Tensor q = h.input({B * lq, H, D}, -2.f, 2.f), k = h.input({B * cur, H, D}, -2.f, 2.f), v = h.input({B * cur, H, D});
    const int32_t width = int32_t(tables[0].size()), used = int32_t((hist + bs - 1) / bs);
    Tensor ref = Harness::cpu_out({B * lq, H, D});
    const float scale = 1.f / std::sqrt(float(D));
    const TensorView kpd = h.dev(kp), vpd = h.dev(vp);
    std::vector<Tensor> table_dev;
    std::vector<PagedKvView> views;
    for (int64_t b = 0; b < B; ++b) {
        const PagedKvView host_view{kp.data(), vp.data(), DType::F32, int32_t(H), int32_t(D), int32_t(bs), 0, bs * row,
                                    row, D, tables[b].data(), width, used, hist};
        cpu().paged_attention({scale}, q.view().slice(0, b * lq, lq), host_view, 0, k.view().slice(0, b * cur, cur),
                              v.view().slice(0, b * cur, cur), ref.view().slice(0, b * lq, lq));
        Tensor table_host = Tensor::host({width}, DType::I32);
        std::copy(tables[b].begin(), tables[b].end(), table_host.ptr<int32_t>());
        table_dev.push_back(gpu().alloc({width}, DType::I32));
        gpu().upload(table_host, table_dev.back());
        PagedKvView dev_view = host_view;
        dev_view.k_base = kpd.data, dev_view.v_base = vpd.data, dev_view.dtype = h.dt();
        dev_view.block_table = table_dev.back().ptr<const BlockId>();
        views.push_back(dev_view);
    }
    const TensorView qd = h.dev(q), kd = h.dev(k), vd = h.dev(v), od = h.dev_out({B * lq, H, D});
    gpu().synchronize();  // fast_gpu() has its own stream
    const int64_t before = fast_gpu().batched_attention_calls();
    fast_gpu().paged_attention_batched({scale}, qd, views, 0, kd, vd, od);
    fast_gpu().synchronize();
    CHECK_MESSAGE(fast_gpu().batched_attention_calls() == before + 1, "the branches did not run as one call");
    Stats s = h.compare(od, ref);
    gpu().synchronize();  // table_dev is freed on return
    return s;
}

/// Scatters 5 rows into slots {7, 2, pad, 9, 40 (outside: skipped)} of layer 1 of a 2-layer pool of 12
/// slots; compares the whole pool (untouched slots stay zero).
Stats run_scatter_kv(Harness& h) {
    const int64_t H = 2, D = 16, bs = 4, slots_per_layer = 12, layers = 2, row = H * D;
    Tensor k = h.input({5, H, D}), v = h.input({5, H, D});
    const std::vector<int64_t> slots = {7, 2, kPadSlot, 9, 40};
    Tensor kref = Tensor::host({layers * slots_per_layer, H, D}, DType::F32);
    Tensor vref = Tensor::host({layers * slots_per_layer, H, D}, DType::F32);
    Tensor slots_host = Tensor::host({5}, DType::I64);
    std::copy(slots.begin(), slots.end(), slots_host.ptr<int64_t>());
    const BlockId table[1] = {kNullBlockId};
    PagedKvView pool{kref.data(), vref.data(), DType::F32, int32_t(H), int32_t(D), int32_t(bs), slots_per_layer * row,
                     bs * row, row, D, table, 1, 0, 0};
    cpu().scatter_kv(pool, 1, slots_host.view().slice(0, 0, 4), k, v, slots_per_layer);  // the CPU refuses slot 40
    Tensor kd = gpu().alloc({layers * slots_per_layer, H, D}, h.dt()), vd = gpu().alloc(kd.shape(), h.dt());
    Tensor slots_dev = gpu().alloc({5}, DType::I64);
    gpu().upload(slots_host, slots_dev);
    pool.k_base = kd.data(), pool.v_base = vd.data(), pool.dtype = h.dt();
    gpu().scatter_kv(pool, 1, slots_dev, h.dev(k), h.dev(v), slots_per_layer);
    Stats a = h.compare(kd, kref, 0.0), b = h.compare(vd, vref, 0.0);
    a.bad += b.bad, a.n += b.n, a.max_abs = std::max(a.max_abs, b.max_abs), a.max_rel = std::max(a.max_rel, b.max_rel);
    return a;
}

// ---- fused ops of `fast` numerics -----------------------------------------------------------------------------

/// Vector i of each group of a [G, 6, C] tensor as a [G, C] view (row stride 6·C), on either side.
TensorView group_vecs(const TensorView& mod, int i) {
    const int64_t G = mod.dim(0), C = mod.dim(2);
    char* base = static_cast<char*>(mod.data) + size_t(i) * size_t(C) * dtype_size(mod.dtype);
    return TensorView(base, mod.dtype, Shape{G, C}, Shape{6 * C, 1}, mod.device);
}

Stats run_ada_layer_norm(Harness& h, int64_t L, int64_t C, int64_t split, bool affine, bool mod,
                         int64_t period = INT64_MAX) {
    const int64_t G = split < std::min(L, period) ? 2 : 1;
    Tensor x = h.input({L, C}, -3.f, 3.f);
    Tensor w = affine ? h.input({C}) : Tensor(), b = affine ? h.input({C}) : Tensor();
    Tensor m = h.input({G, 6, C}, -0.5f, 0.5f);
    const TensorView md = h.dev(m);
    Tensor ref = Harness::cpu_out({L, C});
    const FusedRowParams p{1e-6f, split, period};
    cpu().ada_layer_norm(p, x, affine ? w.view() : TensorView{}, affine ? b.view() : TensorView{},
                         mod ? group_vecs(m, 1) : TensorView{}, mod ? group_vecs(m, 0) : TensorView{}, ref);
    const TensorView out = h.dev_out({L, C});
    gpu().ada_layer_norm(p, h.dev(x), affine ? h.dev(w) : TensorView{}, affine ? h.dev(b) : TensorView{},
                         mod ? group_vecs(md, 1) : TensorView{}, mod ? group_vecs(md, 0) : TensorView{}, out);
    return h.compare(out, ref);
}

Stats run_gated_residual(Harness& h, int64_t L, int64_t C, int64_t split, bool gate, int64_t period = INT64_MAX) {
    const int64_t G = split < std::min(L, period) ? 2 : 1;
    Tensor x = h.input({L, C}), y = h.input({L, C});
    Tensor m = h.input({G, 6, C});
    const TensorView xd = h.dev(x), yd = h.dev(y), md = h.dev(m);
    const FusedRowParams p{1e-6f, split, period};
    cpu().gated_residual(p, x, y, gate ? group_vecs(m, 2) : TensorView{});
    gpu().gated_residual(p, xd, yd, gate ? group_vecs(md, 2) : TensorView{});
    return h.compare(xd, x);
}

/// A RoPE table [rows, pairs, entry] of angles t · 0.01 · (j + 1), as (cos, sin) or double-float pairs.
Tensor rope_table(int64_t rows, int64_t pairs, int entry, int64_t t0) {
    Tensor t = Tensor::host({rows, pairs, entry}, DType::F32);
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < pairs; ++j) {
            const double a = double(t0 + r) * 0.01 * double(j + 1);
            float* e = t.ptr<float>() + (r * pairs + j) * entry;
            if (entry == 2) {
                e[0] = float(std::cos(a)), e[1] = float(std::sin(a));
            } else {
                e[0] = float(std::cos(a)), e[1] = float(std::cos(a) - double(e[0]));
                e[2] = float(std::sin(a)), e[3] = float(std::sin(a) - double(e[2]));
            }
        }
    return t;
}

Stats run_rms_norm_rope(Harness& h, int64_t L, int64_t H, int64_t D, int64_t split, int64_t pairs, int entry,
                        int64_t period = INT64_MAX) {
    Tensor x = h.input({L, H * D}, -2.f, 2.f), w = h.input({H * D});
    const int64_t P = std::min(L, period), s = std::min(split, P);
    Tensor ta = pairs ? rope_table(s, pairs, entry, 0) : Tensor();
    Tensor tb = pairs && s < P ? rope_table(P - s, pairs, entry, 1000) : Tensor();
    const FusedRowParams p{1e-6f, split, period};
    Tensor ref = Harness::cpu_out({L, H, D});
    cpu().rms_norm_rope(p, x, w, pairs ? ta.view() : TensorView{}, tb.defined() ? tb.view() : TensorView{}, ref);
    const TensorView out = h.dev_out({L, H, D});
    gpu().rms_norm_rope(p, h.dev(x), h.dev(w), pairs ? h.dev(ta, DType::F32) : TensorView{},
                        tb.defined() ? h.dev(tb, DType::F32) : TensorView{}, out);
    return h.compare(out, ref);
}

Stats run_gated_residual_norm(Harness& h, int64_t L, int64_t C, int64_t split, bool gate, bool affine, bool mod,
                              int64_t period = INT64_MAX) {
    const int64_t G = split < std::min(L, period) ? 2 : 1;
    Tensor x = h.input({L, C}, -2.f, 2.f), y = h.input({L, C});
    Tensor w = affine ? h.input({C}) : Tensor(), b = affine ? h.input({C}) : Tensor();
    Tensor m = h.input({G, 6, C}, -0.5f, 0.5f);
    const TensorView xd = h.dev(x), yd = h.dev(y), md = h.dev(m);
    const FusedRowParams p{1e-6f, split, period};
    Tensor ref = Harness::cpu_out({L, C});
    cpu().gated_residual_norm(p, x, y, gate ? group_vecs(m, 2) : TensorView{}, affine ? w.view() : TensorView{},
                              affine ? b.view() : TensorView{}, mod ? group_vecs(m, 1) : TensorView{},
                              mod ? group_vecs(m, 0) : TensorView{}, ref);
    const TensorView out = h.dev_out({L, C});
    gpu().gated_residual_norm(p, xd, yd, gate ? group_vecs(md, 2) : TensorView{}, affine ? h.dev(w) : TensorView{},
                              affine ? h.dev(b) : TensorView{}, mod ? group_vecs(md, 1) : TensorView{},
                              mod ? group_vecs(md, 0) : TensorView{}, out);
    // both outputs: the updated residual x and the norm of it
    Stats a = h.compare(xd, x), n = h.compare(out, ref);
    a.bad += n.bad, a.n += n.n, a.max_abs = std::max(a.max_abs, n.max_abs), a.max_rel = std::max(a.max_rel, n.max_rel);
    return a;
}

struct GemmGeluSpec {
    int64_t M, N, K;
    bool bias = true;
    DType bias_dtype = DType::F32;  // used when the case dtype is bf16
    bool fallback = false;          // dzr's plain kernel, then the GELU kernel
    bool expect_fused = false;      // the GELU must have run in cuBLASLt's epilogue
};

Stats run_gemm_gelu(Harness& h, const GemmGeluSpec& g) {
    const DType bias_dt = h.dt() == DType::BF16 ? g.bias_dtype : DType::F32;
    Tensor a = h.input({g.M, g.K}), w = h.input({g.N, g.K}, -0.3f, 0.3f);
    Tensor bias = g.bias ? h.input_as({g.N}, bias_dt) : Tensor();
    Tensor ref = Harness::cpu_out({g.M, g.N});
    cpu().gemm_gelu(GemmParams{}, a, w, g.bias ? bias.view() : TensorView{}, ref);
    const TensorView out = h.dev_out({g.M, g.N});
    gpu().set_fallback_only(g.fallback);
    gpu().gemm_gelu(GemmParams{}, h.dev(a), h.dev(w), g.bias ? h.dev(bias, bias_dt) : TensorView{}, out);
    gpu().set_fallback_only(false);
    if (g.expect_fused) CHECK(gpu().last_gemm_gelu_fused());
    if (g.fallback) CHECK_FALSE(gpu().last_gemm_gelu_fused());
    // NOTE: cuBLASLt's epilogue may evaluate tanh with the hardware approximation (relative error ~5e-4), so an f32
    // output is held to 1e-3, not f32's 1e-5; bf16 keeps its 1e-2
    return h.compare(out, ref, std::max(h.rtol(), 1e-3));
}

/// FP8 operands on both sides: random rows (rounded to the case dtype) quantized by the CPU (core/fp8.h), the codes
/// and scales uploaded unchanged.
struct Fp8Operand {
    Tensor values;  // host f32 [rows, cols] (case-dtype values)
    Tensor q, s;    // host F8_E4M3 [rows, cols], F32 [rows]
    TensorView q_dev, s_dev;
};

Fp8Operand fp8_operand(Harness& h, int64_t rows, int64_t cols, float lo, float hi) {
    Fp8Operand o;
    o.values = h.input({rows, cols}, lo, hi);
    o.q = Tensor::host({rows, cols}, DType::F8_E4M3);
    o.s = Tensor::host({rows}, DType::F32);
    cpu().quantize_fp8(o.values, o.q, o.s);
    Tensor qd = gpu().alloc({rows, cols}, DType::F8_E4M3), sd = gpu().alloc({rows}, DType::F32);
    gpu().upload(o.q, qd);
    gpu().upload(o.s, sd);
    o.q_dev = qd.view(), o.s_dev = sd.view();
    static std::vector<Tensor> keep;  // NOTE: the harness keeps float tensors only; these live for the run
    keep.push_back(qd);
    keep.push_back(sd);
    return o;
}

/// quantize_fp8: the GPU's codes and scales, dequantized on the CPU, against the CPU's (exact: same bits).
Stats run_quantize_fp8(Harness& h, int64_t rows, int64_t cols, float lo, float hi) {
    Tensor x = h.input({rows, cols}, lo, hi);
    Tensor q = Tensor::host({rows, cols}, DType::F8_E4M3), s = Tensor::host({rows}, DType::F32);
    cpu().quantize_fp8(x, q, s);
    Tensor ref = Tensor::host({rows, cols}, DType::F32);
    cpu().dequantize_fp8(q, s, ref);
    Tensor qd = gpu().alloc({rows, cols}, DType::F8_E4M3), sd = gpu().alloc({rows}, DType::F32);
    gpu().quantize_fp8(h.dev(x), qd, sd);
    Tensor qh = Tensor::host({rows, cols}, DType::F8_E4M3), sh = Tensor::host({rows}, DType::F32);
    gpu().download(qd, qh);
    gpu().download(sd, sh);
    Tensor got = Tensor::host({rows, cols}, DType::F32);
    cpu().dequantize_fp8(qh, sh, got);
    const TensorView got_dev = h.dev(got, DType::F32);
    return h.compare(got_dev, ref, 0.0);
}

// NOTE: one E4M3 step (1/8 of a value) plus the rounding of the rows: the CPU quantizes its f32 rows, the GPU its
// compute-dtype rows, so a value at a code boundary may take the neighbouring code (tests/cuda/test_fp8.cpp checks the
// fused kernels against the two GPU ops they replace bit for bit)
constexpr double kFp8StepTol = 0.13;

/// The GPU's FP8 codes and scales [rows, cols] dequantized, against the CPU's quantization of `ref_rows`.
Stats compare_fp8(Harness& h, const TensorView& qd, const TensorView& sd, const Tensor& ref_rows) {
    const int64_t rows = qd.dim(0), cols = qd.dim(1);
    Tensor q = Tensor::host({rows, cols}, DType::F8_E4M3), s = Tensor::host({rows}, DType::F32);
    cpu().quantize_fp8(ref_rows, q, s);
    Tensor ref = Tensor::host({rows, cols}, DType::F32);
    cpu().dequantize_fp8(q, s, ref);
    Tensor qh = Tensor::host({rows, cols}, DType::F8_E4M3), sh = Tensor::host({rows}, DType::F32);
    gpu().download(qd, qh);
    gpu().download(sd, sh);
    Tensor got = Tensor::host({rows, cols}, DType::F32);
    cpu().dequantize_fp8(qh, sh, got);
    return h.compare(h.dev(got, DType::F32), ref, kFp8StepTol);
}

/// ada_layer_norm_fp8: the GPU's codes against the CPU's ada_layer_norm, quantized.
Stats run_ada_layer_norm_fp8(Harness& h, int64_t L, int64_t C, int64_t split, int64_t period, bool affine, bool mod) {
    const int64_t G = split < std::min(L, period) ? 2 : 1;
    Tensor x = h.input({L, C}, -3.f, 3.f);
    Tensor w = affine ? h.input({C}) : Tensor(), b = affine ? h.input({C}) : Tensor();
    Tensor m = h.input({G, 6, C}, -0.5f, 0.5f);
    const TensorView md = h.dev(m);
    const FusedRowParams p{1e-6f, split, period};
    Tensor rows = Harness::cpu_out({L, C});
    cpu().ada_layer_norm(p, x, affine ? w.view() : TensorView{}, affine ? b.view() : TensorView{},
                         mod ? group_vecs(m, 1) : TensorView{}, mod ? group_vecs(m, 0) : TensorView{}, rows);
    Tensor qd = gpu().alloc({L, C}, DType::F8_E4M3), sd = gpu().alloc({L}, DType::F32);
    gpu().ada_layer_norm_fp8(p, h.dev(x), affine ? h.dev(w) : TensorView{}, affine ? h.dev(b) : TensorView{},
                             mod ? group_vecs(md, 1) : TensorView{}, mod ? group_vecs(md, 0) : TensorView{}, qd, sd);
    return compare_fp8(h, qd, sd, rows);
}

/// activation_quantize_fp8 (tanh GELU): the GPU's codes against the CPU's GELU, quantized.
Stats run_activation_quantize_fp8(Harness& h, int64_t L, int64_t F) {
    Tensor x = h.input({L, F}, -6.f, 6.f);
    Tensor rows = Harness::cpu_out({L, F});
    cpu().activation({Activation::GeluTanh}, x, rows);
    Tensor qd = gpu().alloc({L, F}, DType::F8_E4M3), sd = gpu().alloc({L}, DType::F32);
    gpu().activation_quantize_fp8({Activation::GeluTanh}, h.dev(x), qd, sd);
    return compare_fp8(h, qd, sd, rows);
}

/// gemm_fp8 against the CPU's (decoded E4M3 codes, f32 sums, the two scales and the bias).
Stats run_gemm_fp8(Harness& h, int64_t M, int64_t N, int64_t K, bool bias, bool fallback) {
    const Fp8Operand x = fp8_operand(h, M, K, -3.f, 3.f), w = fp8_operand(h, N, K, -0.2f, 0.2f);
    Tensor b = bias ? h.input({N}, -0.5f, 0.5f) : Tensor();
    Tensor ref = Harness::cpu_out({M, N});
    cpu().gemm_fp8(x.q, x.s, w.q, w.s, bias ? b.view() : TensorView{}, ref);
    const TensorView od = h.dev_out({M, N});
    gpu().set_fallback_only(fallback);
    gpu().gemm_fp8(x.q_dev, x.s_dev, w.q_dev, w.s_dev, bias ? h.dev(b) : TensorView{}, od);
    gpu().set_fallback_only(false);
    // NOTE: the same exact E4M3 products summed in another order, then rounded to the output dtype: bf16's
    // tolerance. An f32 output cannot be held to f32's 1e-5 once cuBLASLt runs it: Hopper's FP8 tensor cores add
    // their products with a narrower accumulator (about 14 bits) before each promotion to f32, so the sums differ
    // from f32 ones by about 2^-13 relative (measured on the H200: max rel 6.8e-4 at M64 N96 K128 and 6.3e-4 at
    // 1785 x 5120 x 5120; dzr's plain kernel, which sums in f32, stays at 0)
    return h.compare(od, ref, h.dt() == DType::F32 ? 2e-3 : h.rtol());
}

/// fn run on the GPU backend's `k` row kernels (CudaBackendOptions::row_kernels), then back on the streamed ones.
std::function<Stats(Harness&)> on_rows(RowKernels k, std::function<Stats(Harness&)> fn) {
    return [k, fn = std::move(fn)](Harness& h) {
        struct Restore {
            ~Restore() {
                CudaBackendOptions o = gpu().cuda_options();
                o.row_kernels = RowKernels::Stream;
                gpu().set_cuda_options(o);
            }
        } restore;
        CudaBackendOptions o = gpu().cuda_options();
        o.row_kernels = k;
        gpu().set_cuda_options(o);
        return fn(h);
    };
}

std::string shape_name(std::initializer_list<int64_t> dims) { return Shape(dims).str(); }

std::vector<OpCase> make_cases() {
    std::vector<OpCase> cases;
    const auto add = [&](const std::string& op, const std::string& name, DType dt, std::function<Stats(Harness&)> fn) {
        cases.push_back({op, name, dt, std::move(fn), false});
    };
    const auto add_big = [&](const std::string& op, const std::string& name, DType dt,
                             std::function<Stats(Harness&)> fn) { cases.push_back({op, name, dt, std::move(fn), true}); };
    for (DType dt : {DType::F32, DType::BF16}) {
        // gemm
        for (int ta = 0; ta < 2; ++ta)
            for (int tb = 0; tb < 2; ++tb) {
                GemmSpec g{7, 5, 13};
                g.ta = ta, g.tb = tb, g.alpha = 1.5f, g.beta = 0.5f;
                add("gemm", fmt::format("M7 N5 K13 trans_a={} trans_b={} alpha=1.5 beta=0.5", ta, tb), dt,
                    [g](Harness& h) { return run_gemm(h, g); });
            }
        {
            GemmSpec g{64, 96, 80};
            g.bias = true, g.bias_dtype = dt;
            add("gemm", "M64 N96 K80 bias (epilogue)", dt, [g](Harness& h) { return run_gemm(h, g); });
            g.bias_dtype = DType::F32;
            if (dt == DType::BF16)
                add("gemm", "M64 N96 K80 f32 bias on bf16 out (separate kernel)", dt,
                    [g](Harness& h) { return run_gemm(h, g); });
        }
        {
            GemmSpec g{33, 40, 24};
            g.pad_cols = 8;
            add("gemm", "M33 N40 K24 strided rows (lda = K + 8)", dt, [g](Harness& h) { return run_gemm(h, g); });
            g.pad_cols = 0, g.batch = 3, g.broadcast_b = true;
            add("gemm", "batch 3, b broadcast (batch stride 0)", dt, [g](Harness& h) { return run_gemm(h, g); });
            g.broadcast_b = false, g.ta = true, g.tb = false;
            add("gemm", "batch 3, trans_a, no trans_b", dt, [g](Harness& h) { return run_gemm(h, g); });
            if (dt == DType::BF16) {  // bias-free GEMMs through cuBLAS (bf16 only), as torch.mm / torch.bmm run
                g.cublas = true;
                add("gemm", "batch 3 through cuBLAS, trans_a, no trans_b", dt,
                    [g](Harness& h) { return run_gemm(h, g); });
                g.ta = false, g.tb = true, g.broadcast_b = true, g.pad_cols = 5;
                add("gemm", "batch 3 through cuBLAS, b broadcast, strided rows", dt,
                    [g](Harness& h) { return run_gemm(h, g); });
                g.bias = true, g.bias_dtype = dt;
                add("gemm", "batch 3 with a bias under the cuBLAS setting (cuBLASLt runs it)", dt,
                    [g](Harness& h) { return run_gemm(h, g); });
                GemmSpec one{24, 40, 32};  // CategorySpecificLinear: x [1, A, in] · W [1, in, out]
                one.cublas = true, one.batch = 1;
                add("gemm", "batch 1 through cuBLAS (cublasGemmEx)", dt, [one](Harness& h) { return run_gemm(h, one); });
                one.batch = 0, one.M = 1;  // the state token: one row (degenerate leading dimensions)
                add("gemm", "M1 through cuBLAS (one row)", dt, [one](Harness& h) { return run_gemm(h, one); });
                one.M = 17, one.tb = true, one.pad_cols = 3;
                add("gemm", "M17 trans_b strided rows through cuBLAS", dt,
                    [one](Harness& h) { return run_gemm(h, one); });
            }
        }
        {
            GemmSpec g{9, 11, 0};
            g.beta = 0.25f, g.bias = true, g.bias_dtype = dt;
            add("gemm", "K=0 gives beta * out + bias", dt, [g](Harness& h) { return run_gemm(h, g); });
        }
        for (int variant = 0; variant < 3; ++variant) {
            GemmSpec g{21, 19, 17};
            g.fallback = true, g.bias = true, g.bias_dtype = dt;
            if (variant == 1) g.ta = true, g.beta = -1.f;
            if (variant == 2) g.batch = 2, g.broadcast_b = true, g.pad_cols = 3;
            add("gemm", fmt::format("plain fallback kernel, variant {}", variant), dt,
                [g](Harness& h) { return run_gemm(h, g); });
        }
        if (dt == DType::BF16) {
            GemmSpec g{100, 72, 64};
            g.f32_out = true;
            add("gemm", "bf16 inputs -> f32 output", dt, [g](Harness& h) { return run_gemm(h, g); });
        }
        {
            GemmSpec g{1785, 5120, 5120};
            g.bias = true, g.bias_dtype = dt;
            // NOTE: f32: two summation orders of K = 5120 products of U(-1, 1) values differ by about
            // u * sqrt(K^2 / 2) * 1/3 ~ 1e-4 per element (sequential partial sums), and the largest of 9.1 M differences
            // reaches 5 of those (1 element of 9139200 exceeded kRtolF32's 2.4e-4 at one seed on the H200);
            // 5e-5 of the rms (24) is 1.2e-3, still 1e-4 of an output and far below any wiring mistake
            if (dt == DType::F32) g.rtol = 5e-5;
            add_big("gemm", "DreamZero M1785 N5120 K5120 + bias", dt, [g](Harness& h) { return run_gemm(h, g); });
        }

        // binary
        add("binary", "add " + shape_name({5, 7, 9}), dt,
            [](Harness& h) { return run_binary(h, BinaryOp::Add, {5, 7, 9}, {5, 7, 9}, false, false); });
        add("binary", "sub [5, 7, 9] - [7, 9]", dt,
            [](Harness& h) { return run_binary(h, BinaryOp::Sub, {5, 7, 9}, {7, 9}, false, false); });
        add("binary", "mul [4, 6, 16] * [1, 6, 16] (vectorized)", dt,
            [](Harness& h) { return run_binary(h, BinaryOp::Mul, {4, 6, 16}, {1, 6, 16}, false, false); });
        add("binary", "mul [3, 11] * scalar", dt,
            [](Harness& h) { return run_binary(h, BinaryOp::Mul, {3, 11}, {1}, false, false); });
        add("binary", "div [3, 50176] / [1] (CLIP's per-channel std)", dt, [](Harness& h) {
            Tensor a = h.input({3, 50176}), b = h.input({1}, 0.2f, 0.3f);  // a divisor away from zero
            const TensorView ad = h.dev(a), bd = h.dev(b), od = h.dev_out({3, 50176});
            Tensor ref = Harness::cpu_out({3, 50176});
            gpu().binary({BinaryOp::Div}, ad, bd, od);
            cpu().binary({BinaryOp::Div}, a, b, ref);
            return h.compare(od, ref);
        });
        add_big("binary", "add in place [1785, 5120] + [5120]", dt,
            [](Harness& h) { return run_binary(h, BinaryOp::Add, {1785, 5120}, {5120}, false, true); });
        if (dt == DType::BF16)
            add("binary", "mul bf16 [64, 40] * f32 [40] (mixed dtypes)", dt,
                [](Harness& h) { return run_binary(h, BinaryOp::Mul, {64, 40}, {40}, true, false); });

        // scale
        add("scale", "[1001] alpha=-0.7 beta=0.3", dt, [](Harness& h) {
            return run_unary(h, {1001}, -2.f, 2.f, [](Backend& be, const TensorView& x, const TensorView& o) {
                be.scale({-0.7f, 0.3f}, x, o);
            });
        });
        add_big("scale", "[1785, 5120] alpha=0.5", dt, [](Harness& h) {
            return run_unary(h, {1785, 5120}, -2.f, 2.f, [](Backend& be, const TensorView& x, const TensorView& o) {
                be.scale({0.5f, 0.f}, x, o);
            });
        });

        // activation
        const std::pair<Activation, const char*> acts[] = {{Activation::GeluTanh, "gelu_tanh"},
                                                           {Activation::GeluErf, "gelu_erf"},
                                                           {Activation::Silu, "silu"},
                                                           {Activation::Relu, "relu"}};
        for (const auto& [kind, label] : acts) {
            const Activation k = kind;
            add("activation", std::string(label) + " [37, 29]", dt, [k](Harness& h) {
                return run_unary(h, {37, 29}, -6.f, 6.f, [k](Backend& be, const TensorView& x, const TensorView& o) {
                    be.activation({k}, x, o);
                });
            });
        }
        add_big("activation", "gelu_tanh DreamZero FFN [1785, 13824]", dt, [](Harness& h) {
            return run_unary(h, {1785, 13824}, -5.f, 5.f, [](Backend& be, const TensorView& x, const TensorView& o) {
                be.activation({Activation::GeluTanh}, x, o);
            });
        });
        add("activation", "silu [256, 5120]", dt, [](Harness& h) {
            return run_unary(h, {256, 5120}, -8.f, 8.f, [](Backend& be, const TensorView& x, const TensorView& o) {
                be.activation({Activation::Silu}, x, o);
            });
        });

        // norms
        add("layer_norm", "[17, 33] weight + bias", dt, [](Harness& h) { return run_norm(h, true, 17, 33, true, true, h.dt()); });
        add_big("layer_norm", "DreamZero [1785, 5120] no affine", dt,
            [](Harness& h) { return run_norm(h, true, 1785, 5120, false, false, h.dt()); });
        add_big("layer_norm", "[1785, 5120] f32 weight + bias", dt,
            [](Harness& h) { return run_norm(h, true, 1785, 5120, true, true, DType::F32); });
        add_big("rms_norm", "DreamZero q/k [1785, 5120] weight", dt,
            [](Harness& h) { return run_norm(h, false, 1785, 5120, true, false, h.dt()); });
        add("rms_norm", "[5, 100] no weight", dt, [](Harness& h) { return run_norm(h, false, 5, 100, false, false, h.dt()); });
        add("rms_norm", "[40, 128] f32 weight", dt,
            [](Harness& h) { return run_norm(h, false, 40, 128, true, false, DType::F32); });

        // NOTE: the eager mode rounds up to five times on bf16 by design, more than this harness's one-rounding
        // tolerance allows; tests/cuda/test_vae_norm.cpp checks it bit for bit against an emulation instead.
        add("l2_norm", "[37, 96] autocast + SiLU", dt, [](Harness& h) { return run_l2_norm(h, 37, 96, false, true); });
        add("l2_norm", "[21, 384] autocast", dt, [](Harness& h) { return run_l2_norm(h, 21, 384, false, false); });
        add_big("l2_norm", "VAE stage 0 [4 x 352 x 640, 96] autocast + SiLU", dt,
            [](Harness& h) { return run_l2_norm(h, 4 * 352 * 640, 96, false, true); });

        // resize_bicubic (f32 images): PyTorch's kernel arithmetic on CUDA against the CPU's interpolation matrices
        if (dt == DType::F32) {
            add("resize_bicubic", "[3, 352, 640] -> [3, 224, 224] (CLIP's input)", dt,
                [](Harness& h) { return run_resize(h, 3, 352, 640, 224, 224); });
            add("resize_bicubic", "[2, 9, 13] -> [2, 20, 7] (up along y, down along x, border taps)", dt,
                [](Harness& h) { return run_resize(h, 2, 9, 13, 20, 7); });
        }
        // sin_cos_table: the device's expf/sinf/cosf against the host's
        add("sin_cos_table", "[1000, 256] (the action encoder's timestep sinusoid)", dt, [dt](Harness& h) {
            const float step = std::log(10000.0f) / 128.0f;
            const TensorView od = h.dev_out({1000, 256});
            Tensor ref = Harness::cpu_out({1000, 256});
            gpu().sin_cos_table(step, od);
            cpu().sin_cos_table(step, ref);
            // NOTE: the device's and the host's expf differ by an ulp at some j; times t up to 999 that moves the
            // sine's argument by up to an ulp of 999 (6.1e-5), so the tolerance is that, not f32 rounding
            return h.compare(od, ref, dt == DType::F32 ? 2e-4 : kRtolBf16);
        });

        // softmax
        add("softmax", "[7, 3] scale 1", dt, [](Harness& h) {
            return run_unary(h, {7, 3}, -3.f, 3.f, [](Backend& be, const TensorView& x, const TensorView& o) {
                be.softmax({1.f}, x, o);
            });
        });
        add_big("softmax", "attention rows [320, 7945] scale 1/sqrt(128)", dt, [](Harness& h) {
            return run_unary(h, {320, 7945}, -40.f, 40.f, [](Backend& be, const TensorView& x, const TensorView& o) {
                be.softmax({0.08838834764831845f}, x, o);
            });
        });

        // reduce
        const std::pair<ReduceOp, const char*> reds[] = {{ReduceOp::Sum, "sum"}, {ReduceOp::Mean, "mean"}, {ReduceOp::Max, "max"}};
        for (const auto& [rop, label] : reds) {
            const ReduceOp r = rop;
            for (const auto& [R, C] : {std::pair<int64_t, int64_t>{33, 1000}, {1785, 5120}}) {
                add("reduce", fmt::format("{} [{}, {}]", label, R, C), dt, [r, R = R, C = C](Harness& h) {
                    Tensor x = h.input({R, C}, -1.f, 2.f);
                    const TensorView xd = h.dev(x), od = h.dev_out({R});
                    Tensor ref = Harness::cpu_out({R});
                    gpu().reduce({r}, xd, od);
                    cpu().reduce({r}, x, ref);
                    return h.compare(od, ref);
                });
            }
        }

        // count_nonfinite: exact counts; NaN and infinities survive the upload in both dtypes
        for (const auto& [R, C] : {std::pair<int64_t, int64_t>{3, 7}, {1785, 5120}}) {
            add("count_nonfinite", fmt::format("[{}, {}] with NaN, +inf and -inf sprinkled", R, C), dt,
                [R = R, C = C](Harness& h) {
                    Tensor x = h.input({R, C});
                    std::uniform_int_distribution<int64_t> pos(0, R * C - 1);
                    for (int i = 0; i < 5; ++i) x.ptr<float>()[pos(h.rng())] = i % 3 == 0 ? NAN : i % 3 == 1 ? INFINITY : -INFINITY;
                    const TensorView xd = h.dev(x), cd = h.dev_out({1}, DType::I32);
                    Tensor ref = Tensor::host(Shape{1}, DType::I32);
                    gpu().count_nonfinite(xd, cd);
                    cpu().count_nonfinite(x, ref);
                    int32_t got = -1;
                    gpu().download(cd, TensorView(&got, DType::I32, Shape{1}));
                    Stats s;
                    s.n = 1;
                    s.bad = got == ref.ptr<int32_t>()[0] && got > 0 ? 0 : 1;
                    s.max_abs = std::fabs(double(got) - double(ref.ptr<int32_t>()[0]));
                    return s;
                });
        }
        add("activation", "relu passes NaN (as torch.relu) and keeps +inf", dt, [](Harness& h) {
            Tensor x = h.input({4, 64}, -2.f, 2.f);
            for (int64_t i = 0; i < x.numel(); i += 7) x.ptr<float>()[i] = i % 2 ? INFINITY : NAN;
            const TensorView xd = h.dev(x), od = h.dev_out({4, 64});
            gpu().activation({Activation::Relu}, xd, od);
            Tensor got = Tensor::host(Shape{4, 64}, DType::F32);
            gpu().download(od, got);
            Stats s;
            s.n = x.numel();
            for (int64_t i = 0; i < s.n; ++i) {
                const float v = x.ptr<float>()[i], g = got.ptr<float>()[i];
                const float want = std::isnan(v) ? v : v <= 0.f ? 0.f : v;
                s.bad += std::isnan(want) ? !std::isnan(g) : g != want;
            }
            return s;
        });

        // rope
        add_big("rope", "DreamZero [1785, 40, 128], 64 pairs split 22/21/21 + action/state", dt,
            [](Harness& h) { return run_rope(h, 1785, 40, 128, 64, false, true); });
        add("rope", "[9, 3, 128] partial 44 pairs (scalar path)", dt,
            [](Harness& h) { return run_rope(h, 9, 3, 128, 44, false, false); });
        add("rope", "[33, 4, 64] in place", dt, [](Harness& h) { return run_rope(h, 33, 4, 64, 32, true, false); });
        add("rope", "[880, 2, 128] double-float table (vector path)", dt,
            [](Harness& h) { return run_rope(h, 880, 2, 128, 64, false, false, true); });
        add("rope", "[9, 3, 128] double-float table, partial 44 pairs (scalar path)", dt,
            [](Harness& h) { return run_rope(h, 9, 3, 128, 44, false, false, true); });

        // attention
        add("attention", "Lq37 Lk53 H3 D64", dt, [](Harness& h) { return run_attention(h, {37, 53, 3, 64}); });
        add("attention", "Lq37 Lk53 H3 D64 + f32 bias, fused qkv (strided rows)", dt,
            [](Harness& h) { return run_attention(h, {37, 53, 3, 64, true, true}); });
        add_big("attention", "Lq1785 Lk2665 H4 D128 (DreamZero first chunk, 4 of 40 heads)", dt,
            [](Harness& h) { return run_attention(h, {1785, 2665, 4, 128}); });
        add("attention", "Lq64 Lk100 H5 D32 in head groups (small workspace)", dt, [](Harness& h) {
            // 64 x 100 logits need 38 KB per head: a 100 KB workspace runs the 5 heads in groups.
            static std::unique_ptr<Backend> small = make_cuda_backend(0, 100 << 10);
            return run_attention(h, {64, 100, 5, 32, true, false, small.get()});
        });
        add("attention", "Lk = 0 writes zeros", dt, [](Harness& h) { return run_attention(h, {5, 0, 2, 8}); });

        // conv3d
        {
            ConvSpec c{4, 6, 5, 9, 11, 3, 3, 3};
            c.pb[0] = 2, c.pb[1] = 1, c.pa[1] = 1, c.pb[2] = 1, c.pa[2] = 1;
            add("conv3d", "Ci4 Co6 [5, 9, 11] k3 causal time padding", dt, [c](Harness& h) { return run_conv(h, c); });
            ConvSpec f = c;
            f.fallback = true;
            add("conv3d", "same, direct kernel", dt, [f](Harness& h) { return run_conv(h, f); });
        }
        {
            ConvSpec c{8, 5, 4, 10, 12, 3, 3, 3};
            c.stride[1] = c.stride[2] = 2;
            for (int i = 0; i < 3; ++i) c.pb[i] = c.pa[i] = 1;
            c.bias = false;
            add("conv3d", "Ci8 Co5 [4, 10, 12] k3 stride (1, 2, 2) symmetric padding", dt,
                [c](Harness& h) { return run_conv(h, c); });
        }
        {
            ConvSpec c{16, 32, 2, 22, 40, 1, 2, 2};
            c.stride[1] = c.stride[2] = 2;
            add("conv3d", "patch embedding Ci16 Co32 [2, 22, 40] k(1,2,2) stride (1,2,2)", dt,
                [c](Harness& h) { return run_conv(h, c); });
        }
        for (const bool cl : {false, true}) {
            // 2-D convolutions over the frames: CLIP's patch embedding (no bias) and a padded 3x3 one
            ConvSpec c{3, 32, 2, 28, 28, 1, 14, 14};
            c.stride[1] = c.stride[2] = 14;
            c.bias = false;
            c.frames_2d = true;
            c.channels_last = cl;
            add("conv3d", cl ? "2-D channels-last frames, CLIP-like patch Ci3 Co32 [2, 28, 28] k14 stride 14"
                             : "2-D frames, CLIP-like patch Ci3 Co32 [2, 28, 28] k14 stride 14",
                dt, [c](Harness& h) { return run_conv(h, c); });
            ConvSpec d{8, 6, 3, 9, 13, 1, 3, 3};
            d.pb[1] = d.pa[1] = d.pb[2] = d.pa[2] = 1;
            d.frames_2d = true;
            d.channels_last = cl;
            add("conv3d", cl ? "2-D channels-last frames Ci8 Co6 [3, 9, 13] k3 padding 1"
                             : "2-D frames Ci8 Co6 [3, 9, 13] k3 padding 1",
                dt, [d](Harness& h) { return run_conv(h, d); });
        }
        {
            ConvSpec c{32, 32, 3, 44, 80, 3, 3, 3};
            c.pb[0] = 2, c.pb[1] = c.pa[1] = 1, c.pb[2] = c.pa[2] = 1;
            add_big("conv3d", "VAE-like Ci32 Co32 [3, 44, 80] k3 causal", dt, [c](Harness& h) { return run_conv(h, c); });
        }

        // fill
        for (float v : {0.1f, -3.5f}) {
            add("fill", fmt::format("[1000] = {}", v), dt, [v](Harness& h) {
                const TensorView od = h.dev_out({1000});
                gpu().fill(od, v);
                Tensor ref = Tensor::host({1000}, DType::F32);
                std::fill(ref.ptr<float>(), ref.ptr<float>() + 1000, round_to(h.dt(), v));
                return h.compare(od, ref, 0.0);
            });
        }
    }

    // dtype conversions and layouts (exact)
    for (DType src : {DType::F32, DType::BF16})
        for (DType dst : {DType::F32, DType::BF16, DType::F16}) {
            add("copy", fmt::format("permuted [4, 5, 6] -> [6, 4, 5] {} -> {}", dtype_name(src), dtype_name(dst)), src,
                [src, dst](Harness& h) {
                    return run_copy(h, src, dst, {4, 5, 6}, {6, 4, 5}, {1, 30, 6}, 0);
                });
        }
    add("copy", "nearest 2x upsample [3, 5, 7] -> [3, 5, 2, 7, 2] through 0 strides", DType::BF16, [](Harness& h) {
        return run_copy(h, DType::BF16, DType::BF16, {3, 5, 7}, {3, 5, 2, 7, 2}, {35, 7, 0, 1, 0}, 0);
    });
    add("copy", "6-d transposed slice f32 -> bf16", DType::F32, [](Harness& h) {
        // storage [2, 3, 4, 5, 6, 7]; view swaps the last two dims and starts at an offset
        return run_copy(h, DType::F32, DType::BF16, {2, 3, 4, 5, 6, 7}, {2, 3, 4, 5, 7, 5},
                        {2520, 840, 210, 42, 1, 7}, 1);
    });
    add("copy", "tiled transpose [70, 90] -> [90, 70] f32 -> bf16 (partial tiles)", DType::F32,
        [](Harness& h) { return run_copy(h, DType::F32, DType::BF16, {70, 90}, {90, 70}, {1, 90}, 0); });
    add("copy", "tiled transpose bf16 [3, 40, 50] -> [3, 50, 40] (batched)", DType::BF16,
        [](Harness& h) { return run_copy(h, DType::BF16, DType::BF16, {3, 40, 50}, {3, 50, 40}, {2000, 1, 50}, 0); });
    add("copy", "tiled [37, 3, 40] -> [40, 3, 37] (contiguous dim not next to the last) bf16 -> f32", DType::BF16,
        [](Harness& h) { return run_copy(h, DType::BF16, DType::F32, {37, 3, 40}, {40, 3, 37}, {1, 40, 120}, 0); });
    add("copy", "contiguous bf16 -> bf16 (memcpy)", DType::BF16,
        [](Harness& h) { return run_copy(h, DType::BF16, DType::BF16, {1000}, {1000}, {1}, 0); });
    add("copy", "i32 strided (raw elements)", DType::F32, [](Harness& h) {
        Tensor host = Tensor::host({8, 6}, DType::I32);
        for (int i = 0; i < 48; ++i) host.ptr<int32_t>()[i] = i * 7 - 100;
        Tensor dev = gpu().alloc({8, 6}, DType::I32);
        gpu().upload(host, dev);
        const TensorView t(dev.data(), DType::I32, Shape{6, 8}, Shape{1, 6}, dev.device());
        const TensorView od = h.dev_out({6, 8}, DType::I32);
        gpu().copy(t, od);
        Tensor ref = Tensor::host({6, 8}, DType::F32);
        for (int i = 0; i < 6; ++i)
            for (int j = 0; j < 8; ++j) ref.ptr<float>()[i * 8 + j] = float(j * 6 + i) * 7 - 100;
        Tensor back = Tensor::host({6, 8}, DType::I32);
        gpu().download(od, back);
        Stats s;
        s.n = 48;
        for (int i = 0; i < 48; ++i) {
            const double d = std::fabs(double(back.ptr<int32_t>()[i]) - fp(ref)[i]);
            s.max_abs = std::max(s.max_abs, d);
            s.bad += d != 0;
        }
        return s;
    });

    // transfers
    for (DType dt : {DType::F32, DType::BF16}) {
        add_big("upload", "12M elements through the staging buffers (several chunks)", dt, [](Harness& h) {
            Tensor x = h.input_as({12 << 20}, DType::F32, -1000.f, 1000.f);
            const TensorView d = h.dev(x);  // converts to the case dtype on upload
            Tensor ref = Tensor::host(x.shape(), DType::F32);
            for (int64_t i = 0; i < x.numel(); ++i) ref.ptr<float>()[i] = round_to(h.dt(), fp(x)[i]);
            return h.compare(d, ref, 0.0);
        });
        add("upload", "strided host source [30, 40] transposed", dt, [](Harness& h) {
            Tensor x = h.input({30, 40});
            const TensorView t = x.view().transpose(0, 1);
            Tensor d = gpu().alloc({40, 30}, h.dt());
            gpu().upload(t, d);
            Tensor ref = Tensor::host({40, 30}, DType::F32);
            cpu().copy(t, ref);
            return h.compare(d, ref, 0.0);
        });
        add("download", "strided device source [64, 48] transposed", dt, [](Harness& h) {
            Tensor x = h.input({64, 48});
            const TensorView d = h.dev(x);
            Tensor host = Tensor::host({48, 64}, DType::F32);
            gpu().download(d.transpose(0, 1), host);
            Tensor ref = Tensor::host({48, 64}, DType::F32);
            cpu().copy(x.view().transpose(0, 1), ref);
            Stats s;
            s.n = host.numel();
            for (int64_t i = 0; i < s.n; ++i) {
                const double e = std::fabs(double(fp(host)[i]) - fp(ref)[i]);
                s.max_abs = std::max(s.max_abs, std::isnan(e) ? INFINITY : e);
                s.bad += !(e == 0);
            }
            return s;
        });
        add("alloc", "alloc zero-fills [777]", dt, [](Harness& h) {
            Tensor d = gpu().alloc({777}, h.dt());
            Tensor ref = Tensor::host({777}, DType::F32);
            return h.compare(d, ref, 0.0);
        });
        add("scatter_kv", "5 rows into a 2-layer pool, pad and out-of-range slots skipped", dt,
            [](Harness& h) { return run_scatter_kv(h); });
    }
    // fused ops of `fast` numerics
    for (DType dt : {DType::F32, DType::BF16}) {
        add("ada_layer_norm", "[37, 40] two groups split 30, modulated", dt,
            [](Harness& h) { return run_ada_layer_norm(h, 37, 40, 30, false, true); });
        add("ada_layer_norm", "[19, 36] affine, one group (scalar path)", dt,
            [](Harness& h) { return run_ada_layer_norm(h, 19, 36, INT64_MAX, true, false); });
        add("ada_layer_norm", "[11, 4104] affine and modulated, split 0", dt,
            [](Harness& h) { return run_ada_layer_norm(h, 11, 4104, 0, true, true); });
        add_big("ada_layer_norm", "DreamZero [1785, 5120] split 1760, modulated", dt,
                [](Harness& h) { return run_ada_layer_norm(h, 1785, 5120, 1760, false, true); });
        // two CFG branches stacked: the groups repeat every `period` rows
        add("ada_layer_norm", "[74, 40] two blocks of 37 split 30, modulated", dt,
            [](Harness& h) { return run_ada_layer_norm(h, 74, 40, 30, false, true, 37); });
        add("ada_layer_norm", "[70, 36] affine and modulated, blocks of 35 split 20 (scalar path)", dt,
            [](Harness& h) { return run_ada_layer_norm(h, 70, 36, 20, true, true, 35); });
        add("ada_layer_norm", "[22, 4104] modulated, blocks of 11 split 8 (block kernel)", dt,
            [](Harness& h) { return run_ada_layer_norm(h, 22, 4104, 8, false, true, 11); });
        add_big("ada_layer_norm", "DreamZero [3570, 5120] two branches of 1785 split 1760, modulated", dt,
                [](Harness& h) { return run_ada_layer_norm(h, 3570, 5120, 1760, false, true, 1785); });
        // the streamed kernels (bf16 rows): ragged row counts, one row, the widest rows, and the warp kernels they replace
        add("ada_layer_norm", "[7, 5120] modulated, blocks of 3 split 2", dt,
            [](Harness& h) { return run_ada_layer_norm(h, 7, 5120, 2, false, true, 3); });
        add("ada_layer_norm", "[1, 5120] affine and modulated, split 0", dt,
            [](Harness& h) { return run_ada_layer_norm(h, 1, 5120, 0, true, true); });
        add("ada_layer_norm", "[5, 6144] affine and modulated, blocks of 2 split 1 (six staged vectors)", dt,
            [](Harness& h) { return run_ada_layer_norm(h, 5, 6144, 1, true, true, 2); });
        add("ada_layer_norm", "[97, 256] modulated, blocks of 33 split 20", dt,
            [](Harness& h) { return run_ada_layer_norm(h, 97, 256, 20, false, true, 33); });
        add_big("ada_layer_norm", "DreamZero [1785, 5120] one branch split 1760, affine and modulated", dt,
                [](Harness& h) { return run_ada_layer_norm(h, 1785, 5120, 1760, true, true, 1785); });
        add_big("ada_layer_norm", "[1001, 5120] ragged, blocks of 500 split 480, modulated", dt,
                [](Harness& h) { return run_ada_layer_norm(h, 1001, 5120, 480, false, true, 500); });
        add("ada_layer_norm", "[74, 40] two blocks of 37 split 30, modulated (warp kernels)", dt,
            on_rows(RowKernels::Warp, [](Harness& h) { return run_ada_layer_norm(h, 74, 40, 30, false, true, 37); }));
        add_big("ada_layer_norm", "DreamZero [3570, 5120] two branches of 1785 split 1760 (warp kernels)", dt,
                on_rows(RowKernels::Warp,
                        [](Harness& h) { return run_ada_layer_norm(h, 3570, 5120, 1760, false, true, 1785); }));
        add("gated_residual", "[74, 40] gated, blocks of 37 split 30", dt,
            [](Harness& h) { return run_gated_residual(h, 74, 40, 30, true, 37); });
        add("gated_residual", "[26, 21] gated, blocks of 13 split 9 (scalar path)", dt,
            [](Harness& h) { return run_gated_residual(h, 26, 21, 9, true, 13); });
        add_big("gated_residual", "DreamZero [3570, 5120] gated, two branches of 1785 split 1760", dt,
                [](Harness& h) { return run_gated_residual(h, 3570, 5120, 1760, true, 1785); });
        add("gated_residual_norm", "[74, 40] gated, modulated, blocks of 37 split 30", dt,
            [](Harness& h) { return run_gated_residual_norm(h, 74, 40, 30, true, false, true, 37); });
        add("gated_residual", "[37, 40] gated, split 30", dt,
            [](Harness& h) { return run_gated_residual(h, 37, 40, 30, true); });
        add("gated_residual", "[13, 20] no gate (scalar path)", dt,
            [](Harness& h) { return run_gated_residual(h, 13, 20, INT64_MAX, false); });
        add_big("gated_residual", "DreamZero [1785, 5120] gated, split 1760", dt,
                [](Harness& h) { return run_gated_residual(h, 1785, 5120, 1760, true); });
        add("gated_residual_norm", "[37, 40] gated, modulated, split 30", dt,
            [](Harness& h) { return run_gated_residual_norm(h, 37, 40, 30, true, false, true); });
        add("gated_residual_norm", "[11, 4104] no gate, affine, split 0", dt,
            [](Harness& h) { return run_gated_residual_norm(h, 11, 4104, 0, false, true, false); });
        add("gated_residual_norm", "[9, 44] gated, affine and modulated (scalar path)", dt,
            [](Harness& h) { return run_gated_residual_norm(h, 9, 44, 5, true, true, true); });
        add_big("gated_residual_norm", "DreamZero [1785, 5120] gated + affine (norm3), split 1760", dt,
                [](Harness& h) { return run_gated_residual_norm(h, 1785, 5120, 1760, true, true, false); });
        add("gemm_gelu", "M64 N96 K80 + bias (GELU_BIAS epilogue)", dt,
            [](Harness& h) { return run_gemm_gelu(h, {64, 96, 80, true, h.dt(), false, h.dt() == DType::BF16}); });
        add("gemm_gelu", "M33 N40 K24 no bias (GELU epilogue)", dt,
            [](Harness& h) { return run_gemm_gelu(h, {33, 40, 24, false}); });
        add("gemm_gelu", "M20 N24 K16 + bias, plain kernel then the GELU kernel", dt,
            [](Harness& h) { return run_gemm_gelu(h, {20, 24, 16, true, DType::F32, true}); });
        if (dt == DType::BF16)
            add("gemm_gelu", "M31 N48 K40 f32 bias on bf16 out (not fusable: GEMM, bias, then GELU)", dt,
                [](Harness& h) { return run_gemm_gelu(h, {31, 48, 40, true, DType::F32}); });
        if (dt == DType::BF16)
            add_big("gemm_gelu", "DreamZero FFN up M1785 N13824 K5120 + bias", dt,
                    [](Harness& h) { return run_gemm_gelu(h, {1785, 13824, 5120, true, DType::BF16, false, true}); });
        add("rms_norm_rope", "[30, 2, 16] split 22, (cos, sin) tables", dt,
            [](Harness& h) { return run_rms_norm_rope(h, 30, 2, 16, 22, 8, 2); });
        add("rms_norm_rope", "[25, 3, 64] one table, double-float entries, partial 24 pairs", dt,
            [](Harness& h) { return run_rms_norm_rope(h, 25, 3, 64, INT64_MAX, 24, 4); });
        add("rms_norm_rope", "[21, 5, 48] split 13, double-float entries (head_dim not dividing 256)", dt,
            [](Harness& h) { return run_rms_norm_rope(h, 21, 5, 48, 13, 24, 4); });
        add("rms_norm_rope", "[9, 3, 10] no table (scalar path)", dt,
            [](Harness& h) { return run_rms_norm_rope(h, 9, 3, 10, INT64_MAX, 0, 2); });
        add_big("rms_norm_rope", "DreamZero [1785, 40, 128] split 1760, 64 pairs", dt,
                [](Harness& h) { return run_rms_norm_rope(h, 1785, 40, 128, 1760, 64, 4); });
        add("rms_norm_rope", "[60, 2x16] blocks of 30 split 22, 8 pairs (warp kernel)", dt,
            [](Harness& h) { return run_rms_norm_rope(h, 60, 2, 16, 22, 8, 2, 30); });
        add("rms_norm_rope", "[42, 5x48] blocks of 21 split 13, 24 pairs double-float", dt,
            [](Harness& h) { return run_rms_norm_rope(h, 42, 5, 48, 13, 24, 4, 21); });
        add("rms_norm_rope", "[18, 3x10] blocks of 9 split 5, 4 pairs (plain kernel)", dt,
            [](Harness& h) { return run_rms_norm_rope(h, 18, 3, 10, 5, 4, 2, 9); });
        add_big("rms_norm_rope", "DreamZero [3570, 40x128] two branches of 1785 split 1760", dt,
                [](Harness& h) { return run_rms_norm_rope(h, 3570, 40, 128, 1760, 64, 4, 1785); });
        add("rms_norm_rope", "[7, 40x128] blocks of 3 split 2, 64 pairs double-float", dt,
            [](Harness& h) { return run_rms_norm_rope(h, 7, 40, 128, 2, 64, 4, 3); });
        add_big("rms_norm_rope", "[1001, 40x128] ragged, blocks of 500 split 480, 64 pairs", dt,
                [](Harness& h) { return run_rms_norm_rope(h, 1001, 40, 128, 480, 64, 2, 500); });
        add("rms_norm_rope", "[60, 2x16] blocks of 30 split 22, 8 pairs (warp kernels)", dt,
            on_rows(RowKernels::Warp, [](Harness& h) { return run_rms_norm_rope(h, 60, 2, 16, 22, 8, 2, 30); }));
        add_big("rms_norm_rope", "DreamZero [3570, 40x128] two branches of 1785 split 1760 (warp kernels)", dt,
                on_rows(RowKernels::Warp,
                        [](Harness& h) { return run_rms_norm_rope(h, 3570, 40, 128, 1760, 64, 4, 1785); }));
    }
    // FP8 (E4M3): quantization bit for bit, its inverse, the GEMM through cuBLASLt and through the plain kernel
    for (DType dt : {DType::F32, DType::BF16}) {
        add("quantize_fp8", "[37, 300] rows in [-5, 5]", dt, [](Harness& h) { return run_quantize_fp8(h, 37, 300, -5.f, 5.f); });
        add("quantize_fp8", "[3, 7] values below the amax floor 1e-12 (zero codes)", dt,
            [](Harness& h) { return run_quantize_fp8(h, 3, 7, -1e-30f, 1e-30f); });
        add_big("quantize_fp8", "DreamZero FFN input [1785, 13824]", dt,
                [](Harness& h) { return run_quantize_fp8(h, 1785, 13824, -4.f, 4.f); });
        add("ada_layer_norm_fp8", "[74, 40] modulated, blocks of 37 split 30", dt,
            [](Harness& h) { return run_ada_layer_norm_fp8(h, 74, 40, 30, 37, false, true); });
        add("ada_layer_norm_fp8", "[9, 36] affine (not the fused kernel: 36 columns)", dt,
            [](Harness& h) { return run_ada_layer_norm_fp8(h, 9, 36, INT64_MAX, INT64_MAX, true, false); });
        add_big("ada_layer_norm_fp8", "DreamZero [3570, 5120] two branches of 1785 split 1760, modulated", dt,
                [](Harness& h) { return run_ada_layer_norm_fp8(h, 3570, 5120, 1760, 1785, false, true); });
        add("ada_layer_norm_fp8", "[13, 5120] modulated, blocks of 5 split 3", dt,
            [](Harness& h) { return run_ada_layer_norm_fp8(h, 13, 5120, 3, 5, false, true); });
        add_big("ada_layer_norm_fp8", "DreamZero [1785, 5120] affine (norm3)", dt,
                [](Harness& h) { return run_ada_layer_norm_fp8(h, 1785, 5120, INT64_MAX, INT64_MAX, true, false); });
        add("ada_layer_norm_fp8", "[74, 40] modulated, blocks of 37 split 30 (warp kernels)", dt,
            on_rows(RowKernels::Warp,
                    [](Harness& h) { return run_ada_layer_norm_fp8(h, 74, 40, 30, 37, false, true); }));
        add("activation_quantize_fp8", "[7, 24] tanh GELU", dt,
            [](Harness& h) { return run_activation_quantize_fp8(h, 7, 24); });
        add("activation_quantize_fp8", "[3, 20] tanh GELU (not the fused kernel: 20 columns)", dt,
            [](Harness& h) { return run_activation_quantize_fp8(h, 3, 20); });
        add_big("activation_quantize_fp8", "DreamZero FFN hidden [3570, 13824]", dt,
                [](Harness& h) { return run_activation_quantize_fp8(h, 3570, 13824); });
        add("activation_quantize_fp8", "[5, 16384] tanh GELU, the widest rows", dt,
            [](Harness& h) { return run_activation_quantize_fp8(h, 5, 16384); });
        add_big("activation_quantize_fp8", "DreamZero FFN hidden [1785, 13824]", dt,
                [](Harness& h) { return run_activation_quantize_fp8(h, 1785, 13824); });
        add("activation_quantize_fp8", "[7, 24] tanh GELU (evaluated, not by table)", dt,
            on_rows(RowKernels::Warp, [](Harness& h) { return run_activation_quantize_fp8(h, 7, 24); }));
        add("dequantize_fp8", "[45, 128]", dt, [](Harness& h) {
            const Fp8Operand x = fp8_operand(h, 45, 128, -2.f, 2.f);
            Tensor ref = Tensor::host({45, 128}, DType::F32);
            cpu().dequantize_fp8(x.q, x.s, ref);
            for (int64_t i = 0; i < ref.numel(); ++i) ref.ptr<float>()[i] = round_to(h.dt(), fp(ref)[i]);
            const TensorView od = h.dev_out({45, 128});
            gpu().dequantize_fp8(x.q_dev, x.s_dev, od);
            return h.compare(od, ref, 0.0);
        });
        add("gemm_fp8", "M64 N96 K128 + bias", dt, [](Harness& h) { return run_gemm_fp8(h, 64, 96, 128, true, false); });
        add("gemm_fp8", "M7 N5 K48 no bias", dt, [](Harness& h) { return run_gemm_fp8(h, 7, 5, 48, false, false); });
        add("gemm_fp8", "M33 N40 K32 + bias, plain kernel", dt,
            [](Harness& h) { return run_gemm_fp8(h, 33, 40, 32, true, true); });
        add_big("gemm_fp8", "DreamZero M1785 N5120 K5120 + bias", dt,
                [](Harness& h) { return run_gemm_fp8(h, 1785, 5120, 5120, true, false); });
    }
    // paged attention: bf16 pools only (the CUDA kernels take bf16/f16)
    add("paged_attention", "H2 D64 block 40, history 90 through a shuffled table, 37 current, Lq 29", DType::BF16,
        [](Harness& h) { return run_paged_attention(h, 2, 64, 40, 90, 37, 29); });
    add("paged_attention", "H3 D128 block 16, empty history, 20 current, Lq 5", DType::BF16,
        [](Harness& h) { return run_paged_attention(h, 3, 128, 16, 0, 20, 5); });
    add("paged_attention_batched", "2 branches, H2 D128 block 40, history 90 each, 37 current, fast numerics",
        DType::BF16, [](Harness& h) { return run_paged_attention_batched(h, 2, 128, 40, 90, 37); });
    add("paged_attention_batched", "2 branches, H3 D128, empty histories, 20 current, fast numerics", DType::BF16,
        [](Harness& h) { return run_paged_attention_batched(h, 3, 128, 16, 0, 20); });
    return cases;
}

/// The ops the Backend interface declares: every `virtual ... name(` in backend.h except the
/// accessors and housekeeping below, an op's implementation `do_<op>` named as the op.
std::set<std::string> declared_backend_ops() {
    std::ifstream in(dzr::test::source_dir() / "lib" / "backend" / "backend.h");
    REQUIRE(in.good());
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    // conv3d_workspace_bytes is a planning query, tested below
    // DeviceContext, Stream, Event and Graph housekeeping, the backend's accessors and its implementation choices
    const std::set<std::string> not_ops = {"device", "name", "compute_dtype", "workspace", "reserve_workspace",
                                           "synchronize", "device_memory_in_use", "conv3d_workspace_bytes",
                                           "paged_attention_workspace_bytes", "paged_attention_batched_workspace_bytes", "memory_in_use", "memory_free", "pci_bus_id", "capabilities",
                                           "make_event", "record", "wait", "elapsed_ms", "begin_capture",
                                           "end_capture", "abort_capture", "capturing", "launch", "context", "stream", "set_cuda_options",
                                           "cuda_options", "last_attention_impl", "conv_plan_report", "profiler",
                                           // the streamed layers' transfers: cuda/test_layer_stream runs them end to end
                                           "alloc_pinned", "copy_pinned", "make_copy_stream"};
    std::set<std::string> ops;
    const std::regex decl(R"(virtual\s+[\w:<>&\s]+?[\s&*](\w+)\s*\()");
    for (auto it = std::sregex_iterator(text.begin(), text.end(), decl); it != std::sregex_iterator(); ++it) {
        std::string name = (*it)[1];
        if (name.rfind("do_", 0) == 0) name = name.substr(3);
        if (!not_ops.count(name)) ops.insert(name);
    }
    return ops;
}

}  // namespace

TEST_CASE("every backend op has at least one parity case") {
    const std::set<std::string> declared = declared_backend_ops();
    // The table both sides must list: what backend.h declares and what the case list covers.
    const std::set<std::string> expected = {"alloc",   "upload",  "download",   "copy",       "fill",
                                            "gemm",    "binary",  "scale",      "activation", "layer_norm",
                                            "rms_norm", "l2_norm", "softmax", "reduce",     "rope",       "attention",
                                            "conv3d",  "paged_attention", "paged_attention_batched", "scatter_kv", "resize_bicubic",
                                            "sin_cos_table", "count_nonfinite", "ada_layer_norm",
                                            "gated_residual", "rms_norm_rope", "gated_residual_norm", "gemm_gelu",
                                            "quantize_fp8", "dequantize_fp8", "gemm_fp8", "ada_layer_norm_fp8",
                                            "activation_quantize_fp8"};
    CHECK(declared == expected);
    std::set<std::string> covered;
    for (const OpCase& c : make_cases()) covered.insert(c.op);
    for (const std::string& op : declared) {
        CAPTURE(op);
        CHECK(covered.count(op) == 1);
    }
    for (const std::string& op : covered) {
        CAPTURE(op);
        CHECK(declared.count(op) == 1);
    }
}

TEST_CASE("every cuda op matches the cpu reference within tolerance") {
    std::printf("op parity: seed %llu (DZR_TEST_SEED reproduces), device %s\n",
                static_cast<unsigned long long>(base_seed()), gpu().name().c_str());
    std::printf("%-11s %-5s %-72s %11s %11s %s\n", "op", "dtype", "case", "max_abs", "max_rel", "result");
    std::map<std::pair<std::string, DType>, double> worst;
    const std::vector<OpCase> cases = make_cases();
    const bool small_only = std::getenv("DZR_TEST_SMALL") != nullptr;
    for (size_t i = 0; i < cases.size(); ++i) {
        const OpCase& c = cases[i];
        if (small_only && c.big) continue;
        CAPTURE(c.op);
        CAPTURE(c.name);
        CAPTURE(dtype_name(c.dtype));
        Harness h(c.dtype, base_seed() + i * 7919);
        Stats s;
        try {
            s = c.run(h);
        } catch (const std::exception& e) {
            FAIL_CHECK("threw: " << e.what());
            std::printf("%-11s %-5s %-72s %11s %11s FAIL (threw: %s)\n", c.op.c_str(), std::string(dtype_name(c.dtype)).c_str(),
                        c.name.c_str(), "-", "-", e.what());
            continue;
        }
        std::printf("%-11s %-5s %-72s %11.3e %11.3e %s\n", c.op.c_str(), std::string(dtype_name(c.dtype)).c_str(),
                    c.name.c_str(), s.max_abs, s.max_rel, s.bad == 0 ? "ok" : fmt::format("FAIL ({} of {})", s.bad, s.n).c_str());
        CHECK(s.n > 0);
        CHECK(s.bad == 0);
        auto& w = worst[{c.op, c.dtype}];
        w = std::max(w, s.max_rel);
    }
    std::printf("\nworst max_rel per op:\n%-11s %12s %12s\n", "op", "f32", "bf16");
    std::set<std::string> ops;
    for (const auto& [key, v] : worst) ops.insert(key.first);
    for (const std::string& op : ops) {
        const auto get = [&](DType t) {
            auto it = worst.find({op, t});
            return it == worst.end() ? std::string("-") : fmt::format("{:.3e}", it->second);
        };
        std::printf("%-11s %12s %12s\n", op.c_str(), get(DType::F32).c_str(), get(DType::BF16).c_str());
    }
    std::fflush(stdout);
}

TEST_CASE("a conv3d planned through conv3d_workspace_bytes runs its unlimited engine in a workspace of that size") {
    // The VAE encoder's first residual convolution on a 4-frame chunk: its first cuDNN engine needs ~435 MB of
    // workspace (H200, cuDNN 9.14). A backend whose workspace holds the padded input plus what the query reports
    // must run the same engine, bit for bit, as one with room to spare.
    const int64_t Ci = 96, T = 4, H = 352, W = 640;
    Conv3dParams p;
    p.pad_before[0] = 2;
    p.pad_before[1] = p.pad_after[1] = p.pad_before[2] = p.pad_after[2] = 1;
    std::mt19937_64 rng(77);
    std::uniform_real_distribution<float> dist(-1.f, 1.f);
    Tensor xh = Tensor::host({Ci, T, H, W}, DType::F32), wh = Tensor::host({Ci, Ci, 3, 3, 3}, DType::F32);
    for (int64_t i = 0; i < xh.numel(); ++i) xh.ptr<float>()[i] = bf16_to_f32(f32_to_bf16(dist(rng)));
    for (int64_t i = 0; i < wh.numel(); ++i) wh.ptr<float>()[i] = bf16_to_f32(f32_to_bf16(0.05f * dist(rng)));
    const size_t padded = size_t(Ci * (T + 2) * (H + 2) * (W + 2)) * 2;
    const auto run = [&](Backend& be, bool plan_first) {
        Tensor x = be.alloc({Ci, T, H, W}, DType::BF16), w = be.alloc({Ci, Ci, 3, 3, 3}, DType::BF16);
        Tensor out = be.alloc({Ci, T, H, W}, DType::BF16);
        be.upload(xh, x);
        be.upload(wh, w);
        if (plan_first) {
            const size_t ws = be.conv3d_workspace_bytes(p, x, w, out);
            std::printf("conv3d_workspace_bytes: %zu B\n", ws);
            be.reserve_workspace(padded + ws + 2 * Arena::kAlign);
        }
        be.conv3d(p, x, w, {}, out);
        Tensor host = Tensor::host(out.shape(), DType::F32);
        be.download(out, host);
        return host;
    };
    auto roomy = make_cuda_backend(0, size_t(4) << 30);
    const Tensor ref = run(*roomy, false);
    auto planned = make_cuda_backend(0, size_t(64) << 20);
    const Tensor got = run(*planned, true);
    int64_t differ = 0;
    for (int64_t i = 0; i < ref.numel(); ++i) differ += ref.ptr<float>()[i] != got.ptr<float>()[i];
    CHECK(differ == 0);
    // the CPU backend has no library workspace
    CHECK(cpu().conv3d_workspace_bytes(p, xh, wh, xh) == 0);
}

TEST_CASE("cuBLASLt's GELU epilogue is the tanh GELU of the DiT's FFN, not the erf one") {
    // bf16 operands, pre-activations over about [-4, 4], where the two GELUs differ by up to 4.7e-4 (rms 2e-4). The
    // epilogue's result must lie closer to the tanh form than to the erf form: with an f32 output and bias (no output
    // rounding), or, where cuBLASLt has no such epilogue, the DiT's bf16 output (its rounding noise is uncorrelated
    // with the difference of the two forms, which the 32768 outputs resolve).
    const int64_t M = 256, N = 128, K = 16;
    std::mt19937_64 rng(base_seed() ^ 0x9e1u);
    std::uniform_real_distribution<float> dist(-1.f, 1.f);
    Tensor a = Tensor::host({M, K}, DType::F32), w = Tensor::host({N, K}, DType::F32), b = Tensor::host({N}, DType::F32);
    for (Tensor* t : {&a, &w, &b})
        for (int64_t i = 0; i < t->numel(); ++i) t->ptr<float>()[i] = round_to(DType::BF16, dist(rng));
    Tensor pre = Tensor::host({M, N}, DType::F32);
    cpu().gemm(GemmParams{}, a, w, b, pre);
    Tensor ad = gpu().alloc({M, K}, DType::BF16), wd = gpu().alloc({N, K}, DType::BF16);
    gpu().upload(a, ad);
    gpu().upload(w, wd);
    bool fused = false;
    double e_tanh = 0, e_erf = 0;
    for (DType out_dt : {DType::F32, DType::BF16}) {
        Tensor bd = gpu().alloc({N}, out_dt), od = gpu().alloc({M, N}, out_dt);
        gpu().upload(b, bd);
        gpu().gemm_gelu(GemmParams{}, ad, wd, bd, od);
        fused = gpu().last_gemm_gelu_fused();
        Tensor got = Tensor::host({M, N}, DType::F32);
        gpu().download(od, got);
        e_tanh = e_erf = 0;
        for (int64_t i = 0; i < M * N; ++i) {
            const double v = pre.ptr<float>()[i], g = got.ptr<float>()[i];
            const double t = 0.5 * v * (1 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
            const double e = 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
            e_tanh += (g - t) * (g - t), e_erf += (g - e) * (g - e);
        }
        e_tanh = std::sqrt(e_tanh / double(M * N)), e_erf = std::sqrt(e_erf / double(M * N));
        std::printf("gemm_gelu bf16 -> %s (%s): rms error vs tanh GELU %.3e, vs erf GELU %.3e\n",
                    std::string(dtype_name(out_dt)).c_str(), fused ? "cuBLASLt epilogue" : "separate GELU kernel",
                    e_tanh, e_erf);
        if (fused) break;
    }
    CHECK(fused);
    CHECK(e_tanh < e_erf);
}

TEST_CASE("cuda backend rejects mismatched operands with a dzr::Error") {
    Tensor a = gpu().alloc({4, 3}, DType::BF16), b = gpu().alloc({5, 2}, DType::BF16), out = gpu().alloc({4, 5}, DType::BF16);
    CHECK_THROWS_AS(gpu().gemm(GemmParams{}, a, b, {}, out), Error);
    Tensor f = gpu().alloc({5, 3}, DType::F32);
    CHECK_THROWS_AS(gpu().gemm(GemmParams{}, a, f, {}, out), Error);  // mixed input dtypes
    Tensor x = gpu().alloc({2, 3, 8}, DType::BF16), table = gpu().alloc({2, 5, 2}, DType::F32);
    CHECK_THROWS_AS(gpu().rope({}, x, table, x), Error);  // 5 pairs > 8 / 2
    Tensor host = Tensor::host({2, 3, 8}, DType::F32);
    CHECK_THROWS_AS(gpu().rms_norm({}, host, {}, x), Error);  // a host tensor
    Tensor c = gpu().alloc({3, 7}, DType::F32), bad = gpu().alloc({3, 1}, DType::F32);
    CHECK_THROWS_AS(gpu().binary({BinaryOp::Add}, c, bad, c), Error);
}
