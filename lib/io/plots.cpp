#include "io/plots.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "core/error.h"

namespace dzr::io {

namespace {

constexpr int kLeft = 64;
constexpr int kRight = 12;
constexpr int kTop = 26;
constexpr int kBottom = 38;
constexpr Rgb kGrid{232, 232, 232};
constexpr Rgb kAxis{60, 60, 60};

struct Range {
    double lo = std::numeric_limits<double>::infinity();
    double hi = -std::numeric_limits<double>::infinity();
    void add(double v) {
        if (!std::isfinite(v)) return;
        lo = std::min(lo, v);
        hi = std::max(hi, v);
    }
    bool empty() const { return lo > hi; }
};

/// Widens an empty or zero-width range so that it can be drawn.
void settle(Range& r, double pad_fraction) {
    if (r.empty()) {
        r.lo = 0;
        r.hi = 1;
        return;
    }
    if (r.hi == r.lo) {
        const double d = r.lo == 0 ? 1.0 : std::abs(r.lo) * 0.1;
        r.lo -= d;
        r.hi += d;
        return;
    }
    const double pad = (r.hi - r.lo) * pad_fraction;
    r.lo -= pad;
    r.hi += pad;
}

}  // namespace

std::vector<double> nice_ticks(double lo, double hi, int target) {
    std::vector<double> ticks;
    if (!(hi > lo) || !std::isfinite(lo) || !std::isfinite(hi) || target < 1) return ticks;
    const double raw = (hi - lo) / target;
    const double mag = std::pow(10.0, std::floor(std::log10(raw)));
    // The finest of 1, 2, 5, 10 x mag that gives at most target + 1 intervals.
    double step = mag;
    for (double m : {1.0, 2.0, 5.0, 10.0}) {
        step = m * mag;
        if ((hi - lo) / step <= target + 1) break;
    }
    const double first = std::ceil(lo / step - 1e-9) * step;
    for (int k = 0; k < 1000; ++k) {
        double t = first + k * step;
        if (t > hi + step * 1e-9) break;
        if (std::abs(t) < step * 1e-9) t = 0;  // no "-0" or 1e-17 labels
        ticks.push_back(t);
    }
    return ticks;
}

std::string format_tick(double value, double step) {
    const double a = std::max(std::abs(value), std::abs(step));
    if (a >= 1e6 || (a > 0 && a < 1e-4)) return fmt::format("{:.3g}", value);
    const int decimals = step > 0 ? std::clamp(int(-std::floor(std::log10(step) + 1e-9)), 0, 6) : 3;
    return fmt::format("{:.{}f}", value, decimals);
}

Image render_plot(const PlotSpec& spec) {
    Image img(spec.width, spec.height);
    const int pw = spec.width - kLeft - kRight;
    const int ph = spec.height - kTop - kBottom;
    DZR_CHECK(pw > 20 && ph > 20, "plot '{}': {}x{} is too small", spec.title, spec.width, spec.height);

    Range xr, yr;
    for (const auto& s : spec.series) {
        DZR_CHECK(s.x.size() == s.y.size(), "plot '{}': series '{}' has {} x values and {} y values", spec.title,
                  s.label, s.x.size(), s.y.size());
        for (size_t i = 0; i < s.x.size(); ++i) {
            if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
            xr.add(s.x[i]);
            yr.add(s.y[i]);
        }
    }
    settle(xr, 0.0);
    settle(yr, 0.06);
    auto px = [&](double x) { return kLeft + int(std::lround((x - xr.lo) / (xr.hi - xr.lo) * (pw - 1))); };
    auto py = [&](double y) { return kTop + int(std::lround((1.0 - (y - yr.lo) / (yr.hi - yr.lo)) * (ph - 1))); };

    // Grid and tick labels.
    const auto xt = nice_ticks(xr.lo, xr.hi, std::max(2, pw / 90));
    const auto yt = nice_ticks(yr.lo, yr.hi, std::max(2, ph / 45));
    const double xstep = xt.size() > 1 ? xt[1] - xt[0] : 1.0;
    const double ystep = yt.size() > 1 ? yt[1] - yt[0] : 1.0;
    for (double t : xt) {
        const int x = px(t);
        img.line(x, kTop, x, kTop + ph - 1, kGrid);
        const std::string label = format_tick(t, xstep);
        img.text(x - Image::text_width(label) / 2, kTop + ph + 5, label, kAxis);
    }
    for (double t : yt) {
        const int y = py(t);
        img.line(kLeft, y, kLeft + pw - 1, y, kGrid);
        const std::string label = format_tick(t, ystep);
        img.text(kLeft - 5 - Image::text_width(label), y - 3, label, kAxis);
    }
    // Frame, title and axis labels.
    img.line(kLeft, kTop, kLeft + pw - 1, kTop, kAxis);
    img.line(kLeft, kTop + ph - 1, kLeft + pw - 1, kTop + ph - 1, kAxis);
    img.line(kLeft, kTop, kLeft, kTop + ph - 1, kAxis);
    img.line(kLeft + pw - 1, kTop, kLeft + pw - 1, kTop + ph - 1, kAxis);
    img.text(kLeft + (pw - Image::text_width(spec.title)) / 2, 8, spec.title, kBlack);
    img.text(kLeft + (pw - Image::text_width(spec.x_label)) / 2, spec.height - 12, spec.x_label, kAxis);
    img.text(4, 8, spec.y_label, kAxis);

    // Series: segments between consecutive finite points.
    for (const auto& s : spec.series) {
        bool have_prev = false;
        int x0 = 0, y0 = 0;
        for (size_t i = 0; i < s.x.size(); ++i) {
            if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) {
                have_prev = false;
                continue;
            }
            const int x1 = px(s.x[i]), y1 = py(s.y[i]);
            if (have_prev) img.line(x0, y0, x1, y1, s.color, s.thickness);
            if (s.markers) img.fill_rect(x1 - 1, y1 - 1, 3, 3, s.color);
            x0 = x1, y0 = y1, have_prev = true;
        }
    }
    // Legend in the top-right corner of the plot area.
    int ly = kTop + 6;
    for (const auto& s : spec.series) {
        if (s.label.empty()) continue;
        const int tw = Image::text_width(s.label);
        const int lx = kLeft + pw - 8 - tw - 22;
        img.fill_rect(lx - 4, ly - 3, tw + 30, 13, kWhite);
        img.line(lx, ly + 3, lx + 16, ly + 3, s.color, 2);
        img.text(lx + 22, ly, s.label, kBlack);
        ly += 13;
    }
    return img;
}

Image tile_images(const std::vector<Image>& images, int cols, int gap) {
    DZR_CHECK(!images.empty() && cols > 0, "tile_images: nothing to tile");
    int cw = 0, ch = 0;
    for (const auto& im : images) {
        cw = std::max(cw, im.width());
        ch = std::max(ch, im.height());
    }
    const int n = int(images.size());
    const int rows = (n + cols - 1) / cols;
    const int used_cols = std::min(cols, n);
    Image out(used_cols * cw + (used_cols + 1) * gap, rows * ch + (rows + 1) * gap);
    for (int i = 0; i < n; ++i)
        out.blit(images[size_t(i)], gap + (i % cols) * (cw + gap), gap + (i / cols) * (ch + gap));
    return out;
}

}  // namespace dzr::io
