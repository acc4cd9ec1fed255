#pragma once
/// FlowUniPC: the multistep UniPC sampler for flow matching that DreamZero uses for both the video
/// latent and the action chunk (official FlowUniPCMultistepScheduler with solver order 2, "bh2",
/// predict-x0, lower_order_final, the corrector on at every step after the first, final sigma 0).
///
/// The schedule (sigmas, integer timesteps) and every per-step scalar are computed on the host when
/// the sampler is built, in float32 and in the reference's operation order (the official scheduler
/// does this arithmetic on 0-dim float32 tensors). A step then executes the reference's elementwise
/// op sequence literally, one Backend op per eager PyTorch op, on tensors of the sample dtype: on a
/// bf16 sample every intermediate rounds to bf16 where PyTorch's does (docs/SAMPLING.md §2 lists the
/// ops). No host sync and no allocation per step, and a fixed op sequence per step index, so the same
/// code serves the CPU reference and the CUDA path (and a CUDA graph).
///
/// Notation per step i: x_i is the sample the network sees at step i, v_i the velocity used at step
/// i, m_i = x_i - sigma_i v_i the x0 prediction, c_i the corrected sample (the official
/// `last_sample`; c_0 = x_0), x_{i+1} the predictor's output.
#include <cstdint>
#include <span>
#include <vector>

#include "backend/backend.h"

namespace dzr {

struct FlowUniPCConfig {
    int num_steps = 16;              ///< inference steps (DreamZero: 16)
    double shift = 5.0;              ///< sigma shift (DreamZero: 5.0)
    int num_train_timesteps = 1000;  ///< training timesteps (sigma_max = float32(1 - 1/this))
};

/// The schedule of the official set_timesteps(num_steps, shift).
struct FlowSchedule {
    std::vector<float> sigmas;       ///< num_steps + 1 entries (float32), the last is 0
    std::vector<int64_t> timesteps;  ///< num_steps entries: int64(sigma * 1000) truncated, in float64
};

/// Builds the schedule: sigma_max = float32(1 - 1/T), s = linspace(sigma_max, 0, n + 1)[:n] in
/// float64, sigma = shift * s / (1 + (shift - 1) * s), timesteps = int64(sigma * T), sigmas in f32
/// with a final 0. Throws dzr::Error for num_steps < 1, shift <= 0 or num_train_timesteps < 2.
FlowSchedule make_flow_schedule(const FlowUniPCConfig& cfg);

/// The float32 scalars of one UniC (corrector) or UniP (predictor) update, as the reference computes
/// them on its 0-dim float32 tensors, between sigma_s0 (the step's source) and sigma_t (its target):
/// alpha = 1 - sigma, lambda = log(alpha) - log(sigma), h = lambda_t - lambda_s0, hh = -h,
/// h_phi_1 = B_h = expm1(hh) (bh2).
struct UniPCUpdate {
    int order = 0;      ///< 0: no update (the corrector of step 0), else 1 or 2
    float ratio = 0.f;  ///< sigma_t / sigma_s0
    float a_phi = 0.f;  ///< alpha_t * h_phi_1
    float a_b = 0.f;    ///< alpha_t * B_h
    float rk = 0.f;     ///< order 2: (lambda_s1 - lambda_s0) / h (s1: the source of the step before)
    float rho0 = 0.f;   ///< order 2: weight of D1 = (m_s1 - m_s0) / rk (predictor 0.5, corrector rhos_c[0])
    float rho_last = 0.f;  ///< corrector: weight of D1_t = m_t - m_s0 (rhos_c[-1]; 0.5 at order 1)
};

/// The scalars of step i: the x0 prediction's sigma_i, the corrector (sigma_{i-1} -> sigma_i) and
/// the predictor (sigma_i -> sigma_{i+1}).
struct UniPCStep {
    int index = 0;
    float sigma = 0.f;  ///< sigma_i of m_i = x_i - sigma_i * v_i
    UniPCUpdate corrector;
    UniPCUpdate predictor;
};

/// The scalars of every step of `schedule`. Orders follow the official warm-up and
/// lower_order_final rule: p_i = min(2, n - i, i + 1); the corrector at step i uses p_{i-1}. The
/// corrector's rhos solve [[1, 1], [rk, 1]] rho = b in float32 as LAPACK does (order 2).
std::vector<UniPCStep> make_unipc_steps(const FlowSchedule& schedule);

/// The sampler on a Backend. Owns its state (the corrected sample and three x0-prediction buffers in
/// the sample dtype, allocated once at construction with be.alloc); a step takes three scratch
/// buffers from the workspace arena (four when the velocity must be converted). Two instances
/// (video, action) are independent.
///
/// Rounding (bf16 samples, as the reference's eager ops on bf16 tensors): every op rounds its
/// result once; a scheduler scalar that multiplies a sample tensor (a 0-dim float32 CUDA tensor in the
/// reference) is rounded to bf16 first; the rhos are bf16 (`.to(x.dtype)`); Python-float constants
/// stay exact. On f32 samples nothing is rounded beyond float32.
class FlowUniPC {
  public:
    /// sample_shape/dtype: the shape and dtype of the sample this instance will step (the state uses
    /// the same dtype; bf16 on CUDA rounds like the reference, f32 like its fp32 run).
    FlowUniPC(Backend& be, const Shape& sample_shape, DType dtype, const FlowUniPCConfig& cfg = {});
    FlowUniPC(const FlowUniPC&) = delete;  // copies would share the state buffers
    FlowUniPC& operator=(const FlowUniPC&) = delete;

    /// Start a new trajectory at step 0 (no allocation).
    void reset() { step_index_ = 0; }

    /// One step: `velocity` is v_i (any float dtype; converted to the sample dtype through scratch when
    /// it differs), `sample` is x_i on entry and x_{i+1} on return. Steps must be taken in order 0..n-1.
    void step(const TensorView& velocity, const TensorView& sample);

    int step_index() const { return step_index_; }
    int num_steps() const { return int(steps_.size()); }
    int64_t timestep(int i) const { return schedule_.timesteps.at(size_t(i)); }
    float sigma(int i) const { return schedule_.sigmas.at(size_t(i)); }
    const FlowSchedule& schedule() const { return schedule_; }
    const std::vector<UniPCStep>& steps() const { return steps_; }
    const Shape& sample_shape() const { return shape_; }

  private:
    Backend& be_;
    Shape shape_;
    DType dtype_;
    FlowSchedule schedule_;
    std::vector<UniPCStep> steps_;
    Tensor corrected_;       // c_{i-1} on entry to step i, c_i after its corrector; flat [numel]
    Tensor predictions_[3];  // m_{i} ring, flat [numel]
    int step_index_ = 0;
};

/// A literal host port of the official step() on f32 vectors: the same scalar and elementwise
/// float32 operations in the same order, as the reference's fp32 run. It is what the Backend
/// sampler's f32 path is tested against (the goldens check both against the official scheduler).
class FlowUniPCReference {
  public:
    explicit FlowUniPCReference(const FlowUniPCConfig& cfg = {});
    void reset();
    /// `sample` is x_i on entry and x_{i+1} on return.
    void step(std::span<const float> velocity, std::span<float> sample);
    int step_index() const { return step_index_; }
    const FlowSchedule& schedule() const { return schedule_; }

  private:
    FlowSchedule schedule_;
    std::vector<float> m_prev_, m_prev2_, last_sample_;
    int this_order_ = 0;
    int lower_order_nums_ = 0;
    int step_index_ = 0;
};

}  // namespace dzr
