#pragma once
/// Observation preprocessing of the DreamZero policy (dreamzero-reference.md §1.4), on the host. DROID's:
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
///
/// Other embodiments (CanvasSpec, from config/embodiment.h): the frame size is the camera's recorded
/// resolution, the crop int(side * scale) of VideoCrop, the view size VideoResize's, and the layout
/// DreamTransform's (the DROID layout, a 2 x 2 grid with a black quadrant, or a single view).
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "config/embodiment.h"
#include "core/tensor.h"

namespace dzr {

inline constexpr int kFrameHeight = 180, kFrameWidth = 320;    ///< the frame size the policy asserts
inline constexpr int kCropHeight = 171, kCropWidth = 304;      ///< int(180 * 0.95), int(320 * 0.95)
inline constexpr int kViewHeight = 176, kViewWidth = 320;      ///< the reference's view size after the resize
inline constexpr int kCanvasHeight = 352, kCanvasWidth = 640;  ///< 2 x the reference's view size

/// An allocator whose resize() leaves new elements uninitialized (for buffers that are written in
/// full right after: the model inputs are 27 MB per call at the DROID geometry).
template <typename T>
struct UninitAllocator : std::allocator<T> {
    template <typename U>
    struct rebind {
        using other = UninitAllocator<U>;
    };
    UninitAllocator() = default;
    template <typename U>
    UninitAllocator(const UninitAllocator<U>&) noexcept {}
    template <typename U>
    void construct(U* p) noexcept {
        ::new (static_cast<void*>(p)) U;  // default-initialization: no zeroing
    }
    template <typename U, typename... Args>
    void construct(U* p, Args&&... args) {
        ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
    }
};

/// A host float buffer that resize() does not zero.
using HostFloats = std::vector<float, UninitAllocator<float>>;

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
/// `out += t_j * w_j`, which its AVX2/AVX512 builds (torch 2.11 and 2.15) round like an in-order
/// vectorized reduction: the taps after t0 in whole blocks of 4 are a multiply, then an add, the
/// (taps - 1) mod 4 left over fused multiply-adds. So outputs of at most 4 taps along an axis (every
/// DROID geometry) are all fused, 5 taps all unfused, 6 taps 4 unfused and 1 fused (480x640 frames to
/// 176x320 views). `fused_multiply_add` follows that rule; false rounds every accumulation unfused, as
/// a build without FMA (docs/PARITY.md, Embodiments).
struct ResizeOptions {
    bool fused_multiply_add = true;
};

/// torchvision Resize(bilinear, antialias=True) on (x / 255) as float32 [C, H, W], then
/// (x * 255).to(uint8) (truncation). The input region is rows [top, top + h) and columns
/// [left, left + w) of `in` (a crop without a copy).
RgbImage resize_bilinear_aa_u8(RgbView in, int top, int left, int h, int w, int out_height, int out_width,
                               const ResizeOptions& opt = {});

/// How uint8 becomes [-1, 1].
enum class UnitRangeMode : uint8_t {
    F32,           ///< (x / 255 - 0.5) * 2 in float32 (the port's default)
    Bf16Reference  ///< the reference on CUDA: bf16(bf16(x * float(1/255)) - 0.5) / 0.5, values exact in bf16
};

/// resize_bilinear_aa_u8 for one geometry, fast and bit-identical: the index ranges and weights are
/// computed once (padded to a fixed tap count with zero weights, which leave every sum unchanged), the
/// frame stays interleaved RGB, and the inner loops run over whole rows (vectorized, with FMA
/// instructions where the CPU has them). Thread-safe: run() keeps its buffers per thread.
class AaResizer {
public:
    AaResizer(int in_height, int in_width, int out_height, int out_width, const ResizeOptions& opt = {});
    int in_height() const { return in_h_; }
    int in_width() const { return in_w_; }
    int out_height() const { return out_h_; }
    int out_width() const { return out_w_; }
    /// Resizes rows [top, top + in_height) and columns [left, left + in_width) of `in`; output row y
    /// goes to out + y * out_row_stride (out_width * 3 bytes each). With `repeat_columns` every output
    /// pixel is written twice side by side (the wrist view's np.repeat along the width).
    void run(RgbView in, int top, int left, uint8_t* out, size_t out_row_stride, bool repeat_columns = false) const;
    RgbImage run(RgbView in, int top, int left) const;

private:
    int in_h_, in_w_, out_h_, out_w_;
    bool fma_;
    int taps_h_ = 1, taps_v_ = 1;
    std::vector<int32_t> src_h_;  // [out_w * 3]: first source element of each output element
    std::vector<float> w_h_;      // [taps_h][out_w * 3]
    std::vector<int32_t> src_v_;  // [out_h]: first source row
    std::vector<float> w_v_;      // [taps_v][out_h]
    struct MixedElement {
        int32_t element;  // index into the horizontal pass's output row
        int32_t unfused;  // its first accumulations done as a multiply, then an add (the rest fused)
    };
    std::vector<MixedElement> mixed_h_;  // elements of more than 4 taps (as PyTorch's kernel rounds them)
    std::vector<int32_t> unfused_v_;     // [out_h]: the row's first accumulations done as a multiply, then an add
};

/// Runs fn(0) .. fn(n - 1) on up to `threads` threads (the caller's included); rethrows the first
/// exception once all have finished.
void parallel_for(int n, int threads, const std::function<void(int)>& fn);

/// How one embodiment's camera views become the model's canvas (Embodiment's video part): the cameras in
/// concatenation order, the recorded frame size the crop is taken from, the centre-crop scale, the view
/// size after the resize and the layout (config/embodiment.h CanvasLayout).
struct CanvasSpec {
    CanvasLayout layout = CanvasLayout::DroidWrist;
    std::vector<std::string> cameras = {"exterior_image_1_left", "exterior_image_2_left", "wrist_image_left"};
    /// Frames of another size are resized with padding to this first (openpi's resize_with_pad, logged);
    /// 0 x 0: each frame is cropped at the size it comes in.
    int frame_height = kFrameHeight, frame_width = kFrameWidth;
    double crop_scale = 0.95;
    ViewSize view;

    int canvas_height() const { return layout == CanvasLayout::Single ? view.height : 2 * view.height; }
    int canvas_width() const { return layout == CanvasLayout::Single ? view.width : 2 * view.width; }
    /// The crop of a frame of `height` x `width`: (int(height * scale), int(width * scale)).
    std::pair<int, int> crop_size(int height, int width) const;
    bool operator==(const CanvasSpec&) const = default;
};

/// DROID's canvas at a view size (the reference's 176x320 by default).
CanvasSpec droid_canvas_spec(ViewSize view = {});
/// An embodiment's canvas at the model's geometry (embodiment_view_size).
CanvasSpec canvas_spec(const Embodiment& embodiment, const ModelConfig& model);

/// The policy's host preprocessing of one call: the camera views of every frame -> canvases -> the model
/// input of the reference frame and of the commit clip. Bit-identical to preprocess_view, compose_canvas and
/// canvases_to_model_input; the resize tables are built once and the views, frames and channels are spread
/// over threads. Thread-safe.
class ObservationPreprocessor {
public:
    /// threads <= 0: min(8, hardware threads).
    ObservationPreprocessor(CanvasSpec spec, UnitRangeMode mode = UnitRangeMode::F32, int threads = 0);
    /// DROID's canvas at `view`.
    explicit ObservationPreprocessor(ViewSize view, UnitRangeMode mode = UnitRangeMode::F32, int threads = 0);
    ViewSize view() const { return spec_.view; }
    const CanvasSpec& spec() const { return spec_; }
    int threads() const { return threads_; }
    /// Canvas of frame t of the uint8 [T, H, W, 3] cameras (in the spec's order) into `canvas`
    /// (canvas_height x canvas_width x 3 bytes).
    void canvas(std::span<const TensorView> cameras, int64_t t, uint8_t* canvas) const;
    /// Host bytes for the canvases of one call; a caller that keeps one across calls saves the allocation
    /// (and the page faults of fresh memory) every call.
    using Scratch = std::vector<uint8_t, UninitAllocator<uint8_t>>;
    /// The model inputs of one call: `reference_out` [3, H, W] from canvas `reference`, and (when
    /// `clip` is not empty) `clip_out` [3, clip.size(), H, W] from canvases clip[0], clip[1], ...
    /// `scratch` (optional) holds the canvases.
    void run(std::span<const TensorView> cameras, int reference, std::span<const int> clip,
             std::span<float> reference_out, std::span<float> clip_out, Scratch* scratch = nullptr) const;
    /// The same inputs rounded to bf16 (the bits of f32_to_bf16 of each value above), written directly:
    /// what a bf16 backend uploads, without an f32 pass.
    void run_bf16(std::span<const TensorView> cameras, int reference, std::span<const int> clip,
                  std::span<uint16_t> reference_out, std::span<uint16_t> clip_out, Scratch* scratch = nullptr) const;

    /// DROID's forms (wrist, exterior 1, exterior 2), for a preprocessor with the DROID spec.
    void canvas(const TensorView& wrist, const TensorView& exterior_1, const TensorView& exterior_2, int64_t t,
                uint8_t* canvas) const;
    void run(const TensorView& wrist, const TensorView& exterior_1, const TensorView& exterior_2, int reference,
             std::span<const int> clip, std::span<float> reference_out, std::span<float> clip_out,
             Scratch* scratch = nullptr) const;
    void run_bf16(const TensorView& wrist, const TensorView& exterior_1, const TensorView& exterior_2, int reference,
                  std::span<const int> clip, std::span<uint16_t> reference_out, std::span<uint16_t> clip_out,
                  Scratch* scratch = nullptr) const;

private:
    template <typename Elem>
    void run_impl(std::span<const TensorView> cameras, int reference, std::span<const int> clip,
                  std::span<Elem> reference_out, std::span<Elem> clip_out, const Elem* lut, Scratch* scratch) const;
    /// Camera `position` (concatenation order) of frame t into its place on `canvas`.
    void view_into(const TensorView& camera, int position, int64_t t, uint8_t* canvas) const;
    /// Zeroes the parts of `canvas` no view covers (the grid's black quadrants).
    void clear_uncovered(uint8_t* canvas) const;
    /// Validates the cameras of a call (count, layout, one T); returns T.
    int64_t check_cameras(std::span<const TensorView> cameras) const;

    CanvasSpec spec_;
    UnitRangeMode mode_;
    int threads_;
    std::unique_ptr<AaResizer> resizer_;  // for the spec's frame size (null when frames come at any size)
    float lut_[256];
    uint16_t lut_bf16_[256];  // f32_to_bf16(lut_[i])
};

/// One camera view through the eval transform: resize_with_pad to 180x320 when the size differs
/// (logged once per size and name), crop 171x304 at (4, 8), resize to `size`.
RgbImage preprocess_view(RgbView frame, ViewSize size, std::string_view name = "view",
                         const ResizeOptions& opt = {});
/// The same at the reference's view size, 176x320.
RgbImage preprocess_view(RgbView frame, std::string_view name = "view", const ResizeOptions& opt = {});

/// One camera view through an embodiment's eval transform: resize_with_pad to the spec's frame size when
/// the size differs (logged once per size and name), centre crop at the spec's scale, resize to the view.
RgbImage preprocess_view(RgbView frame, const CanvasSpec& spec, std::string_view name = "view",
                         const ResizeOptions& opt = {});

/// The [2h, 2w] canvas from three preprocessed views of one size [h, w] (352x640 from 176x320).
/// Throws when the views differ in size.
RgbImage compose_canvas(const RgbImage& wrist, const RgbImage& exterior_1, const RgbImage& exterior_2);

/// The canvas of `layout` from preprocessed views of one size in concatenation order (DreamTransform.
/// _prepare_video): DroidWrist = compose_canvas(views[2], views[0], views[1]); Grid = views 0, 1, 2 at
/// top-left, bottom-left, top-right, the rest black; Single = views[0]. Views past the third are not drawn.
RgbImage compose_canvas(CanvasLayout layout, std::span<const RgbImage> views);


/// Canvases (T of them, all H x W, 352x640 in the reference) -> `out` [3, T, H, W], values in [-1, 1].
/// Throws when the canvases differ in size or `out` does not hold 3 * T * H * W values.
void canvases_to_model_input(std::span<const RgbImage> canvases, std::span<float> out,
                             UnitRangeMode mode = UnitRangeMode::F32);

}  // namespace dzr
