#pragma once
/// ModelConfig <-> a checkpoint's config.json (the HuggingFace `VLA` config of DreamZero:
/// dreamzero-reference.md §4.1). DiT geometry is read from action_head_cfg.config.diffusion_model_cfg;
/// umT5 / CLIP / VAE geometry from our explicit fields in text_encoder_cfg / image_encoder_cfg /
/// vae_cfg when present (the released file carries only pretrained paths there), else the real
/// defaults of model_config.h. A field that is present is always used and type-checked.
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "config/model_fields.h"
#include "config/model_config.h"

namespace dzr::config {

struct ModelConfigFromJson {
    ModelConfig model;
    /// Fields (YAML-style names, "t5.vocab") absent from config.json that took the real default.
    std::vector<std::string> defaulted;
};

/// Reads the geometry. `source` names the file in messages. Throws dzr::Error when the head config or
/// diffusion_model_cfg is missing, a required DiT field is absent, or a field has the wrong type.
ModelConfigFromJson model_config_from_json(const nlohmann::json& config, const std::string& source);

/// A config.json in the real shape carrying every ModelConfig field. `extra` (an object) is merged into
/// the top-level "dzr" section (e.g. the seed of `dzr ckpt make`).
nlohmann::json model_config_to_json(const ModelConfig& m,
                                    const nlohmann::json& extra = nlohmann::json::object());

/// The JSON path of a field, "action_head_cfg.config.diffusion_model_cfg.dim", for messages.
std::string json_path(const ModelField& field);

}  // namespace dzr::config
