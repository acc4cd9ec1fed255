#pragma once
/// One table of every ModelConfig field: its path under the YAML `model:` node and where it lives in a
/// checkpoint's config.json. The YAML reader, the config.json reader and writer, and the geometry
/// comparison all walk this table, so a new field is added in one place.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "config/model_config.h"

namespace dzr::config {

/// Where a field sits in config.json.
enum class JsonSection : uint8_t {
    Head,   // action_head_cfg.config.*
    Dit,    // action_head_cfg.config.diffusion_model_cfg.*
    Text,   // action_head_cfg.config.text_encoder_cfg.*
    Image,  // action_head_cfg.config.image_encoder_cfg.*
    Vae,    // action_head_cfg.config.vae_cfg.*
    Dzr,    // top-level "dzr" object (our own fields; the released config.json has none)
};

struct ModelField {
    std::string_view yaml;  // path under `model:` ("dit.dim")
    JsonSection section;
    std::string_view json;          // key inside the section ("dim")
    bool required_in_json = false;  // config.json must carry it (never defaulted)
};

/// Calls f(const ModelField&, field&) for every field of `m` (ModelConfig or const ModelConfig).
/// Field types: int, float, bool, std::vector<int>, std::vector<bool>, std::array<int, 3>.
template <class M, class F>
void for_each_model_field(M& m, F&& f) {
    using S = JsonSection;
    // DiT (CausalWanModel constructor arguments; reference names)
    f(ModelField{"dit.dim", S::Dit, "dim", true}, m.dit.dim);
    f(ModelField{"dit.num_layers", S::Dit, "num_layers", true}, m.dit.num_layers);
    f(ModelField{"dit.num_heads", S::Dit, "num_heads", true}, m.dit.num_heads);
    f(ModelField{"dit.ffn_dim", S::Dit, "ffn_dim", true}, m.dit.ffn_dim);
    f(ModelField{"dit.in_dim", S::Dit, "in_dim", true}, m.dit.in_dim);
    f(ModelField{"dit.out_dim", S::Dit, "out_dim", true}, m.dit.out_dim);
    f(ModelField{"dit.freq_dim", S::Dit, "freq_dim"}, m.dit.freq_dim);
    f(ModelField{"dit.text_dim", S::Dit, "text_dim"}, m.dit.text_dim);
    f(ModelField{"dit.text_len", S::Dit, "text_len"}, m.dit.text_len);
    f(ModelField{"dit.patch_size", S::Dit, "patch_size"}, m.dit.patch_size);
    f(ModelField{"dit.frame_seqlen", S::Dit, "frame_seqlen"}, m.dit.frame_seqlen);
    f(ModelField{"dit.num_frame_per_block", S::Dit, "num_frame_per_block"}, m.dit.num_frame_per_block);
    f(ModelField{"dit.num_action_per_block", S::Dit, "num_action_per_block"}, m.dit.num_action_per_block);
    f(ModelField{"dit.num_state_per_block", S::Dit, "num_state_per_block"}, m.dit.num_state_per_block);
    f(ModelField{"dit.max_chunk_size", S::Dit, "max_chunk_size"}, m.dit.max_chunk_size);
    f(ModelField{"dit.action_dim", S::Dit, "action_dim"}, m.dit.action_dim);
    f(ModelField{"dit.max_state_dim", S::Dit, "max_state_dim"}, m.dit.max_state_dim);
    f(ModelField{"dit.hidden_size", S::Dit, "hidden_size"}, m.dit.hidden_size);
    f(ModelField{"dit.image_dim", S::Dit, "image_dim"}, m.dit.image_dim);
    f(ModelField{"dit.eps", S::Dit, "eps"}, m.dit.eps);
    // umT5 (WanTextEncoder constructor arguments, plus text_len and eps)
    f(ModelField{"t5.vocab", S::Text, "vocab"}, m.t5.vocab);
    f(ModelField{"t5.dim", S::Text, "dim"}, m.t5.dim);
    f(ModelField{"t5.dim_attn", S::Text, "dim_attn"}, m.t5.dim_attn);
    f(ModelField{"t5.ffn_dim", S::Text, "dim_ffn"}, m.t5.ffn_dim);
    f(ModelField{"t5.num_heads", S::Text, "num_heads"}, m.t5.num_heads);
    f(ModelField{"t5.num_layers", S::Text, "num_layers"}, m.t5.num_layers);
    f(ModelField{"t5.num_buckets", S::Text, "num_buckets"}, m.t5.num_buckets);
    f(ModelField{"t5.text_len", S::Text, "text_len"}, m.t5.text_len);
    f(ModelField{"t5.eps", S::Text, "eps"}, m.t5.eps);
    // CLIP visual tower (open-clip vision_* names)
    f(ModelField{"clip.image_size", S::Image, "image_size"}, m.clip.image_size);
    f(ModelField{"clip.patch_size", S::Image, "patch_size"}, m.clip.patch_size);
    f(ModelField{"clip.width", S::Image, "vision_dim"}, m.clip.width);
    f(ModelField{"clip.num_layers", S::Image, "vision_layers"}, m.clip.num_layers);
    f(ModelField{"clip.num_heads", S::Image, "vision_heads"}, m.clip.num_heads);
    f(ModelField{"clip.mlp_dim", S::Image, "vision_mlp_dim"}, m.clip.mlp_dim);
    f(ModelField{"clip.embed_dim", S::Image, "embed_dim"}, m.clip.embed_dim);
    f(ModelField{"clip.use_layers", S::Image, "use_layers"}, m.clip.use_layers);
    f(ModelField{"clip.eps", S::Image, "eps"}, m.clip.eps);
    // VAE
    f(ModelField{"vae.base_dim", S::Vae, "base_dim"}, m.vae.base_dim);
    f(ModelField{"vae.z_dim", S::Vae, "z_dim"}, m.vae.z_dim);
    f(ModelField{"vae.dim_mult", S::Vae, "dim_mult"}, m.vae.dim_mult);
    f(ModelField{"vae.num_res_blocks", S::Vae, "num_res_blocks"}, m.vae.num_res_blocks);
    f(ModelField{"vae.temporal_downsample", S::Vae, "temporal_downsample"}, m.vae.temporal_downsample);
    f(ModelField{"vae.has_decoder", S::Vae, "has_decoder"}, m.vae.has_decoder);
    // policy head
    f(ModelField{"num_frames", S::Head, "num_frames"}, m.num_frames);
    f(ModelField{"action_horizon", S::Head, "action_horizon"}, m.action_horizon);
    f(ModelField{"max_action_dim", S::Head, "max_action_dim"}, m.max_action_dim);
    f(ModelField{"canvas_height", S::Dzr, "canvas_height"}, m.canvas_height);
    f(ModelField{"canvas_width", S::Dzr, "canvas_width"}, m.canvas_width);
}

/// Problems that make a geometry unusable (text_dim != umT5 width, frame_seqlen != canvas tokens, ...),
/// one line each; empty when the geometry is consistent.
std::vector<std::string> check_model_config(const ModelConfig& m);

/// Throws dzr::Error listing check_model_config()'s problems, prefixed by `source`.
void require_consistent_model_config(const ModelConfig& m, const std::string& source);

/// Field-by-field differences "dit.dim: 5120 vs 256" between `a` and `b` (a's value first).
std::vector<std::string> diff_model_configs(const ModelConfig& a, const ModelConfig& b);

}  // namespace dzr::config
