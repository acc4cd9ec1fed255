// FlowUniPC schedule, folded per-step coefficients, the Backend sampler and the literal host port.
// NOTE: the scalar primitives are evaluated in float32 in the official operation order
// (alpha = 1 - sigma, lambda = log(alpha) - log(sigma), h, hh = -h, expm1, the 2x2 solve), because
// the official scheduler keeps its sigmas as float32 tensors and does this arithmetic on 0-dim
// float32 tensors.
#include "sampling/flow_unipc.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/arena.h"
#include "core/error.h"

namespace dzr {
namespace {

// NOTE: glibc's logf/expm1f are used here; torch's vectorized float32 kernels (CPU) and CUDA's libm
// differ from them in the last bit for some sigmas, which moves a trajectory by ~1e-7 relative.
float lambda_of(float sigma) {
    const float alpha = 1.0f - sigma;
    return std::log(alpha) - std::log(sigma);  // sigma = 0 gives +inf, as in the reference
}

struct Rho2 {
    float r0, r1;
};

// Solves [[1, 1], [r, 1]] rho = [b1, b2] as torch.linalg.solve on the CPU does for a 2x2 system
// (LAPACK sgesv through OpenBLAS): LU with partial pivoting (first maximal pivot on ties), the
// multiplier formed with the pivot's reciprocal, and back substitution multiplying by the reciprocal
// of each diagonal entry (checked bit for bit against torch 2.11 on the 16-step schedule).
Rho2 solve_rhos(float r, float b1, float b2) {
    float a11 = 1.f, a12 = 1.f, a21 = r, a22 = 1.f;
    if (std::fabs(a21) > std::fabs(a11)) {
        std::swap(a11, a21);
        std::swap(a12, a22);
        std::swap(b1, b2);
    }
    const float l = a21 * (1.f / a11);
    const float u22 = a22 - l * a12;
    const float y2 = b2 - l * b1;
    const float x2 = y2 * (1.f / u22);
    const float x1 = (b1 - a12 * x2) * (1.f / a11);
    return {x1, x2};
}

// The corrector's b vector entries (official multistep_uni_c_bh_update, order 2, bh2, predict_x0).
void corrector_b(float hh, float phi1, float b_h, float& b1, float& b2) {
    float h_phi_k = phi1 / hh - 1.f;
    b1 = h_phi_k * 1.f / b_h;
    h_phi_k = h_phi_k / hh - 0.5f;
    b2 = h_phi_k * 2.f / b_h;
}

int predictor_order(int i, int n) {
    return std::min({2, n - i, i + 1});
}

TensorView flat(const TensorView& t) {
    return t.reshape(Shape{t.numel()});
}  // [...] -> [numel]

// out = sum_k coef_k * t_k over the terms with a non-zero coefficient (zero terms are skipped so
// unset history buffers are never read). `tmp` is a scratch buffer of out's shape and dtype.
void linear_combination(Backend& be, const TensorView& out,
                        std::initializer_list<std::pair<float, TensorView>> terms, const TensorView& tmp) {
    bool first = true;
    for (const auto& [coef, t] : terms) {
        if (coef == 0.f) continue;
        if (first) {
            be.scale({coef, 0.f}, t, out);
            first = false;
        } else {
            be.scale({coef, 0.f}, t, tmp);
            be.add(out, tmp, out);
        }
    }
    if (first) be.fill(out, 0.f);
}

}  // namespace

FlowSchedule make_flow_schedule(const FlowUniPCConfig& cfg) {
    DZR_CHECK(cfg.num_steps >= 1, "FlowUniPC: num_steps must be >= 1, got {}", cfg.num_steps);
    DZR_CHECK(cfg.shift > 0.0 && std::isfinite(cfg.shift), "FlowUniPC: shift must be > 0, got {}", cfg.shift);
    DZR_CHECK(cfg.num_train_timesteps >= 2, "FlowUniPC: num_train_timesteps must be >= 2, got {}",
              cfg.num_train_timesteps);
    const int n = cfg.num_steps;
    const double train_t = double(cfg.num_train_timesteps);
    // __init__: sigmas = 1 - linspace(1, 1/T, T)[::-1] as float32, so sigma_max = float32(1 - 1/T) and
    // sigma_min = 0; the shift=1 transform of __init__ is the identity.
    const double sigma_max = double(float(1.0 - 1.0 / train_t));
    // set_timesteps: numpy linspace(sigma_max, 0, n + 1)[:-1] = i * step + start with step = delta / n.
    const double step = (0.0 - sigma_max) / double(n);
    FlowSchedule s;
    s.sigmas.resize(size_t(n) + 1);
    s.timesteps.resize(size_t(n));
    for (int i = 0; i < n; ++i) {
        const double lin = double(i) * step + sigma_max;
        const double shifted = cfg.shift * lin / (1.0 + (cfg.shift - 1.0) * lin);
        s.timesteps[size_t(i)] = int64_t(shifted * train_t);  // truncation toward zero
        s.sigmas[size_t(i)] = float(shifted);
    }
    s.sigmas[size_t(n)] = 0.f;
    return s;
}

std::vector<UniPCStep> make_unipc_steps(const FlowSchedule& schedule) {
    const int n = int(schedule.timesteps.size());
    DZR_CHECK(n >= 1 && schedule.sigmas.size() == size_t(n) + 1,
              "FlowUniPC: schedule needs n >= 1 timesteps and n + 1 sigmas, got {} and {}", n,
              schedule.sigmas.size());
    const auto& sg = schedule.sigmas;
    std::vector<UniPCStep> steps(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
        UniPCStep& st = steps[size_t(i)];
        st.index = i;
        st.sigma = sg[size_t(i)];

        // ---- corrector (UniC) at step i >= 1, order = the predictor order of step i - 1 ----
        if (i >= 1) {
            const int p = predictor_order(i - 1, n);
            st.corrector_order = p;
            const float sigma_t = sg[size_t(i)], sigma_s0 = sg[size_t(i - 1)];
            const float alpha_t = 1.f - sigma_t;
            const float lambda_t = lambda_of(sigma_t), lambda_s0 = lambda_of(sigma_s0);
            const float h = lambda_t - lambda_s0;
            const float hh = -h;
            const float phi1 = std::expm1(hh);
            const float b_h = std::expm1(hh);
            const float a_phi = alpha_t * phi1;
            const float a_b = alpha_t * b_h;
            const double ab = a_b;
            st.corr_last = sigma_t / sigma_s0;
            if (p == 1) {
                st.corr_m2 = 0.f;
                st.corr_m1 = float(-double(a_phi) + ab * 0.5);
                st.corr_m0 = float(-ab * 0.5);
            } else {
                const float lambda_s1 = lambda_of(sg[size_t(i - 2)]);
                const float r = (lambda_s1 - lambda_s0) / h;
                float b1 = 0.f, b2 = 0.f;
                corrector_b(hh, phi1, b_h, b1, b2);
                const Rho2 rho = solve_rhos(r, b1, b2);
                st.corr_m2 = float(-ab * double(rho.r0) / double(r));
                st.corr_m1 = float(-double(a_phi) + ab * double(rho.r0) / double(r) + ab * double(rho.r1));
                st.corr_m0 = float(-ab * double(rho.r1));
            }
        }

        // ---- predictor (UniP) from step i to i + 1 ----
        const int p = predictor_order(i, n);
        st.predictor_order = p;
        const float sigma_t = sg[size_t(i + 1)], sigma_s0 = sg[size_t(i)];
        const float alpha_t = 1.f - sigma_t;
        const float h = lambda_of(sigma_t) - lambda_of(sigma_s0);
        const float hh = -h;
        const float phi1 = std::expm1(hh);
        const float b_h = std::expm1(hh);
        const float a_phi = alpha_t * phi1;
        const float a_b = alpha_t * b_h;
        st.pred_c = sigma_t / sigma_s0;
        if (p == 1) {
            st.pred_m0 = -a_phi;
            st.pred_m1 = 0.f;
        } else {
            const float r = (lambda_of(sg[size_t(i - 1)]) - lambda_of(sigma_s0)) / h;
            const double k = double(a_b) * 0.5 / double(r);
            st.pred_m0 = float(-double(a_phi) + k);
            st.pred_m1 = float(-k);
        }
    }
    return steps;
}

// ---- FlowUniPC (Backend) -------------------------------------------------------------------------

FlowUniPC::FlowUniPC(Backend& be, const Shape& sample_shape, DType dtype, const FlowUniPCConfig& cfg)
    : be_(be),
      shape_(sample_shape),
      dtype_(dtype),
      schedule_(make_flow_schedule(cfg)),
      steps_(make_unipc_steps(schedule_)) {
    DZR_CHECK(dtype_is_float(dtype), "FlowUniPC: state dtype must be a float type, got {}",
              dtype_name(dtype));
    DZR_CHECK(sample_shape.numel() > 0, "FlowUniPC: empty sample shape {}", sample_shape.str());
    const Shape flat_shape{sample_shape.numel()};
    for (auto& t : corrected_) t = be_.alloc(flat_shape, dtype);
    for (auto& t : predictions_) t = be_.alloc(flat_shape, dtype);
}

void FlowUniPC::step(const TensorView& velocity, const TensorView& sample) {
    const int i = step_index_;
    DZR_CHECK(i < num_steps(),
              "FlowUniPC: step {} requested but the schedule has {} steps (reset() starts over)", i,
              num_steps());
    DZR_CHECK(sample.numel() == shape_.numel() && velocity.numel() == shape_.numel(),
              "FlowUniPC: sample {} / velocity {} do not match the sampler's shape {}", sample.str(),
              velocity.str(), shape_.str());
    DZR_CHECK(sample.dtype == dtype_, "FlowUniPC: sample dtype {} differs from the sampler's {}",
              dtype_name(sample.dtype), dtype_name(dtype_));
    DZR_CHECK(sample.is_contiguous() && velocity.is_contiguous(),
              "FlowUniPC: sample {} and velocity {} must be contiguous", sample.str(), velocity.str());

    ArenaScope scope(be_.workspace());
    const int64_t n = shape_.numel();
    const TensorView x = flat(sample);
    TensorView v = flat(velocity);
    if (v.dtype != dtype_) {
        TensorView converted = be_.scratch(Shape{n}, dtype_);
        be_.copy(v, converted);
        v = converted;
    }
    const TensorView tmp = be_.scratch(Shape{n}, dtype_);
    const UniPCStep& s = steps_[size_t(i)];

    auto pred = [&](int k) { return predictions_[((k % 3) + 3) % 3].view(); };
    auto corr = [&](int k) { return corrected_[((k % 2) + 2) % 2].view(); };
    const TensorView m0 = pred(i), m1 = pred(i - 1), m2 = pred(i - 2);
    const TensorView c = corr(i), c_prev = corr(i - 1);

    // m_i = x_i - sigma_i * v_i   ([n], same rounding as `sample - sigma_t * model_output`)
    be_.scale({-s.sigma, 0.f}, v, m0);
    be_.add(m0, x, m0);

    // corrected sample c_i
    if (i == 0) {
        be_.copy(x, c);
    } else {
        linear_combination(be_, c, {{s.corr_last, c_prev}, {s.corr_m2, m2}, {s.corr_m1, m1}, {s.corr_m0, m0}},
                           tmp);
    }

    // x_{i+1}, written over the caller's sample
    linear_combination(be_, x, {{s.pred_c, c}, {s.pred_m0, m0}, {s.pred_m1, m1}}, tmp);
    ++step_index_;
}

// ---- FlowUniPCReference (literal host port) ------------------------------------------------------

FlowUniPCReference::FlowUniPCReference(const FlowUniPCConfig& cfg) : schedule_(make_flow_schedule(cfg)) {}

void FlowUniPCReference::reset() {
    m_prev_.clear();
    m_prev2_.clear();
    last_sample_.clear();
    this_order_ = 0;
    lower_order_nums_ = 0;
    step_index_ = 0;
}

void FlowUniPCReference::step(std::span<const float> velocity, std::span<float> sample) {
    const int i = step_index_;
    const int n = int(schedule_.timesteps.size());
    DZR_CHECK(i < n, "FlowUniPCReference: step {} requested but the schedule has {} steps", i, n);
    DZR_CHECK(velocity.size() == sample.size() && !sample.empty(),
              "FlowUniPCReference: velocity has {} elements, sample {}", velocity.size(), sample.size());
    const size_t len = sample.size();
    DZR_CHECK(last_sample_.empty() || last_sample_.size() == len,
              "FlowUniPCReference: sample size changed from {} to {} within a trajectory",
              last_sample_.size(), len);
    const auto& sg = schedule_.sigmas;

    // convert_model_output (flow_prediction, predict_x0)
    std::vector<float> model(len);
    {
        const float sigma_t = sg[size_t(i)];
        for (size_t k = 0; k < len; ++k) model[k] = sample[k] - sigma_t * velocity[k];
    }

    // multistep_uni_c_bh_update
    std::vector<float> corrected(sample.begin(), sample.end());
    if (i > 0 && !last_sample_.empty()) {
        const int order = this_order_;
        const std::vector<float>& m0 = m_prev_;
        const std::vector<float>& x = last_sample_;
        const float sigma_t = sg[size_t(i)], sigma_s0 = sg[size_t(i - 1)];
        const float alpha_t = 1.f - sigma_t;
        const float lambda_t = lambda_of(sigma_t), lambda_s0 = lambda_of(sigma_s0);
        const float h = lambda_t - lambda_s0;
        float rk = 0.f;
        std::vector<float> d1;
        if (order == 2) {
            rk = (lambda_of(sg[size_t(i - 2)]) - lambda_s0) / h;
            d1.resize(len);
            for (size_t k = 0; k < len; ++k) d1[k] = (m_prev2_[k] - m0[k]) / rk;
        }
        const float hh = -h;
        const float phi1 = std::expm1(hh);
        const float b_h = std::expm1(hh);
        float rho0 = 0.f, rho_last = 0.5f;
        if (order == 2) {
            float b1 = 0.f, b2 = 0.f;
            corrector_b(hh, phi1, b_h, b1, b2);
            const Rho2 rho = solve_rhos(rk, b1, b2);
            rho0 = rho.r0;
            rho_last = rho.r1;
        }
        const float ratio = sigma_t / sigma_s0;
        const float a_phi = alpha_t * phi1;
        const float a_b = alpha_t * b_h;
        for (size_t k = 0; k < len; ++k) {
            const float base = ratio * x[k] - a_phi * m0[k];
            const float d1_t = model[k] - m0[k];
            const float res = order == 2 ? rho0 * d1[k] + rho_last * d1_t : rho_last * d1_t;
            corrected[k] = base - a_b * res;
        }
    }

    // bookkeeping of step()
    m_prev2_ = std::move(m_prev_);
    m_prev_ = model;
    this_order_ = std::min(std::min(2, n - i), lower_order_nums_ + 1);
    last_sample_ = corrected;

    // multistep_uni_p_bh_update
    {
        const int order = this_order_;
        const std::vector<float>& m0 = m_prev_;
        const float sigma_t = sg[size_t(i + 1)], sigma_s0 = sg[size_t(i)];
        const float alpha_t = 1.f - sigma_t;
        const float lambda_s0 = lambda_of(sigma_s0);
        const float h = lambda_of(sigma_t) - lambda_s0;
        std::vector<float> d1;
        if (order == 2) {
            const float rk = (lambda_of(sg[size_t(i - 1)]) - lambda_s0) / h;
            d1.resize(len);
            for (size_t k = 0; k < len; ++k) d1[k] = (m_prev2_[k] - m0[k]) / rk;
        }
        const float hh = -h;
        const float phi1 = std::expm1(hh);
        const float b_h = std::expm1(hh);
        const float ratio = sigma_t / sigma_s0;
        const float a_phi = alpha_t * phi1;
        const float a_b = alpha_t * b_h;
        for (size_t k = 0; k < len; ++k) {
            const float base = ratio * corrected[k] - a_phi * m0[k];
            sample[k] = order == 2 ? base - a_b * (0.5f * d1[k]) : base;
        }
    }
    if (lower_order_nums_ < 2) ++lower_order_nums_;
    ++step_index_;
}

}  // namespace dzr
