#pragma once
/// `dzr ckpt make`: a checkpoint directory with random weights under the real key names at a config's
/// geometry, a config.json in the real shape, a plausible experiment_cfg/metadata.json (DROID's, or the
/// caller's) and, when given, an experiment_cfg/conf.yaml (`--embodiment`, config/embodiment.h).
///
/// Determinism: tensor `key` is drawn from its own generator, xoshiro256** seeded by splitmix64 from
/// (seed, FNV-1a-64(key)), so every tensor is independent of the others and of the write order; normals
/// come from Box-Muller pairs. Same seed, config and dtype => identical bytes.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "weights/inventory.h"
#include "weights/outlier_columns.h"
#include "config/model_config.h"

#include <nlohmann/json.hpp>

namespace dzr {

struct MakeOptions {
    uint64_t seed = 0;
    DType dtype = DType::BF16;            // bf16, f16 or f32
    uint64_t shard_size = 5'000'000'000;  // most tensor bytes per shard (HF's default 5 GB)
    std::filesystem::path tokenizer;      // copied in as spiece.model when set (rollouts then find it)
    /// experiment_cfg/metadata.json text; empty: droid_metadata_json().
    std::string metadata_json;
    /// experiment_cfg/conf.yaml text; empty: none (the policy then uses its built-in embodiments).
    std::string conf_yaml;
    int threads = 0;                      // shards written at once; 0 = up to 8 (the bytes never depend on it)
    /// Outlier input columns in the FP8 Linear weights (weights/outlier_columns.h); off by default.
    OutlierOptions outliers;
};

struct ShardPlan {
    std::string name;             // "model.safetensors" or "model-00001-of-00003.safetensors"
    std::vector<size_t> weights;  // indices into MakePlan::weights
    uint64_t bytes = 0;           // tensor bytes
};

/// What `make` would write: the inventory, its split into shards, and the totals.
struct MakePlan {
    std::vector<ExpectedWeight> weights;
    std::vector<ShardPlan> shards;
    ComponentCensus census;
    uint64_t total_bytes = 0;  // tensor bytes at the chosen dtype
    bool indexed() const { return shards.size() > 1; }
};

/// The plan of `weights` (an inventory: model/inventory.h expected_weights(), whose header also has the
/// overloads that take a ModelConfig).
MakePlan plan_random_checkpoint(std::vector<ExpectedWeight> weights, const MakeOptions& options);

/// Writes the checkpoint of `weights` (the inventory of `config`) into `out_dir`, which must not exist (or be an
/// empty directory). Everything is written into a temporary sibling directory first and renamed at the end, so a
/// failure leaves nothing.
/// Shards are written in parallel; checksums.sha256 lists the SHA-256 of every file written.
/// Returns the plan it wrote.
MakePlan write_random_checkpoint(const ModelConfig& config, std::vector<ExpectedWeight> weights,
                                 const MakeOptions& options, const std::filesystem::path& out_dir);

/// The generator of one tensor (see the header comment).
class WeightRng {
  public:
    WeightRng(uint64_t seed, std::string_view key);
    uint64_t next_u64();
    /// Uniform in [0, 1) with 53 random bits.
    double uniform();
    /// Standard normal (Box-Muller; the second value of each pair is returned by the next call).
    double normal();

  private:
    uint64_t s_[4];
    bool has_spare_ = false;
    double spare_ = 0.0;
};

/// The values of one weight as `dtype` bytes (size = numel * dtype size), as `make` writes them.
void fill_random_weight(const ExpectedWeight& weight, uint64_t seed, DType dtype, std::vector<uint8_t>& out);

/// A plausible experiment_cfg/metadata.json for oxe_droid (state joint/gripper/cartesian quantiles over
/// the Franka joint ranges; relative joint actions within +-0.5 rad; gripper in [0, 1]).
std::string droid_metadata_json();

/// "random weights (dzr ckpt make, seed 0)" when a checkpoint's config.json says `dzr ckpt make` wrote it (its
/// "dzr" section): its actions are noise, which every report must say. nullopt for any other checkpoint.
std::optional<std::string> random_weights_note(const nlohmann::json& config_json);

}  // namespace dzr
