#pragma once
/// The expected weights of a geometry, derived from the networks themselves: expected_weights() builds the
/// DiT, umT5, CLIP and the VAE over a recording WeightLoader on a MeasuringBackend (no weight memory, no
/// upload) and lists what their constructors declare, with each weight's shape and init hint. The constructors
/// are so the one schema of the checkpoint: a weight added to a network is in the inventory, the check and
/// `dzr ckpt make`. At the DROID geometry this is exactly tests/data/dreamzero-checkpoint-keys.tsv (2146
/// tensors, 22,924,172,116 parameters).
#include <filesystem>
#include <vector>

#include "config/model_config.h"
#include "weights/inventory.h"
#include "weights/random_checkpoint.h"

namespace dzr {

/// Every weight of the geometry in module order (DiT, umT5, CLIP, VAE), each network's in the order its
/// constructor declares them (the order `dzr ckpt make` writes). Throws dzr::Error on a geometry a network
/// refuses.
std::vector<ExpectedWeight> expected_weights(const ModelConfig& config);

/// plan_random_checkpoint / write_random_checkpoint (weights/random_checkpoint.h) of expected_weights(config).
MakePlan plan_random_checkpoint(const ModelConfig& config, const MakeOptions& options);
MakePlan write_random_checkpoint(const ModelConfig& config, const MakeOptions& options,
                                 const std::filesystem::path& out_dir);

}  // namespace dzr
