#include "config/model_json.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>

#include "config/model_fields.h"
#include "core/error.h"

namespace dzr::config {

using nlohmann::json;

namespace {

constexpr const char* kHeadTarget =
    "groot.vla.model.dreamzero.action_head.wan_flow_matching_action_tf.WANPolicyHead";
constexpr const char* kHeadConfigTarget =
    "groot.vla.model.dreamzero.action_head.wan_flow_matching_action_tf.WANPolicyHeadConfig";
constexpr const char* kDitTarget =
    "groot.vla.model.dreamzero.modules.wan_video_dit_action_casual_chunk.CausalWanModel";
constexpr const char* kTextTarget = "groot.vla.model.dreamzero.modules.wan_video_text_encoder.WanTextEncoder";
constexpr const char* kImageTarget =
    "groot.vla.model.dreamzero.modules.wan_video_image_encoder.WanImageEncoder";
constexpr const char* kVaeTarget = "groot.vla.model.dreamzero.modules.wan_video_vae.WanVideoVAE";
constexpr const char* kBackboneTarget = "groot.vla.model.dreamzero.backbone.identity.IdentityBackbone";

const char* section_path(JsonSection s) {
    switch (s) {
        case JsonSection::Head:
            return "action_head_cfg.config";
        case JsonSection::Dit:
            return "action_head_cfg.config.diffusion_model_cfg";
        case JsonSection::Text:
            return "action_head_cfg.config.text_encoder_cfg";
        case JsonSection::Image:
            return "action_head_cfg.config.image_encoder_cfg";
        case JsonSection::Vae:
            return "action_head_cfg.config.vae_cfg";
        case JsonSection::Dzr:
            return "dzr";
    }
    return "?";
}

/// The section object, or nullptr when absent / null.
const json* find_section(const json& root, JsonSection s, const std::string& source) {
    auto child = [&](const json* node, const char* key, const std::string& path) -> const json* {
        if (!node) return nullptr;
        auto it = node->find(key);
        if (it == node->end() || it->is_null()) return nullptr;
        DZR_CHECK(it->is_object(), "{}: {} must be an object, got {}", source, path, it->type_name());
        return &*it;
    };
    const json* head =
        child(child(&root, "action_head_cfg", "action_head_cfg"), "config", "action_head_cfg.config");
    switch (s) {
        case JsonSection::Head:
            return head;
        case JsonSection::Dit:
            return child(head, "diffusion_model_cfg", section_path(s));
        case JsonSection::Text:
            return child(head, "text_encoder_cfg", section_path(s));
        case JsonSection::Image:
            return child(head, "image_encoder_cfg", section_path(s));
        case JsonSection::Vae:
            return child(head, "vae_cfg", section_path(s));
        case JsonSection::Dzr:
            return child(&root, "dzr", "dzr");
    }
    return nullptr;
}

[[noreturn]] void bad_type(const std::string& source, const std::string& path, const char* what,
                           const json& v) {
    DZR_THROW("{}: {}: expected {}, got {}", source, path, what, v.dump());
}

int read_int(const json& v, const std::string& source, const std::string& path) {
    if (!v.is_number_integer()) bad_type(source, path, "an integer", v);
    const int64_t x = v.get<int64_t>();
    if (x < INT32_MIN || x > INT32_MAX) bad_type(source, path, "a 32-bit integer", v);
    return int(x);
}

// NOTE: hydra/OmegaConf dumps can carry floats such as 1e-6 as strings; accept numeric strings.
float read_float(const json& v, const std::string& source, const std::string& path) {
    if (v.is_number()) return v.get<float>();
    if (v.is_string()) {
        const std::string s = v.get<std::string>();
        char* end = nullptr;
        const double d = std::strtod(s.c_str(), &end);
        if (!s.empty() && end == s.c_str() + s.size() && std::isfinite(d)) return float(d);
    }
    bad_type(source, path, "a number", v);
}

void read_value(const json& v, int& out, const std::string& src, const std::string& path) {
    out = read_int(v, src, path);
}
void read_value(const json& v, float& out, const std::string& src, const std::string& path) {
    out = read_float(v, src, path);
}
void read_value(const json& v, bool& out, const std::string& src, const std::string& path) {
    if (!v.is_boolean()) bad_type(src, path, "true or false", v);
    out = v.get<bool>();
}
void read_value(const json& v, std::vector<int>& out, const std::string& src, const std::string& path) {
    if (!v.is_array()) bad_type(src, path, "a list of integers", v);
    out.clear();
    for (const auto& x : v) out.push_back(read_int(x, src, path));
}
void read_value(const json& v, std::vector<bool>& out, const std::string& src, const std::string& path) {
    if (!v.is_array()) bad_type(src, path, "a list of booleans", v);
    out.clear();
    for (const auto& x : v) {
        if (!x.is_boolean()) bad_type(src, path, "a list of booleans", v);
        out.push_back(x.get<bool>());
    }
}
void read_value(const json& v, std::array<int, 3>& out, const std::string& src, const std::string& path) {
    if (!v.is_array() || v.size() != 3) bad_type(src, path, "a list of 3 integers", v);
    for (size_t i = 0; i < 3; ++i) out[i] = read_int(v[i], src, path);
}

json to_json(int v) {
    return v;
}
// NOTE: the shortest decimal that round-trips the float (1e-06, not 9.999999974752427e-07).
json to_json(float v) {
    return std::strtod(fmt::format("{}", v).c_str(), nullptr);
}
json to_json(bool v) {
    return v;
}
json to_json(const std::vector<int>& v) {
    return v;
}
json to_json(const std::array<int, 3>& v) {
    return json::array({v[0], v[1], v[2]});
}
json to_json(const std::vector<bool>& v) {
    json a = json::array();
    for (bool b : v) a.push_back(b);
    return a;
}

}  // namespace

std::string json_path(const ModelField& field) {
    return std::string(section_path(field.section)) + "." + std::string(field.json);
}

ModelConfigFromJson model_config_from_json(const json& config, const std::string& source) {
    DZR_CHECK(config.is_object(), "{}: expected a JSON object at the top level, got {}", source,
              config.type_name());
    DZR_CHECK(find_section(config, JsonSection::Head, source) != nullptr,
              "{}: no action_head_cfg.config object (not a DreamZero VLA config.json)", source);
    DZR_CHECK(find_section(config, JsonSection::Dit, source) != nullptr,
              "{}: no action_head_cfg.config.diffusion_model_cfg object (the DiT geometry)", source);
    ModelConfigFromJson out;
    for_each_model_field(out.model, [&](const ModelField& f, auto& value) {
        const json* section = find_section(config, f.section, source);
        const std::string path = json_path(f);
        const json* v = nullptr;
        if (section) {
            auto it = section->find(std::string(f.json));
            if (it != section->end() && !it->is_null()) v = &*it;
        }
        if (!v) {
            DZR_CHECK(!f.required_in_json, "{}: {} is missing (needed for the DiT geometry)", source, path);
            out.defaulted.emplace_back(f.yaml);
            return;
        }
        read_value(*v, value, source, path);
    });
    return out;
}

json model_config_to_json(const ModelConfig& m, const json& extra) {
    json head = {
        {"_target_", kHeadConfigTarget},
        {"num_frame_per_block", m.dit.num_frame_per_block},
        {"action_dim", m.max_action_dim},
        {"max_state_dim", m.dit.max_state_dim},
        {"hidden_size", m.dit.hidden_size},
        {"input_embedding_dim", 1536},
        {"num_inference_timesteps", 16},
        {"backbone_embedding_dim", 0},
        {"train_architecture", "full"},
        {"skip_component_loading", true},
        {"decouple_inference_noise", false},
        {"tiled", false},
        {"diffusion_model_cfg", {{"_target_", kDitTarget}, {"model_type", "i2v"}}},
        {"text_encoder_cfg", {{"_target_", kTextTarget}, {"text_encoder_pretrained_path", nullptr}}},
        {"image_encoder_cfg", {{"_target_", kImageTarget}, {"image_encoder_pretrained_path", nullptr}}},
        {"vae_cfg", {{"_target_", kVaeTarget}, {"vae_pretrained_path", nullptr}}},
    };
    json root = {
        {"architectures", json::array({"VLA"})},
        {"model_type", "vla"},
        {"action_horizon", m.action_horizon},
        {"action_dim", m.max_action_dim},
        {"backbone_cfg", {{"_target_", kBackboneTarget}}},
        {"action_head_cfg", {{"_target_", kHeadTarget}, {"config", head}}},
        {"dzr", json::object()},
    };
    for_each_model_field(m, [&](const ModelField& f, const auto& value) {
        json* section = nullptr;
        json& h = root["action_head_cfg"]["config"];
        switch (f.section) {
            case JsonSection::Head:
                section = &h;
                break;
            case JsonSection::Dit:
                section = &h["diffusion_model_cfg"];
                break;
            case JsonSection::Text:
                section = &h["text_encoder_cfg"];
                break;
            case JsonSection::Image:
                section = &h["image_encoder_cfg"];
                break;
            case JsonSection::Vae:
                section = &h["vae_cfg"];
                break;
            case JsonSection::Dzr:
                section = &root["dzr"];
                break;
        }
        (*section)[std::string(f.json)] = to_json(value);
    });
    if (extra.is_object())
        for (const auto& [k, v] : extra.items()) root["dzr"][k] = v;
    return root;
}

}  // namespace dzr::config
