// The CPU backend (the reference the CUDA op-parity test compares against) checked against naive
// double-precision loops and closed forms.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/blas_kernels.h"
#include "backend/cpu/cpu_gemm.h"
#include "backend/cpu/cpu_kernels.h"
#include "core/error.h"
#include "core/half.h"
#include "support/test_support.h"

using namespace dzr;
using dzr::test::random_floats;

namespace {

Tensor host(Shape shape, uint64_t seed, float lo = -1.f, float hi = 1.f) {
    return Tensor::host_f32(shape, random_floats(size_t(shape.numel()), seed, lo, hi));
}

const float* f(const TensorView& t) { return static_cast<const float*>(t.data); }
float* fw(const TensorView& t) { return static_cast<float*>(t.data); }

/// Every element within atol + rtol * |ref| (NaN fails).
void check_close(const TensorView& got, const std::vector<double>& ref, double rtol, double atol) {
    REQUIRE(size_t(got.numel()) == ref.size());
    const std::vector<float> g = to_f32_vector(got);
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        const double d = std::fabs(double(g[i]) - ref[i]);
        if (!(d <= atol + rtol * std::fabs(ref[i]))) {
            if (bad++ == 0) first = i;
        }
    }
    INFO("first mismatch at " << first << ": got " << g[first] << ", expected " << ref[first]);
    CHECK(bad == 0);
}

void poison(const TensorView& t) {
    for (int64_t i = 0; i < t.numel(); ++i) fw(t)[i] = NAN;
}

}  // namespace

TEST_CASE("OpenBLAS's Prescott fallback is replaced by the best kernels the CPU runs, and nothing else is") {
    CHECK(better_blas_core("Prescott", true, true) == "SkylakeX");
    CHECK(better_blas_core("PRESCOTT", false, true) == "Haswell");
    CHECK(better_blas_core("Prescott", false, false).empty());
    for (const char* known : {"SkylakeX", "Haswell", "Zen", "Cooperlake", "Sandybridge", ""}) {
        CAPTURE(known);
        CHECK(better_blas_core(known, true, true).empty());
    }
    // This process started through test_main's use_best_blas_kernels: OpenBLAS runs what that rule left it.
    const char* forced = std::getenv("OPENBLAS_CORETYPE");
    if (std::getenv("DZR_BLAS_CORE_SET") != nullptr && forced != nullptr) CHECK(blas_core_name() == forced);
    CHECK(!blas_core_name().empty());
}

TEST_CASE("cpu gemm matches a naive double loop for every transpose combination") {
    auto be = make_cpu_backend();
    const int64_t M = 5, N = 7, K = 3;
    for (int ta = 0; ta < 2; ++ta)
        for (int tb = 0; tb < 2; ++tb) {
            CAPTURE(ta);
            CAPTURE(tb);
            Tensor a = host(ta ? Shape{K, M} : Shape{M, K}, 10 + ta);
            Tensor b = host(tb ? Shape{N, K} : Shape{K, N}, 20 + tb);
            Tensor bias = host({N}, 30);
            Tensor out = host({M, N}, 40);
            const std::vector<float> out0 = to_f32_vector(out);
            GemmParams p;
            p.trans_a = ta;
            p.trans_b = tb;
            p.alpha = 0.75f;
            p.beta = -0.5f;
            be->gemm(p, a, b, bias, out);
            std::vector<double> ref(static_cast<size_t>(M * N));
            for (int64_t m = 0; m < M; ++m)
                for (int64_t n = 0; n < N; ++n) {
                    double acc = 0;
                    for (int64_t k = 0; k < K; ++k) {
                        const double av = ta ? f(a)[k * M + m] : f(a)[m * K + k];
                        const double bv = tb ? f(b)[n * K + k] : f(b)[k * N + n];
                        acc += av * bv;
                    }
                    ref[size_t(m * N + n)] = 0.75 * acc - 0.5 * out0[size_t(m * N + n)] + f(bias)[n];
                }
            check_close(out, ref, 1e-5, 1e-6);
        }
}

TEST_CASE("cpu gemm handles strided rows and a broadcast batch") {
    auto be = make_cpu_backend();
    const int64_t B = 3, M = 4, N = 6, K = 5;
    // a: columns 1..K of a wider [B, M, K + 3] buffer, so its rows are strided.
    Tensor wide = host({B, M, K + 3}, 1);
    TensorView a = wide.view().slice(2, 1, K);
    // b: one [N, K] matrix shared by every batch (batch stride 0).
    Tensor b1 = host({N, K}, 2);
    TensorView b(b1.data(), DType::F32, Shape{B, N, K}, Shape{0, K, 1}, Device::cpu());
    Tensor out = Tensor::host({B, M, N}, DType::F32);
    poison(out);
    be->gemm(GemmParams{}, a, b, {}, out);
    std::vector<double> ref(static_cast<size_t>(B * M * N));
    for (int64_t i = 0; i < B; ++i)
        for (int64_t m = 0; m < M; ++m)
            for (int64_t n = 0; n < N; ++n) {
                double acc = 0;
                for (int64_t k = 0; k < K; ++k)
                    acc += double(f(wide)[(i * M + m) * (K + 3) + 1 + k]) * f(b1)[n * K + k];
                ref[size_t((i * M + m) * N + n)] = acc;
            }
    check_close(out, ref, 1e-5, 1e-6);
}

TEST_CASE("cpu gemm rejects operands whose inner dimensions differ") {
    auto be = make_cpu_backend();
    Tensor a = host({4, 3}, 1), b = host({5, 2}, 2), out = host({4, 5}, 3);
    CHECK_THROWS_AS(be->gemm(GemmParams{}, a, b, {}, out), Error);
}

TEST_CASE("cpu binary ops broadcast a trailing shape and a scalar") {
    auto be = make_cpu_backend();
    Tensor a = host({2, 3, 4}, 1);
    struct Case {
        Shape bshape;
        BinaryOp op;
    };
    for (const Case& c : {Case{{2, 3, 4}, BinaryOp::Sub}, Case{{3, 4}, BinaryOp::Add}, Case{{1, 3, 4}, BinaryOp::Mul},
                          Case{{4}, BinaryOp::Mul}, Case{{1}, BinaryOp::Add}, Case{{3, 4}, BinaryOp::Div},
                          Case{{1}, BinaryOp::Div}}) {
        CAPTURE(c.bshape.str());
        Tensor b = host(c.bshape, 5);
        Tensor out = Tensor::host({2, 3, 4}, DType::F32);
        poison(out);
        be->binary({c.op}, a, b, out);
        std::vector<double> ref(24);
        for (int64_t i = 0; i < 24; ++i) {
            const double x = f(a)[i], y = f(b)[i % b.numel()];
            ref[size_t(i)] = c.op == BinaryOp::Add   ? x + y
                             : c.op == BinaryOp::Sub ? x - y
                             : c.op == BinaryOp::Mul ? x * y
                                                     : x / y;
        }
        check_close(out, ref, 1e-7, 0);  // one f32 rounding of the exact result
    }
    Tensor bad = host({3, 1}, 6), out = Tensor::host({2, 3, 4}, DType::F32);
    CHECK_THROWS_AS(be->binary({BinaryOp::Add}, a, bad, out), Error);
}

TEST_CASE("cpu scale computes alpha x + beta") {
    auto be = make_cpu_backend();
    Tensor x = host({3, 5}, 1), out = Tensor::host({3, 5}, DType::F32);
    be->scale({-2.5f, 0.25f}, x, out);
    std::vector<double> ref(15);
    for (int i = 0; i < 15; ++i) ref[size_t(i)] = -2.5 * f(x)[i] + 0.25;
    check_close(out, ref, 1e-7, 0);
}

TEST_CASE("cpu activations match their closed forms") {
    auto be = make_cpu_backend();
    Tensor x = host({4, 33}, 7, -6.f, 6.f);
    // Known values at x = 1 pin the formulas themselves.
    fw(x)[0] = 1.f;
    const struct {
        Activation kind;
        double at_one;
    } cases[] = {{Activation::GeluTanh, 0.8411919906082768},
                 {Activation::GeluErf, 0.8413447460685429},
                 {Activation::Silu, 0.7310585786300049},
                 {Activation::Relu, 1.0},
                 {Activation::Sigmoid, 0.7310585786300049},
                 {Activation::GeluTanhStepwise, 0.8411919906082768}};
    for (const auto& c : cases) {
        CAPTURE(int(c.kind));
        Tensor out = Tensor::host(x.shape(), DType::F32);
        poison(out);
        be->activation({c.kind}, x, out);
        std::vector<double> ref(size_t(x.numel()));
        for (int64_t i = 0; i < x.numel(); ++i) {
            const double v = f(x)[i];
            switch (c.kind) {
                case Activation::GeluTanh:
                case Activation::GeluTanhStepwise:  // f32: the same function (its bf16 steps round on CUDA only)
                    ref[size_t(i)] = 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
                    break;
                case Activation::Sigmoid:
                    ref[size_t(i)] = 1 / (1 + std::exp(-v));
                    break;
                case Activation::GeluErf:
                    ref[size_t(i)] = 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
                    break;
                case Activation::Silu:
                    ref[size_t(i)] = v / (1 + std::exp(-v));
                    break;
                case Activation::Relu:
                    ref[size_t(i)] = v > 0 ? v : 0;
                    break;
            }
        }
        check_close(out, ref, 1e-6, 1e-7);
        CHECK(f(out)[0] == doctest::Approx(c.at_one).epsilon(1e-6));
    }
}

TEST_CASE("cpu silu and gelu stay accurate over the whole float range and ignore an element's position") {
    auto be = make_cpu_backend();
    // a sweep from -100 to 100, past the range where exp(-x) over- or underflows in float
    const int64_t n = 4003;
    Tensor x = Tensor::host({n}, DType::F32);
    for (int64_t i = 0; i < n; ++i) fw(x)[i] = -100.f + 200.f * float(i) / float(n - 1);
    for (const Activation kind : {Activation::Silu, Activation::GeluTanh}) {
        CAPTURE(int(kind));
        Tensor out = Tensor::host({n}, DType::F32);
        poison(out);
        be->activation({kind}, x, out);
        std::vector<double> ref(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) {
            const double v = f(x)[i];
            ref[size_t(i)] = kind == Activation::Silu
                                 ? v / (1 + std::exp(-v))
                                 : 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
        }
        // relative 1e-6; below ~1e-12 the tanh form itself cancels to zero, and silu may return a tiny
        // value where exp(-x) leaves the float range
        check_close(out, ref, 1e-6, 1e-12);
        // the same values at other offsets (and so other lanes, or the tail) give the same bits
        for (const int64_t shift : {1, 2, 3}) {
            Tensor shifted = Tensor::host({n - shift}, DType::F32), shifted_out = Tensor::host({n - shift}, DType::F32);
            std::memcpy(shifted.data(), f(x) + shift, size_t(n - shift) * sizeof(float));
            be->activation({kind}, shifted, shifted_out);
            CHECK(std::memcmp(f(shifted_out), f(out) + shift, size_t(n - shift) * sizeof(float)) == 0);
        }
    }
    // in place, and NaN stays NaN
    Tensor y = Tensor::host_f32({5}, {0.f, 1.f, -1.f, NAN, 30.f});
    be->activation({Activation::Silu}, y, y);
    CHECK(f(y)[0] == 0.f);
    CHECK(f(y)[1] == doctest::Approx(0.7310585786300049).epsilon(1e-7));
    CHECK(f(y)[2] == doctest::Approx(-0.2689414213699951).epsilon(1e-7));
    CHECK(std::isnan(f(y)[3]));
    CHECK(f(y)[4] == 30.f);
}

TEST_CASE("cpu layer norm and rms norm match double loops") {
    auto be = make_cpu_backend();
    const int64_t R = 6, C = 37;
    Tensor x = host({R, C}, 3, -2.f, 3.f), w = host({C}, 4), b = host({C}, 5);
    for (int with_params = 0; with_params < 2; ++with_params) {
        CAPTURE(with_params);
        Tensor ln = Tensor::host({R, C}, DType::F32), rn = Tensor::host({R, C}, DType::F32);
        poison(ln);
        poison(rn);
        be->layer_norm({1e-5f}, x, with_params ? w.view() : TensorView{}, with_params ? b.view() : TensorView{}, ln);
        be->rms_norm({1e-6f}, x, with_params ? w.view() : TensorView{}, rn);
        std::vector<double> ref_ln(size_t(R * C)), ref_rn(size_t(R * C));
        for (int64_t r = 0; r < R; ++r) {
            double mean = 0, ss = 0;
            for (int64_t c = 0; c < C; ++c) mean += f(x)[r * C + c];
            mean /= C;
            double var = 0;
            for (int64_t c = 0; c < C; ++c) {
                const double d = f(x)[r * C + c] - mean;
                var += d * d;
                ss += double(f(x)[r * C + c]) * f(x)[r * C + c];
            }
            var /= C;
            for (int64_t c = 0; c < C; ++c) {
                const double v = f(x)[r * C + c];
                const double wv = with_params ? f(w)[c] : 1.0, bv = with_params ? f(b)[c] : 0.0;
                ref_ln[size_t(r * C + c)] = (v - mean) / std::sqrt(var + 1e-5) * wv + bv;
                ref_rn[size_t(r * C + c)] = v / std::sqrt(ss / C + 1e-6) * wv;
            }
        }
        check_close(ln, ref_ln, 1e-5, 1e-6);
        check_close(rn, ref_rn, 1e-5, 1e-6);
    }
    // A known row: [1, 2, 3, 4] has mean 2.5 and variance 1.25.
    Tensor row = Tensor::host_f32({1, 4}, {1, 2, 3, 4}), out = Tensor::host({1, 4}, DType::F32);
    be->layer_norm({0.f}, row, {}, {}, out);
    CHECK(f(out)[0] == doctest::Approx(-1.5 / std::sqrt(1.25)).epsilon(1e-6));
    CHECK(f(out)[3] == doctest::Approx(1.5 / std::sqrt(1.25)).epsilon(1e-6));
}

TEST_CASE("cpu softmax and reductions match double loops") {
    auto be = make_cpu_backend();
    const int64_t R = 5, C = 19;
    Tensor x = host({R, C}, 9, -4.f, 4.f);
    Tensor sm = Tensor::host({R, C}, DType::F32);
    be->softmax({0.7f}, x, sm);
    std::vector<double> ref(static_cast<size_t>(R * C));
    for (int64_t r = 0; r < R; ++r) {
        double mx = -INFINITY, sum = 0;
        for (int64_t c = 0; c < C; ++c) mx = std::max(mx, 0.7 * f(x)[r * C + c]);
        for (int64_t c = 0; c < C; ++c) sum += std::exp(0.7 * f(x)[r * C + c] - mx);
        for (int64_t c = 0; c < C; ++c) ref[size_t(r * C + c)] = std::exp(0.7 * f(x)[r * C + c] - mx) / sum;
    }
    check_close(sm, ref, 1e-6, 1e-8);

    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max}) {
        CAPTURE(int(op));
        Tensor out = Tensor::host({R}, DType::F32);
        poison(out);
        be->reduce({op}, x, out);
        std::vector<double> rr(static_cast<size_t>(R));
        for (int64_t r = 0; r < R; ++r) {
            double acc = op == ReduceOp::Max ? -INFINITY : 0.0;
            for (int64_t c = 0; c < C; ++c)
                acc = op == ReduceOp::Max ? std::max<double>(acc, f(x)[r * C + c]) : acc + f(x)[r * C + c];
            rr[size_t(r)] = op == ReduceOp::Mean ? acc / C : acc;
        }
        check_close(out, rr, 1e-6, 1e-7);
    }
}

TEST_CASE("cpu rope rotates interleaved pairs and leaves pairs past the table unchanged") {
    auto be = make_cpu_backend();
    const int64_t L = 3, H = 2, D = 8, P = 3;  // partial: pairs 3 of 4 rotate
    Tensor x = host({L, H, D}, 11);
    std::vector<float> tab(size_t(L * P * 2));
    for (int64_t l = 0; l < L; ++l)
        for (int64_t j = 0; j < P; ++j) {
            const double ang = (l + 1) * std::pow(10000.0, -double(j) / P);
            tab[size_t((l * P + j) * 2)] = float(std::cos(ang));
            tab[size_t((l * P + j) * 2 + 1)] = float(std::sin(ang));
        }
    Tensor table = Tensor::host_f32({L, P, 2}, tab);
    std::vector<double> ref(static_cast<size_t>(L * H * D));
    for (int64_t l = 0; l < L; ++l)
        for (int64_t h = 0; h < H; ++h)
            for (int64_t j = 0; j < D / 2; ++j) {
                const int64_t o = (l * H + h) * D + 2 * j;
                const double x0 = f(x)[o], x1 = f(x)[o + 1];
                if (j < P) {
                    const double c = tab[size_t((l * P + j) * 2)], s = tab[size_t((l * P + j) * 2 + 1)];
                    ref[size_t(o)] = x0 * c - x1 * s;
                    ref[size_t(o + 1)] = x0 * s + x1 * c;
                } else {
                    ref[size_t(o)] = x0;
                    ref[size_t(o + 1)] = x1;
                }
            }
    Tensor out = Tensor::host({L, H, D}, DType::F32);
    poison(out);
    be->rope({}, x, table, out);
    check_close(out, ref, 1e-6, 1e-7);
    be->rope({}, x, table, x);  // in place
    check_close(x, ref, 1e-6, 1e-7);
}

TEST_CASE("cpu rope with a double-float table rotates in double and rounds once to f32") {
    auto be = make_cpu_backend();
    const int64_t L = 4, H = 3, D = 8, P = 4;
    Tensor x = host({L, H, D}, 12);
    std::vector<float> tab(size_t(L * P * 4));
    std::vector<double> cosv(size_t(L * P)), sinv(size_t(L * P));
    for (int64_t i = 0; i < L * P; ++i) {
        const double ang = 0.37 * double(i + 1);
        const double c = std::cos(ang), s = std::sin(ang);
        float* e = &tab[size_t(i * 4)];
        e[0] = float(c), e[1] = float(c - double(e[0])), e[2] = float(s), e[3] = float(s - double(e[2]));
        cosv[size_t(i)] = double(e[0]) + double(e[1]);
        sinv[size_t(i)] = double(e[2]) + double(e[3]);
    }
    Tensor table = Tensor::host_f32({L, P, 4}, tab);
    Tensor out = Tensor::host({L, H, D}, DType::F32);
    poison(out);
    be->rope({}, x, table, out);
    size_t bad = 0;
    for (int64_t l = 0; l < L; ++l)
        for (int64_t h = 0; h < H; ++h)
            for (int64_t j = 0; j < P; ++j) {
                const int64_t o = (l * H + h) * D + 2 * j;
                const double x0 = f(x)[o], x1 = f(x)[o + 1], c = cosv[size_t(l * P + j)], s = sinv[size_t(l * P + j)];
                bad += f(out)[o] != float(x0 * c - x1 * s);
                bad += f(out)[o + 1] != float(x0 * s + x1 * c);
            }
    CHECK(bad == 0);
}

TEST_CASE("cpu attention matches a naive loop on strided q, k, v with a bias") {
    auto be = make_cpu_backend();
    const int64_t Lq = 5, Lk = 7, H = 2, D = 4;
    // q, k, v are slices of fused [L, 3, H, D] buffers, so their token rows are strided.
    Tensor fq = host({Lq, 3, H, D}, 21), fkv = host({Lk, 3, H, D}, 22, -2.f, 2.f);
    const auto part = [&](const Tensor& t, int64_t L, int i) {
        return TensorView(fw(t) + i * H * D, DType::F32, Shape{L, H, D}, Shape{3 * H * D, D, 1}, Device::cpu());
    };
    const TensorView q = part(fq, Lq, 0), k = part(fkv, Lk, 1), v = part(fkv, Lk, 2);
    Tensor bias = host({H, Lq, Lk}, 23);
    const float scale = 0.5f;
    for (int with_bias = 0; with_bias < 2; ++with_bias) {
        CAPTURE(with_bias);
        Tensor out = Tensor::host({Lq, H, D}, DType::F32);
        poison(out);
        be->attention({scale}, q, k, v, with_bias ? bias.view() : TensorView{}, out);
        std::vector<double> ref(static_cast<size_t>(Lq * H * D));
        for (int64_t h = 0; h < H; ++h)
            for (int64_t i = 0; i < Lq; ++i) {
                std::vector<double> w(static_cast<size_t>(Lk));
                double mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j < Lk; ++j) {
                    double dot = 0;
                    for (int64_t d = 0; d < D; ++d)
                        dot += double(f(q)[i * 3 * H * D + h * D + d]) * f(k)[j * 3 * H * D + h * D + d];
                    w[size_t(j)] = scale * dot + (with_bias ? f(bias)[(h * Lq + i) * Lk + j] : 0.0);
                    mx = std::max(mx, w[size_t(j)]);
                }
                for (auto& e : w) sum += (e = std::exp(e - mx));
                for (int64_t d = 0; d < D; ++d) {
                    double acc = 0;
                    for (int64_t j = 0; j < Lk; ++j) acc += w[size_t(j)] / sum * f(v)[j * 3 * H * D + h * D + d];
                    ref[size_t((i * H + h) * D + d)] = acc;
                }
            }
        check_close(out, ref, 1e-5, 1e-6);
    }
}

TEST_CASE("cpu attention over zero keys writes zeros") {
    auto be = make_cpu_backend();
    Tensor q = host({3, 2, 4}, 1), k = Tensor::host({0, 2, 4}, DType::F32), v = Tensor::host({0, 2, 4}, DType::F32);
    Tensor out = Tensor::host({3, 2, 4}, DType::F32);
    poison(out);
    be->attention({1.f}, q, k, v, {}, out);
    check_close(out, std::vector<double>(24, 0.0), 0, 0);
}

TEST_CASE("cpu conv3d matches a naive loop with causal padding and strides") {
    auto be = make_cpu_backend();
    const int64_t Ci = 3, Co = 4, T = 5, Hh = 6, W = 7;
    Tensor x = host({Ci, T, Hh, W}, 31), w = host({Co, Ci, 3, 3, 2}, 32), bias = host({Co}, 33);
    struct Case {
        int stride[3], pb[3], pa[3];
    };
    for (const Case& c : {Case{{1, 1, 1}, {2, 1, 1}, {0, 1, 0}}, Case{{2, 2, 1}, {1, 0, 1}, {1, 2, 0}}}) {
        Conv3dParams p;
        for (int i = 0; i < 3; ++i) {
            p.stride[i] = c.stride[i];
            p.pad_before[i] = c.pb[i];
            p.pad_after[i] = c.pa[i];
        }
        const int64_t k[3] = {3, 3, 2}, in[3] = {T, Hh, W};
        int64_t o[3];
        for (int i = 0; i < 3; ++i) o[i] = (in[i] + c.pb[i] + c.pa[i] - k[i]) / c.stride[i] + 1;
        Tensor out = Tensor::host({Co, o[0], o[1], o[2]}, DType::F32);
        poison(out);
        be->conv3d(p, x, w, bias, out);
        std::vector<double> ref(size_t(out.numel()));
        for (int64_t co = 0; co < Co; ++co)
            for (int64_t ot = 0; ot < o[0]; ++ot)
                for (int64_t oh = 0; oh < o[1]; ++oh)
                    for (int64_t ow = 0; ow < o[2]; ++ow) {
                        double acc = f(bias)[co];
                        for (int64_t ci = 0; ci < Ci; ++ci)
                            for (int64_t a = 0; a < k[0]; ++a)
                                for (int64_t b = 0; b < k[1]; ++b)
                                    for (int64_t e = 0; e < k[2]; ++e) {
                                        const int64_t it = ot * c.stride[0] - c.pb[0] + a;
                                        const int64_t ih = oh * c.stride[1] - c.pb[1] + b;
                                        const int64_t iw = ow * c.stride[2] - c.pb[2] + e;
                                        if (it < 0 || it >= T || ih < 0 || ih >= Hh || iw < 0 || iw >= W) continue;
                                        acc += double(f(x)[((ci * T + it) * Hh + ih) * W + iw]) *
                                               f(w)[(((co * Ci + ci) * 3 + a) * 3 + b) * 2 + e];
                                    }
                        ref[size_t(((co * o[0] + ot) * o[1] + oh) * o[2] + ow)] = acc;
                    }
        check_close(out, ref, 1e-5, 1e-6);
    }
}

namespace {

struct ConvCase {
    int64_t Ci, Co, T, H, W;
    int k[3], stride[3], pb[3], pa[3];
    bool bias;
};

/// The output extents of a conv case.
std::array<int64_t, 3> conv_out(const ConvCase& c) {
    const int64_t in[3] = {c.T, c.H, c.W};
    std::array<int64_t, 3> o{};
    for (int i = 0; i < 3; ++i) o[size_t(i)] = (in[i] + c.pb[i] + c.pa[i] - c.k[i]) / c.stride[i] + 1;
    return o;
}

/// Naive zero-padded convolution in double; `mag` gets each output's sum of |bias| and |x * w| (the scale
/// of f32 rounding in a long dot product).
std::vector<double> naive_conv(const ConvCase& c, const float* x, const float* w, const float* bias,
                               std::vector<double>& mag) {
    const auto o = conv_out(c);
    std::vector<double> ref(size_t(c.Co * o[0] * o[1] * o[2]));
    mag.assign(ref.size(), 0.0);
    for (int64_t co = 0; co < c.Co; ++co)
        for (int64_t ot = 0; ot < o[0]; ++ot)
            for (int64_t oh = 0; oh < o[1]; ++oh)
                for (int64_t ow = 0; ow < o[2]; ++ow) {
                    double acc = bias ? bias[co] : 0.0, sum_abs = std::fabs(acc);
                    for (int64_t ci = 0; ci < c.Ci; ++ci)
                        for (int64_t a = 0; a < c.k[0]; ++a)
                            for (int64_t b = 0; b < c.k[1]; ++b)
                                for (int64_t e = 0; e < c.k[2]; ++e) {
                                    const int64_t it = ot * c.stride[0] - c.pb[0] + a;
                                    const int64_t ih = oh * c.stride[1] - c.pb[1] + b;
                                    const int64_t iw = ow * c.stride[2] - c.pb[2] + e;
                                    if (it < 0 || it >= c.T || ih < 0 || ih >= c.H || iw < 0 || iw >= c.W) continue;
                                    const double t = double(x[((ci * c.T + it) * c.H + ih) * c.W + iw]) *
                                                     w[(((co * c.Ci + ci) * c.k[0] + a) * c.k[1] + b) * c.k[2] + e];
                                    acc += t;
                                    sum_abs += std::fabs(t);
                                }
                    const size_t i = size_t(((co * o[0] + ot) * o[1] + oh) * o[2] + ow);
                    ref[i] = acc;
                    mag[i] = sum_abs;
                }
    return ref;
}

Conv3dParams conv_params(const ConvCase& c) {
    Conv3dParams p;
    for (int i = 0; i < 3; ++i) {
        p.stride[i] = c.stride[i];
        p.pad_before[i] = c.pb[i];
        p.pad_after[i] = c.pa[i];
    }
    return p;
}

}  // namespace

TEST_CASE("cpu conv3d matches a naive loop for the VAE's kernel shapes, channel counts and widths") {
    auto be = make_cpu_backend();
    // Channel counts off the 4-channel tiles, widths off the 8/16-column tiles, the VAE's kernels
    // (3x3x3 causal, 1x3x3 stride-2 downsample with right/bottom padding, 3x1x1 stride-2 time conv,
    // 1x1x1 shortcut), a stride-3 width, and wide convs that take the im2col + GEMM path.
    const ConvCase cases[] = {
        {4, 4, 4, 6, 40, {3, 3, 3}, {1, 1, 1}, {2, 1, 1}, {0, 1, 1}, true},
        {3, 5, 3, 5, 21, {3, 3, 3}, {1, 1, 1}, {2, 1, 1}, {0, 1, 1}, true},
        {8, 3, 1, 4, 37, {3, 3, 3}, {1, 1, 1}, {2, 1, 1}, {0, 1, 1}, false},
        {5, 6, 2, 7, 19, {1, 3, 3}, {1, 2, 2}, {0, 0, 0}, {0, 1, 1}, true},
        {6, 6, 5, 3, 9, {3, 1, 1}, {2, 1, 1}, {0, 0, 0}, {0, 0, 0}, true},
        {7, 9, 2, 3, 17, {1, 1, 1}, {1, 1, 1}, {0, 0, 0}, {0, 0, 0}, true},
        {2, 4, 3, 4, 23, {2, 2, 5}, {1, 2, 3}, {1, 0, 2}, {0, 1, 2}, true},
        {1, 1, 1, 1, 1, {1, 1, 1}, {1, 1, 1}, {0, 0, 0}, {0, 0, 0}, true},
        {16, 64, 3, 5, 11, {3, 3, 3}, {1, 1, 1}, {2, 1, 1}, {0, 1, 1}, true},
        {32, 66, 2, 6, 9, {1, 3, 3}, {1, 2, 2}, {0, 0, 0}, {0, 1, 1}, false},
    };
    uint64_t seed = 100;
    for (const ConvCase& c : cases) {
        CAPTURE(c.Ci);
        CAPTURE(c.Co);
        CAPTURE(c.W);
        Tensor x = host({c.Ci, c.T, c.H, c.W}, ++seed), w = host({c.Co, c.Ci, c.k[0], c.k[1], c.k[2]}, ++seed),
               bias = host({c.Co}, ++seed);
        const auto o = conv_out(c);
        std::vector<double> mag;
        const std::vector<double> ref = naive_conv(c, f(x), f(w), c.bias ? f(bias) : nullptr, mag);
        // the backend's choice, then every kernel forced
        for (int k = 0; k < 4; ++k) {
            const auto kernel = static_cast<cpu::ConvKernel>(k);
            CAPTURE(k);
            Tensor out = Tensor::host({c.Co, o[0], o[1], o[2]}, DType::F32);
            poison(out);
            if (kernel == cpu::ConvKernel::Auto) {
                be->conv3d(conv_params(c), x, w, c.bias ? bias.view() : TensorView{}, out);
            } else {
                std::vector<float> scratch;
                cpu::conv3d_f32(conv_params(c), x, w, c.bias ? f(bias) : nullptr, out, scratch, kernel);
            }
            // 1e-5 relative, plus f32 summation error of up to 1e-7 of the summed magnitudes (a few
            // hundred taps that cancel); a wrong or missing tap is off by ~0.1 or more
            size_t bad = 0;
            for (size_t i = 0; i < ref.size(); ++i) {
                const double d = std::fabs(double(f(out)[i]) - ref[i]);
                bad += !(d <= 1e-5 * std::fabs(ref[i]) + 1e-6 + 1e-7 * mag[i]);
            }
            CHECK(bad == 0);
        }
    }
    MESSAGE("direct conv SIMD kernel (AVX2 + FMA) available: " << cpu::conv_simd_available());
}

TEST_CASE("cpu conv3d gives the same bits for a frame whatever the clip split and spatial extent around it") {
    // A causal 3x3x3 conv over 7 frames at once, and over [frames 3..4 | frames 5..6] with the two
    // history frames supplied instead of padded: output frames 5 and 6 must be bit-identical (the VAE's
    // chunked encode relies on it).
    auto be = make_cpu_backend();
    for (const int64_t C : {int64_t(4), int64_t(64)}) {  // the direct path and the GEMM path (Auto)
        CAPTURE(C);
        const int64_t T = 7, H = 9, W = 27;
        Tensor x = host({C, T, H, W}, 200 + uint64_t(C)), w = host({C, C, 3, 3, 3}, 201), bias = host({C}, 202);
        Conv3dParams whole;
        whole.pad_before[0] = 2;
        whole.pad_before[1] = whole.pad_before[2] = whole.pad_after[1] = whole.pad_after[2] = 1;
        Tensor full = Tensor::host({C, T, H, W}, DType::F32);
        be->conv3d(whole, x, w, bias, full);

        Tensor tail = Tensor::host({C, 4, H, W}, DType::F32);  // input frames 3..6
        be->copy(x.view().slice(1, 3, 4), tail);
        Conv3dParams chunk = whole;
        chunk.pad_before[0] = 0;
        Tensor part = Tensor::host({C, 2, H, W}, DType::F32);
        be->conv3d(chunk, tail, w, bias, part);
        size_t differ = 0;
        for (int64_t c = 0; c < C; ++c)
            for (int64_t t = 0; t < 2; ++t)
                differ += std::memcmp(f(part) + (c * 2 + t) * H * W, f(full) + (c * T + 5 + t) * H * W,
                                      size_t(H * W) * sizeof(float)) != 0;
        CHECK(differ == 0);
    }
}

TEST_CASE("cpu copy of permuted, sliced and broadcast views matches direct indexing") {
    auto be = make_cpu_backend();
    auto expect_equal = [&](const TensorView& src, auto index) {
        Tensor dst = Tensor::host(src.shape, src.dtype);
        be->copy(src, dst);
        const std::vector<float> got = to_f32_vector(dst);
        size_t bad = 0;
        for (int64_t i = 0; i < src.numel(); ++i) bad += got[size_t(i)] != index(i);
        CHECK(bad == 0);
    };
    // channels-first <-> channels-last, with channel counts below and above the 32-element tile
    for (const int64_t C : {int64_t(3), int64_t(45)}) {
        const int64_t T = 2, H = 5, W = 7;
        Tensor x = host({C, T, H, W}, 300 + uint64_t(C));
        // [C, T, H, W] -> [T, H, W, C]
        expect_equal(x.view().permute({1, 2, 3, 0}), [&](int64_t i) {
            const int64_t c = i % C, p = i / C;  // p = (t * H + h) * W + w
            return f(x)[c * T * H * W + p];
        });
        Tensor y = host({T, H, W, C}, 310 + uint64_t(C));
        // [T, H, W, C] -> [C, T, H, W]
        expect_equal(y.view().permute({3, 0, 1, 2}), [&](int64_t i) {
            const int64_t p = i % (T * H * W), c = i / (T * H * W);
            return f(y)[p * C + c];
        });
    }
    // a slice along an inner dim, then a transpose of a slice
    Tensor z = host({4, 9, 33}, 320);
    expect_equal(z.view().slice(1, 2, 5), [&](int64_t i) {
        const int64_t k = i % 33, j = (i / 33) % 5, b = i / (33 * 5);
        return f(z)[(b * 9 + j + 2) * 33 + k];
    });
    expect_equal(z.view().slice(2, 1, 30).transpose(1, 2), [&](int64_t i) {  // [4, 30, 9]
        const int64_t j = i % 9, k = (i / 9) % 30, b = i / (9 * 30);
        return f(z)[(b * 9 + j) * 33 + k + 1];
    });
    // nearest x2 upsampling as a stride-0 broadcast view [C, H, 2, W, 2]
    Tensor u = host({3, 4, 5}, 330);
    const TensorView up(u.data(), DType::F32, Shape{3, 4, 2, 5, 2}, Shape{20, 5, 0, 1, 0}, Device::cpu());
    expect_equal(up, [&](int64_t i) {
        const int64_t w = (i / 2) % 5, h = (i / 20) % 4, c = i / 80;
        return f(u)[(c * 4 + h) * 5 + w];
    });
    // non-float dtypes copy their bits the same way
    Tensor ints = Tensor::host({6, 11}, DType::I32);
    for (int64_t i = 0; i < 66; ++i) ints.ptr<int32_t>()[i] = int32_t(i * 7 - 100);
    Tensor ints_t = Tensor::host({11, 6}, DType::I32);
    be->copy(ints.view().transpose(0, 1), ints_t);
    size_t bad = 0;
    for (int64_t r = 0; r < 11; ++r)
        for (int64_t c = 0; c < 6; ++c) bad += ints_t.ptr<int32_t>()[r * 6 + c] != int32_t((c * 11 + r) * 7 - 100);
    CHECK(bad == 0);
    // and mismatched element counts are still rejected
    Tensor small = Tensor::host({5}, DType::F32);
    CHECK_THROWS_AS(be->copy(z.view().slice(1, 2, 5), small), Error);
}

TEST_CASE("cpu copy converts dtypes from a permuted source and fill sets every element") {
    auto be = make_cpu_backend();
    Tensor x = host({2, 3, 4}, 41, -300.f, 300.f);
    const TensorView perm = x.view().permute({2, 0, 1});  // [2, 3, 4] -> [4, 2, 3]
    Tensor bf = Tensor::host({4, 2, 3}, DType::BF16);
    be->copy(perm, bf);
    const auto* raw = static_cast<const uint16_t*>(bf.data());
    for (int64_t i = 0; i < 4; ++i)
        for (int64_t j = 0; j < 2; ++j)
            for (int64_t l = 0; l < 3; ++l) {
                const float src = f(x)[(j * 3 + l) * 4 + i];
                CHECK(raw[(i * 2 + j) * 3 + l] == f32_to_bf16(src));
            }
    Tensor back = Tensor::host({4, 2, 3}, DType::F32);
    be->download(bf, back);
    for (int64_t i = 0; i < 24; ++i) CHECK(f(back)[i] == bf16_to_f32(raw[i]));

    Tensor filled = Tensor::host({5, 3}, DType::F32);
    be->fill(filled, -1.25f);
    for (int64_t i = 0; i < 15; ++i) CHECK(f(filled)[i] == -1.25f);
}

TEST_CASE("cpu relu and max keep NaN and count_nonfinite counts NaN and infinities") {
    auto be = make_cpu_backend(1 << 20);
    const float nan = std::nanf(""), inf = INFINITY;
    Tensor x = Tensor::host_f32(Shape{2, 4}, {-1.f, nan, 2.f, -0.f, inf, -inf, 0.5f, nan});
    Tensor y = Tensor::host(Shape{2, 4}, DType::F32);
    be->activation({Activation::Relu}, x, y);
    // NOTE: relu(NaN) is NaN, as torch.relu: a ReLU that turns NaN into 0 hid NaN weights from every check.
    CHECK(f(y)[0] == 0.f);
    CHECK(std::isnan(f(y)[1]));
    CHECK(f(y)[2] == 2.f);
    CHECK(f(y)[3] == 0.f);
    CHECK(f(y)[4] == inf);
    CHECK(f(y)[5] == 0.f);
    CHECK(std::isnan(f(y)[7]));

    Tensor mx = Tensor::host(Shape{2}, DType::F32);
    be->reduce({ReduceOp::Max}, x, mx);
    CHECK(std::isnan(f(mx)[0]));
    CHECK(std::isnan(f(mx)[1]));

    Tensor count = Tensor::host(Shape{1}, DType::I32);
    be->count_nonfinite(x, count);
    CHECK(count.ptr<int32_t>()[0] == 4);
    be->count_nonfinite(y, count);
    CHECK(count.ptr<int32_t>()[0] == 3);  // NaN, inf, NaN
}

TEST_CASE("the CPU GEMM gives the same bits on any number of threads") {
    // NOTE: OpenBLAS alone changes the last bits with its thread count at shapes like these (few rows: its small-
    // matrix and gemv-like paths), which made `mpirun -np 2` differ from one process
    struct Shape {
        int64_t M, N, K;
        bool ta, tb;
    };
    for (const Shape s : {Shape{3, 1000, 6000, false, true}, Shape{300, 600, 128, false, false},
                          Shape{1500, 700, 64, true, false}, Shape{1, 5120, 5120, false, true}}) {
        const auto a = test::random_floats(size_t(s.M * s.K), 1), b = test::random_floats(size_t(s.N * s.K), 2);
        auto run = [&](int threads) {
            cpu::set_gemm_threads(threads);
            std::vector<float> c(size_t(s.M * s.N), 0.5f);
            cpu::sgemm({s.ta, s.tb, s.M, s.N, s.K, 0.75f, a.data(), s.ta ? s.M : s.K, b.data(), s.tb ? s.K : s.N,
                        0.25f, c.data(), s.N});
            return c;
        };
        const int saved = cpu::gemm_threads();
        const auto one = run(1), two = run(2), five = run(5);
        cpu::set_gemm_threads(saved);
        CHECK(std::memcmp(one.data(), two.data(), one.size() * 4) == 0);
        CHECK(std::memcmp(one.data(), five.data(), one.size() * 4) == 0);
        // and it is the product: one element against a double-precision sum
        const int64_t m = s.M - 1, n = s.N / 2;
        double ref = 0;
        for (int64_t k = 0; k < s.K; ++k)
            ref += double(a[size_t(s.ta ? k * s.M + m : m * s.K + k)]) * b[size_t(s.tb ? n * s.K + k : k * s.N + n)];
        CHECK(std::fabs(one[size_t(m * s.N + n)] - (0.75 * ref + 0.125)) < 1e-2);
    }
}
