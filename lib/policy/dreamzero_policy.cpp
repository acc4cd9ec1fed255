#include "policy/dreamzero_policy.h"

namespace dzr {

DreamZeroPolicy::DreamZeroPolicy(const ModelConfig& model, const WeightSource& weights,
                                 const Embodiment& embodiment, const std::filesystem::path& tokenizer,
                                 const PolicyOptions& options, Backend& be)
    : DreamZeroPolicy(model, weights, embodiment, tokenizer, options, Placement{{&be}}) {}

DreamZeroPolicy::DreamZeroPolicy(const ModelConfig& model, const WeightSource& weights,
                                 const Embodiment& embodiment, const std::filesystem::path& tokenizer,
                                 const PolicyOptions& options, const Placement& placement)
    : engine_(std::make_unique<Engine>(model, weights, embodiment, tokenizer, options, placement)),
      session_(engine_->open_session()) {}

DreamZeroPolicy::~DreamZeroPolicy() {
    session_.reset();  // before the engine it runs on
}

PolicyCallResult DreamZeroPolicy::step(const Observation& obs) {
    PreparedObservation prepared = prepare(obs);
    PolicyCallResult result = step(prepared);
    recycle(std::move(prepared));
    return result;
}

}  // namespace dzr
