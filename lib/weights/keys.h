#pragma once
/// Checkpoint key names. Every key string in dzr is built here: network code writes
/// `keys::dit_block(i) + "self_attn.q.weight"`, never a full key typed inline. Keys are the
/// reference state-dict names used verbatim (dreamzero-reference.md §4.2,
/// tests/data/dreamzero-checkpoint-keys.tsv).
#include <string>
#include <string_view>

namespace dzr::keys {

/// Component prefixes (each ends with a dot).
inline constexpr std::string_view kDit = "action_head.model.";
inline constexpr std::string_view kTextEncoder = "action_head.text_encoder.";
inline constexpr std::string_view kImageEncoder = "action_head.image_encoder.model.";
inline constexpr std::string_view kVae = "action_head.vae.model.";
/// The IdentityBackbone has no parameters; anything stored under it is ignored.
inline constexpr std::string_view kBackbone = "backbone.";

/// PEFT wraps a LoRA-adapted Linear so its weight reads `...q.base_layer.weight`.
inline constexpr std::string_view kPeftBaseLayer = ".base_layer.";

namespace detail {
inline std::string join(std::string_view prefix, std::string_view name) {
    std::string s;
    s.reserve(prefix.size() + name.size());
    s.append(prefix);
    s.append(name);
    return s;
}
inline std::string indexed(std::string_view prefix, std::string_view group, int i) {
    std::string s = join(prefix, group);
    s += std::to_string(i);
    s += '.';
    return s;
}
}  // namespace detail

// ---- causal DiT (action_head.model.) ----

/// "action_head.model." + name, e.g. dit("patch_embedding.weight").
inline std::string dit(std::string_view name) {
    return detail::join(kDit, name);
}
/// "action_head.model.blocks.{i}." (one DiT layer).
inline std::string dit_block(int i) {
    return detail::indexed(kDit, "blocks.", i);
}

// ---- umT5 encoder (action_head.text_encoder.) ----

/// "action_head.text_encoder." + name, e.g. t5("token_embedding.weight").
inline std::string t5(std::string_view name) {
    return detail::join(kTextEncoder, name);
}
/// "action_head.text_encoder.blocks.{j}.".
inline std::string t5_block(int j) {
    return detail::indexed(kTextEncoder, "blocks.", j);
}

// ---- CLIP visual tower (action_head.image_encoder.model.) ----

/// "action_head.image_encoder.model." + name, e.g. clip("visual.cls_embedding").
inline std::string clip(std::string_view name) {
    return detail::join(kImageEncoder, name);
}
/// "action_head.image_encoder.model.visual.transformer.{b}.".
inline std::string clip_block(int b) {
    return detail::indexed(kImageEncoder, "visual.transformer.", b);
}

// ---- Wan2.1 VAE (action_head.vae.model.) ----

/// "action_head.vae.model." + name, e.g. vae("conv1.weight").
inline std::string vae(std::string_view name) {
    return detail::join(kVae, name);
}
/// "action_head.vae.model.encoder." + name.
inline std::string vae_encoder(std::string_view name) {
    return vae(detail::join("encoder.", name));
}
/// "action_head.vae.model.decoder." + name.
inline std::string vae_decoder(std::string_view name) {
    return vae(detail::join("decoder.", name));
}
/// "action_head.vae.model.encoder.downsamples.{i}." (residual block or resample layer).
inline std::string vae_encoder_down(int i) {
    return detail::indexed(kVae, "encoder.downsamples.", i);
}
/// "action_head.vae.model.decoder.upsamples.{i}.".
inline std::string vae_decoder_up(int i) {
    return detail::indexed(kVae, "decoder.upsamples.", i);
}
/// "action_head.vae.model.encoder.middle.{i}." (0, 2: residual blocks; 1: attention).
inline std::string vae_encoder_middle(int i) {
    return detail::indexed(kVae, "encoder.middle.", i);
}
/// "action_head.vae.model.decoder.middle.{i}.".
inline std::string vae_decoder_middle(int i) {
    return detail::indexed(kVae, "decoder.middle.", i);
}

/// True when `key` starts with `prefix`.
inline bool has_prefix(std::string_view key, std::string_view prefix) {
    return key.substr(0, prefix.size()) == prefix;
}

}  // namespace dzr::keys
