// The fp32 reference backend. Straightforward loops plus OpenBLAS sgemm; accumulations that decide
// accuracy (norm statistics, softmax sums) run in double.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_fp8.h"
#include "backend/cpu/cpu_gemm.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/cpu_paged_attention.h"
#include "backend/host_context.h"
#include "core/convert.h"
#include "core/error.h"

namespace dzr {
namespace {

void require_f32(const TensorView& t, const char* op, const char* what) {
    DZR_CHECK(t.dtype == DType::F32, "cpu backend: {} needs f32 {}, got {}", op, what, t.str());
    DZR_CHECK(t.device.is_cpu(), "cpu backend: {} got a {} tensor for {}", op, t.device.str(), what);
}

void require_contiguous(const TensorView& t, const char* op, const char* what) {
    DZR_CHECK(t.is_contiguous(), "cpu backend: {} needs a contiguous {} ({})", op, what, t.str());
}

float* f32(const TensorView& t) { return static_cast<float*>(t.data); }

typedef float V4 __attribute__((vector_size(16)));
typedef int32_t I4 __attribute__((vector_size(16)));

typedef float V8 __attribute__((vector_size(32)));
typedef int32_t I8 __attribute__((vector_size(32)));

/// exp of each lane, in place (Cephes-style: 2^n * e^r, |r| <= ln2 / 2, degree-6 polynomial): within 1.5 ulp for
/// x in [-87.3, 88.3]; 0 below (no denormals), exp(88.3) above (finite), NaN kept. One body for the 4-lane code and
/// the AVX2 8-lane code, so a lane computes the same arithmetic at either width; always inlined, so the 8-lane use is
/// compiled inside its AVX2 caller (AVX2 without FMA: no multiply-add is fused).
template <class V, class I>
__attribute__((always_inline)) inline void exp_lanes(V& x) {
    const V x_in = x;
    x = x < -87.3f ? V{} - 87.3f : x;
    x = x > 88.3f ? V{} + 88.3f : x;
    const float kRound = 12582912.0f;  // 1.5 * 2^23: adding and subtracting it rounds to an integer
    const V n = (x * 1.44269504088896341f + kRound) - kRound;
    V r = x - n * 0.693359375f;  // ln2 in two parts, so r = x - n ln2 is exact enough
    r = r - n * -2.12194440e-4f;
    V p = V{} + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const V y = p * (r * r) + r + 1.0f;
    const I bits = (__builtin_convertvector(n, I) + 127) << 23;  // 2^n, n in [-126, 127]
    x = x_in < -87.3f ? V{} : y * (V)bits;
}

inline V4 exp_v4(V4 x) {
    exp_lanes<V4, I4>(x);
    return x;
}

bool avx2_available() {
    static const bool yes = __builtin_cpu_supports("avx2");
    return yes;
}

/// silu_f32's lanes 8 at a time: the elements [0, the returned count) (a multiple of 8).
__attribute__((target("avx2"))) int64_t silu_avx2(const float* x, float* out, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        V8 v;
        std::memcpy(&v, x + i, sizeof(v));
        V8 e = -v;
        exp_lanes<V8, I8>(e);
        const V8 r = v / (1.0f + e);
        std::memcpy(out + i, &r, sizeof(r));
    }
    return i;
}

/// SiLU x / (1 + exp(-x)) in float, 4 lanes at a time (8 with AVX2: the same per-lane arithmetic); the tail goes
/// through the same lanes, so every element gets the same bits whatever its position (chunked and whole-clip VAE
/// passes stay equal).
void silu_f32(const float* x, float* out, int64_t n) {
    int64_t i = avx2_available() ? silu_avx2(x, out, n) : 0;
    for (; i + 4 <= n; i += 4) {
        V4 v;
        std::memcpy(&v, x + i, sizeof(v));
        const V4 r = v / (1.0f + exp_v4(-v));
        std::memcpy(out + i, &r, sizeof(r));
    }
    if (i < n) {
        V4 v{};
        std::memcpy(&v, x + i, size_t(n - i) * sizeof(float));
        const V4 r = v / (1.0f + exp_v4(-v));
        std::memcpy(out + i, &r, size_t(n - i) * sizeof(float));
    }
}

/// softmax_row's exponentials, 8 at a time with AVX2: o[i] = exp(float(x[i] * scale - mx)) for i in [0, the
/// returned count), added to `sum` in index order (the 4-lane loop's order, so the same double sum).
__attribute__((target("avx2"))) int64_t softmax_exp_avx2(const float* x, float* o, int64_t n, float scale, double mx,
                                                         double& sum) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        V8 a;
        for (int j = 0; j < 8; ++j) a[j] = float(double(x[i + j]) * scale - mx);
        exp_lanes<V8, I8>(a);
        for (int j = 0; j < 8; ++j) sum += a[j];
        std::memcpy(o + i, &a, sizeof(a));
    }
    return i;
}

class CpuBackend final : public Backend {
public:
    explicit CpuBackend(const BackendOptions& o) : Backend(o.numerics), device_(o.workspace_bytes) {
        Capabilities c;
        c.paged_kv = true;
        c.fp8 = true;  // emulated: E4M3 values decoded to f32 (cpu_fp8.h)
        device_.set_capabilities(c);
    }

    std::string name() const override { return "cpu (fp32, OpenBLAS)"; }
    DType compute_dtype() const override { return DType::F32; }
    DeviceContext& context() override { return device_; }
    const DeviceContext& context() const override { return device_; }
    Stream& stream() override { return stream_; }
    std::unique_ptr<Stream> make_copy_stream() override { return std::make_unique<HostStream>(); }

  private:
    void do_copy(const TensorView& src, const TensorView& dst) override { host_copy(src, dst); }
    void do_fill(const TensorView& dst, float value) override {
        require_f32(dst, "fill", "dst");
        require_contiguous(dst, "fill", "dst");
        std::fill(f32(dst), f32(dst) + dst.numel(), value);
    }

    void do_gemm(const GemmParams& p, const TensorView& a, const TensorView& b, const TensorView& bias,
                 const TensorView& out) override {
        require_f32(a, "gemm", "a");
        require_f32(b, "gemm", "b");
        require_f32(out, "gemm", "out");
        const int r = out.rank();
        DZR_CHECK(r == 2 || r == 3, "cpu backend: gemm output must be rank 2 or 3, got {}", out.str());
        DZR_CHECK(a.rank() == r && b.rank() == r, "cpu backend: gemm operand ranks differ: {} {} {}", a.str(),
                  b.str(), out.str());
        const int64_t batch = r == 3 ? out.dim(0) : 1;
        const int64_t M = out.dim(-2), N = out.dim(-1);
        const int64_t K = p.trans_a ? a.dim(-2) : a.dim(-1);
        DZR_CHECK((p.trans_a ? a.dim(-1) : a.dim(-2)) == M, "cpu backend: gemm a {} does not give M={}",
                  a.str(), M);
        DZR_CHECK((p.trans_b ? b.dim(-1) : b.dim(-2)) == K && (p.trans_b ? b.dim(-2) : b.dim(-1)) == N,
                  "cpu backend: gemm b {} does not match K={} N={}", b.str(), K, N);
        for (const TensorView* t : {&a, &b, &out})
            DZR_CHECK(t->strides[-1] == 1 || t->dim(-1) == 1, "cpu backend: gemm needs unit last stride: {}",
                      t->str());
        if (bias.defined()) {
            require_f32(bias, "gemm", "bias");
            DZR_CHECK(bias.numel() == N, "cpu backend: gemm bias {} does not match N={}", bias.str(), N);
        }
        const int64_t lda = std::max<int64_t>(a.strides[-2], 1), ldb = std::max<int64_t>(b.strides[-2], 1),
                      ldc = std::max<int64_t>(out.strides[-2], 1);
        for (int64_t i = 0; i < batch; ++i) {
            const float* pa = f32(a) + (r == 3 ? i * a.strides[0] : 0);
            const float* pb = f32(b) + (r == 3 ? i * b.strides[0] : 0);
            float* pc = f32(out) + (r == 3 ? i * out.strides[0] : 0);
            if (M > 0 && N > 0) {
                if (K == 0) {
                    for (int64_t m = 0; m < M; ++m)
                        for (int64_t n = 0; n < N; ++n) pc[m * ldc + n] *= p.beta;
                } else {
                    cpu::sgemm({p.trans_a, p.trans_b, M, N, K, p.alpha, pa, lda, pb, ldb, p.beta, pc, ldc});
                }
            }
            if (bias.defined()) {
                const float* pbias = f32(bias);
                for (int64_t m = 0; m < M; ++m)
                    for (int64_t n = 0; n < N; ++n) pc[m * ldc + n] += pbias[n];
            }
        }
    }

    void do_binary(const BinaryParams& p, const TensorView& a, const TensorView& b,
                   const TensorView& out) override {
        for (const TensorView* t : {&a, &b, &out}) {
            require_f32(*t, "binary", "operand");
            require_contiguous(*t, "binary", "operand");
        }
        DZR_CHECK(out.numel() == a.numel(), "cpu backend: binary out {} vs a {}", out.str(), a.str());
        check_broadcast(a, b);
        const int64_t n = a.numel(), nb = b.numel();
        if (n == 0) return;
        // b repeats over a's leading dims: rows of nb elements (a single element broadcasts per element)
        const int64_t cols = nb == 1 ? n : nb;
        for (int64_t r = 0; r < n / cols; ++r) {
            const float* pa = f32(a) + r * cols;
            float* po = f32(out) + r * cols;
            if (nb == 1)
                binary_row_scalar(p.op, pa, f32(b)[0], po, cols);
            else
                binary_row(p.op, pa, f32(b), po, cols);
        }
    }

    void do_scale(const ScaleParams& p, const TensorView& x, const TensorView& out) override {
        unary_check(x, out, "scale");
        const float* px = f32(x);
        float* po = f32(out);
        for (int64_t i = 0, n = x.numel(); i < n; ++i) po[i] = p.alpha * px[i] + p.beta;
    }

    void do_activation(const ActivationParams& p, const TensorView& x, const TensorView& out) override {
        unary_check(x, out, "activation");
        const float* px = f32(x);
        float* po = f32(out);
        const int64_t n = x.numel();
        switch (p.kind) {
            case Activation::GeluTanh:
            case Activation::GeluTanhStepwise:  // f32: the same function (no rounding steps to mirror)
                // 0.5 v (1 + tanh(u)) = v / (1 + exp(-2u)): the same value, one exp instead of a tanh
                for (int64_t i = 0; i < n; ++i) {
                    const double v = px[i];
                    const double u = 0.7978845608028654 * (v + 0.044715 * v * v * v);
                    po[i] = float(v / (1.0 + std::exp(-2.0 * u)));
                }
                break;
            case Activation::GeluErf:
                for (int64_t i = 0; i < n; ++i) {
                    const double v = px[i];
                    po[i] = float(0.5 * v * (1.0 + std::erf(v * 0.7071067811865476)));
                }
                break;
            case Activation::Silu:
                // NOTE: float math, as PyTorch's f32 kernel (within 3 ulp of the exact value, inputs below
                // -87 give a tiny value instead of a denormal or zero): the VAE runs it over every activation.
                silu_f32(px, po, n);
                break;
            case Activation::Relu:
                // NOTE: NaN passes (as torch.relu lets it): `x > 0 ? x : 0` would turn a NaN into 0 and hide it.
                for (int64_t i = 0; i < n; ++i) po[i] = px[i] <= 0.f ? 0.f : px[i];
                break;
            case Activation::Sigmoid:
                for (int64_t i = 0; i < n; ++i) po[i] = float(1.0 / (1.0 + std::exp(-double(px[i]))));
                break;
        }
    }

    void do_layer_norm(const LayerNormParams& p, const TensorView& x, const TensorView& weight,
                       const TensorView& bias, const TensorView& out) override {
        unary_check(x, out, "layer_norm");
        const int64_t R = x.rows(), C = x.cols();
        const float* w = optional_vec(weight, C, "layer_norm weight");
        const float* bb = optional_vec(bias, C, "layer_norm bias");
        for (int64_t r = 0; r < R; ++r) {
            const float* px = f32(x) + r * C;
            float* po = f32(out) + r * C;
            double mean = 0, var = 0;
            for (int64_t c = 0; c < C; ++c) mean += px[c];
            mean /= double(C);
            for (int64_t c = 0; c < C; ++c) var += (px[c] - mean) * (px[c] - mean);
            var /= double(C);
            const double inv = 1.0 / std::sqrt(var + p.eps);
            for (int64_t c = 0; c < C; ++c) {
                double v = (px[c] - mean) * inv;
                if (w) v *= w[c];
                if (bb) v += bb[c];
                po[c] = float(v);
            }
        }
    }

    void do_rms_norm(const RmsNormParams& p, const TensorView& x, const TensorView& weight,
                     const TensorView& out) override {
        unary_check(x, out, "rms_norm");
        const int64_t R = x.rows(), C = x.cols();
        const float* w = optional_vec(weight, C, "rms_norm weight");
        for (int64_t r = 0; r < R; ++r) {
            const float* px = f32(x) + r * C;
            float* po = f32(out) + r * C;
            double ss = 0;
            for (int64_t c = 0; c < C; ++c) ss += double(px[c]) * px[c];
            const double inv = 1.0 / std::sqrt(ss / double(C) + p.eps);
            for (int64_t c = 0; c < C; ++c) po[c] = float(px[c] * inv * (w ? w[c] : 1.0f));
        }
    }

    void do_l2_norm(const L2NormParams& p, const TensorView& x, const TensorView& weight,
                    const TensorView& out) override {
        unary_check(x, out, "l2_norm");
        const int64_t R = x.rows(), C = x.cols();
        const float* w = optional_vec(weight, C, "l2_norm weight");
        DZR_CHECK(w != nullptr, "cpu backend: l2_norm needs a weight of {} channels", C);
        // NOTE: f32 has no rounding points to mirror, so `eager` changes nothing here. The steps are the
        // reference's f32 ops in its order (divide by the clamped norm, * scale, * weight); only the sum of
        // squares is accumulated in double.
        for (int64_t r = 0; r < R; ++r) {
            const float* px = f32(x) + r * C;
            float* po = f32(out) + r * C;
            double ss = 0;
            for (int64_t c = 0; c < C; ++c) ss += double(px[c]) * px[c];
            const float norm = std::max(float(std::sqrt(ss)), p.eps);
            for (int64_t c = 0; c < C; ++c) po[c] = px[c] / norm * p.scale * w[c];
        }
        // NOTE: one pass over every row (the VAE's rows are 4-16 channels): silu_f32 gives each element the same bits
        // wherever it lies.
        if (p.silu) silu_f32(f32(out), f32(out), R * C);
    }

    void do_softmax(const SoftmaxParams& p, const TensorView& x, const TensorView& out) override {
        unary_check(x, out, "softmax");
        const int64_t R = x.rows(), C = x.cols();
        for (int64_t r = 0; r < R; ++r) softmax_row(f32(x) + r * C, f32(out) + r * C, C, p.scale);
    }

    void do_reduce(const ReduceParams& p, const TensorView& x, const TensorView& out) override {
        require_f32(x, "reduce", "x");
        require_f32(out, "reduce", "out");
        require_contiguous(x, "reduce", "x");
        const int64_t R = x.rows(), C = x.cols();
        DZR_CHECK(out.numel() == R, "cpu backend: reduce out {} needs {} elements", out.str(), R);
        for (int64_t r = 0; r < R; ++r) {
            const float* px = f32(x) + r * C;
            double acc = p.op == ReduceOp::Max ? -INFINITY : 0.0;
            // NOTE: a NaN wins the maximum, as in torch.max (std::max would skip it).
            for (int64_t c = 0; c < C; ++c)
                acc = p.op != ReduceOp::Max ? acc + px[c] : (std::isnan(px[c]) || px[c] > acc) ? double(px[c]) : acc;
            if (p.op == ReduceOp::Mean) acc /= double(C);
            f32(out)[r] = float(acc);
        }
    }

    void do_rope(const RopeParams&, const TensorView& x, const TensorView& table,
                 const TensorView& out) override {
        unary_check(x, out, "rope");
        require_f32(table, "rope", "table");
        DZR_CHECK(x.rank() == 3, "cpu backend: rope needs x [L, H, D], got {}", x.str());
        const int64_t L = x.dim(0), H = x.dim(1), D = x.dim(2);
        DZR_CHECK(table.rank() == 3 && table.dim(0) == L && (table.dim(2) == 2 || table.dim(2) == 4) &&
                      table.dim(1) * 2 <= D,
                  "cpu backend: rope table {} does not fit x {}", table.str(), x.str());
        const int64_t P = table.dim(1), E = table.dim(2);
        for (int64_t l = 0; l < L; ++l) {
            const float* cs = f32(table) + l * P * E;
            for (int64_t h = 0; h < H; ++h) {
                const float* px = f32(x) + (l * H + h) * D;
                float* po = f32(out) + (l * H + h) * D;
                for (int64_t j = 0; j < P; ++j) {
                    const float* e = cs + E * j;
                    const float x0 = px[2 * j], x1 = px[2 * j + 1];
                    if (E == 4) {  // double-float cos/sin: rotate in double, round once to f32
                        const double c = double(e[0]) + double(e[1]), s = double(e[2]) + double(e[3]);
                        po[2 * j] = float(double(x0) * c - double(x1) * s);
                        po[2 * j + 1] = float(double(x0) * s + double(x1) * c);
                    } else {
                        const float c = e[0], s = e[1];
                        po[2 * j] = x0 * c - x1 * s;
                        po[2 * j + 1] = x0 * s + x1 * c;
                    }
                }
                if (po != px)
                    for (int64_t d = 2 * P; d < D; ++d) po[d] = px[d];
            }
        }
    }

    void do_attention(const AttentionParams& p, const TensorView& q, const TensorView& k, const TensorView& v,
                      const TensorView& bias, const TensorView& out) override {
        for (const TensorView* t : {&q, &k, &v, &out}) require_f32(*t, "attention", "operand");
        DZR_CHECK(q.rank() == 3 && k.rank() == 3 && v.rank() == 3 && out.rank() == 3,
                  "cpu backend: attention needs [L, H, D] operands: q {} k {} v {} out {}", q.str(), k.str(),
                  v.str(), out.str());
        const int64_t Lq = q.dim(0), H = q.dim(1), D = q.dim(2), Lk = k.dim(0), Dv = v.dim(2);
        DZR_CHECK(k.dim(1) == H && v.dim(1) == H && k.dim(2) == D && v.dim(0) == Lk && out.dim(0) == Lq &&
                      out.dim(1) == H && out.dim(2) == Dv,
                  "cpu backend: attention shapes disagree: q {} k {} v {} out {}", q.str(), k.str(), v.str(),
                  out.str());
        for (const TensorView* t : {&q, &k, &v, &out})
            DZR_CHECK(t->strides[2] == 1, "cpu backend: attention needs unit head-dim stride: {}", t->str());
        if (bias.defined()) {
            require_f32(bias, "attention", "bias");
            require_contiguous(bias, "attention", "bias");
            DZR_CHECK(bias.numel() == H * Lq * Lk, "cpu backend: attention bias {} must be [H={}, Lq={}, Lk={}]",
                      bias.str(), H, Lq, Lk);
        }
        attn_scratch_.resize(size_t(Lq * Lk));
        float* logits = attn_scratch_.data();
        for (int64_t h = 0; h < H; ++h) {
            const float* pq = f32(q) + h * q.strides[1];
            const float* pk = f32(k) + h * k.strides[1];
            const float* pv = f32(v) + h * v.strides[1];
            float* po = f32(out) + h * out.strides[1];
            if (Lk == 0) {
                for (int64_t i = 0; i < Lq; ++i) std::fill(po + i * out.strides[0], po + i * out.strides[0] + Dv, 0.f);
                continue;
            }
            cpu::sgemm({false, true, Lq, Lk, D, p.scale, pq, q.strides[0], pk, k.strides[0], 0.f, logits, Lk});
            if (bias.defined()) {
                const float* pb = f32(bias) + h * Lq * Lk;
                for (int64_t i = 0; i < Lq * Lk; ++i) logits[i] += pb[i];
            }
            for (int64_t i = 0; i < Lq; ++i) softmax_row(&logits[i * Lk], &logits[i * Lk], Lk, 1.0f);
            cpu::sgemm({false, false, Lq, Dv, Lk, 1.f, logits, Lk, pv, v.strides[0], 0.f, po, out.strides[0]});
        }
    }

    void do_conv3d(const Conv3dParams& p, const TensorView& x, const TensorView& w, const TensorView& bias,
                   const TensorView& out) override;

    void do_paged_attention(const AttentionParams& p, const TensorView& q, const PagedKvView& history,
                            int layer, const TensorView& k_cur, const TensorView& v_cur,
                            const TensorView& out) override {
        for (const TensorView* t : {&k_cur, &v_cur}) {
            require_f32(*t, "paged_attention", "current rows");
            DZR_CHECK(t->rank() == 3 && t->strides[2] == 1 && t->dim(1) == history.num_heads &&
                          t->dim(2) == history.head_dim,
                      "cpu backend: paged_attention current rows {} must be [L, {}, {}] with unit head-dim stride",
                      t->str(), history.num_heads, history.head_dim);
        }
        DZR_CHECK(k_cur.dim(0) == v_cur.dim(0) && k_cur.strides == v_cur.strides,
                  "cpu backend: paged_attention k {} and v {} differ in length or strides", k_cur.str(), v_cur.str());
        // [Lc, H, D] rows with their own strides -> a one-layer ContiguousKvView
        const ContiguousKvView cur{k_cur.data, v_cur.data, DType::F32, history.num_heads, history.head_dim,
                                   0,           k_cur.strides[0],       k_cur.strides[1], k_cur.dim(0)};
        paged_attention_cpu(q, history, cur, layer, p.scale, out);
    }

    void do_count_nonfinite(const TensorView& x, const TensorView& out) override {
        require_f32(x, "count_nonfinite", "x");
        require_contiguous(x, "count_nonfinite", "x");
        DZR_CHECK(out.dtype == DType::I32 && out.numel() == 1 && out.device.is_cpu(),
                  "cpu backend: count_nonfinite needs an i32 [1] output, got {}", out.str());
        const float* px = f32(x);
        int32_t n = 0;
        for (int64_t i = 0, e = x.numel(); i < e; ++i) n += std::isfinite(px[i]) ? 0 : 1;
        *static_cast<int32_t*>(out.data) = n;
    }

    void do_scatter_kv(const PagedKvView& pool, int layer, const TensorView& slots, const TensorView& k,
                       const TensorView& v, int64_t num_slots) override {
        DZR_CHECK(slots.device.is_cpu() && slots.dtype == DType::I64 && slots.is_contiguous(),
                  "cpu backend: scatter_kv slots {} must be a contiguous i64 host vector", slots.str());
        scatter_kv_cpu(pool, layer, slots.ptr<const int64_t>(), slots.numel(), num_slots, k, v);
    }

    void do_quantize_fp8(const TensorView& x, const TensorView& q, const TensorView& scales) override {
        cpu::quantize_fp8(x, q, scales);
    }
    void do_dequantize_fp8(const TensorView& q, const TensorView& scales, const TensorView& out) override {
        cpu::dequantize_fp8(q, scales, out);
    }
    void do_gemm_fp8(const TensorView& xq, const TensorView& x_scales, const TensorView& wq,
                     const TensorView& w_scales, const TensorView& bias, const TensorView& out) override {
        cpu::gemm_fp8(xq, x_scales, wq, w_scales, bias, out);
    }

    static void binary_row(BinaryOp op, const float* a, const float* b, float* o, int64_t n) {
        switch (op) {
            case BinaryOp::Add:
                for (int64_t i = 0; i < n; ++i) o[i] = a[i] + b[i];
                break;
            case BinaryOp::Sub:
                for (int64_t i = 0; i < n; ++i) o[i] = a[i] - b[i];
                break;
            case BinaryOp::Mul:
                for (int64_t i = 0; i < n; ++i) o[i] = a[i] * b[i];
                break;
            case BinaryOp::Div:
                for (int64_t i = 0; i < n; ++i) o[i] = a[i] / b[i];
                break;
        }
    }

    static void binary_row_scalar(BinaryOp op, const float* a, float b, float* o, int64_t n) {
        switch (op) {
            case BinaryOp::Add:
                for (int64_t i = 0; i < n; ++i) o[i] = a[i] + b;
                break;
            case BinaryOp::Sub:
                for (int64_t i = 0; i < n; ++i) o[i] = a[i] - b;
                break;
            case BinaryOp::Mul:
                for (int64_t i = 0; i < n; ++i) o[i] = a[i] * b;
                break;
            case BinaryOp::Div:
                for (int64_t i = 0; i < n; ++i) o[i] = a[i] / b;
                break;
        }
    }

    static void softmax_row(const float* x, float* o, int64_t n, float scale) {
        double mx = -INFINITY;
        for (int64_t i = 0; i < n; ++i) mx = std::max<double>(mx, double(x[i]) * scale);
        // exp once per element, kept in o (x and o may alias), then normalized.
        // NOTE: float exp (4 lanes) of the shifted logit computed in double: relative error about
        // (2 + |x - max|) * 6e-8, so terms far below the maximum are off by negligible absolute amounts;
        // the sum stays double.
        double sum = 0;
        for (int64_t i0 = avx2_available() ? softmax_exp_avx2(x, o, n, scale, mx, sum) : 0; i0 < n; i0 += 4) {
            const int64_t m = std::min<int64_t>(4, n - i0);
            V4 a{};
            for (int64_t j = 0; j < m; ++j) a[j] = float(double(x[i0 + j]) * scale - mx);
            const V4 e = exp_v4(a);
            for (int64_t j = 0; j < m; ++j) {
                sum += e[j];
                o[i0 + j] = e[j];
            }
        }
        const double inv = 1.0 / sum;
        for (int64_t i = 0; i < n; ++i) o[i] = float(double(o[i]) * inv);
    }

    static void unary_check(const TensorView& x, const TensorView& out, const char* op) {
        require_f32(x, op, "x");
        require_f32(out, op, "out");
        require_contiguous(x, op, "x");
        require_contiguous(out, op, "out");
        DZR_CHECK(x.shape == out.shape, "cpu backend: {} shapes differ: x {} out {}", op, x.str(), out.str());
    }

    static const float* optional_vec(const TensorView& t, int64_t n, const char* what) {
        if (!t.defined()) return nullptr;
        require_f32(t, what, "parameter");
        DZR_CHECK(t.numel() == n, "cpu backend: {} {} does not match {} channels", what, t.str(), n);
        return f32(t);
    }

    static void check_broadcast(const TensorView& a, const TensorView& b) {
        if (b.numel() == 1 || b.shape == a.shape) return;
        const int rb = b.rank(), ra = a.rank();
        bool ok = rb <= ra && b.numel() > 0 && a.numel() % b.numel() == 0;
        // b's shape (ignoring leading 1s) must equal the trailing part of a's shape
        int ib = rb - 1, ia = ra - 1;
        for (; ok && ib >= 0; --ib, --ia) {
            if (ia < 0) {
                ok = b.shape[ib] == 1;
                continue;
            }
            if (b.shape[ib] != a.shape[ia]) {
                // leading ones in b are fine once the trailing part matched
                bool rest_ones = true;
                for (int j = ib; j >= 0; --j) rest_ones = rest_ones && b.shape[j] == 1;
                ok = rest_ones;
                break;
            }
        }
        DZR_CHECK(ok, "cpu backend: cannot broadcast {} onto {}", b.str(), a.str());
    }

    HostDevice device_;
    HostStream stream_;
    std::vector<float> conv_scratch_;  // packed conv input and weights, reused across calls
    std::vector<float> attn_scratch_;  // attention logits [Lq, Lk] of one head
};

void CpuBackend::do_conv3d(const Conv3dParams& p, const TensorView& x, const TensorView& w,
                           const TensorView& bias, const TensorView& out) {
    for (const TensorView* t : {&x, &w, &out}) {
        require_f32(*t, "conv3d", "operand");
        require_contiguous(*t, "conv3d", "operand");
    }
    DZR_CHECK(x.rank() == 4 && w.rank() == 5 && out.rank() == 4,
              "cpu backend: conv3d needs x [C,T,H,W], w [Co,Ci,kt,kh,kw], out [Co,T,H,W]: {} {} {}", x.str(),
              w.str(), out.str());
    const int64_t Ci = x.dim(0), T = x.dim(1), H = x.dim(2), W = x.dim(3);
    const int64_t Co = w.dim(0), kt = w.dim(2), kh = w.dim(3), kw = w.dim(4);
    DZR_CHECK(w.dim(1) == Ci, "cpu backend: conv3d weight {} vs input channels {}", w.str(), Ci);
    const int64_t k[3] = {kt, kh, kw}, in[3] = {T, H, W};
    int64_t o[3];
    for (int i = 0; i < 3; ++i) {
        DZR_CHECK(p.stride[i] >= 1 && p.pad_before[i] >= 0 && p.pad_after[i] >= 0 && k[i] >= 1,
                  "cpu backend: conv3d needs strides >= 1, paddings >= 0 and a kernel of extent >= 1 (dim {})", i);
        o[i] = (in[i] + p.pad_before[i] + p.pad_after[i] - k[i]) / p.stride[i] + 1;
    }
    DZR_CHECK(out.dim(0) == Co && out.dim(1) == o[0] && out.dim(2) == o[1] && out.dim(3) == o[2],
              "cpu backend: conv3d out {} should be [{}, {}, {}, {}]", out.str(), Co, o[0], o[1], o[2]);
    const float* pb = optional_vec(bias, Co, "conv3d bias");
    cpu::conv3d_f32(p, x, w, pb, out, conv_scratch_);
}

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options) {
    return std::make_unique<CpuBackend>(options);
}

}  // namespace dzr
