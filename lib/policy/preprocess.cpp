// Host preprocessing of camera frames. Two resamplers are reproduced operation by operation:
//  - PIL's fixed-point bilinear resampler (libImaging/Resample.c) for openpi's resize_with_pad;
//  - PyTorch's CPU float anti-aliased bilinear kernel (UpSampleKernel.cpp, separable, horizontal pass
//    first) for torchvision Resize(antialias=True) on float32 frames.
#include "policy/preprocess.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <set>
#include <string>

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

// One output sample: t0*w0, then += t_j*w_j in order (interpolate_aa_single_dim).
float aa_dot(const float* src, int64_t stride, const float* w, int64_t n, bool fma) {
    float out = src[0] * w[0];
    for (int64_t j = 1; j < n; ++j)
        out = fma ? std::fma(src[j * stride], w[j], out) : out + src[j * stride] * w[j];
    return out;
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
                        &ax_w.w[size_t(x * ax_w.max_interp)], ax_w.xsize[size_t(x)], opt.fused_multiply_add);
            cur = &tmp;
        }
        // vertical pass: [h, out_w] -> [out_h, out_w]
        if (need_v) {
            dst.assign(size_t(out_height) * size_t(out_width), 0.f);
            for (int y = 0; y < out_height; ++y)
                for (int x = 0; x < out_width; ++x)
                    dst[size_t(y) * size_t(out_width) + size_t(x)] = aa_dot(
                        &(*cur)[size_t(ax_h.xmin[size_t(y)]) * size_t(out_width) + size_t(x)], out_width,
                        &ax_h.w[size_t(y * ax_h.max_interp)], ax_h.xsize[size_t(y)], opt.fused_multiply_add);
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
    DZR_CHECK(frame.data != nullptr && frame.height > 0 && frame.width > 0, "preprocess: {} frame is empty",
              name);
    DZR_CHECK(size.height >= 1 && size.width >= 1, "preprocess: {} view size {}x{} is not positive", name,
              size.height, size.width);
    RgbImage padded;
    RgbView src = frame;
    if (frame.height != kFrameHeight || frame.width != kFrameWidth) {
        static std::mutex mu;
        static std::set<std::string> logged;
        const std::string key =
            std::string(name) + ":" + std::to_string(frame.height) + "x" + std::to_string(frame.width);
        {
            std::lock_guard<std::mutex> lock(mu);
            if (logged.insert(key).second)
                log()->info("{}: {}x{} frames are resized with padding to {}x{} (openpi resize_with_pad)",
                            name, frame.height, frame.width, kFrameHeight, kFrameWidth);
        }
        padded = resize_with_pad(frame, kFrameHeight, kFrameWidth);
        src = padded.view();
    }
    const int top = center_crop_offset(kFrameHeight, kCropHeight);
    const int left = center_crop_offset(kFrameWidth, kCropWidth);
    return resize_bilinear_aa_u8(src, top, left, kCropHeight, kCropWidth, size.height, size.width, opt);
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

void canvases_to_model_input(std::span<const RgbImage> canvases, std::span<float> out, UnitRangeMode mode) {
    const size_t t_count = canvases.size();
    DZR_CHECK(t_count >= 1, "model input: no canvases");
    const int height = canvases[0].height, width = canvases[0].width;
    const size_t plane = size_t(height) * size_t(width);
    DZR_CHECK(out.size() == 3 * t_count * plane, "model input: {} canvases of {}x{} need {} output values, got {}",
              t_count, height, width, 3 * t_count * plane, out.size());
    float lut[256];
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
    for (size_t t = 0; t < t_count; ++t) {
        const RgbImage& cv = canvases[t];
        DZR_CHECK(cv.height == height && cv.width == width, "model input: canvas {} is {}x{}, expected {}x{}", t,
                  cv.height, cv.width, height, width);
        // [H, W, 3] -> [3, T, H, W]
        for (size_t p = 0; p < plane; ++p)
            for (size_t c = 0; c < 3; ++c) out[(c * t_count + t) * plane + p] = lut[cv.pixels[p * 3 + c]];
    }
}

}  // namespace dzr
