#include "model/inventory.h"

#include "backend/measuring_backend.h"
#include "model/causal_dit.h"
#include "model/clip_vision.h"
#include "model/umt5.h"
#include "model/wan_vae.h"

namespace dzr {

std::vector<ExpectedWeight> expected_weights(const ModelConfig& config) {
    MeasuringBackend be(DType::BF16);
    WeightLoader recorder(be);
    // NOTE: each network is dropped as soon as it has declared its weights; only the records are kept.
    CausalDit(config.dit, config.canvas_height / 8, config.canvas_width / 8, recorder);
    Umt5Encoder(recorder, config.t5);
    ClipVision(recorder, config.clip, config.canvas_height, config.canvas_width);
    WanVae(recorder, config.vae);
    std::vector<ExpectedWeight> out;
    out.reserve(recorder.declarations().size());
    for (const WeightDeclaration& d : recorder.declarations())
        out.push_back({d.key, d.shape, component_of(d.key), d.init, d.linear});
    return out;
}

MakePlan plan_random_checkpoint(const ModelConfig& config, const MakeOptions& options) {
    return plan_random_checkpoint(expected_weights(config), options);
}

MakePlan write_random_checkpoint(const ModelConfig& config, const MakeOptions& options,
                                 const std::filesystem::path& out_dir) {
    return write_random_checkpoint(config, expected_weights(config), options, out_dir);
}

}  // namespace dzr
