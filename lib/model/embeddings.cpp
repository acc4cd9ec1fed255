#include "model/embeddings.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace dzr {
namespace {

void check_even(int dim, const char* what) {
    DZR_CHECK(dim > 0 && dim % 2 == 0, "{} sinusoid: dimension must be positive and even, got {}", what, dim);
}

void check_timestep(int64_t t, const char* what) {
    DZR_CHECK(t >= 0 && t < kNumTrainTimesteps, "causal dit: {} timestep {} is outside [0, {})", what, t,
              kNumTrainTimesteps);
}

}  // namespace

std::vector<double> dit_timestep_sinusoid(int dim, double t) {
    check_even(dim, "dit timestep");
    const int half = dim / 2;
    std::vector<double> out(static_cast<size_t>(dim));
    for (int j = 0; j < half; ++j) {
        const double arg = t * std::pow(10000.0, -double(j) / double(half));
        out[size_t(j)] = std::cos(arg);
        out[size_t(half + j)] = std::sin(arg);
    }
    return out;
}

std::vector<float> action_timestep_sinusoid(int dim, float t) {
    check_even(dim, "action timestep");
    const int half = dim / 2;
    // NOTE: float32 throughout, in the reference's order: −j · (ln(10000) / half), exp, · t.
    const float step = std::log(10000.0f) / float(half);
    std::vector<float> out(static_cast<size_t>(dim));
    for (int j = 0; j < half; ++j) {
        const float arg = t * std::exp(-float(j) * step);
        out[size_t(j)] = std::sin(arg);
        out[size_t(half + j)] = std::cos(arg);
    }
    return out;
}

TimestepTables::TimestepTables(Backend& be, int dit_dim, int action_dim) {
    std::vector<float> d(size_t(kNumTrainTimesteps) * dit_dim);
    for (int t = 0; t < kNumTrainTimesteps; ++t) {
        const std::vector<double> s = dit_timestep_sinusoid(dit_dim, double(t));
        for (int j = 0; j < dit_dim; ++j) d[size_t(t) * dit_dim + j] = float(s[size_t(j)]);
    }
    dit_ = be.alloc(Shape{kNumTrainTimesteps, dit_dim}, be.compute_dtype());
    be.upload(TensorView(d.data(), DType::F32, dit_.shape()), dit_);
    // NOTE: the action sinusoid is f32 arithmetic that the reference runs on its device; the backend
    // evaluates it with that device's exp/sin/cos (on CUDA, bit for bit the reference's; on the CPU the
    // host's, which is action_timestep_sinusoid()).
    check_even(action_dim, "action timestep");
    action_ = be.alloc(Shape{kNumTrainTimesteps, action_dim}, be.compute_dtype());
    be.sin_cos_table(std::log(10000.0f) / float(action_dim / 2), action_);
}

TensorView TimestepTables::dit(int64_t t) const {
    check_timestep(t, "video");
    return dit_.view().slice(0, t, 1);
}

TensorView TimestepTables::action(int64_t t) const {
    check_timestep(t, "action");
    return action_.view().slice(0, t, 1);
}

TimestepRows TimestepTables::make_rows(Backend& be) const {
    TimestepRows rows;
    rows.dit = be.alloc(Shape{2, dit_.shape()[1]}, dit_.dtype());
    rows.action = be.alloc(Shape{1, action_.shape()[1]}, action_.dtype());
    return rows;
}

void TimestepTables::stage(Backend& be, int64_t video, int64_t action, const TimestepRows& rows) const {
    const TensorView v = dit(video);
    if (action < 0) {
        be.copy(v, rows.dit.view().slice(0, 0, 1));
        return;
    }
    const TensorView a = dit(action), tau = this->action(action);
    be.copy(v, rows.dit.view().slice(0, 0, 1));
    be.copy(a, rows.dit.view().slice(0, 1, 1));
    be.copy(tau, rows.action);
}

}  // namespace dzr
