#pragma once
/// Model geometry. Read from a checkpoint's config.json (action_head_cfg.config.*) at load, or from
/// the `model:` section of configs/*.yaml (which `dzr ckpt make` writes into a config.json).
/// Defaults are the real DreamZero-DROID values (dreamzero-reference.md §2).
#include <array>
#include <string>
#include <vector>

namespace dzr {

/// Causal Wan DiT with the DreamZero action/state heads (prefix action_head.model.).
struct DitConfig {
    int dim = 5120;
    int num_layers = 40;
    int num_heads = 40;            // head_dim = dim / num_heads (128 in every supported config)
    int ffn_dim = 13824;
    int in_dim = 36;               // 16 latent + 4 mask + 16 y
    int out_dim = 16;
    int freq_dim = 256;
    int text_dim = 4096;           // must equal the text encoder width
    int text_len = 512;
    std::array<int, 3> patch_size = {1, 2, 2};
    int frame_seqlen = 880;        // tokens per latent frame = (H/16)(W/16) of the canvas
    int num_frame_per_block = 2;
    int num_action_per_block = 24;
    int num_state_per_block = 1;
    int max_chunk_size = 4;        // local_attn_size = max_chunk_size * num_frame_per_block + 1
    int action_dim = 32;
    int max_state_dim = 64;
    int hidden_size = 1024;        // width of the state encoder / action decoder MLPs
    int image_dim = 1280;          // CLIP width feeding img_emb
    float eps = 1e-6f;

    int head_dim() const { return dim / num_heads; }
    int local_attn_size() const { return max_chunk_size * num_frame_per_block + 1; }
};

/// umT5 encoder (prefix action_head.text_encoder.).
struct T5Config {
    int vocab = 256384;
    int dim = 4096;
    int dim_attn = 4096;
    int ffn_dim = 10240;
    int num_heads = 64;
    int num_layers = 24;
    int num_buckets = 32;
    int text_len = 512;
    float eps = 1e-6f;
};

/// CLIP ViT visual tower (prefix action_head.image_encoder.model.).
struct ClipConfig {
    int image_size = 224;
    int patch_size = 14;
    int width = 1280;
    int num_layers = 32;           // layers stored in the checkpoint
    int num_heads = 16;
    int mlp_dim = 5120;
    int embed_dim = 1024;          // visual.head output (unused by DreamZero, present in the checkpoint)
    int use_layers = 31;           // DreamZero runs the first num_layers - 1 blocks, no post_norm
    float eps = 1e-5f;

    int num_tokens() const { return (image_size / patch_size) * (image_size / patch_size) + 1; }
};

/// Wan2.1 causal 3-D VAE (prefix action_head.vae.model.).
struct VaeConfig {
    int base_dim = 96;
    int z_dim = 16;
    std::vector<int> dim_mult = {1, 2, 4, 4};
    int num_res_blocks = 2;
    std::vector<bool> temporal_downsample = {false, true, true};
    bool has_decoder = true;
};

struct ModelConfig {
    DitConfig dit;
    T5Config t5;
    ClipConfig clip;
    VaeConfig vae;
    int num_frames = 33;           // frames the VAE sees for the `y` conditioning (9 latent frames)
    int action_horizon = 24;
    int max_action_dim = 32;
    int canvas_height = 352;       // 2 x per-view height (176)
    int canvas_width = 640;        // 2 x per-view width (320)
};

}  // namespace dzr
