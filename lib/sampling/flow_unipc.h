#pragma once
/// FlowUniPC: the multistep UniPC sampler for flow matching that DreamZero uses for both the video
/// latent and the action chunk (official FlowUniPCMultistepScheduler with solver order 2, "bh2",
/// predict-x0, lower_order_final, the corrector on at every step after the first, final sigma 0).
///
/// The schedule (sigmas, integer timesteps) and every per-step scalar coefficient are computed on
/// the host when the sampler is built. A step is then a fixed sequence of Backend scale/add ops on
/// device tensors with those scalars as op parameters: no host sync and no allocation per step, so
/// the same code serves the CPU reference and the CUDA path (and a CUDA graph).
///
/// Notation per step i (docs/SAMPLING.md has the derivation):
///   m_i     = x_i - sigma_i * v_i                                   (x0 prediction)
///   c_0     = x_0
///   c_i     = corr_last * c_{i-1} + corr_m2 * m_{i-2} + corr_m1 * m_{i-1} + corr_m0 * m_i   (i >= 1)
///   x_{i+1} = pred_c * c_i + pred_m0 * m_i + pred_m1 * m_{i-1}
/// x_i is the (uncorrected) sample the network sees at step i, v_i the velocity used at step i,
/// c_i the corrected sample (the official `last_sample`).
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

/// The scalar coefficients of one step (see the header comment for the update they define).
struct UniPCStep {
    int index = 0;
    float sigma = 0.f;        ///< sigma_i of the x0 prediction m_i = x_i - sigma * v_i
    int corrector_order = 0;  ///< 0 at step 0 (no corrector), else 1 or 2
    float corr_last = 0.f, corr_m2 = 0.f, corr_m1 = 0.f, corr_m0 = 0.f;
    int predictor_order = 1;  ///< 1 or 2
    float pred_c = 0.f, pred_m0 = 0.f, pred_m1 = 0.f;
};

/// The coefficients of every step of `schedule`. Orders follow the official warm-up and
/// lower_order_final rule: p_i = min(2, n - i, i + 1); the corrector at step i uses p_{i-1}.
/// The scalar primitives (alpha, lambda, h, expm1, the 2x2 solve) are evaluated in float32 in the
/// reference's order; they are combined into the coefficients in double and rounded once.
std::vector<UniPCStep> make_unipc_steps(const FlowSchedule& schedule);

/// The sampler on a Backend. Owns its state (two corrected-sample and three x0-prediction buffers,
/// allocated once at construction with be.alloc); a step takes only a scratch buffer from the
/// workspace arena. Two instances (video, action) are independent.
class FlowUniPC {
  public:
    /// sample_shape/dtype: the shape and dtype of the sample this instance will step (the state
    /// uses the same dtype; an f32 state is recommended even on CUDA: the tensors are small).
    FlowUniPC(Backend& be, const Shape& sample_shape, DType dtype, const FlowUniPCConfig& cfg = {});
    FlowUniPC(const FlowUniPC&) = delete;  // copies would share the state buffers
    FlowUniPC& operator=(const FlowUniPC&) = delete;

    /// Start a new trajectory at step 0 (no allocation).
    void reset() { step_index_ = 0; }

    /// One step: `velocity` is v_i (any float dtype; converted through scratch when it differs),
    /// `sample` is x_i on entry and x_{i+1} on return. Steps must be taken in order 0..n-1.
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
    Tensor corrected_[2];    // c_{i} ping-pong, flat [numel]
    Tensor predictions_[3];  // m_{i} ring, flat [numel]
    int step_index_ = 0;
};

/// A literal host port of the official step() on f32 vectors: the same scalar and elementwise
/// float32 operations in the same order (no folded coefficients). It is the reference the folded
/// Backend path is tested against, and what a parity run compares with the official dumps.
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
