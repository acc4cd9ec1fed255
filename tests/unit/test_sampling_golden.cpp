// FlowUniPC against the official scheduler's outputs (tests/data/sched_golden.json, produced by
// scripts/parity/gen_sched_golden.py from the official code). Skipped, with a message, until generated.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <vector>

#include "backend/backend.h"
#include "sampling/denoise_loop.h"
#include "sampling/flow_unipc.h"
#include "sampling/step_schedule.h"
#include "support/test_support.h"

using namespace dzr;

namespace {

std::vector<float> floats(const nlohmann::json& j) {
    std::vector<float> out;
    out.reserve(j.size());
    for (const auto& v : j) out.push_back(float(v.get<double>()));
    return out;
}

// Largest |a - b| / max(1, |b|).
double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
    double m = 0;
    for (size_t i = 0; i < a.size(); ++i)
        m = std::max(m, std::fabs(double(a[i]) - double(b[i])) / std::max(1.0, std::fabs(double(b[i]))));
    return m;
}

}  // namespace

TEST_CASE("flow unipc reproduces the official scheduler's golden trajectories") {
    const std::filesystem::path path = test::data_dir() / "sched_golden.json";
    if (!std::filesystem::exists(path)) {
        MESSAGE(
            "skipped: tests/data/sched_golden.json not generated yet (scripts/parity/gen_sched_golden.py)");
        return;
    }
    std::ifstream in(path);
    const nlohmann::json g = nlohmann::json::parse(in);

    const FlowSchedule sched = make_flow_schedule({});
    CHECK(floats(g.at("sigmas")) == sched.sigmas);
    CHECK(g.at("timesteps").get<std::vector<int64_t>>() == sched.timesteps);
    CHECK(g.at("dit8_mask").get<std::vector<bool>>() == StepSchedule::from_num_dit_steps(8).mask());

    auto be = make_cpu_backend(size_t(64) << 20);
    for (const auto& run : g.at("runs")) {
        const std::string name = run.at("name").get<std::string>();
        CAPTURE(name);
        const std::vector<int64_t> dims = run.at("shape").get<std::vector<int64_t>>();
        const Shape shape(dims);
        const size_t n = size_t(shape.numel());
        const std::vector<float> x_init = floats(run.at("x_init"));
        const bool affine = run.at("model").get<std::string>() == "affine";
        const std::vector<bool> mask = run.at("mask").get<std::vector<bool>>();
        std::vector<std::vector<float>> base, used, samples;
        for (const auto& b : run.at("base")) base.push_back(floats(b));
        for (const auto& u : run.at("used")) used.push_back(floats(u));
        for (const auto& s : run.at("samples")) samples.push_back(floats(s));
        REQUIRE(samples.size() == 16);
        REQUIRE(x_init.size() == n);

        // the literal port, fed the velocities the official loop passed to step()
        FlowUniPCReference literal;
        std::vector<float> x = x_init;
        double worst_literal = 0;
        for (int i = 0; i < 16; ++i) {
            literal.step(used[size_t(i)], x);
            worst_literal = std::max(worst_literal, max_rel_diff(x, samples[size_t(i)]));
        }
        MESSAGE(name << ": literal port max relative difference " << worst_literal);
        CHECK(worst_literal <= 2e-6);

        // the Backend sampler (the reference's op sequence) inside the denoise loop, with the network
        // replaced by the run's model
        FlowUniPC video(*be, shape, DType::F32), action(*be, shape, DType::F32);
        StepSchedule steps = StepSchedule::from_mask(mask);
        Tensor xv = Tensor::host_f32(shape, x_init), xa = Tensor::host_f32(shape, x_init);
        Tensor vv = Tensor::host(shape, DType::F32), va = Tensor::host(shape, DType::F32);
        const DenoiseTensors t{xv, xa, vv, va, {}};
        int calls = 0;
        const int evals = run_denoise_loop(*be, video, action, steps, t, [&](const DenoiseStep& st) {
            ++calls;
            const std::vector<float>& b = base[size_t(st.index)];
            for (size_t k = 0; k < n; ++k) {
                const float v = affine ? b[k] + 0.5f * xv.ptr<float>()[k] : b[k];
                vv.ptr<float>()[k] = v;
                va.ptr<float>()[k] = v;
            }
        });
        CHECK(evals == int(std::count(mask.begin(), mask.end(), true)));
        const std::vector<float> final_v(xv.ptr<float>(), xv.ptr<float>() + n);
        const std::vector<float> final_a(xa.ptr<float>(), xa.ptr<float>() + n);
        const double backend = max_rel_diff(final_v, samples[15]);
        MESSAGE(name << ": backend sampler max relative difference " << backend);
        CHECK(backend <= 2e-6);
        CHECK(final_a == final_v);  // both samplers saw identical inputs
    }
}
