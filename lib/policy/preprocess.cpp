// Host preprocessing of camera frames. Two resamplers are reproduced operation by operation:
//  - PIL's fixed-point bilinear resampler (libImaging/Resample.c) for openpi's resize_with_pad;
//  - PyTorch's CPU float anti-aliased bilinear kernel (UpSampleKernel.cpp, separable, horizontal pass
//    first) for torchvision Resize(antialias=True) on float32 frames.
#include "policy/preprocess.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <system_error>
#include <thread>
#include <tuple>

#include "core/error.h"
#include "core/half.h"
#include "core/log.h"

namespace dzr {
namespace {

// ---- PIL bilinear (8 bits per channel) -----------------------------------------------------------

constexpr int kPilPrecisionBits = 32 - 8 - 2;

struct PilAxis {
    int ksize = 0;
    std::vector<int> xmin, xsize;
    std::vector<int32_t> k;  // [out, ksize] fixed-point coefficients
};

double pil_bilinear(double x) {
    if (x < 0.0) x = -x;
    return x < 1.0 ? 1.0 - x : 0.0;
}

PilAxis pil_axis(int in_size, int out_size) {
    PilAxis ax;
    double filterscale = double(float(in_size) - 0.f) / out_size;
    const double scale = filterscale;
    if (filterscale < 1.0) filterscale = 1.0;
    const double support = 1.0 * filterscale;
    ax.ksize = int(std::ceil(support)) * 2 + 1;
    ax.xmin.resize(size_t(out_size));
    ax.xsize.resize(size_t(out_size));
    ax.k.assign(size_t(out_size) * size_t(ax.ksize), 0);
    std::vector<double> kk(size_t(ax.ksize));
    for (int xx = 0; xx < out_size; ++xx) {
        const double center = 0.0 + (xx + 0.5) * scale;
        const double ss = 1.0 / filterscale;
        int xmin = int(center - support + 0.5);
        if (xmin < 0) xmin = 0;
        int xmax = int(center + support + 0.5);
        if (xmax > in_size) xmax = in_size;
        xmax -= xmin;
        double ww = 0.0;
        for (int x = 0; x < xmax; ++x) {
            kk[size_t(x)] = pil_bilinear((x + xmin - center + 0.5) * ss);
            ww += kk[size_t(x)];
        }
        for (int x = 0; x < xmax; ++x) {
            const double v = ww != 0.0 ? kk[size_t(x)] / ww : kk[size_t(x)];
            ax.k[size_t(xx) * size_t(ax.ksize) + size_t(x)] =
                v < 0 ? int(-0.5 + v * (1 << kPilPrecisionBits)) : int(0.5 + v * (1 << kPilPrecisionBits));
        }
        ax.xmin[size_t(xx)] = xmin;
        ax.xsize[size_t(xx)] = xmax;
    }
    return ax;
}

uint8_t pil_clip8(int in) {
    const int v = in >> kPilPrecisionBits;  // arithmetic shift, as PIL's lookup index
    return uint8_t(std::clamp(v, 0, 255));
}

RgbImage pil_resize_bilinear(RgbView in, int out_h, int out_w) {
    const bool need_h = out_w != in.width;
    const bool need_v = out_h != in.height;
    RgbImage cur(in.height, in.width);
    std::copy(in.data, in.data + cur.pixels.size(), cur.pixels.begin());
    if (need_h) {
        const PilAxis ax = pil_axis(in.width, out_w);
        RgbImage tmp(in.height, out_w);
        for (int y = 0; y < in.height; ++y)
            for (int xx = 0; xx < out_w; ++xx) {
                const int32_t* k = &ax.k[size_t(xx) * size_t(ax.ksize)];
                for (int c = 0; c < 3; ++c) {
                    int ss = 1 << (kPilPrecisionBits - 1);
                    for (int x = 0; x < ax.xsize[size_t(xx)]; ++x)
                        ss += int(cur.at(y, x + ax.xmin[size_t(xx)], c)) * k[x];
                    tmp.at(y, xx, c) = pil_clip8(ss);
                }
            }
        cur = std::move(tmp);
    }
    if (need_v) {
        const PilAxis ax = pil_axis(in.height, out_h);
        RgbImage tmp(out_h, cur.width);
        for (int yy = 0; yy < out_h; ++yy) {
            const int32_t* k = &ax.k[size_t(yy) * size_t(ax.ksize)];
            for (int x = 0; x < cur.width; ++x)
                for (int c = 0; c < 3; ++c) {
                    int ss = 1 << (kPilPrecisionBits - 1);
                    for (int y = 0; y < ax.xsize[size_t(yy)]; ++y)
                        ss += int(cur.at(y + ax.xmin[size_t(yy)], x, c)) * k[y];
                    tmp.at(yy, x, c) = pil_clip8(ss);
                }
        }
        cur = std::move(tmp);
    }
    return cur;
}

// ---- PyTorch CPU anti-aliased bilinear on float ---------------------------------------------------

// Index ranges and weights of one axis, as HelperInterpLinear::compute_index_ranges_weights with
// scalar_t = float (the mixed float/double promotions of the C++ source are spelled out).
struct AaAxis {
    int64_t max_interp = 0;
    std::vector<int64_t> xmin, xsize;
    std::vector<float> w;  // [out, max_interp]
};

float aa_linear_filter(float x) {
    x = std::abs(x);
    return x < 1.0 ? float(1.0 - double(x)) : 0.f;
}

AaAxis torch_aa_axis(int64_t in, int64_t out) {
    AaAxis ax;
    const float scale = float(in) / float(out);  // area_pixel_compute_scale<float>, align_corners=False
    const float support = scale >= 1.0 ? float((2 * 0.5) * double(scale)) : float(2 * 0.5);
    ax.max_interp = int64_t(std::ceil(support)) * 2 + 1;
    const float invscale = scale >= 1.0 ? float(1.0 / double(scale)) : 1.0f;
    ax.xmin.resize(size_t(out));
    ax.xsize.resize(size_t(out));
    ax.w.assign(size_t(out * ax.max_interp), 0.f);
    for (int64_t i = 0; i < out; ++i) {
        const float center = float(double(scale) * (double(i) + 0.5));
        const int64_t xmin = std::max<int64_t>(int64_t(double(center - support) + 0.5), 0);
        int64_t xsize = std::min<int64_t>(int64_t(double(center + support) + 0.5), in) - xmin;
        xsize = std::clamp<int64_t>(xsize, 0, ax.max_interp);
        float* wp = &ax.w[size_t(i * ax.max_interp)];
        float total = 0.f;
        for (int64_t j = 0; j < xsize; ++j) {
            const float d = float(j + xmin) - center;
            const float w = aa_linear_filter(float((double(d) + 0.5) * double(invscale)));
            wp[j] = w;
            total += w;
        }
        if (total != 0.f)
            for (int64_t j = 0; j < xsize; ++j) wp[j] /= total;
        ax.xmin[size_t(i)] = xmin;
        ax.xsize[size_t(i)] = xsize;
    }
    return ax;
}

// NOTE: PyTorch's CPU kernel (interpolate_aa_single_dim*) computes t0*w0, then `out += t_j * w_j` for the other
// taps in order. Its AVX2/AVX512 builds (torch 2.11 and 2.15 wheels) round that loop like an in-order vectorized
// reduction: the first taps after t0, in whole blocks of 4, are multiplied (rounded), then added one by one; the
// (n - 1) mod 4 taps left over are fused multiply-adds. So outputs of at most 4 taps are all fused, 5 taps all
// unfused, 6 taps 4 unfused adds and 1 fused. Measured one axis at a time on random frames, both passes, 2 to 45
// taps: 0 values differ (docs/PARITY.md, Embodiments). Every DROID geometry stays within 4 taps.
constexpr int64_t kReductionBlock = 4;

/// How many of an output's n - 1 accumulations (taps 1 .. n - 1) are a multiply, then an add: the rest are fused.
int64_t unfused_adds(int64_t taps, bool fma) {
    if (taps <= 1) return 0;
    return fma ? (taps - 1) / kReductionBlock * kReductionBlock : taps - 1;
}

// One output sample: t0*w0, then += t_j*w_j in order: the first `unfused` as a multiply, then an add, the rest fused.
float aa_dot(const float* src, int64_t stride, const float* w, int64_t n, int64_t unfused) {
    float out = src[0] * w[0];
    for (int64_t j = 1; j < n; ++j)
        out = j <= unfused ? out + src[j * stride] * w[j] : std::fma(src[j * stride], w[j], out);
    return out;
}

// ---- the fast resize: row kernels ------------------------------------------------------------------

template <bool Fma>
[[gnu::always_inline]] inline float mac(float a, float b, float acc) {
    if constexpr (Fma) {
        return __builtin_fmaf(a, b, acc);
    } else {
        return acc + a * b;
    }
}

// Horizontal pass of one row: out[e] = rowf[src[e]] * w0[e], then out[e] = mac(rowf[src[e] + 3j], wj[e]).
// `rowf` is the interleaved RGB row as float, padded with zeros for the padded taps.
template <bool Fma>
[[gnu::always_inline]] inline void h_row_impl(const float* __restrict rowf, const int32_t* __restrict src,
                                              const float* __restrict w, int taps, int n, float* __restrict out) {
    for (int e = 0; e < n; ++e) out[e] = rowf[src[e]] * w[e];
    for (int j = 1; j < taps; ++j) {
        const float* __restrict wj = w + size_t(j) * size_t(n);
        const int off = 3 * j;
        for (int e = 0; e < n; ++e) out[e] = mac<Fma>(rowf[src[e] + off], wj[e], out[e]);
    }
}

// Vertical pass of one output row over taps [first, taps): acc[e] = rows[0][e] * w[0] when first is 0, then
// acc[e] = mac(rows[j][e], w[j]); then, unless `out` is null, (acc * 255) clamped and truncated to uint8
// (VideoToNumpy), each pixel written once or twice.
template <bool Fma>
[[gnu::always_inline]] inline void v_row_impl(const float* __restrict rows, size_t row_len, const float* w, int first,
                                              int taps, float* __restrict acc, uint8_t* __restrict out, bool repeat) {
    const int n = int(row_len);
    if (first == 0) {
        const float w0 = w[0];
        for (int e = 0; e < n; ++e) acc[e] = rows[e] * w0;
        first = 1;
    }
    for (int j = first; j < taps; ++j) {
        const float* __restrict r = rows + size_t(j) * row_len;
        const float wj = w[j];
        for (int e = 0; e < n; ++e) acc[e] = mac<Fma>(r[e], wj, acc[e]);
    }
    if (out == nullptr) return;
    if (!repeat) {
        for (int e = 0; e < n; ++e) out[e] = uint8_t(std::clamp(acc[e] * 255.0f, 0.f, 255.f));
    } else {
        for (int e = 0; e < n; e += 3)
            for (int c = 0; c < 3; ++c) {
                const uint8_t v = uint8_t(std::clamp(acc[e + c] * 255.0f, 0.f, 255.f));
                out[2 * e + c] = v;
                out[2 * e + 3 + c] = v;
            }
    }
}

using HRowFn = void (*)(const float*, const int32_t*, const float*, int, int, float*);
using VRowFn = void (*)(const float*, size_t, const float*, int, int, float*, uint8_t*, bool);

template <bool Fma>
void h_row_generic(const float* rowf, const int32_t* src, const float* w, int taps, int n, float* out) {
    h_row_impl<Fma>(rowf, src, w, taps, n, out);
}
template <bool Fma>
void v_row_generic(const float* rows, size_t row_len, const float* w, int first, int taps, float* acc, uint8_t* out,
                   bool repeat) {
    v_row_impl<Fma>(rows, row_len, w, first, taps, acc, out, repeat);
}

#if defined(__x86_64__) && defined(__GNUC__)
// NOTE: the baseline x86-64 target has no FMA instruction, so std::fma is a library call per value; these
// copies are compiled for AVX2 + FMA and picked at run time. Only the fused variant is built this way: the
// unfused one must never be contracted into FMAs.
__attribute__((target("avx2,fma"))) void h_row_avx2(const float* rowf, const int32_t* src, const float* w, int taps,
                                                     int n, float* out) {
    h_row_impl<true>(rowf, src, w, taps, n, out);
}
__attribute__((target("avx2,fma"))) void v_row_avx2(const float* rows, size_t row_len, const float* w, int first,
                                                     int taps, float* acc, uint8_t* out, bool repeat) {
    v_row_impl<true>(rows, row_len, w, first, taps, acc, out, repeat);
}
bool cpu_has_avx2_fma() {
    static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    return yes;
}
#endif

HRowFn pick_h_row(bool fma) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (fma && cpu_has_avx2_fma()) return h_row_avx2;
#endif
    return fma ? h_row_generic<true> : h_row_generic<false>;
}
VRowFn pick_v_row(bool fma) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (fma && cpu_has_avx2_fma()) return v_row_avx2;
#endif
    return fma ? v_row_generic<true> : v_row_generic<false>;
}

void unit_range_lut(UnitRangeMode mode, float lut[256]) {
    for (int u = 0; u < 256; ++u) {
        if (mode == UnitRangeMode::F32) {
            lut[u] = (float(u) / 255.0f - 0.5f) / 0.5f;
        } else {
            // NOTE: on CUDA `x.float() / 255.0` multiplies by the float reciprocal; Normalize then runs in
            // bf16.
            const float a = bf16_to_f32(f32_to_bf16(float(u) * (1.0f / 255.0f)));
            const float b = bf16_to_f32(f32_to_bf16(a - 0.5f));
            lut[u] = bf16_to_f32(f32_to_bf16(b / 0.5f));
        }
    }
}

/// The frame the crop is taken from: `frame` itself when it has the expected size (or no size is
/// expected), else resize_with_pad into `padded` (logged once per camera name and size).
RgbView eval_frame(RgbView frame, std::string_view name, RgbImage& padded, int height = kFrameHeight,
                   int width = kFrameWidth) {
    DZR_CHECK(frame.data != nullptr && frame.height > 0 && frame.width > 0, "preprocess: {} frame is empty", name);
    if (height <= 0 || (frame.height == height && frame.width == width)) return frame;
    static std::mutex mu;
    static std::set<std::string> logged;
    const std::string key = std::string(name) + ":" + std::to_string(frame.height) + "x" + std::to_string(frame.width) +
                            "->" + std::to_string(height) + "x" + std::to_string(width);
    {
        std::lock_guard<std::mutex> lock(mu);
        if (logged.insert(key).second)
            log()->info("{}: {}x{} frames are resized with padding to {}x{} (openpi resize_with_pad)", name,
                        frame.height, frame.width, height, width);
    }
    padded = resize_with_pad(frame, height, width);
    return padded.view();
}

/// One AaResizer per geometry, shared (preprocess_view).
const AaResizer& cached_resizer(int h, int w, int out_h, int out_w, bool fma) {
    static std::mutex mu;
    static std::map<std::tuple<int, int, int, int, bool>, std::unique_ptr<AaResizer>> cache;
    std::lock_guard<std::mutex> lock(mu);
    auto& slot = cache[{h, w, out_h, out_w, fma}];
    if (!slot) slot = std::make_unique<AaResizer>(h, w, out_h, out_w, ResizeOptions{fma});
    return *slot;
}

}  // namespace

RgbView frame_view(const TensorView& frames, int64_t t) {
    DZR_CHECK(frames.dtype == DType::U8 && frames.rank() == 4 && frames.dim(3) == 3 &&
                  frames.is_contiguous() && frames.device.is_cpu(),
              "preprocess: frames must be a contiguous host uint8 [T, H, W, 3] tensor, got {}", frames.str());
    DZR_CHECK(t >= 0 && t < frames.dim(0), "preprocess: frame {} requested of {}", t, frames.dim(0));
    const int64_t h = frames.dim(1), w = frames.dim(2);
    return {static_cast<const uint8_t*>(frames.data) + t * h * w * 3, int(h), int(w)};
}

RgbImage resize_with_pad(RgbView in, int height, int width) {
    DZR_CHECK(in.height > 0 && in.width > 0 && height > 0 && width > 0,
              "resize_with_pad: cannot resize a {}x{} frame to {}x{}", in.height, in.width, height, width);
    if (in.height == height && in.width == width) {
        RgbImage copy(height, width);
        std::copy(in.data, in.data + copy.pixels.size(), copy.pixels.begin());
        return copy;
    }
    const double ratio = std::max(double(in.width) / width, double(in.height) / height);
    const int resized_h = int(in.height / ratio);
    const int resized_w = int(in.width / ratio);
    DZR_CHECK(resized_h >= 1 && resized_w >= 1, "resize_with_pad: a {}x{} frame shrinks to {}x{} at {}x{}",
              in.height, in.width, resized_h, resized_w, height, width);
    const RgbImage resized = pil_resize_bilinear(in, resized_h, resized_w);
    const int pad_h = std::max(0, int((height - resized_h) / 2.0));
    const int pad_w = std::max(0, int((width - resized_w) / 2.0));
    RgbImage out(height, width);
    for (int y = 0; y < resized_h && y + pad_h < height; ++y)
        for (int x = 0; x < resized_w && x + pad_w < width; ++x)
            for (int c = 0; c < 3; ++c) out.at(y + pad_h, x + pad_w, c) = resized.at(y, x, c);
    return out;
}

int center_crop_offset(int in_size, int out_size) {
    DZR_CHECK(out_size >= 1 && out_size <= in_size, "center crop: cannot crop {} pixels out of {}", out_size,
              in_size);
    return int(std::nearbyint(double(in_size - out_size) / 2.0));  // round half to even, as Python round()
}

RgbImage resize_bilinear_aa_u8(RgbView in, int top, int left, int h, int w, int out_height, int out_width,
                               const ResizeOptions& opt) {
    DZR_CHECK(top >= 0 && left >= 0 && h >= 1 && w >= 1 && top + h <= in.height && left + w <= in.width,
              "resize: region {}x{} at ({}, {}) is outside the {}x{} frame", h, w, top, left, in.height,
              in.width);
    DZR_CHECK(out_height >= 1 && out_width >= 1, "resize: invalid output size {}x{}", out_height, out_width);
    RgbImage out(out_height, out_width);
    std::vector<float> src(size_t(h) * size_t(w)), tmp, dst;
    const bool need_h = out_width != w, need_v = out_height != h;
    const AaAxis ax_w = need_h ? torch_aa_axis(w, out_width) : AaAxis{};
    const AaAxis ax_h = need_v ? torch_aa_axis(h, out_height) : AaAxis{};
    for (int c = 0; c < 3; ++c) {
        // VideoToTensor: uint8 -> float32 / 255 ([H, W] plane of channel c)
        for (int y = 0; y < h; ++y)
            for (int x = 0; x < w; ++x)
                src[size_t(y) * size_t(w) + size_t(x)] = float(in.at(top + y, left + x, c)) / 255.0f;
        // horizontal pass: [h, w] -> [h, out_w]
        const std::vector<float>* cur = &src;
        if (need_h) {
            tmp.assign(size_t(h) * size_t(out_width), 0.f);
            for (int y = 0; y < h; ++y)
                for (int x = 0; x < out_width; ++x)
                    tmp[size_t(y) * size_t(out_width) + size_t(x)] = aa_dot(
                        &src[size_t(y) * size_t(w) + size_t(ax_w.xmin[size_t(x)])], 1,
                        &ax_w.w[size_t(x * ax_w.max_interp)], ax_w.xsize[size_t(x)],
                        unfused_adds(ax_w.xsize[size_t(x)], opt.fused_multiply_add));
            cur = &tmp;
        }
        // vertical pass: [h, out_w] -> [out_h, out_w]
        if (need_v) {
            dst.assign(size_t(out_height) * size_t(out_width), 0.f);
            for (int y = 0; y < out_height; ++y)
                for (int x = 0; x < out_width; ++x)
                    dst[size_t(y) * size_t(out_width) + size_t(x)] = aa_dot(
                        &(*cur)[size_t(ax_h.xmin[size_t(y)]) * size_t(out_width) + size_t(x)], out_width,
                        &ax_h.w[size_t(y * ax_h.max_interp)], ax_h.xsize[size_t(y)],
                        unfused_adds(ax_h.xsize[size_t(y)], opt.fused_multiply_add));
            cur = &dst;
        }
        // VideoToNumpy: (x * 255).to(uint8) truncates
        for (int y = 0; y < out_height; ++y)
            for (int x = 0; x < out_width; ++x) {
                const float v = (*cur)[size_t(y) * size_t(out_width) + size_t(x)] * 255.0f;
                out.at(y, x, c) = uint8_t(std::clamp(v, 0.f, 255.f));
            }
    }
    return out;
}

RgbImage preprocess_view(RgbView frame, std::string_view name, const ResizeOptions& opt) {
    return preprocess_view(frame, ViewSize{}, name, opt);
}

RgbImage preprocess_view(RgbView frame, ViewSize size, std::string_view name, const ResizeOptions& opt) {
    return preprocess_view(frame, droid_canvas_spec(size), name, opt);
}

RgbImage preprocess_view(RgbView frame, const CanvasSpec& spec, std::string_view name, const ResizeOptions& opt) {
    DZR_CHECK(spec.view.height >= 1 && spec.view.width >= 1, "preprocess: {} view size {}x{} is not positive", name,
              spec.view.height, spec.view.width);
    RgbImage padded;
    const RgbView src = eval_frame(frame, name, padded, spec.frame_height, spec.frame_width);
    const auto [ch, cw] = spec.crop_size(src.height, src.width);
    return cached_resizer(ch, cw, spec.view.height, spec.view.width, opt.fused_multiply_add)
        .run(src, center_crop_offset(src.height, ch), center_crop_offset(src.width, cw));
}

RgbImage compose_canvas(const RgbImage& wrist, const RgbImage& exterior_1, const RgbImage& exterior_2) {
    const int h = wrist.height, w = wrist.width;
    DZR_CHECK(h >= 1 && w >= 1, "canvas: the wrist view is empty ({}x{})", h, w);
    for (const RgbImage* v : {&exterior_1, &exterior_2})
        DZR_CHECK(v->height == h && v->width == w,
                  "canvas: views must share one size after preprocessing: wrist {}x{}, exterior {}x{}", h, w,
                  v->height, v->width);
    RgbImage canvas(2 * h, 2 * w);
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x)
            for (int c = 0; c < 3; ++c) {
                // top: wrist with each column repeated (np.repeat along width)
                canvas.at(y, 2 * x, c) = wrist.at(y, x, c);
                canvas.at(y, 2 * x + 1, c) = wrist.at(y, x, c);
                // bottom-left exterior 1, bottom-right exterior 2
                canvas.at(h + y, x, c) = exterior_1.at(y, x, c);
                canvas.at(h + y, w + x, c) = exterior_2.at(y, x, c);
            }
    return canvas;
}

RgbImage compose_canvas(CanvasLayout layout, std::span<const RgbImage> views) {
    DZR_CHECK(!views.empty(), "canvas: no views");
    if (layout == CanvasLayout::DroidWrist) {
        DZR_CHECK(views.size() >= 3, "canvas: the DROID layout needs 3 views, got {}", views.size());
        return compose_canvas(views[2], views[0], views[1]);
    }
    const int h = views[0].height, w = views[0].width;
    DZR_CHECK(h >= 1 && w >= 1, "canvas: view 0 is empty ({}x{})", h, w);
    for (const auto& v : views)
        DZR_CHECK(v.height == h && v.width == w, "canvas: views must share one size after preprocessing: {}x{} and {}x{}",
                  h, w, v.height, v.width);
    if (layout == CanvasLayout::Single) return views[0];
    RgbImage canvas(2 * h, 2 * w);  // zero: the quadrants no view covers stay black
    const int place[3][2] = {{0, 0}, {h, 0}, {0, w}};  // top-left, bottom-left, top-right
    for (size_t v = 0; v < std::min<size_t>(3, views.size()); ++v)
        for (int y = 0; y < h; ++y)
            for (int x = 0; x < w; ++x)
                for (int c = 0; c < 3; ++c) canvas.at(place[v][0] + y, place[v][1] + x, c) = views[v].at(y, x, c);
    return canvas;
}

void canvases_to_model_input(std::span<const RgbImage> canvases, std::span<float> out, UnitRangeMode mode) {
    const size_t t_count = canvases.size();
    DZR_CHECK(t_count >= 1, "model input: no canvases");
    const int height = canvases[0].height, width = canvases[0].width;
    const size_t plane = size_t(height) * size_t(width);
    DZR_CHECK(out.size() == 3 * t_count * plane, "model input: {} canvases of {}x{} need {} output values, got {}",
              t_count, height, width, 3 * t_count * plane, out.size());
    float lut[256];
    unit_range_lut(mode, lut);
    for (size_t t = 0; t < t_count; ++t) {
        const RgbImage& cv = canvases[t];
        DZR_CHECK(cv.height == height && cv.width == width, "model input: canvas {} is {}x{}, expected {}x{}", t,
                  cv.height, cv.width, height, width);
        // [H, W, 3] -> [3, T, H, W]
        for (size_t p = 0; p < plane; ++p)
            for (size_t c = 0; c < 3; ++c) out[(c * t_count + t) * plane + p] = lut[cv.pixels[p * 3 + c]];
    }
}

// ---- AaResizer -----------------------------------------------------------------------------------------

AaResizer::AaResizer(int in_height, int in_width, int out_height, int out_width, const ResizeOptions& opt)
    : in_h_(in_height), in_w_(in_width), out_h_(out_height), out_w_(out_width), fma_(opt.fused_multiply_add) {
    DZR_CHECK(in_height >= 1 && in_width >= 1 && out_height >= 1 && out_width >= 1,
              "resize: invalid geometry {}x{} -> {}x{}", in_height, in_width, out_height, out_width);
    // NOTE: an axis that keeps its size is not resampled by the reference; one tap of weight 1 copies it
    // exactly (x * 1 == x).
    const int n = out_w_ * 3;
    if (out_w_ != in_w_) {
        const AaAxis ax = torch_aa_axis(in_w_, out_w_);
        taps_h_ = int(ax.max_interp);
        src_h_.resize(size_t(n));
        w_h_.assign(size_t(taps_h_) * size_t(n), 0.f);
        for (int x = 0; x < out_w_; ++x)
            for (int c = 0; c < 3; ++c) {
                const int e = x * 3 + c;
                src_h_[size_t(e)] = int32_t(ax.xmin[size_t(x)] * 3 + c);
                for (int64_t j = 0; j < ax.xsize[size_t(x)]; ++j)
                    w_h_[size_t(j) * size_t(n) + size_t(e)] = ax.w[size_t(x * ax.max_interp + j)];
                const int64_t k = unfused_adds(ax.xsize[size_t(x)], fma_);
                if (fma_ && k > 0) mixed_h_.push_back({e, int32_t(k)});
            }
    } else {
        src_h_.resize(size_t(n));
        for (int e = 0; e < n; ++e) src_h_[size_t(e)] = e;
        w_h_.assign(size_t(n), 1.f);
    }
    if (out_h_ != in_h_) {
        const AaAxis ax = torch_aa_axis(in_h_, out_h_);
        taps_v_ = int(ax.max_interp);
        src_v_.resize(size_t(out_h_));
        w_v_.assign(size_t(out_h_) * size_t(taps_v_), 0.f);
        unfused_v_.assign(size_t(out_h_), 0);
        for (int y = 0; y < out_h_; ++y) {
            src_v_[size_t(y)] = int32_t(ax.xmin[size_t(y)]);
            for (int64_t j = 0; j < ax.xsize[size_t(y)]; ++j)
                w_v_[size_t(y) * size_t(taps_v_) + size_t(j)] = ax.w[size_t(y * ax.max_interp + j)];
            unfused_v_[size_t(y)] = int32_t(unfused_adds(ax.xsize[size_t(y)], fma_));
        }
    } else {
        src_v_.resize(size_t(out_h_));
        for (int y = 0; y < out_h_; ++y) src_v_[size_t(y)] = y;
        w_v_.assign(size_t(out_h_), 1.f);
        unfused_v_.assign(size_t(out_h_), 0);
    }
}

void AaResizer::run(RgbView in, int top, int left, uint8_t* out, size_t out_row_stride, bool repeat_columns) const {
    DZR_CHECK(in.data != nullptr && top >= 0 && left >= 0 && top + in_h_ <= in.height && left + in_w_ <= in.width,
              "resize: region {}x{} at ({}, {}) is outside the {}x{} frame", in_h_, in_w_, top, left, in.height,
              in.width);
    static const auto kByteToUnit = [] {
        std::array<float, 256> t{};
        for (int u = 0; u < 256; ++u) t[size_t(u)] = float(u) / 255.0f;  // VideoToTensor: uint8 -> / 255
        return t;
    }();
    const HRowFn h_row = pick_h_row(fma_);
    const VRowFn v_row = pick_v_row(fma_), v_row_unfused = pick_v_row(false);
    const int n = out_w_ * 3;
    // Per-thread buffers: the float row (zero-padded for the padded taps), the horizontal pass output
    // (zero rows appended for the padded vertical taps) and one accumulator row.
    thread_local std::vector<float> rowf, tmp, acc;
    rowf.resize(size_t(in_w_ + taps_h_) * 3);
    std::fill(rowf.begin() + ptrdiff_t(in_w_) * 3, rowf.end(), 0.f);
    tmp.resize(size_t(in_h_ + taps_v_) * size_t(n));
    std::fill(tmp.begin() + ptrdiff_t(size_t(in_h_) * size_t(n)), tmp.end(), 0.f);
    acc.resize(size_t(n));
    for (int y = 0; y < in_h_; ++y) {
        const uint8_t* row = in.data + (size_t(top + y) * size_t(in.width) + size_t(left)) * 3;
        for (int k = 0; k < in_w_ * 3; ++k) rowf[size_t(k)] = kByteToUnit[row[k]];
        float* hout = tmp.data() + size_t(y) * size_t(n);
        h_row(rowf.data(), src_h_.data(), w_h_.data(), taps_h_, n, hout);
        // The outputs of more than kReductionBlock taps again, their first accumulations a multiply, then an add
        // (the padded taps add exact zeros either way).
        for (const auto& [e, unfused] : mixed_h_) {
            const float* r = rowf.data() + src_h_[size_t(e)];
            float t = r[0] * w_h_[size_t(e)];
            for (int j = 1; j < taps_h_; ++j) {
                const float wj = w_h_[size_t(j) * size_t(n) + size_t(e)];
                t = j <= unfused ? t + r[3 * j] * wj : std::fma(r[3 * j], wj, t);
            }
            hout[e] = t;
        }
    }
    for (int y = 0; y < out_h_; ++y) {
        const float* rows = tmp.data() + size_t(src_v_[size_t(y)]) * size_t(n);
        const float* w = &w_v_[size_t(y) * size_t(taps_v_)];
        const int unfused = unfused_v_[size_t(y)];
        if (unfused > 0) v_row_unfused(rows, size_t(n), w, 0, unfused + 1, acc.data(), nullptr, false);
        v_row(rows, size_t(n), w, unfused > 0 ? unfused + 1 : 0, taps_v_, acc.data(), out + size_t(y) * out_row_stride,
              repeat_columns);
    }
}

RgbImage AaResizer::run(RgbView in, int top, int left) const {
    RgbImage out(out_h_, out_w_);
    run(in, top, left, out.pixels.data(), size_t(out_w_) * 3);
    return out;
}

// ---- parallel_for ------------------------------------------------------------------------------------

void parallel_for(int n, int threads, const std::function<void(int)>& fn) {
    if (n <= 0) return;
    const int workers = std::min(n, std::max(1, threads));
    std::atomic<int> next{0};
    std::mutex mu;
    std::exception_ptr error;
    auto drain = [&] {
        for (int i; (i = next.fetch_add(1)) < n;) {
            try {
                fn(i);
            } catch (...) {
                std::lock_guard<std::mutex> lock(mu);
                if (!error) error = std::current_exception();
            }
        }
    };
    std::vector<std::thread> pool;
    pool.reserve(size_t(workers - 1));
    for (int k = 1; k < workers; ++k) {
        try {
            pool.emplace_back(drain);
        } catch (const std::system_error&) {
            break;  // NOTE: no more threads; the ones running (and this one) finish the work
        }
    }
    drain();
    for (auto& t : pool) t.join();
    if (error) std::rethrow_exception(error);
}

// ---- CanvasSpec -------------------------------------------------------------------------------------------------

std::pair<int, int> CanvasSpec::crop_size(int height, int width) const {
    // NOTE: VideoCrop's size is (int(height * scale), int(width * scale)) in Python floats (IEEE double).
    const int h = int(double(height) * crop_scale), w = int(double(width) * crop_scale);
    DZR_CHECK(h >= 1 && w >= 1 && h <= height && w <= width, "preprocess: a {} crop of {}x{} frames is {}x{}",
              crop_scale, height, width, h, w);
    return {h, w};
}

CanvasSpec droid_canvas_spec(ViewSize view) {
    CanvasSpec s;
    s.view = view;
    return s;
}

CanvasSpec canvas_spec(const Embodiment& e, const ModelConfig& model) {
    CanvasSpec s;
    s.layout = e.layout;
    s.cameras.clear();
    for (const auto& c : e.cameras) s.cameras.push_back(c.key);
    s.frame_height = e.cameras.empty() ? 0 : e.cameras[0].height;
    s.frame_width = e.cameras.empty() ? 0 : e.cameras[0].width;
    s.crop_scale = e.crop_scale;
    const auto [vh, vw] = embodiment_view_size(e, model);
    s.view = ViewSize{vh, vw};
    return s;
}

// ---- ObservationPreprocessor ---------------------------------------------------------------------------

ObservationPreprocessor::ObservationPreprocessor(CanvasSpec spec, UnitRangeMode mode, int threads)
    : spec_(std::move(spec)),
      mode_(mode),
      threads_(threads > 0 ? threads : int(std::clamp(std::thread::hardware_concurrency(), 1u, 8u))) {
    DZR_CHECK(!spec_.cameras.empty(), "preprocess: no cameras");
    DZR_CHECK(spec_.layout != CanvasLayout::DroidWrist || spec_.cameras.size() >= 3,
              "preprocess: the DROID layout needs 3 cameras, got {}", spec_.cameras.size());
    DZR_CHECK(spec_.view.height >= 1 && spec_.view.width >= 1, "preprocess: view size {}x{} is not positive",
              spec_.view.height, spec_.view.width);
    if (spec_.frame_height > 0) {
        const auto [ch, cw] = spec_.crop_size(spec_.frame_height, spec_.frame_width);
        resizer_ = std::make_unique<AaResizer>(ch, cw, spec_.view.height, spec_.view.width);
    }
    unit_range_lut(mode_, lut_);
    for (int i = 0; i < 256; ++i) lut_bf16_[i] = f32_to_bf16(lut_[i]);
}

ObservationPreprocessor::ObservationPreprocessor(ViewSize view, UnitRangeMode mode, int threads)
    : ObservationPreprocessor(droid_canvas_spec(view), mode, threads) {}

int64_t ObservationPreprocessor::check_cameras(std::span<const TensorView> cams) const {
    DZR_CHECK(cams.size() == spec_.cameras.size(), "preprocess: {} cameras given, the embodiment has {}", cams.size(),
              spec_.cameras.size());
    for (const auto& c : cams) (void)frame_view(c, 0);
    const int64_t T = cams[0].dim(0);
    for (size_t v = 1; v < cams.size(); ++v)
        DZR_CHECK(cams[v].dim(0) == T, "preprocess: {} has {} frames, {} has {}", spec_.cameras[v], cams[v].dim(0),
                  spec_.cameras[0], T);
    return T;
}

void ObservationPreprocessor::view_into(const TensorView& camera, int position, int64_t t, uint8_t* canvas) const {
    const size_t p = size_t(position);
    RgbImage padded;
    const RgbView src = eval_frame(frame_view(camera, t), spec_.cameras[p], padded, spec_.frame_height,
                                   spec_.frame_width);
    const int vh = spec_.view.height, vw = spec_.view.width;
    const size_t row = size_t(spec_.canvas_width()) * 3;  // canvas row bytes
    uint8_t* dst = canvas;
    bool repeat = false;
    switch (spec_.layout) {
        case CanvasLayout::DroidWrist:
            // view 2 (the wrist) on top with its columns doubled; views 0 and 1 bottom-left and bottom-right
            if (position == 2) repeat = true;
            else dst += size_t(vh) * row + (position == 1 ? size_t(vw) * 3 : 0);
            break;
        case CanvasLayout::Grid:
            // views 0, 1, 2 at top-left, bottom-left, top-right
            if (position == 1) dst += size_t(vh) * row;
            if (position == 2) dst += size_t(vw) * 3;
            break;
        case CanvasLayout::Single:
            break;
    }
    const auto [ch, cw] = spec_.crop_size(src.height, src.width);
    const AaResizer& resizer =
        resizer_ && resizer_->in_height() == ch && resizer_->in_width() == cw
            ? *resizer_
            : cached_resizer(ch, cw, vh, vw, true);
    resizer.run(src, center_crop_offset(src.height, ch), center_crop_offset(src.width, cw), dst, row, repeat);
}

void ObservationPreprocessor::clear_uncovered(uint8_t* canvas) const {
    if (spec_.layout != CanvasLayout::Grid) return;
    const size_t vh = size_t(spec_.view.height), half = size_t(spec_.view.width) * 3, row = 2 * half;
    for (size_t y = 0; y < 2 * vh; ++y) {
        const bool top = y < vh;
        // bottom-right always; top-right when there is no third view
        if (!top || spec_.cameras.size() < 3) std::memset(canvas + y * row + half, 0, half);
        if (!top && spec_.cameras.size() < 2) std::memset(canvas + y * row, 0, half);
    }
}

static int placed_views(const CanvasSpec& spec) {
    return spec.layout == CanvasLayout::Single ? 1 : int(std::min<size_t>(3, spec.cameras.size()));
}

void ObservationPreprocessor::canvas(std::span<const TensorView> cams, int64_t t, uint8_t* canvas) const {
    check_cameras(cams);
    clear_uncovered(canvas);
    for (int v = 0; v < placed_views(spec_); ++v) view_into(cams[size_t(v)], v, t, canvas);
}

void ObservationPreprocessor::run(std::span<const TensorView> cams, int reference, std::span<const int> clip,
                                  std::span<float> reference_out, std::span<float> clip_out, Scratch* scratch) const {
    run_impl<float>(cams, reference, clip, reference_out, clip_out, lut_, scratch);
}

void ObservationPreprocessor::run_bf16(std::span<const TensorView> cams, int reference, std::span<const int> clip,
                                       std::span<uint16_t> reference_out, std::span<uint16_t> clip_out,
                                       Scratch* scratch) const {
    run_impl<uint16_t>(cams, reference, clip, reference_out, clip_out, lut_bf16_, scratch);
}

void ObservationPreprocessor::canvas(const TensorView& wrist, const TensorView& exterior_1,
                                     const TensorView& exterior_2, int64_t t, uint8_t* out) const {
    const std::array<TensorView, 3> cams = {exterior_1, exterior_2, wrist};
    canvas(std::span<const TensorView>(cams), t, out);
}

void ObservationPreprocessor::run(const TensorView& wrist, const TensorView& exterior_1,
                                  const TensorView& exterior_2, int reference, std::span<const int> clip,
                                  std::span<float> reference_out, std::span<float> clip_out, Scratch* scratch) const {
    const std::array<TensorView, 3> cams = {exterior_1, exterior_2, wrist};
    run(std::span<const TensorView>(cams), reference, clip, reference_out, clip_out, scratch);
}

void ObservationPreprocessor::run_bf16(const TensorView& wrist, const TensorView& exterior_1,
                                       const TensorView& exterior_2, int reference, std::span<const int> clip,
                                       std::span<uint16_t> reference_out, std::span<uint16_t> clip_out,
                                       Scratch* scratch) const {
    const std::array<TensorView, 3> cams = {exterior_1, exterior_2, wrist};
    run_bf16(std::span<const TensorView>(cams), reference, clip, reference_out, clip_out, scratch);
}

template <typename Elem>
void ObservationPreprocessor::run_impl(std::span<const TensorView> cams, int reference, std::span<const int> clip,
                                       std::span<Elem> reference_out, std::span<Elem> clip_out, const Elem* lut,
                                       Scratch* scratch) const {
    const int64_t T = check_cameras(cams);
    const int64_t H = spec_.canvas_height(), W = spec_.canvas_width();
    const size_t plane = size_t(H * W), canvas_bytes = plane * 3;
    DZR_CHECK(reference >= 0 && reference < T, "preprocess: reference frame {} of {}", reference, T);
    for (int f : clip) DZR_CHECK(f >= 0 && f < T, "preprocess: clip frame {} of {}", f, T);
    DZR_CHECK(reference_out.size() == 3 * plane, "preprocess: the reference input needs {} values, got {}",
              3 * plane, reference_out.size());
    DZR_CHECK(clip_out.size() == 3 * clip.size() * plane, "preprocess: a {}-frame clip needs {} values, got {}",
              clip.size(), 3 * clip.size() * plane, clip_out.size());

    // Canvases of the frames used.
    std::vector<int> used(size_t(T), 0);
    used[size_t(reference)] = 1;
    for (int f : clip) used[size_t(f)] = 1;
    std::vector<int> frames;
    for (int t = 0; t < int(T); ++t)
        if (used[size_t(t)]) frames.push_back(t);
    // NOTE: the views tile the canvas except the grid's black quadrants, which clear_uncovered writes; so the
    // scratch is not cleared.
    Scratch own;
    Scratch& canvases = scratch ? *scratch : own;
    canvases.resize(frames.size() * canvas_bytes);
    const int views = placed_views(spec_);
    for (size_t k = 0; k < frames.size(); ++k) clear_uncovered(canvases.data() + k * canvas_bytes);
    parallel_for(int(frames.size()) * views, threads_, [&](int i) {
        view_into(cams[size_t(i % views)], i % views, frames[size_t(i / views)],
                  canvases.data() + size_t(i / views) * canvas_bytes);
    });

    // [H, W, 3] canvases -> [3, S, H, W] inputs: one task per (canvas, channel), each writing every slot the
    // canvas fills (the clip repeats frames).
    const size_t S = clip.size();
    parallel_for(int(frames.size()) * 3, threads_, [&](int i) {
        const int k = i / 3, c = i % 3, t = frames[size_t(k)];
        const uint8_t* cv = canvases.data() + size_t(k) * canvas_bytes + size_t(c);
        std::vector<Elem*> dst;
        for (size_t s = 0; s < S; ++s)
            if (clip[s] == t) dst.push_back(clip_out.data() + (size_t(c) * S + s) * plane);
        if (t == reference) dst.push_back(reference_out.data() + size_t(c) * plane);
        // One read of the canvas, every slot written from it (in cache-sized pieces).
        constexpr size_t kPiece = 4096;
        for (size_t p0 = 0; p0 < plane; p0 += kPiece) {
            const size_t p1 = std::min(plane, p0 + kPiece);
            Elem* first = dst[0];
            for (size_t p = p0; p < p1; ++p) first[p] = lut[cv[p * 3]];
            for (size_t d = 1; d < dst.size(); ++d) std::memcpy(dst[d] + p0, first + p0, (p1 - p0) * sizeof(Elem));
        }
    });
}

}  // namespace dzr
