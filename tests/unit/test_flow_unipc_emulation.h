#pragma once
// A second, independent host port of the official FlowUniPCMultistepScheduler.step() (solver order 2,
// bh2, predict_x0, lower_order_final, final sigma 0), written eager op by eager op as PyTorch runs it,
// with a rounding hook applied to every tensor op's result:
//   - f32 tensors: no rounding beyond float32 (the reference's fp32 run);
//   - bf16 tensors: each elementwise op computes in float and rounds once to bf16 (round to nearest
//     even); a scheduler scalar (a 0-dim float32 CUDA tensor) meeting a bf16 tensor is first cast to
//     bf16; the rhos are bf16 tensors; Python numbers (0, 0.5 in torch.full) enter exactly.
// Scalar arithmetic between 0-dim float32 tensors stays float32. Division is a true division here
// (PyTorch's CUDA div by a non-CPU-scalar tensor), independent of how the library computes it.
// Used by the CPU test (through a host bf16 backend) and the CUDA test.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <utility>
#include <vector>

#include "core/half.h"

namespace dzr::test {

class EmulatedUniPC {
  public:
    using Vec = std::vector<float>;

    /// sigmas: the schedule's float32 sigmas (n + 1 entries, the last 0).
    EmulatedUniPC(std::vector<float> sigmas, bool bf16) : sigmas_(std::move(sigmas)), bf16_(bf16) {}

    /// Rounds a value to the tensor dtype (the hook).
    float round(float v) const { return bf16_ ? bf16_to_f32(f32_to_bf16(v)) : v; }

    /// step(model_output, timestep, sample, step_index): `sample` is replaced by prev_sample.
    void step(const Vec& model_output, Vec& sample) {
        const int i = step_index_;
        const int n = int(sigmas_.size()) - 1;
        // convert_model_output: x0_pred = sample - sigma_t * model_output
        Vec model_conv = sub(sample, mul_scalar(sigmas_[size_t(i)], model_output));
        Vec current = sample;
        if (i > 0 && has_last_) current = uni_c(model_conv, last_sample_, this_order_, i);
        // model_outputs shift: [-2] <- [-1], [-1] <- converted output
        model_outputs_[0] = std::move(model_outputs_[1]);
        model_outputs_[1] = std::move(model_conv);
        this_order_ = std::min(std::min(2, n - i), lower_order_nums_ + 1);
        last_sample_ = current;
        has_last_ = true;
        sample = uni_p(current, this_order_, i);
        if (lower_order_nums_ < 2) ++lower_order_nums_;
        ++step_index_;
    }

  private:
    // ---- eager tensor ops (each rounds its result) ----
    Vec mul_scalar(float s_f32, const Vec& t) const {  // mul.Tensor(f32[], T[...])
        const float s = round(s_f32);
        Vec o(t.size());
        for (size_t k = 0; k < t.size(); ++k) o[k] = round(s * t[k]);
        return o;
    }
    Vec mul_tensor0(float s_tensor, const Vec& t) const {  // mul.Tensor(T[1 or 0-dim], T[...])
        Vec o(t.size());
        for (size_t k = 0; k < t.size(); ++k) o[k] = round(s_tensor * t[k]);
        return o;
    }
    Vec div_scalar(const Vec& t, float s_f32) const {  // div.Tensor(T[...], f32[])
        const float s = round(s_f32);
        Vec o(t.size());
        for (size_t k = 0; k < t.size(); ++k) o[k] = round(t[k] / s);
        return o;
    }
    Vec sub(const Vec& a, const Vec& b) const {
        Vec o(a.size());
        for (size_t k = 0; k < a.size(); ++k) o[k] = round(a[k] - b[k]);
        return o;
    }
    Vec add(const Vec& a, const Vec& b) const {
        Vec o(a.size());
        for (size_t k = 0; k < a.size(); ++k) o[k] = round(a[k] + b[k]);
        return o;
    }
    Vec add_python(const Vec& a, float c) const {  // add.Tensor(T[...], 0)
        Vec o(a.size());
        for (size_t k = 0; k < a.size(); ++k) o[k] = round(a[k] + c);
        return o;
    }
    Vec sub_scalar(const Vec& a, float s_f32) const {  // sub.Tensor(T[...], f32[])
        const float s = round(s_f32);
        Vec o(a.size());
        for (size_t k = 0; k < a.size(); ++k) o[k] = round(a[k] - s);
        return o;
    }

    // ---- 0-dim float32 scalar helpers ----
    static float lambda(float sigma) {
        const float alpha = 1.f - sigma;  // _sigma_to_alpha_sigma_t
        return std::log(alpha) - std::log(sigma);
    }

    // torch.linalg.solve on a 2x2 float32 system as LAPACK's sgetrf/sgetrs (OpenBLAS) run it: row
    // pivoting on the larger |entry| of column 0 (the first on ties), the column below the pivot
    // scaled by the pivot's reciprocal, and the triangular solves multiplying by the reciprocals of
    // the diagonal.
    static std::pair<float, float> solve2(float a00, float a01, float a10, float a11, float b0, float b1) {
        if (std::fabs(a10) > std::fabs(a00)) {
            std::swap(a00, a10);
            std::swap(a01, a11);
            std::swap(b0, b1);
        }
        const float l10 = a10 * (1.f / a00);
        const float u11 = a11 - l10 * a01;
        const float y1 = b1 - l10 * b0;
        const float x1 = y1 * (1.f / u11);
        const float x0 = (b0 - a01 * x1) * (1.f / a00);
        return {x0, x1};
    }

    // h, hh, h_phi_1, B_h and the b vector as the update functions compute them.
    struct Phi {
        float h, hh, h_phi_1, b_h;
        float b[2];
    };
    static Phi phi(float lambda_t, float lambda_s0, int order) {
        Phi p{};
        p.h = lambda_t - lambda_s0;
        p.hh = -p.h;
        p.h_phi_1 = std::expm1(p.hh);
        float h_phi_k = p.h_phi_1 / p.hh - 1.f;
        int factorial_i = 1;
        p.b_h = std::expm1(p.hh);
        for (int k = 1; k <= order; ++k) {
            p.b[k - 1] = h_phi_k * float(factorial_i) / p.b_h;
            factorial_i *= k + 1;
            h_phi_k = h_phi_k / p.hh - float(1.0 / double(factorial_i));
        }
        return p;
    }

    // multistep_uni_c_bh_update (predict_x0)
    Vec uni_c(const Vec& model_t, const Vec& x, int order, int i) const {
        const Vec& m0 = model_outputs_[1];
        const float sigma_t = sigmas_[size_t(i)], sigma_s0 = sigmas_[size_t(i - 1)];
        const float alpha_t = 1.f - sigma_t;
        const float lambda_t = lambda(sigma_t), lambda_s0 = lambda(sigma_s0);
        const float h = lambda_t - lambda_s0;
        float rk = 1.f;
        Vec d1;
        if (order == 2) {
            rk = (lambda(sigmas_[size_t(i - 2)]) - lambda_s0) / h;
            d1 = div_scalar(sub(model_outputs_[0], m0), rk);
        }
        const Phi p = phi(lambda_t, lambda_s0, order);
        float rho_first = 0.f, rho_last = round(0.5f);  // torch.full((1,), 0.5, dtype=x.dtype)
        if (order == 2) {
            const auto [r0, r1] = solve2(1.f, 1.f, rk, 1.f, p.b[0], p.b[1]);  // R = [rks^0; rks^1]
            rho_first = round(r0);                                            // .to(x.dtype)
            rho_last = round(r1);
        }
        const Vec x_t_ = sub(mul_scalar(sigma_t / sigma_s0, x), mul_scalar(alpha_t * p.h_phi_1, m0));
        Vec corr_res;
        if (order == 2) corr_res = mul_tensor0(rho_first, d1);  // einsum over k = 1
        const Vec d1_t = sub(model_t, m0);
        const float a_b = alpha_t * p.b_h;
        const Vec scaled = mul_tensor0(rho_last, d1_t);
        const Vec inner = order == 2 ? add(corr_res, scaled) : add_python(scaled, 0.f);
        return sub(x_t_, mul_scalar(a_b, inner));
    }

    // multistep_uni_p_bh_update (predict_x0)
    Vec uni_p(const Vec& x, int order, int i) const {
        const Vec& m0 = model_outputs_[1];
        const float sigma_t = sigmas_[size_t(i + 1)], sigma_s0 = sigmas_[size_t(i)];
        const float alpha_t = 1.f - sigma_t;
        const float lambda_t = lambda(sigma_t), lambda_s0 = lambda(sigma_s0);
        const float h = lambda_t - lambda_s0;
        Vec d1;
        if (order == 2) {
            const float rk = (lambda(sigmas_[size_t(i - 1)]) - lambda_s0) / h;
            d1 = div_scalar(sub(model_outputs_[0], m0), rk);
        }
        const Phi p = phi(lambda_t, lambda_s0, order);
        const Vec x_t_ = sub(mul_scalar(sigma_t / sigma_s0, x), mul_scalar(alpha_t * p.h_phi_1, m0));
        const float a_b = alpha_t * p.b_h;
        if (order == 2) {
            const Vec pred_res = mul_tensor0(round(0.5f), d1);  // rhos_p = torch.full((1,), 0.5)
            return sub(x_t_, mul_scalar(a_b, pred_res));
        }
        return sub_scalar(x_t_, a_b * 0.f);  // pred_res = 0: a 0-dim f32 product
    }

    std::vector<float> sigmas_;
    bool bf16_;
    Vec model_outputs_[2];  // [-2], [-1]
    Vec last_sample_;
    bool has_last_ = false;
    int this_order_ = 0;
    int lower_order_nums_ = 0;
    int step_index_ = 0;
};

}  // namespace dzr::test
