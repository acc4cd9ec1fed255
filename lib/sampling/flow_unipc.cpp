// FlowUniPC schedule, per-step scalars, the Backend sampler (the reference's op sequence) and the
// literal host port.
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
#include "core/half.h"

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

// The scalars of one update from sigma_s0 = sg[s0] to sigma_t = sg[t] (official
// multistep_uni_{p,c}_bh_update, predict_x0, bh2), in its float32 operation order. `s1` is the source
// of the step before (order 2 only).
UniPCUpdate make_update(const std::vector<float>& sg, int t, int s0, int s1, int order, bool corrector) {
    UniPCUpdate u;
    u.order = order;
    const float sigma_t = sg[size_t(t)], sigma_s0 = sg[size_t(s0)];
    const float alpha_t = 1.f - sigma_t;
    const float lambda_s0 = lambda_of(sigma_s0);
    const float h = lambda_of(sigma_t) - lambda_s0;
    if (order == 2) u.rk = (lambda_of(sg[size_t(s1)]) - lambda_s0) / h;
    const float hh = -h;
    const float h_phi_1 = std::expm1(hh);
    const float b_h = std::expm1(hh);
    u.ratio = sigma_t / sigma_s0;
    u.a_phi = alpha_t * h_phi_1;
    u.a_b = alpha_t * b_h;
    if (corrector) {
        if (order == 2) {
            float b1 = 0.f, b2 = 0.f;
            corrector_b(hh, h_phi_1, b_h, b1, b2);
            const Rho2 rho = solve_rhos(u.rk, b1, b2);
            u.rho0 = rho.r0;
            u.rho_last = rho.r1;
        } else {
            u.rho_last = 0.5f;  // torch.full((1,), 0.5)
        }
    } else if (order == 2) {
        u.rho0 = 0.5f;  // rhos_p: the order-2 shortcut
    }
    return u;
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
        // corrector at step i >= 1 (sigma_{i-1} -> sigma_i), with the predictor order of step i - 1
        if (i >= 1) st.corrector = make_update(sg, i, i - 1, i - 2, predictor_order(i - 1, n), true);
        // predictor from step i to i + 1
        st.predictor = make_update(sg, i + 1, i, i - 1, predictor_order(i, n), false);
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
    corrected_ = be_.alloc(flat_shape, dtype);
    for (auto& t : predictions_) t = be_.alloc(flat_shape, dtype);
}

namespace {

// The eager ops of one step on flat tensors of the sample dtype. Every op rounds its result to that
// dtype once (the Backend contract), as a PyTorch eager op does.
struct StepOps {
    Backend& be;
    DType dtype;

    // A scheduler scalar (a 0-dim float32 CUDA tensor in the reference) as it enters an op with a
    // tensor of the sample dtype: TensorIterator casts it to the common dtype first (bf16).
    float tensor_scalar(float s) const { return dtype == DType::BF16 ? bf16_to_f32(f32_to_bf16(s)) : s; }

    // out = s * t for a value s of the sample dtype.
    // NOTE: scale computes alpha * x + beta; beta = -0 keeps the product's sign of zero (+0 would
    // turn -0 into +0), so the op is exactly an IEEE multiply.
    void mul(float s, const TensorView& t, const TensorView& out) const { be.scale({s, -0.f}, t, out); }
    // out = s * t, with s a scheduler scalar (mul.Tensor(f32[], bf16[...]))
    void mul_scalar(float s, const TensorView& t, const TensorView& out) const {
        mul(tensor_scalar(s), t, out);
    }
    // out = t / s, with s a scheduler scalar (div.Tensor(bf16[...], f32[])).
    // NOTE: computed as t * (1 / s). On bf16 this rounds exactly like the true division: t and
    // bf16(s) have 8-bit significands, so t / s is never a bf16 rounding midpoint (its odd part
    // would need >= 9 bits) and is at least ~2^-18 relative away from one, far more than the
    // float32 error of the reciprocal product (~2^-23). On f32 it is within an ulp of the division.
    void div_scalar(const TensorView& t, float s, const TensorView& out) const {
        mul(1.f / tensor_scalar(s), t, out);
    }
    void sub(const TensorView& a, const TensorView& b, const TensorView& out) const {
        be.binary({BinaryOp::Sub}, a, b, out);
    }

    // x_t_ = sigma_t / sigma_s0 * x - alpha_t * h_phi_1 * m0 (three ops). `tmp` != out.
    void base(const UniPCUpdate& u, const TensorView& x, const TensorView& m0, const TensorView& out,
              const TensorView& tmp) const {
        mul_scalar(u.ratio, x, out);
        mul_scalar(u.a_phi, m0, tmp);
        sub(out, tmp, out);
    }

    // D1 = (m_s1 - m_s0) / rk (two ops)
    void d1(const UniPCUpdate& u, const TensorView& m_s1, const TensorView& m_s0,
            const TensorView& out) const {
        sub(m_s1, m_s0, out);
        div_scalar(out, u.rk, out);
    }

    // einsum("k,bkc...->bc...", rhos[:1], D1s): k = 1 at solver order 2, so one elementwise product
    // (the trace shows mul.Tensor(bf16[1, 1, ...], bf16[..., 1])); the rhos are sample-dtype tensors.
    void einsum_k1(float rho0, const TensorView& d1, const TensorView& out) const {
        mul(tensor_scalar(rho0), d1, out);
    }
};

}  // namespace

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
    const Shape flat_shape{shape_.numel()};
    const TensorView x = flat(sample);
    TensorView v = flat(velocity);
    if (v.dtype != dtype_) {
        const TensorView converted = be_.scratch(flat_shape, dtype_);
        be_.copy(v, converted);
        v = converted;
    }
    const TensorView a = be_.scratch(flat_shape, dtype_), b = be_.scratch(flat_shape, dtype_),
                     d = be_.scratch(flat_shape, dtype_);
    const UniPCStep& s = steps_[size_t(i)];
    const StepOps op{be_, dtype_};

    auto pred = [&](int k) { return predictions_[((k % 3) + 3) % 3].view(); };
    const TensorView m_i = pred(i), m_prev = pred(i - 1), m_prev2 = pred(i - 2);
    const TensorView c = corrected_.view();

    // convert_model_output: x0_pred = sample - sigma_t * model_output
    op.mul_scalar(s.sigma, v, a);
    op.sub(x, a, m_i);

    // multistep_uni_c_bh_update: c_i from last_sample c_{i-1}, m0 = m_{i-1}, model_t = m_i
    const UniPCUpdate& uc = s.corrector;
    if (uc.order == 0) {
        be_.copy(x, c);  // step 0: last_sample = sample
    } else {
        if (uc.order == 2) op.d1(uc, m_prev2, m_prev, d);  // D1s
        op.base(uc, c, m_prev, a, b);                      // x_t_
        if (uc.order == 2) op.einsum_k1(uc.rho0, d, d);    // corr_res
        op.sub(m_i, m_prev, b);                            // D1_t = model_t - m0
        op.mul(op.tensor_scalar(uc.rho_last), b, b);       // rhos_c[-1] * D1_t
        if (uc.order == 2)
            be_.add(d, b, b);  // corr_res + ...
        else
            be_.scale({1.f, 0.f}, b, b);  // ... + 0 (corr_res is the Python int 0)
        op.mul_scalar(uc.a_b, b, b);      // alpha_t * B_h * (...)
        op.sub(a, b, c);                  // x_t = x_t_ - ...
    }

    // multistep_uni_p_bh_update: x_{i+1} from c_i, m0 = m_i, m_{i-1}
    const UniPCUpdate& up = s.predictor;
    if (up.order == 2) op.d1(up, m_prev, m_i, d);  // D1s
    op.base(up, c, m_i, a, b);                     // x_t_
    if (up.order == 2) {
        op.einsum_k1(up.rho0, d, d);  // pred_res (rhos_p = 0.5)
        op.mul_scalar(up.a_b, d, d);  // alpha_t * B_h * pred_res
        op.sub(a, d, x);              // x_t = x_t_ - ...
    } else {
        // pred_res is the Python int 0: alpha_t * B_h * 0 is a 0-dim float32 (-0 here), subtracted
        // from x_t_ (x - z is x + (-z), which turns -0 elements into +0 like the reference).
        const float z = op.tensor_scalar(up.a_b * 0.f);
        be_.scale({1.f, -z}, a, x);
    }
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
