#pragma once
/// Observation preprocessing of the DreamZero-DROID policy (dreamzero-reference.md §1.4), on the host:
///
///   frame uint8 [180, 320, 3] (other sizes: openpi resize_with_pad to 180x320 first, with a log line)
///     -> /255 as float32 -> center crop 171x304 at (top 4, left 8)
///     -> bilinear resize to the view size, 176x320 in the reference (torchvision, antialias=True: for
///        this up-sampling it is plain bilinear with half-pixel centres; PyTorch's CPU float kernel
///        arithmetic is reproduced)
///     -> x255 and truncation to uint8                                   (one view, 176x320)
///   canvas 352x640: wrist view on top with every column duplicated, exterior 1 bottom-left,
///   exterior 2 bottom-right                                             (one canvas per frame)
///   canvases [T] -> [3, T, 352, 640] values in [-1, 1] = (x / 255 - 0.5) / 0.5
///
/// The view size is a training-config value (VideoResize height/width); a model trained at another
/// canvas (configs/tiny.yaml) passes canvas / 2 as its view size. Canvas sizes follow the views.
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "core/tensor.h"

namespace dzr {

inline constexpr int kFrameHeight = 180, kFrameWidth = 320;    ///< the frame size the policy asserts
inline constexpr int kCropHeight = 171, kCropWidth = 304;      ///< int(180 * 0.95), int(320 * 0.95)
inline constexpr int kViewHeight = 176, kViewWidth = 320;      ///< the reference's view size after the resize
inline constexpr int kCanvasHeight = 352, kCanvasWidth = 640;  ///< 2 x the reference's view size

/// Output size of one preprocessed view (the canvas is twice this in both dimensions).
struct ViewSize {
    int height = kViewHeight;
    int width = kViewWidth;
    bool operator==(const ViewSize&) const = default;
};

/// A non-owning view of one uint8 RGB frame, row-major [height, width, 3].
struct RgbView {
    const uint8_t* data = nullptr;
    int height = 0;
    int width = 0;
    uint8_t at(int y, int x, int c) const {
        return data[(size_t(y) * size_t(width) + size_t(x)) * 3 + size_t(c)];
    }
};

/// An owning uint8 RGB frame, row-major [height, width, 3], zero-initialized.
struct RgbImage {
    int height = 0;
    int width = 0;
    std::vector<uint8_t> pixels;

    RgbImage() = default;
    RgbImage(int h, int w) : height(h), width(w), pixels(size_t(h) * size_t(w) * 3, 0) {}
    RgbView view() const { return {pixels.data(), height, width}; }
    uint8_t& at(int y, int x, int c) {
        return pixels[(size_t(y) * size_t(width) + size_t(x)) * 3 + size_t(c)];
    }
    uint8_t at(int y, int x, int c) const {
        return pixels[(size_t(y) * size_t(width) + size_t(x)) * 3 + size_t(c)];
    }
};

/// Frame t of a uint8 [T, H, W, 3] host tensor (contiguous). Throws when the layout differs.
RgbView frame_view(const TensorView& frames, int64_t t);

/// openpi_client.image_tools.resize_with_pad: PIL bilinear resize keeping the aspect ratio
/// (ratio = max(w / W, h / H), sizes truncated), then pasted centred on a black canvas. PIL's
/// fixed-point resampler (22-bit coefficients, horizontal pass first) is reproduced. Returns the
/// input unchanged when it already has the target size.
RgbImage resize_with_pad(RgbView in, int height, int width);

/// torchvision CenterCrop anchors: top = round((H - h) / 2), left = round((W - w) / 2), ties to even
/// (Python round). Throws when the crop is larger than the image.
int center_crop_offset(int in_size, int out_size);

/// Arithmetic of the float bilinear resize. PyTorch's CPU kernel accumulates t0*w0, then
/// `out += t_j * w_j`, which its AVX2/AVX512 builds contract into fused multiply-adds: torch 2.11 on
/// an AVX512 CPU matches the fused form bit for bit (tests/data/preprocess_golden.safetensors) and
/// differs from the unfused one in a few values per frame.
struct ResizeOptions {
    bool fused_multiply_add = true;
};

/// torchvision Resize(bilinear, antialias=True) on (x / 255) as float32 [C, H, W], then
/// (x * 255).to(uint8) (truncation). The input region is rows [top, top + h) and columns
/// [left, left + w) of `in` (a crop without a copy).
RgbImage resize_bilinear_aa_u8(RgbView in, int top, int left, int h, int w, int out_height, int out_width,
                               const ResizeOptions& opt = {});

/// One camera view through the eval transform: resize_with_pad to 180x320 when the size differs
/// (logged once per size and name), crop 171x304 at (4, 8), resize to `size`.
RgbImage preprocess_view(RgbView frame, ViewSize size, std::string_view name = "view",
                         const ResizeOptions& opt = {});
/// The same at the reference's view size, 176x320.
RgbImage preprocess_view(RgbView frame, std::string_view name = "view", const ResizeOptions& opt = {});

/// The [2h, 2w] canvas from three preprocessed views of one size [h, w] (352x640 from 176x320).
/// Throws when the views differ in size.
RgbImage compose_canvas(const RgbImage& wrist, const RgbImage& exterior_1, const RgbImage& exterior_2);

/// How uint8 becomes [-1, 1].
enum class UnitRangeMode : uint8_t {
    F32,           ///< (x / 255 - 0.5) * 2 in float32 (the port's default)
    Bf16Reference  ///< the reference on CUDA: bf16(bf16(x * float(1/255)) - 0.5) / 0.5, values exact in bf16
};

/// Canvases (T of them, all H x W, 352x640 in the reference) -> `out` [3, T, H, W], values in [-1, 1].
/// Throws when the canvases differ in size or `out` does not hold 3 * T * H * W values.
void canvases_to_model_input(std::span<const RgbImage> canvases, std::span<float> out,
                             UnitRangeMode mode = UnitRangeMode::F32);

}  // namespace dzr
