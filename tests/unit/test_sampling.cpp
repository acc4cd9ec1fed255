// FlowUniPC: the schedule against the spec's verified table, the per-step scalars against closed forms
// computed here in double, and the Backend sampler against the literal host port.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "backend/backend.h"
#include "core/convert.h"
#include "core/error.h"
#include "sampling/flow_unipc.h"
#include "support/test_support.h"

using namespace dzr;

namespace {

// dreamzero-reference.md §3.1 (verified by running the official scheduler).
constexpr int64_t kRefTimesteps[16] = {999, 986, 972, 955, 937, 916, 892, 865,
                                       833, 795, 749, 694, 624, 535, 416, 249};
constexpr double kRefSigmas[17] = {0.9997998476028442,
                                   0.9866341948509216,
                                   0.9720060229301453,
                                   0.9556572437286377,
                                   0.9372654557228088,
                                   0.9164220690727234,
                                   0.8926018476486206,
                                   0.865118145942688,
                                   0.8330553770065308,
                                   0.7951651215553284,
                                   0.7496998310089111,
                                   0.6941356062889099,
                                   0.6246873736381531,
                                   0.5354080200195312,
                                   0.4163888096809387,
                                   0.2497999668121338,
                                   0.0};

double lambda_d(double sigma) {
    return std::log(1.0 - sigma) - std::log(sigma);
}

// Relative closeness. NOTE: the coefficients come from float32 primitives (as in the reference), whose
// cancellation in (phi/hh - 1) costs up to ~1e-5 relative against these double closed forms.
bool close(double a, double b, double rel) {
    return std::fabs(a - b) <= rel * std::fabs(b) + 1e-9;
}

}  // namespace

TEST_CASE("flow schedule reproduces the reference's 16 timesteps and float32 sigmas exactly") {
    const FlowSchedule s = make_flow_schedule({});
    REQUIRE(s.timesteps.size() == 16);
    REQUIRE(s.sigmas.size() == 17);
    for (int i = 0; i < 16; ++i) CHECK(s.timesteps[size_t(i)] == kRefTimesteps[i]);
    for (int i = 0; i < 17; ++i) CHECK(s.sigmas[size_t(i)] == float(kRefSigmas[i]));
}

TEST_CASE("flow schedule follows step count and shift: shift 1 is the plain linspace") {
    const double sigma_max = double(0.999f);
    const FlowSchedule s = make_flow_schedule({4, 1.0, 1000});
    REQUIRE(s.sigmas.size() == 5);
    for (int i = 0; i < 4; ++i) {
        const double lin = sigma_max * double(4 - i) / 4.0;  // exact: sigma_max has 24 significant bits
        CHECK(s.sigmas[size_t(i)] == float(lin));
        CHECK(s.timesteps[size_t(i)] == int64_t(lin * 1000.0));
    }
    CHECK(s.sigmas[4] == 0.f);
    // shift 3 with 2 steps: sigma_1 = 3 s / (1 + 2 s) with s = sigma_max / 2 = 0.4995..., t = 749.62 -> 749
    const FlowSchedule s3 = make_flow_schedule({2, 3.0, 1000});
    const double half = sigma_max / 2.0;
    CHECK(s3.sigmas[1] == float(3.0 * half / (1.0 + 2.0 * half)));
    CHECK(s3.timesteps[1] == 749);
    CHECK(s3.timesteps[0] == 999);
}

TEST_CASE("flow schedule rejects impossible configurations") {
    CHECK_THROWS_AS(make_flow_schedule({0, 5.0, 1000}), Error);
    CHECK_THROWS_AS(make_flow_schedule({16, 0.0, 1000}), Error);
    CHECK_THROWS_AS(make_flow_schedule({16, -1.0, 1000}), Error);
    CHECK_THROWS_AS(make_flow_schedule({16, 5.0, 1}), Error);
}

TEST_CASE("unipc orders follow warm-up and lower_order_final") {
    const auto steps = make_unipc_steps(make_flow_schedule({}));
    REQUIRE(steps.size() == 16);
    CHECK(steps[0].predictor.order == 1);
    CHECK(steps[0].corrector.order == 0);
    for (int i = 1; i <= 14; ++i) CHECK(steps[size_t(i)].predictor.order == 2);
    CHECK(steps[15].predictor.order == 1);
    CHECK(steps[1].corrector.order == 1);
    for (int i = 2; i <= 15; ++i) CHECK(steps[size_t(i)].corrector.order == 2);
    const auto one = make_unipc_steps(make_flow_schedule({1, 5.0, 1000}));
    REQUIRE(one.size() == 1);
    CHECK(one[0].predictor.order == 1);
}

TEST_CASE("unipc first-order scalars match the closed form of DPM-Solver-1 in x0 form") {
    // p = 1 predictor: x_t = sigma_t/sigma_s x - alpha_t expm1(-h) m, and -alpha_t expm1(-h) =
    // alpha_t (1 - e^{-h}) = alpha_t - sigma_t alpha_s / sigma_s because e^{-h} = sigma_t alpha_s / (alpha_t
    // sigma_s).
    const FlowSchedule sched = make_flow_schedule({});
    const auto steps = make_unipc_steps(sched);
    const double s0 = sched.sigmas[0], s1 = sched.sigmas[1];
    CHECK(steps[0].sigma == sched.sigmas[0]);
    CHECK(close(steps[0].predictor.ratio, s1 / s0, 1e-6));
    CHECK(close(-steps[0].predictor.a_phi, (1.0 - s1) - s1 * (1.0 - s0) / s0, 1e-5));
    CHECK(steps[0].predictor.a_b == steps[0].predictor.a_phi);  // bh2: B_h = h_phi_1

    // p = 1 corrector at step 1: rho = 1/2, phi = B = expm1(-(lambda_1 - lambda_0))
    const UniPCUpdate& c1 = steps[1].corrector;
    const double a1 = 1.0 - s1;
    const double phi = std::expm1(-(lambda_d(s1) - lambda_d(s0)));
    CHECK(close(c1.ratio, s1 / s0, 1e-6));
    CHECK(close(c1.a_phi, a1 * phi, 1e-5));
    CHECK(c1.a_b == c1.a_phi);
    CHECK(c1.rho_last == 0.5f);
    // the corrector and the step-0 predictor cover the same interval with the same scalars
    CHECK(c1.ratio == steps[0].predictor.ratio);
    CHECK(c1.a_phi == steps[0].predictor.a_phi);
}

TEST_CASE("unipc second-order scalars match the bh2 formulas solved in double") {
    const FlowSchedule sched = make_flow_schedule({});
    const auto steps = make_unipc_steps(sched);
    for (int i = 2; i <= 14; ++i) {
        CAPTURE(i);
        const UniPCStep& st = steps[size_t(i)];
        // predictor i -> i + 1, order 2, rhos_p = [1/2]
        {
            const double st_ = sched.sigmas[size_t(i + 1)], ss = sched.sigmas[size_t(i)],
                         sp = sched.sigmas[size_t(i - 1)];
            const double at = 1.0 - st_;
            const double h = lambda_d(st_) - lambda_d(ss);
            const double b = std::expm1(-h);
            const double r = (lambda_d(sp) - lambda_d(ss)) / h;
            CHECK(close(st.predictor.ratio, st_ / ss, 1e-6));
            CHECK(close(st.predictor.a_phi, at * b, 1e-5));
            CHECK(close(st.predictor.rk, r, 1e-5));
            CHECK(st.predictor.rho0 == 0.5f);
        }
        // corrector at i, order 2: [[1, 1], [r, 1]] rho = [g1, g2]
        {
            const double st_ = sched.sigmas[size_t(i)], ss = sched.sigmas[size_t(i - 1)],
                         sp = sched.sigmas[size_t(i - 2)];
            const double at = 1.0 - st_;
            const double h = lambda_d(st_) - lambda_d(ss);
            const double hh = -h;
            const double b = std::expm1(hh);
            const double r = (lambda_d(sp) - lambda_d(ss)) / h;
            const double g1 = (b / hh - 1.0) / b;
            const double g2 = 2.0 * ((b / hh - 1.0) / hh - 0.5) / b;
            const double rho0 = (g1 - g2) / (1.0 - r);
            const double rho1 = g1 - rho0;
            CHECK(close(st.corrector.ratio, st_ / ss, 1e-6));
            CHECK(close(st.corrector.a_b, at * b, 1e-5));
            CHECK(close(st.corrector.rk, r, 1e-5));
            CHECK(close(st.corrector.rho0, rho0, 5e-5));
            CHECK(close(st.corrector.rho_last, rho1, 5e-5));
        }
    }
}

TEST_CASE("unipc last step returns the x0 prediction exactly") {
    const auto steps = make_unipc_steps(make_flow_schedule({}));
    // sigma_16 = 0: lambda = +inf, h_phi_1 = expm1(-inf) = -1, so x_16 = 0 * c - (-1) * m = m
    CHECK(steps[15].predictor.ratio == 0.f);
    CHECK(steps[15].predictor.a_phi == -1.f);
    CHECK(steps[15].predictor.a_b == -1.f);

    auto be = make_cpu_backend(size_t(64) << 20);
    const Shape shape{3, 5};
    FlowUniPC sampler(*be, shape, DType::F32);
    Tensor x = Tensor::host_f32(shape, test::random_floats(15, 11));
    std::vector<float> before;
    std::vector<float> v;
    for (int i = 0; i < 16; ++i) {
        v = test::random_floats(15, 100 + uint64_t(i));
        before.assign(x.ptr<float>(), x.ptr<float>() + 15);
        sampler.step(Tensor::host_f32(shape, v), x);
    }
    const float sigma15 = sampler.sigma(15);
    for (int k = 0; k < 15; ++k) CHECK(x.ptr<float>()[k] == before[size_t(k)] - sigma15 * v[size_t(k)]);
    CHECK_THROWS_AS(sampler.step(Tensor::host_f32(shape, v), x), Error);  // past the last step
}

TEST_CASE("backend sampler agrees with the literal port of the official step") {
    auto be = make_cpu_backend(size_t(64) << 20);
    for (int num_steps : {16, 3, 1}) {
        CAPTURE(num_steps);
        const FlowUniPCConfig cfg{num_steps, 5.0, 1000};
        const Shape shape{2, 4, 3};
        const size_t n = size_t(shape.numel());
        FlowUniPC sampler(*be, shape, DType::F32, cfg);
        FlowUniPCReference literal(cfg);
        std::vector<float> x_lit = test::random_floats(n, 7, -2.f, 2.f);
        Tensor x = Tensor::host_f32(shape, x_lit);
        for (int i = 0; i < num_steps; ++i) {
            const std::vector<float> v = test::random_floats(n, 1000 + uint64_t(i), -1.5f, 1.5f);
            sampler.step(Tensor::host_f32(shape, v), x);
            literal.step(v, x_lit);
            for (size_t k = 0; k < n; ++k) {
                CAPTURE(i);
                CAPTURE(k);
                CHECK(std::fabs(x.ptr<float>()[k] - x_lit[k]) <= 1e-6f * std::max(1.f, std::fabs(x_lit[k])));
            }
        }
    }
}

TEST_CASE("unipc lands on the data point when the velocity is the exact flow") {
    // Rectified flow: x_t = (1 - sigma) x0 + sigma eps has the constant velocity eps - x0, every x0
    // prediction equals x0 and every UniPC update keeps the sample on the path, so the last step
    // must return x0 (up to f32 rounding), for any step mask.
    const size_t n = 64;
    const std::vector<float> x0 = test::random_floats(n, 21);
    const std::vector<float> eps = test::random_floats(n, 22);
    std::vector<float> v(n);
    for (size_t k = 0; k < n; ++k) v[k] = eps[k] - x0[k];
    auto be = make_cpu_backend(size_t(64) << 20);
    FlowUniPC sampler(*be, Shape{int64_t(n)}, DType::F32);
    const float s0 = sampler.sigma(0);
    std::vector<float> start(n);
    for (size_t k = 0; k < n; ++k) start[k] = (1.f - s0) * x0[k] + s0 * eps[k];
    Tensor x = Tensor::host_f32(Shape{int64_t(n)}, start);
    FlowUniPCReference literal;
    std::vector<float> xl = start;
    for (int i = 0; i < 16; ++i) {
        sampler.step(Tensor::host_f32(Shape{int64_t(n)}, v), x);
        literal.step(v, xl);
        // intermediate samples stay on the path
        const float s = sampler.sigma(i + 1);
        for (size_t k = 0; k < n; ++k)
            CHECK(std::fabs(x.ptr<float>()[k] - ((1.f - s) * x0[k] + s * eps[k])) < 2e-5f);
    }
    for (size_t k = 0; k < n; ++k) {
        CHECK(std::fabs(x.ptr<float>()[k] - x0[k]) < 1e-5f);
        CHECK(std::fabs(xl[k] - x0[k]) < 1e-5f);
    }
}

TEST_CASE("backend sampler accepts a velocity of another dtype and keeps independent instances") {
    auto be = make_cpu_backend(size_t(64) << 20);
    const Shape shape{8};
    FlowUniPC a(*be, shape, DType::F32), b(*be, shape, DType::F32);
    Tensor xa = Tensor::host_f32(shape, test::random_floats(8, 1));
    Tensor xb = Tensor::host_f32(shape, test::random_floats(8, 1));
    Tensor other = Tensor::host_f32(shape, test::random_floats(8, 2));
    for (int i = 0; i < 4; ++i) {
        const std::vector<float> v = test::random_floats(8, 50 + uint64_t(i));
        a.step(Tensor::host_f32(shape, v), xa);
        // interleave a second trajectory on `b` with different data; `a` must not notice
        b.step(Tensor::host_f32(shape, test::random_floats(8, 70 + uint64_t(i))), other);
        b.step(Tensor::host_f32(shape, test::random_floats(8, 90 + uint64_t(i))), other);
        b.reset();
    }
    FlowUniPCReference literal;
    std::vector<float> xl = test::random_floats(8, 1);
    for (int i = 0; i < 4; ++i) literal.step(test::random_floats(8, 50 + uint64_t(i)), xl);
    for (size_t k = 0; k < 8; ++k) CHECK(std::fabs(xa.ptr<float>()[k] - xl[k]) < 2e-5f);

    // a bf16 velocity is converted to the f32 state
    FlowUniPC c(*be, shape, DType::F32);
    Tensor v16 = Tensor::host(shape, DType::BF16);
    Tensor v32 = Tensor::host_f32(shape, std::vector<float>(8, 0.5f));
    convert_copy_host(v32, v16);
    c.step(v16, xb);
    FlowUniPCReference lit2;
    std::vector<float> xl2 = test::random_floats(8, 1);
    lit2.step(std::vector<float>(8, 0.5f), xl2);
    for (size_t k = 0; k < 8; ++k) CHECK(std::fabs(xb.ptr<float>()[k] - xl2[k]) < 2e-5f);

    Tensor wrong = Tensor::host_f32(Shape{9}, std::vector<float>(9, 0.f));
    CHECK_THROWS_AS(c.step(wrong, xb), Error);
}
