#include "io/plots.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "core/error.h"

namespace dzr::io {

namespace {

// Margins around the plot area: tick labels on the left and below, the title above.
constexpr int kLeft = 64;
constexpr int kTop = 26;
constexpr int kBottom = 38;

constexpr std::array<Rgb, 10> kTab10 = {{{31, 119, 180}, {255, 127, 14}, {44, 160, 44}, {214, 39, 40},
                                         {148, 103, 189}, {140, 86, 75}, {227, 119, 194}, {127, 127, 127},
                                         {188, 189, 34}, {23, 190, 207}}};

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

Rgb palette_color(size_t i) { return kTab10[i % kTab10.size()]; }

PlotFrame plot_frame(const PlotSpec& spec, bool y_from_zero, int right_margin) {
    PlotFrame f;
    f.left = kLeft;
    f.top = kTop;
    f.width = spec.width - kLeft - right_margin;
    f.height = spec.height - kTop - kBottom;
    DZR_CHECK(f.width > 20 && f.height > 20, "plot '{}': {}x{} is too small", spec.title, spec.width, spec.height);
    Range xr, yr;
    if (y_from_zero) yr.add(0.0);
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
    if (y_from_zero && yr.lo < 0 && yr.lo > -(yr.hi - yr.lo) * 0.1) yr.lo = 0;
    f.x_lo = xr.lo, f.x_hi = xr.hi, f.y_lo = yr.lo, f.y_hi = yr.hi;
    f.x_ticks = nice_ticks(xr.lo, xr.hi, std::max(2, f.width / 90));
    f.y_ticks = nice_ticks(yr.lo, yr.hi, std::max(2, f.height / 45));
    f.x_step = f.x_ticks.size() > 1 ? f.x_ticks[1] - f.x_ticks[0] : 1.0;
    if (spec.integer_x && f.x_step < 1.0) {
        f.x_ticks.clear();
        for (double t = std::ceil(xr.lo); t <= xr.hi; t += 1.0) f.x_ticks.push_back(t);
        f.x_step = 1.0;
    }
    f.y_step = f.y_ticks.size() > 1 ? f.y_ticks[1] - f.y_ticks[0] : 1.0;
    return f;
}

}  // namespace dzr::io
