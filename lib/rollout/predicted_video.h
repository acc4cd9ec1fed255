#pragma once
/// `dzr rollout --save-video`: the predicted future frames of an episode next to the observed ones.
///
/// As the official server (SingleGPU/ARDroid policy wrappers, `_reset_state`): every call's
/// `video_pred` latent ([z, 3, h, w] on a window's first call, else [z, 2, h, w]) is kept; when the
/// episode ends they are joined along time and decoded once by the VAE decoder (K latent frames ->
/// 1 + 4 (K - 1) frames), converted with ((x + 1) * 127.5) clipped and truncated to uint8, and saved
/// at 5 fps. The observed video holds, frame for frame, the canvases the decoded frames stand for
/// (observed_frame_indices()).
#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"
#include "io/episode.h"
#include "policy/preprocess.h"

namespace dzr::rollout {

/// Frame rate of the saved videos (the official server's imageio.mimsave(..., fps=5)).
inline constexpr double kVideoFps = 5.0;

/// Episode frame indices that the decoded frames of one call's video prediction stand for, in order:
///  - the reference latent (a window's first call only): the reference frame (the call's newest
///    frame), once when it opens the stream (1 decoded frame), else 4 times;
///  - each of the `predicted_latents` denoised latents: 4 frames, the frames the next call commits in
///    their place (the next call's frames, each twice, as its VAE clip holds them; spread evenly when
///    a call has other than 4 frames).
/// `next_frames` are the next call's frames (clamped to the episode by the caller).
std::vector<int64_t> observed_frame_indices(bool opens_stream, bool with_reference, int64_t reference_frame,
                                            std::span<const int64_t> next_frames, int predicted_latents);

/// An episode's video predictions, joined along time.
class VideoAccumulator {
public:
    /// One call's prediction (host f32 [z, f, h, w]) and the observed frames it stands for.
    void add(const Tensor& latent, std::span<const int64_t> observed);
    int64_t latent_frames() const { return latent_frames_; }
    bool empty() const { return chunks_.empty(); }
    /// Host f32 [z, K, h, w].
    Tensor joined() const;
    const std::vector<int64_t>& observed() const { return observed_; }

private:
    std::vector<Tensor> chunks_;
    int64_t latent_frames_ = 0;
    std::vector<int64_t> observed_;
};

/// The model's canvas (as the policy composes it from the episode's cameras, in the spec's layout) of
/// every listed episode frame: uint8 [n, canvas height, canvas width, 3]. Each distinct frame is
/// preprocessed once.
Tensor observed_canvases(const io::Episode& ep, std::span<const int64_t> frames, const CanvasSpec& spec);

}  // namespace dzr::rollout
