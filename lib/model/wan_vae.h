#pragma once
/// The Wan2.1 causal 3-D VAE (prefix action_head.vae.model.): encoder + conv1 (video -> normalized
/// latent), conv2 + decoder (latent -> video). dreamzero-reference.md §2.3, §2.4; docs/VAE.md.
///
/// Layout: channels-first, one sample. Video [3, T, H, W] in [-1, 1] with T = 1 + 4k and H, W
/// multiples of 8; latent [z_dim, 1 + k, H/8, W/8]. All tensors live on the backend the weights were
/// loaded to, in its compute dtype. Activations come from the backend workspace (no allocation inside
/// encode/decode); see docs/VAE.md for the workspace each call needs. One WanVae runs one call at a
/// time (the temporal caches of a call are per instance).
#include <array>
#include <functional>
#include <optional>
#include <variant>
#include <vector>

#include "backend/backend.h"
#include "model/wan_vae_blocks.h"
#include "config/model_config.h"
#include "weights/weight_source.h"

namespace dzr {

/// How a VAE pass walks the time axis.
enum class VaeSchedule : uint8_t {
    /// The reference schedule: frame 0 alone, then 4 frames per chunk (decoder: one latent frame per
    /// chunk), with per-conv temporal caches. Activation memory does not grow with the clip length.
    Chunked,
    /// One causal pass over the whole clip. Same result (bit-exact on the CPU backend); activation
    /// memory grows with the clip length. For tests and short clips.
    WholeClip,
};

class WanVae {
  public:
    /// Channels of the conditioning mask prepended to the latent in `ys` (dreamzero-reference.md §2.4).
    static constexpr int kMaskChannels = 4;
    /// Frames of the reference encode, and of one later chunk (VAE.py encode / decode loops).
    static constexpr int kChunkFrames = 4;
    /// The standard Wan2.1 latent statistics (VAE.py WanVideoVAE), defined for z_dim = 16.
    static const std::array<float, 16> kLatentMean;
    static const std::array<float, 16> kLatentStd;

    /// Loads every encoder (and, with config.has_decoder, decoder) weight under action_head.vae.model.
    /// (keys.h). Throws dzr::Error naming the key on a missing or misshapen weight, or on an
    /// unsupported config.
    WanVae(WeightLoader& loader, const VaeConfig& config);
    ~WanVae();
    WanVae(const WanVae&) = delete;
    WanVae& operator=(const WanVae&) = delete;

    const VaeConfig& config() const { return config_; }
    int z_dim() const { return config_.z_dim; }
    /// Pixels per latent pixel along H and W (8 for the Wan2.1 layout).
    int spatial_factor() const { return spatial_factor_; }

    /// [3, T, H, W] -> [z_dim, 1 + (T - 1)/4, H/8, W/8]; throws on a shape the VAE cannot encode.
    Shape latent_shape(const Shape& video) const;
    /// [z_dim, K, h, w] -> [3, 1 + 4(K - 1), 8h, 8w].
    Shape video_shape(const Shape& latent) const;
    /// `ys` for a clip of num_frames at H x W: [4 + z_dim, 1 + (num_frames - 1)/4, H/8, W/8].
    Shape conditioning_shape(int num_frames, int64_t height, int64_t width) const;

    /// latent = (mu - mean) / std, mu = the first z_dim channels of conv1(encoder(video)).
    /// `precision`: the default, Eager, is how the reference encodes the observed clip (encode_video,
    /// no autocast).
    void encode(const TensorView& video, const TensorView& latent, VaePrecision precision = VaePrecision::Eager,
                VaeSchedule schedule = VaeSchedule::Chunked);

    /// `ys` of the first-frame conditioning: the encode of [frame, num_frames - 1 zero frames] with a
    /// 4-channel mask prepended (1 at latent frame 0, 0 elsewhere). frame: [3, H, W] in [-1, 1].
    /// `precision`: the default, Autocast, is how the reference computes `ys` (encode_image runs under
    /// torch.autocast(bf16)).
    void encode_conditioning(const TensorView& frame, int num_frames, const TensorView& ys,
                             VaePrecision precision = VaePrecision::Autocast);

    /// video = clamp(decoder(conv2(latent * std + mean)), -1, 1). Rounds as plain bf16 eager ops
    /// (VaePrecision::Eager).
    void decode(const TensorView& latent, const TensorView& video,
                VaeSchedule schedule = VaeSchedule::Chunked);

    /// Parity diagnostics: the encoder's first two temporal chunks of every encode, block by block:
    /// "vae.conv_in", "vae.block" (layer = block index: the reference's downsamples[i], then
    /// middle[i - #downsamples]), "vae.head" ([C, frames, H, W] channels-first); the second chunk's as
    /// "vae.chunk1.<name>". Empty: no tracing.
    using TraceFn = std::function<void(const char* name, int layer, const TensorView& t)>;
    void set_trace(TraceFn trace) { trace_ = std::move(trace); }

    /// The encoder's activations channels-last ([T, H, W, C] buffers: the norms' rows and the layout of cuDNN's
    /// fast convolutions, no transposes between them) or channels-first. Default (nullopt): channels-last in fast
    /// numerics on a backend whose conv3d takes channels-last operands (Capabilities::conv_channels_last), else
    /// channels-first; elsewhere channels-last convolutions run transposed around a channels-first one (tests
    /// compare the two layouts on the CPU). A traced encode stays channels-first.
    void set_channels_last_encoder(std::optional<bool> on) { channels_last_encoder_ = on; }

    /// Internal: one causal stack (encoder or decoder): an input conv, blocks, RMS + SiLU + conv head.
    struct Net {
        using Block = std::variant<vae::ResidualBlock, vae::AttentionBlock, vae::Resample>;
        vae::CausalConv3d conv_in;
        std::vector<Block> blocks;
        std::vector<int> cache_slot;  // first TemporalCache slot of each block (-1: none)
        vae::ChannelRmsNorm head_norm;
        vae::CausalConv3d head_conv;
        int num_caches = 0;
        std::vector<vae::TemporalCache> caches;  // per-call state, buffers from the workspace
    };

  private:
    void load_encoder(WeightLoader& loader);
    void load_decoder(WeightLoader& loader);

    Backend& be_;
    VaeConfig config_;
    int spatial_factor_ = 8;
    Net encoder_, decoder_;
    vae::CausalConv3d conv1_, conv2_;
    /// The encoder's convolution weights kept channels-last (fast numerics; vae::ChannelsLastWeight), filled by the
    /// first encode.
    std::vector<vae::ChannelsLastWeight*> encoder_cl_weights_;
    TraceFn trace_;
    std::optional<bool> channels_last_encoder_;
};

}  // namespace dzr
