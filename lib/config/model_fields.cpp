#include "config/model_fields.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"

namespace dzr::config {

namespace {

std::string text(int v) {
    return std::to_string(v);
}
std::string text(float v) {
    return fmt::format("{}", v);
}
std::string text(bool v) {
    return v ? "true" : "false";
}
std::string text(const std::vector<int>& v) {
    return fmt::format("[{}]", fmt::join(v, ", "));
}
std::string text(const std::array<int, 3>& v) {
    return fmt::format("[{}]", fmt::join(v, ", "));
}
std::string text(const std::vector<bool>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + text(bool(v[i]));
    return s + "]";
}

}  // namespace

std::vector<std::string> check_model_config(const ModelConfig& m) {
    std::vector<std::string> p;
    auto need = [&](bool ok, std::string msg) {
        if (!ok) p.push_back(std::move(msg));
    };
    const auto& d = m.dit;
    for_each_model_field(m, [&](const ModelField& f, const auto& v) {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, int>)
            need(v > 0, fmt::format("{} must be positive, got {}", f.yaml, v));
        if constexpr (std::is_same_v<T, float>)
            need(v > 0, fmt::format("{} must be positive, got {}", f.yaml, v));
    });
    if (!p.empty()) return p;  // the checks below divide by these values

    need(d.dim % d.num_heads == 0,
         fmt::format("dit.dim {} is not a multiple of dit.num_heads {}", d.dim, d.num_heads));
    need(d.head_dim() % 2 == 0, fmt::format("DiT head dim {} must be even (RoPE pairs)", d.head_dim()));
    need(d.text_dim == m.t5.dim,
         fmt::format("dit.text_dim {} must equal the umT5 width t5.dim {}", d.text_dim, m.t5.dim));
    need(d.text_len == m.t5.text_len,
         fmt::format("dit.text_len {} must equal t5.text_len {}", d.text_len, m.t5.text_len));
    need(d.image_dim == m.clip.width,
         fmt::format("dit.image_dim {} must equal the CLIP width clip.width {}", d.image_dim, m.clip.width));
    need(d.in_dim == 2 * m.vae.z_dim + 4,
         fmt::format("dit.in_dim {} must be 2 * vae.z_dim + 4 = {} (latent + mask + y)", d.in_dim,
                     2 * m.vae.z_dim + 4));
    need(d.out_dim == m.vae.z_dim,
         fmt::format("dit.out_dim {} must equal vae.z_dim {}", d.out_dim, m.vae.z_dim));
    need(d.patch_size[0] > 0 && d.patch_size[1] > 0 && d.patch_size[2] > 0,
         fmt::format("dit.patch_size {} must be positive", text(d.patch_size)));
    need(d.num_action_per_block == m.action_horizon,
         fmt::format("dit.num_action_per_block {} must equal action_horizon {} (one block per call)",
                     d.num_action_per_block, m.action_horizon));
    need(d.action_dim == m.max_action_dim,
         fmt::format("dit.action_dim {} must equal max_action_dim {}", d.action_dim, m.max_action_dim));

    need(m.t5.dim_attn % m.t5.num_heads == 0,
         fmt::format("t5.dim_attn {} is not a multiple of t5.num_heads {}", m.t5.dim_attn, m.t5.num_heads));
    need(m.clip.image_size % m.clip.patch_size == 0,
         fmt::format("clip.image_size {} is not a multiple of clip.patch_size {}", m.clip.image_size,
                     m.clip.patch_size));
    need(m.clip.width % m.clip.num_heads == 0,
         fmt::format("clip.width {} is not a multiple of clip.num_heads {}", m.clip.width, m.clip.num_heads));
    need(m.clip.use_layers <= m.clip.num_layers,
         fmt::format("clip.use_layers {} exceeds clip.num_layers {}", m.clip.use_layers, m.clip.num_layers));

    const auto& v = m.vae;
    need(!v.dim_mult.empty(), "vae.dim_mult must not be empty");
    for (int x : v.dim_mult) need(x > 0, fmt::format("vae.dim_mult {} must be positive", text(v.dim_mult)));
    need(v.temporal_downsample.size() + 1 == v.dim_mult.size(),
         fmt::format("vae.temporal_downsample has {} entries, expected len(vae.dim_mult) - 1 = {}",
                     v.temporal_downsample.size(), v.dim_mult.empty() ? 0 : v.dim_mult.size() - 1));
    if (!p.empty()) return p;

    int temporal = 1;
    for (bool t : v.temporal_downsample) temporal *= t ? 2 : 1;
    const int spatial = 1 << (int(v.dim_mult.size()) - 1);
    need((m.num_frames - 1) % temporal == 0,
         fmt::format("num_frames {} must be 1 + a multiple of the VAE's temporal factor {}", m.num_frames,
                     temporal));
    const int ph = spatial * d.patch_size[1], pw = spatial * d.patch_size[2];
    need(m.canvas_height % ph == 0 && m.canvas_width % pw == 0,
         fmt::format("canvas {}x{} must be a multiple of {}x{} (VAE {}x times the DiT patch)",
                     m.canvas_height, m.canvas_width, ph, pw, spatial));
    if (m.canvas_height % ph == 0 && m.canvas_width % pw == 0) {
        const int tokens = (m.canvas_height / ph) * (m.canvas_width / pw);
        need(
            d.frame_seqlen == tokens,
            fmt::format("dit.frame_seqlen {} must equal the tokens per latent frame of the {}x{} canvas ({})",
                        d.frame_seqlen, m.canvas_height, m.canvas_width, tokens));
    }
    return p;
}

void require_consistent_model_config(const ModelConfig& m, const std::string& source) {
    auto problems = check_model_config(m);
    if (problems.empty()) return;
    std::string msg = fmt::format("{}: inconsistent model geometry ({} problem{}):", source, problems.size(),
                                  problems.size() == 1 ? "" : "s");
    for (const auto& s : problems) msg += "\n  " + s;
    throw Error(msg);
}

std::vector<std::string> diff_model_configs(const ModelConfig& a, const ModelConfig& b) {
    std::vector<std::string> out;
    std::vector<std::string> va, vb;
    for_each_model_field(a, [&](const ModelField&, const auto& v) { va.push_back(text(v)); });
    size_t i = 0;
    for_each_model_field(b, [&](const ModelField& f, const auto& v) {
        std::string t = text(v);
        if (t != va[i]) out.push_back(fmt::format("{}: {} vs {}", f.yaml, va[i], t));
        ++i;
    });
    return out;
}

}  // namespace dzr::config
