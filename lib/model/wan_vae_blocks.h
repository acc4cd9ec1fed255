#pragma once
/// Building blocks of the Wan2.1 causal 3-D VAE (reference: VAE.py, dreamzero-reference.md §2.3).
///
/// Activations are channels-first, one sample: [C, T, H, W], contiguous, in the backend's compute
/// dtype. Every block writes into an output view the caller provides (carved from ping-pong
/// buffers) and takes its temporaries from the backend workspace inside an ArenaScope, so a forward
/// allocates nothing outside the arena.
///
/// Weights: each block loads from a module path built by lib/weights/keys.h (ending with '.', e.g.
/// keys::vae_encoder_down(3)) plus the reference's own sub-module names ("residual.0.gamma").
///
/// Temporal state: the reference encodes a clip in chunks (frame 0, then 4 frames at a time) and
/// keeps, per causal conv, the last input frames of the previous chunk (`feat_cache`). A
/// TemporalCache is that state for one conv. Passing no cache (nullptr) means "this call sees the
/// whole clip": causal zero padding, and the resample time convs apply their first-chunk rule to the
/// whole input. Both give the same numbers (docs/VAE.md).
#include <array>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "weights/weight_source.h"

namespace dzr {

/// Where a VAE pass rounds on a bf16 backend. The reference runs its VAE encoder in two regimes
/// (docs/VAE.md "Precision"), which WanVae::encode sets as the backend's autocast state (AutocastScope); on
/// the f32 CPU backend both are the same computation.
enum class VaePrecision : uint8_t {
    /// Under torch.autocast(bf16) (encode_image's `ys` encode): RMS_norm and SiLU run in f32 and round
    /// once, at the next conv's input cast.
    Autocast,
    /// Plain bf16 eager ops (encode_video's clip encode): ||x||, the division, * sqrt(C), * gamma and the
    /// SiLU each round to bf16.
    Eager,
};

}  // namespace dzr

namespace dzr::vae {

/// History frames a causal temporal kernel of size 3 needs (reference CACHE_T).
inline constexpr int kCacheFrames = 2;

/// Per-conv history carried from one temporal chunk to the next.
struct TemporalCache {
    TensorView buf;        ///< [capacity, H*W, C] channels-last, oldest frame first
    int frames = 0;        ///< valid frames in buf
    bool started = false;  ///< resample time convs: the first chunk has passed
};

/// RMS_norm of the VAE: F.normalize over channels (eps 1e-12) * sqrt(C) * gamma, per voxel, through
/// Backend::l2_norm on channels-last rows (with the SiLU that follows it fused where there is one).
class ChannelRmsNorm {
  public:
    /// gamma is stored [C, 1, 1, 1] (3-D blocks) or [C, 1, 1] (the attention block).
    void load(WeightLoader& loader, const std::string& key, int channels, bool images);
    int channels() const { return channels_; }
    /// x, out: [N, C] channels-last rows (contiguous); out = SiLU(norm(x)) with `silu`, else norm(x).
    /// out may alias x.
    void forward_rows(Backend& be, const TensorView& x, const TensorView& out,
                      bool silu) const;

    /// F.normalize's eps (the clamp of ||x||).
    static constexpr float kNormEps = 1e-12f;

  private:
    Tensor gamma_;
    TensorView gamma_vec_;  // [C]
    int channels_ = 0;
};

/// A convolution weight [Co, Ci, kt, kh, kw] kept a second time channels-last, [Co, kt, kh, kw, Ci], for fast
/// numerics' channels-last convolutions (Conv3dParams::w_channels_last), which otherwise transpose the weight on
/// every call. Allocated at load where the backend would use it (fast numerics, Capabilities::conv_channels_last,
/// kt·kh·kw > 1: a 1x1x1 weight is the same memory either way), so a measured load counts it; filled by fill(),
/// which the first encode calls (a deferred load uploads the weights after the networks are built).
class ChannelsLastWeight {
  public:
    void allocate(Backend& be, const TensorView& w);
    /// Writes the channels-last copy from the weight (once; later calls do nothing).
    void fill(Backend& be);
    /// The copy once filled, else undefined (the convolution then transposes w itself).
    TensorView view() const { return filled_ ? cl_.view() : TensorView{}; }

  private:
    TensorView w_;
    Tensor cl_;
    bool filled_ = false;
};

/// CausalConv3d: zero padding 2*p_t frames before (0 after) in time, symmetric p_h, p_w in space.
/// With a cache, the cached frames replace that many leading zero frames.
class CausalConv3d {
  public:
    /// weight [Co, Ci, kt, kh, kw] under "<path>weight", bias [Co] under "<path>bias".
    /// padding = the reference's (p_t, p_h, p_w).
    void load(WeightLoader& loader, const std::string& path, int in_ch, int out_ch, std::array<int, 3> kernel,
              std::array<int, 3> padding);
    int in_channels() const { return in_; }
    int out_channels() const { return out_; }
    /// Frames of history this conv reads (2 * p_t).
    int history() const { return 2 * pad_[0]; }

    /// out [Co, T, H, W] = conv(x [Ci, T, H, W]). x may be strided. The cache (if any) provides the
    /// previous frames and receives the last kCacheFrames input frames.
    void forward(Backend& be, const TensorView& x, TemporalCache* cache, const TensorView& out) const;
    /// Same, on SiLU(norm(x)) (the residual blocks and the heads), rounded as the backend's autocast state says.
    void forward_normed(Backend& be, const ChannelRmsNorm& norm, const TensorView& x, TemporalCache* cache,
                        const TensorView& out) const;
    /// The raw convolution on an assembled, contiguous input [Ci, T', H, W] with `time_pad` zero
    /// frames before it (none after) and the given time stride; spatial padding as loaded.
    void convolve(Backend& be, const TensorView& input, int time_pad, int time_stride,
                  const TensorView& out) const;
    /// Keeps the weight channels-last too (ChannelsLastWeight::allocate); the copy is `*fill` (kept by the caller).
    void keep_channels_last(Backend& be, std::vector<ChannelsLastWeight*>& fill);

  private:
    Tensor weight_, bias_;
    ChannelsLastWeight weight_cl_;
    int in_ = 0, out_ = 0;
    std::array<int, 3> kernel_{}, pad_{};
};

/// ResidualBlock: RMS -> SiLU -> conv3 -> RMS -> SiLU -> conv3, plus a 1x1x1 shortcut when the
/// channel count changes (keys residual.0 / residual.2 / residual.3 / residual.6 / shortcut).
class ResidualBlock {
  public:
    static constexpr int kNumCaches = 2;
    void load(WeightLoader& loader, const std::string& path, int in_ch, int out_ch);
    int in_channels() const { return conv1_.in_channels(); }
    int out_channels() const { return conv2_.out_channels(); }
    /// x [Ci, T, H, W] -> out [Co, T, H, W]; caches: kNumCaches consecutive entries, or nullptr.
    void forward(Backend& be, const TensorView& x, TemporalCache* caches, const TensorView& out) const;
    void keep_channels_last(Backend& be, std::vector<ChannelsLastWeight*>& fill);

  private:
    ChannelRmsNorm norm1_, norm2_;
    CausalConv3d conv1_, conv2_;
    std::optional<CausalConv3d> shortcut_;
};

/// Single-head spatial self-attention per frame: RMS over channels, 1x1 qkv, SDPA over the H*W
/// tokens of the frame (scale 1/sqrt(C)), 1x1 proj, residual (keys norm / to_qkv / proj). The 1x1
/// convs add their bias after the product (two roundings on bf16, as cuDNN's conv + bias add).
class AttentionBlock {
  public:
    void load(WeightLoader& loader, const std::string& path, int channels);
    int channels() const { return channels_; }
    /// x, out: [C, T, H, W].
    void forward(Backend& be, const TensorView& x, const TensorView& out) const;

  private:
    void forward_channels_last(Backend& be, const TensorView& x, const TensorView& out) const;
    /// y [T, L, C] = softmax(q k^T / sqrt(C)) v per frame, from qkv [T, L, 3C], as two GEMMs around a softmax of
    /// f32 logits (fast numerics; the workspace holds one frame's [L, L] logits and probabilities).
    void attend_gemm(Backend& be, const TensorView& qkv, const TensorView& y) const;

    ChannelRmsNorm norm_;
    Tensor qkv_w_, qkv_b_, proj_w_, proj_b_;
    TensorView qkv_w5_, proj_w5_;  // [3C, C, 1, 1, 1], [C, C, 1, 1, 1]
    int channels_ = 0;
};

enum class ResampleMode : uint8_t { Down2d, Down3d, Up2d, Up3d };

/// Resample layers (keys resample.1 and time_conv):
///  - Down2d: per frame, zero-pad right/bottom by 1, 3x3 conv stride 2 (C -> C).
///  - Down3d: Down2d, then time_conv (kernel 3, stride 2, no padding). First chunk: no time conv,
///    the first frame passes through; later chunks convolve [last cached frame, chunk].
///  - Up2d: per frame, nearest x2, 3x3 conv pad 1 (C -> C/2).
///  - Up3d: time_conv (causal kernel 3, C -> 2C, the two halves become frames 2t and 2t+1), then
///    Up2d. The first frame of the clip skips the time conv (it is not doubled), and the time conv's
///    history starts from zeros after it.
class Resample {
  public:
    void load(WeightLoader& loader, const std::string& path, int channels, ResampleMode mode);
    ResampleMode mode() const { return mode_; }
    bool has_time_conv() const { return mode_ == ResampleMode::Down3d || mode_ == ResampleMode::Up3d; }
    int in_channels() const { return channels_; }
    int out_channels() const;
    /// Shape of the time conv's cache for input [C, T, H, W]: [frames, H'*W', C] with 1 frame at the
    /// output resolution (Down3d) or 2 frames at the input resolution (Up3d). Empty without time conv.
    Shape cache_shape(const Shape& in) const;
    /// Output shape for input [C, T, H, W]; `first` = the clip's first chunk (or no cache).
    Shape output_shape(const Shape& in, bool first) const;
    /// x [C, T, H, W] -> out (output_shape). cache: the time conv's, or nullptr (whole clip).
    void forward(Backend& be, const TensorView& x, TemporalCache* cache, const TensorView& out) const;
    /// The downsamples' convolutions keep their weights channels-last too (CausalConv3d::keep_channels_last).
    void keep_channels_last(Backend& be, std::vector<ChannelsLastWeight*>& fill);

  private:
    void spatial(Backend& be, const TensorView& x, const TensorView& out) const;
    void forward_down3d(Backend& be, const TensorView& x, TemporalCache* cache, const TensorView& out) const;
    void forward_down3d_channels_last(Backend& be, const TensorView& x, TemporalCache* cache,
                                      const TensorView& out) const;
    void forward_up3d(Backend& be, const TensorView& x, TemporalCache* cache, const TensorView& out) const;

    ResampleMode mode_ = ResampleMode::Down2d;
    int channels_ = 0;
    Tensor conv_w_, conv_b_;
    TensorView conv_w5_;  // [Co, C, 1, 3, 3]
    ChannelsLastWeight conv_cl_;
    CausalConv3d time_conv_;
};

// ---- helpers shared by the blocks and WanVae ---------------------------------------------------

/// A view of `shape` at the start of buffer `buf` (which must be large enough).
TensorView carve(const TensorView& buf, const Shape& shape);

/// [C, T, H, W] channels-first -> [T, H*W, C] channels-last (contiguous out).
void to_channels_last(Backend& be, const TensorView& x, const TensorView& out);
/// [T, H*W, C] channels-last -> [C, T, H, W] channels-first (out's shape gives H and W).
void to_channels_first(Backend& be, const TensorView& x, const TensorView& out);

// Channels-last activations (the encoder's fast path, WanVae::set_channels_last_encoder): a [C, T, H, W] view of a
// contiguous [T, H, W, C] buffer. Blocks given a channels-last x write a channels-last out.

/// Whether x is such a view (every other activation here is contiguous channels-first).
bool is_channels_last(const TensorView& x);
/// The [C, T, H, W] channels-last view of a contiguous [T, H, W, C] buffer.
TensorView cl_view(const TensorView& buf);
/// The contiguous [T, H, W, C] buffer of a channels-last view.
TensorView cl_rows(const TensorView& x);
/// A channels-last view of logical shape [C, T, H, W] at the start of `buf` (carve).
TensorView carve_channels_last(const TensorView& buf, const Shape& shape);
/// A channels-last view of logical shape [C, T, H, W] from the workspace.
TensorView scratch_channels_last(Backend& be, const Shape& shape);
/// be.conv3d, with channels-last x or out transposed around a channels-first convolution where the backend does
/// not take them (Capabilities::conv_channels_last).
void conv3d_any_layout(Backend& be, const Conv3dParams& p, const TensorView& x, const TensorView& w,
                       const TensorView& bias, const TensorView& out);

/// Nearest-neighbour x2 in H and W: x [C, T, H, W] -> out [C, T, 2H, 2W].
void upsample_nearest2x(Backend& be, const TensorView& x, const TensorView& out);

/// out = clamp(x, -1, 1) elementwise (x and out contiguous, same shape; may alias). Exact for every
/// |x| below 2^24 in f32 (2^8 in bf16), see the NOTE in the implementation.
void clamp_unit(Backend& be, const TensorView& x, const TensorView& out);

}  // namespace dzr::vae
