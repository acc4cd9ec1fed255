// Step masks, CFG, the velocity similarity and the denoising loop (zero-order hold, both samplers
// stepping on skipped steps).
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "sampling/cfg.h"
#include "sampling/denoise_loop.h"
#include "sampling/flow_unipc.h"
#include "sampling/step_schedule.h"
#include "support/test_support.h"

using namespace dzr;

namespace {

std::vector<int> run_steps(const StepSchedule& s) {
    std::vector<int> out;
    for (int i = 0; i < s.num_steps(); ++i)
        if (s.mask()[size_t(i)]) out.push_back(i);
    return out;
}

// Drives a dynamic schedule with a fixed similarity value; returns the steps that ran and counts the
// similarity evaluations.
std::vector<int> drive(StepSchedule& s, double sim, int& calls) {
    std::vector<int> ran;
    calls = 0;
    s.reset();
    for (int i = 0; i < s.num_steps(); ++i)
        if (s.should_run(i, [&] {
                ++calls;
                return sim;
            }))
            ran.push_back(i);
    return ran;
}

}  // namespace

TEST_CASE("step masks reproduce the official NUM_DIT_STEPS presets") {
    CHECK(run_steps(StepSchedule::from_num_dit_steps(8)) == std::vector<int>{0, 1, 2, 6, 10, 13, 14, 15});
    CHECK(run_steps(StepSchedule::from_num_dit_steps(7)) == std::vector<int>{0, 1, 2, 6, 10, 14, 15});
    CHECK(run_steps(StepSchedule::from_num_dit_steps(6)) == std::vector<int>{0, 1, 5, 10, 14, 15});
    CHECK(run_steps(StepSchedule::from_num_dit_steps(5)) == std::vector<int>{0, 1, 2, 7, 12});
    for (int other : {0, 1, 4, 9, 16, 100}) {
        CAPTURE(other);
        const StepSchedule s = StepSchedule::from_num_dit_steps(other);
        CHECK(s.num_network_steps() == 16);
    }
    CHECK(StepSchedule::from_num_dit_steps(8).describe() == "0,1,2,6,10,13,14,15");
    CHECK(StepSchedule::from_num_dit_steps(8).num_network_steps() == 8);
    // presets are 16-step masks; "all" works for any count
    CHECK_THROWS_AS(StepSchedule::from_num_dit_steps(8, 10), Error);
    CHECK(StepSchedule::from_num_dit_steps(16, 10).num_network_steps() == 10);
}

TEST_CASE("user step lists parse and reject broken input") {
    const StepSchedule s = StepSchedule::parse("0,1,2,6,10,13,14,15", 16);
    CHECK(s.mask() == StepSchedule::from_num_dit_steps(8).mask());
    CHECK(run_steps(StepSchedule::parse(" 15, 0 ,3", 16)) == std::vector<int>{0, 3, 15});
    CHECK(StepSchedule::parse("all", 4).num_network_steps() == 4);
    CHECK(StepSchedule::parse("dynamic", 16).is_dynamic());
    for (const char* bad : {"", "0,,1", "1,2", "0,16", "0,a", "0,1,1", "-1,0", "0,1,", "0;1", "0,1.5"}) {
        CAPTURE(bad);
        CHECK_THROWS_AS(StepSchedule::parse(bad, 16), Error);
    }
    CHECK_THROWS_AS(StepSchedule::from_mask({false, true}), Error);
    CHECK_THROWS_AS(StepSchedule::from_mask({}), Error);
}

TEST_CASE("fixed schedules answer in order and never ask for the similarity") {
    StepSchedule s = StepSchedule::from_num_dit_steps(8);
    int calls = 0;
    const std::vector<int> ran = drive(s, 1.0, calls);
    CHECK(ran == std::vector<int>{0, 1, 2, 6, 10, 13, 14, 15});
    CHECK(calls == 0);
    CHECK(s.computed_steps() == 8);
    s.reset();
    CHECK_THROWS_AS(s.should_run(1), Error);  // out of order
}

TEST_CASE("dynamic schedule skips after similar velocities as the official countdowns") {
    StepSchedule s = StepSchedule::dynamic(16);
    int calls = 0;
    // > 0.95: skip the current step and the next 3, run one, re-evaluate
    CHECK(drive(s, 0.99, calls) == std::vector<int>{0, 1, 6, 11});
    CHECK(calls == 3);  // asked at steps 2, 7, 12
    // in (0.93, 0.95]: skip the current step and the next one
    CHECK(drive(s, 0.94, calls) == std::vector<int>{0, 1, 4, 7, 10, 13});
    CHECK(calls == 5);
    // at or below 0.93 every step runs, and the similarity is asked from step 2 on
    CHECK(drive(s, 0.93, calls).size() == 16);
    CHECK(calls == 14);
    // a schedule needing the similarity without a callback is a usage error
    s.reset();
    CHECK(s.should_run(0));
    CHECK(s.should_run(1));
    CHECK_THROWS_AS(s.should_run(2), Error);
}

TEST_CASE("cfg combines conditional and unconditional velocities in the reference order") {
    auto be = make_cpu_backend(size_t(16) << 20);
    const size_t n = 40;
    const std::vector<float> c = test::random_floats(n, 1), u = test::random_floats(n, 2);
    Tensor tc = Tensor::host_f32(Shape{4, 10}, c), tu = Tensor::host_f32(Shape{4, 10}, u);
    Tensor out = Tensor::host(Shape{4, 10}, DType::F32);
    apply_cfg(*be, tc, tu, 5.0f, out);
    for (size_t k = 0; k < n; ++k) CHECK(out.ptr<float>()[k] == u[k] + 5.0f * (c[k] - u[k]));
    // in place over the conditional velocity
    apply_cfg(*be, tc, tu, 5.0f, tc);
    for (size_t k = 0; k < n; ++k) CHECK(tc.ptr<float>()[k] == out.ptr<float>()[k]);
    // scale 1 gives the conditional velocity back up to rounding; aliasing the unconditional one is refused
    Tensor tc2 = Tensor::host_f32(Shape{4, 10}, c);
    apply_cfg(*be, tc2, tu, 1.0f, out);
    for (size_t k = 0; k < n; ++k) CHECK(std::fabs(out.ptr<float>()[k] - c[k]) < 1e-6f);
    CHECK_THROWS_AS(apply_cfg(*be, tc2, tu, 5.0f, tu), Error);
    Tensor small = Tensor::host(Shape{3}, DType::F32);
    CHECK_THROWS_AS(apply_cfg(*be, tc2, tu, 5.0f, small), Error);
}

TEST_CASE("cosine similarity of velocities matches hand-computed angles") {
    auto be = make_cpu_backend(size_t(16) << 20);
    Tensor a = Tensor::host_f32(Shape{2}, {1.f, 0.f});
    Tensor b = Tensor::host_f32(Shape{2}, {1.f, 1.f});
    CHECK(cosine_similarity(*be, a, b) == doctest::Approx(1.0 / std::sqrt(2.0)).epsilon(1e-7));
    CHECK(cosine_similarity(*be, a, a) == doctest::Approx(1.0));
    Tensor neg = Tensor::host_f32(Shape{2}, {-3.f, 0.f});
    CHECK(cosine_similarity(*be, a, neg) == doctest::Approx(-1.0));
    // per batch item, then the mean: (1 + 0) / 2
    Tensor x = Tensor::host_f32(Shape{2, 2}, {1.f, 0.f, 0.f, 2.f});
    Tensor y = Tensor::host_f32(Shape{2, 2}, {2.f, 0.f, 5.f, 0.f});
    CHECK(cosine_similarity(*be, x, y, 2) == doctest::Approx(0.5));
    // a zero vector gives 0 (eps in the norm), not NaN
    Tensor z = Tensor::host_f32(Shape{2}, {0.f, 0.f});
    CHECK(cosine_similarity(*be, a, z) == 0.0);
    CHECK_THROWS_AS(cosine_similarity(*be, a, x), Error);
}

TEST_CASE("denoise loop holds the last velocity on skipped steps and still steps both samplers") {
    auto be = make_cpu_backend(size_t(64) << 20);
    const Shape vshape{2, 3}, ashape{4};
    FlowUniPC vs(*be, vshape, DType::F32), as(*be, ashape, DType::F32);
    StepSchedule sched = StepSchedule::from_num_dit_steps(8);
    Tensor video = Tensor::host_f32(vshape, test::random_floats(6, 1));
    Tensor action = Tensor::host_f32(ashape, test::random_floats(4, 2));
    Tensor vv = Tensor::host(vshape, DType::F32), av = Tensor::host(ashape, DType::F32);
    std::vector<int> seen;
    std::vector<int64_t> timesteps;
    // The "network": fresh velocities that depend on the step and on the current samples.
    auto fresh_video = [](int i, const float* x) {
        std::vector<float> v = test::random_floats(6, 300 + uint64_t(i));
        for (size_t k = 0; k < 6; ++k) v[k] += 0.25f * x[k];
        return v;
    };
    auto fresh_action = [](int i, const float* x) {
        std::vector<float> v = test::random_floats(4, 400 + uint64_t(i));
        for (size_t k = 0; k < 4; ++k) v[k] -= 0.5f * x[k];
        return v;
    };
    const DenoiseTensors t{video, action, vv, av, {}};
    const int evals = run_denoise_loop(*be, vs, as, sched, t, [&](const DenoiseStep& st) {
        seen.push_back(st.index);
        timesteps.push_back(st.video_timestep);
        CHECK(st.action_timestep == st.video_timestep);
        const auto v = fresh_video(st.index, video.ptr<float>());
        const auto a = fresh_action(st.index, action.ptr<float>());
        std::copy(v.begin(), v.end(), vv.ptr<float>());
        std::copy(a.begin(), a.end(), av.ptr<float>());
    });
    CHECK(evals == 8);
    CHECK(seen == std::vector<int>{0, 1, 2, 6, 10, 13, 14, 15});
    CHECK(timesteps == std::vector<int64_t>{999, 986, 972, 892, 749, 535, 416, 249});
    CHECK(vs.step_index() == 16);
    CHECK(as.step_index() == 16);

    // The same trajectory by hand with the literal port and an explicit zero-order hold.
    FlowUniPCReference rv, ra;
    std::vector<float> x = test::random_floats(6, 1), y = test::random_floats(4, 2), hv, ha;
    const auto mask = sched.mask();
    for (int i = 0; i < 16; ++i) {
        if (mask[size_t(i)]) {
            hv = fresh_video(i, x.data());
            ha = fresh_action(i, y.data());
        }
        rv.step(hv, x);
        ra.step(ha, y);
    }
    for (size_t k = 0; k < 6; ++k)
        CHECK(std::fabs(video.ptr<float>()[k] - x[k]) < 3e-5f * std::max(1.f, std::fabs(x[k])));
    for (size_t k = 0; k < 4; ++k)
        CHECK(std::fabs(action.ptr<float>()[k] - y[k]) < 3e-5f * std::max(1.f, std::fabs(y[k])));
}

TEST_CASE("denoise loop with the dynamic schedule compares the two latest computed velocities") {
    auto be = make_cpu_backend(size_t(64) << 20);
    const Shape shape{8};
    FlowUniPC vs(*be, shape, DType::F32), as(*be, shape, DType::F32);
    StepSchedule sched = StepSchedule::dynamic(16);
    Tensor video = Tensor::host_f32(shape, test::random_floats(8, 1));
    Tensor action = Tensor::host_f32(shape, test::random_floats(8, 2));
    Tensor vv = Tensor::host(shape, DType::F32), av = Tensor::host(shape, DType::F32),
           prev = Tensor::host(shape, DType::F32);
    const DenoiseTensors t{video, action, vv, av, prev};
    // Velocities that rotate slowly: consecutive computed ones are nearly parallel (cos > 0.95) as
    // long as the angle step is small; make the step jump at index 6 so the similarity drops there.
    std::vector<int> seen;
    auto eval = [&](const DenoiseStep& st) {
        seen.push_back(st.index);
        const double angle = st.index < 6 ? 0.01 * st.index : 1.0 + 0.8 * st.index;
        for (int k = 0; k < 8; ++k)
            vv.ptr<float>()[k] = float(k % 2 == 0 ? std::cos(angle) : std::sin(angle));
        std::fill(av.ptr<float>(), av.ptr<float>() + 8, 0.1f);
    };
    const int evals = run_denoise_loop(*be, vs, as, sched, t, eval);
    // steps 0, 1 (warm-up), similar -> skip 2..5, run 6, dissimilar (angle jump) -> run 7, then the
    // angles 1 + 0.8 i differ by 0.8 rad (cos 0.70) so every later step runs.
    CHECK(seen == std::vector<int>{0, 1, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15});
    CHECK(evals == 12);

    // the dynamic schedule refuses to run without the buffer for the previous velocity
    const DenoiseTensors missing{video, action, vv, av, {}};
    CHECK_THROWS_AS(run_denoise_loop(*be, vs, as, sched, missing, eval), Error);
    // samplers with different step counts are refused
    FlowUniPC short_sampler(*be, shape, DType::F32, FlowUniPCConfig{8, 5.0, 1000});
    StepSchedule all16 = StepSchedule::all(16);
    CHECK_THROWS_AS(run_denoise_loop(*be, short_sampler, as, all16, missing, eval), Error);
}
