#pragma once
/// What the CUDA tests that compare engines share: an engine over random weights on GPU 0, and a bitwise comparison.
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "config/run_config.h"
#include "policy/engine.h"
#include "rollout/bench_rollout.h"
#include "support/test_support.h"
#include "model/inventory.h"
#include "weights/random_weights.h"

namespace dzr::test {

/// The tiny config with `overrides` and random weights of its model (make one per test binary: it is large).
struct RandomModel {
    config::RunConfig rc;
    RandomWeightSource weights;
    RandomModel(const std::vector<config::Override>& overrides, uint64_t seed)
        : rc(config::load_run_config(source_dir() / "configs/tiny.yaml", overrides)),
          weights(expected_weights(rc.model), seed, 2) {}
};

/// An engine of the model's geometry, sampling and kv settings over its weights on GPU 0 in `numerics`, the bench's
/// embodiment; `adjust` edits the policy options first. Convolutions are untuned: fast numerics time each
/// shape's cuDNN engines, so two engines could otherwise differ in the last bits for that reason alone.
inline std::unique_ptr<Engine> gpu_engine(const RandomModel& m, Numerics numerics,
                                          const std::function<void(PolicyOptions&)>& adjust = {}) {
    PolicyOptions po;
    po.sampling = m.rc.sampling;
    po.kv = m.rc.kv;
    if (adjust) adjust(po);
    BackendOptions bo;
    bo.numerics = numerics;
    bo.cuda.conv_tune = ConvTune::Off;
    return Engine::create(m.rc.model, m.weights, rollout::bench_embodiment(), data_dir() / "tokenizer/spiece.model", po,
                          {Device::cuda(0)}, bo);
}

/// Bitwise equality of two float vectors (NaN payloads included).
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace dzr::test
