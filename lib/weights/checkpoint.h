#pragma once
/// A DreamZero checkpoint directory (docs/CHECKPOINTS.md):
///   config.json                       model geometry (HF `VLA` config)
///   model.safetensors.index.json      {"metadata": {"total_size": N}, "weight_map": {key: shard}}
///   model-0000k-of-0000N.safetensors  the shards (or a single model.safetensors without index)
///   experiment_cfg/metadata.json      per-embodiment normalization statistics (q01 / q99)
///   spiece.model or tokenizer/        umT5 tokenizer (optional; the path is resolved, not loaded)
/// Opening maps every shard and validates its header and the index; tensors are read lazily through the
/// mappings. PEFT `.base_layer.` infixes are removed from keys (`q.base_layer.weight` reads as `q.weight`).
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config/model_config.h"
#include "weights/safetensors.h"
#include "config/statistics.h"
#include "weights/weight_source.h"

namespace dzr {

/// One safetensors file of a checkpoint.
struct CheckpointShard {
    std::string name;  // file name relative to the checkpoint directory
    std::shared_ptr<SafetensorsFile> file;
};

class Checkpoint final : public WeightSource {
  public:
    /// Opens `dir`: config.json (required), the index or model.safetensors, every shard (strictly
    /// validated), and experiment_cfg/metadata.json when present. Throws dzr::Error naming the file.
    explicit Checkpoint(const std::filesystem::path& dir);

    // WeightSource
    std::optional<TensorView> find(const std::string& key) const override;
    std::vector<std::string> keys() const override;
    std::string location(const std::string& key) const override;
    /// The shard file and the byte offset of the key's data (data_offset() + begin).
    std::optional<StoredRange> stored_range(const std::string& key) const override;

    const std::filesystem::path& dir() const { return dir_; }
    const std::vector<CheckpointShard>& shards() const { return shards_; }
    bool has_index() const { return has_index_; }
    /// metadata.total_size of the index (nullopt without an index or when the index has none).
    std::optional<uint64_t> declared_total_size() const { return declared_total_size_; }
    /// Sum of the stored tensors' bytes.
    uint64_t tensor_bytes() const;

    /// The stored (raw) key of a normalized key (differs only for PEFT `.base_layer.` keys).
    const std::string& stored_key(const std::string& key) const;
    /// Header entry and shard of a (normalized) key; nullptr when absent.
    const SafetensorsEntry* entry(const std::string& key) const;
    const CheckpointShard* shard_of(const std::string& key) const;
    /// An owning host tensor for `key` (shares the shard's mapping). Throws when absent.
    Tensor tensor(const std::string& key) const;

    const nlohmann::json& config_json() const { return config_json_; }
    /// Geometry from config.json (DiT from diffusion_model_cfg; encoders/VAE from explicit fields).
    const ModelConfig& model_config() const { return model_config_; }
    /// ModelConfig fields that config.json does not carry and that took the real defaults.
    const std::vector<std::string>& defaulted_fields() const { return defaulted_; }

    bool has_metadata() const { return !statistics_.empty(); }
    /// All embodiments of experiment_cfg/metadata.json.
    const std::map<std::string, EmbodimentStatistics>& all_statistics() const { return statistics_; }
    /// Statistics of `embodiment`. Throws when metadata.json is absent or lacks the embodiment.
    const EmbodimentStatistics& statistics(const std::string& embodiment) const;

    /// The umT5 tokenizer model, if one is found: spiece.model in the directory, tokenizer/spiece.model,
    /// or tokenizer_path in experiment_cfg/conf.yaml when that path exists.
    std::optional<std::filesystem::path> tokenizer_path() const { return tokenizer_path_; }

  private:
    void open_shards();
    void index_shard(size_t shard_index);
    void load_config();
    void load_metadata();
    void find_tokenizer();

    std::filesystem::path dir_;
    bool has_index_ = false;
    std::optional<uint64_t> declared_total_size_;
    std::vector<CheckpointShard> shards_;
    struct Location {
        size_t shard;
        std::string stored;  // key as stored in the shard
    };
    std::map<std::string, Location> keys_;  // normalized key -> where it is stored
    nlohmann::json config_json_;
    ModelConfig model_config_;
    std::vector<std::string> defaulted_;
    std::map<std::string, EmbodimentStatistics> statistics_;
    std::optional<std::filesystem::path> tokenizer_path_;
};

/// Removes PEFT `.base_layer.` infixes: "a.q.base_layer.weight" -> "a.q.weight".
std::string normalize_peft_key(const std::string& key);

/// Resolves a tokenizer given on the command line or in a config: a spiece.model file, or a directory
/// holding spiece.model (or tokenizer/spiece.model). Throws dzr::Error naming what was tried.
std::filesystem::path resolve_tokenizer_path(const std::filesystem::path& given);

}  // namespace dzr
