#pragma once
/// The CLIP ViT-H/14 visual tower (open-clip xlm-roberta-large-vit-huge-14) that turns the reference
/// canvas frame into the DiT's 257 image-context tokens (dreamzero-reference.md §2.2; checkpoint prefix
/// action_head.image_encoder.model.).
///
/// Preprocess: bicubic resize of the [-1, 1] frame to image_size², x·0.5 + 0.5, per-channel CLIP
/// mean/std. Tower: patch embedding (conv, kernel = stride = patch, no bias), class token, positional
/// embedding, pre_norm LayerNorm, then the first `use_layers` pre-norm blocks
/// x += proj(SDPA(LN1(x))), x += fc2(gelu_erf(fc1(LN2(x)))). No post_norm, no head: all tokens out.
///
/// Precision (bf16 backend), as the reference under bf16 autocast: the preprocessing runs in f32 from
/// the bf16 frame and rounds once, to the pixels; the patch GEMM, the positional add, each LayerNorm
/// (f32 inside), each Linear (bias in the epilogue), the GELU and each residual add round once.
#include <array>
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/tensor.h"
#include "model/image_resize.h"
#include "model/layers.h"
#include "config/model_config.h"
#include "weights/weight_source.h"

namespace dzr {

/// CLIP image statistics (hard-coded in the reference's transforms).
// NOTE: the Python floats of the reference's transform rounded to float32 (decimal -> double -> float).
inline constexpr std::array<float, 3> kClipMean = {float(0.48145466), float(0.4578275), float(0.40821073)};
inline constexpr std::array<float, 3> kClipStd = {float(0.26862954), float(0.26130258), float(0.27577711)};

class ClipVision {
  public:
    /// Optional per-stage hook for parity dumps: (stage name, layer or -1, tensor on the backend).
    using TraceFn = std::function<void(const char* name, int layer, const TensorView& t)>;

    ClipVision() = default;
    /// Loads the embeddings, pre_norm and the first cfg.use_layers blocks, and sets up the resize from
    /// input frames of [3, input_height, input_width] (the canvas) to cfg.image_size².
    /// The weights it does not run (see skipped_keys) are not uploaded.
    ClipVision(WeightLoader& loader, const ClipConfig& cfg, int input_height, int input_width);

    /// frame: [3, input_height, input_width] in [-1, 1]; pixels: [3, image_size, image_size], both
    /// contiguous in the compute dtype. The resize and the normalization run in f32 (workspace).
    void preprocess(Backend& be, const TensorView& frame, const TensorView& pixels) const;
    /// pixels (preprocessed): [3, image_size, image_size]; out: [num_tokens, width], compute dtype.
    /// channels_last: the patch convolution runs on channels-last pixels (Conv3dParams::channels_last), as the
    /// reference's does when its frame is a slice of a multi-frame clip: that slice is channels-last in
    /// memory, the resize and normalization keep the layout, and PyTorch then runs cuDNN's NHWC convolution,
    /// which sums in another order (docs/PARITY.md). A single-frame call's frame is contiguous.
    void forward(Backend& be, const TensorView& pixels, const TensorView& out, const TraceFn& trace = {},
                 bool channels_last = false) const;
    /// preprocess() then forward().
    void encode(Backend& be, const TensorView& frame, const TensorView& out, const TraceFn& trace = {},
                bool channels_last = false) const;

    /// Workspace bytes encode() takes on `be` (forward() and preprocess() take less): encode measured on a
    /// MeasuringBackend over `be` (measure_workspace).
    size_t workspace_bytes(Backend& be, bool channels_last = false) const;

    const ClipConfig& config() const { return cfg_; }

    /// Checkpoint keys of the tower that are present but never run: blocks use_layers..num_layers−1,
    /// post_norm, head and log_scale. The checkpoint validation checks them; they are not loaded.
    static std::vector<std::string> skipped_keys(const ClipConfig& cfg);

  private:
    struct Layer {
        LayerNorm norm1;
        Linear qkv;   // [3·width, width], rows [q | k | v]
        Linear proj;  // [width, width]
        LayerNorm norm2;
        Linear fc1;   // [mlp_dim, width] (mlp.0)
        Linear fc2;   // [width, mlp_dim] (mlp.2)

        /// Loads the block under `block` ("...visual.transformer.3.").
        void load(WeightLoader& loader, const std::string& block, const ClipConfig& cfg);
    };

    ClipConfig cfg_;
    BicubicResize resize_;
    Tensor patch_w_;  // [width, 3, patch, patch]
    Tensor cls_;      // [1, 1, width]
    Tensor pos_;      // [1, num_tokens, width]
    LayerNorm pre_norm_;
    Tensor std_;  // f32 [3] on the backend: the divisors of the input normalization
    std::vector<Layer> layers_;  // the first use_layers blocks
};

}  // namespace dzr
