#pragma once
/// Plot descriptions for reports, shared by the two renderers: SVG text (io/svg.h, always) and PNG
/// (render_plot_png, drawn by OpenCV in builds with it). The layout (plot area, ranges, ticks) is
/// computed once here, so both renderers draw the same picture.
#include <functional>
#include <string>
#include <vector>

#include "io/image.h"

namespace dzr::io {

inline constexpr Rgb kPlotBlue{31, 119, 180};
inline constexpr Rgb kPlotOrange{255, 127, 14};
inline constexpr Rgb kPlotGrey{200, 200, 200};
inline constexpr Rgb kPlotDark{40, 40, 40};

/// The i-th colour of a 10-colour qualitative palette (matplotlib's tab10), cycling.
Rgb palette_color(size_t i);

struct PlotSeries {
    std::string label;  // empty: not in the legend
    Rgb color = kPlotBlue;
    std::vector<double> x;
    std::vector<double> y;  // a NaN (in x or y) breaks the line
    double width = 1.5;     // line width in pixels
    bool markers = false;   // a small square at every point
    std::string tooltip;    // SVG only: shown on hover
};

struct PlotSpec {
    std::string title;
    std::string x_label;
    std::string y_label;
    std::vector<PlotSeries> series;
    int width = 640;
    int height = 300;
    bool integer_x = false;  // x ticks at whole numbers only (call or step indices)
};

/// Where a plot's data lands: the plot area in pixels, the data ranges and the ticks.
struct PlotFrame {
    int left = 0, top = 0, width = 0, height = 0;  // the plot area
    double x_lo = 0, x_hi = 1, y_lo = 0, y_hi = 1;
    std::vector<double> x_ticks, y_ticks;
    double x_step = 1, y_step = 1;

    double px(double x) const { return left + (x - x_lo) / (x_hi - x_lo) * (width - 1); }
    double py(double y) const { return top + (1.0 - (y - y_lo) / (y_hi - y_lo)) * (height - 1); }
};

/// The frame of `spec` scaled to its finite data (x exact, y padded by 6%). `y_from_zero` keeps 0 on
/// the y axis (bars); `right_margin` leaves room right of the plot area (a legend). Throws dzr::Error
/// when the plot is too small or a series' x and y differ in length.
PlotFrame plot_frame(const PlotSpec& spec, bool y_from_zero = false, int right_margin = 12);

/// Axis ticks inside [lo, hi] at a step of 1, 2 or 5 times a power of ten, about `target` of them.
std::vector<double> nice_ticks(double lo, double hi, int target = 5);

/// A tick label with just enough decimals for `step` ("0.25", "-3", "1.5e+06").
std::string format_tick(double value, double step);

/// Draws a plot as a raster image (for PNG files).
using PlotRasterizer = std::function<Image(const PlotSpec&)>;

/// The plot drawn by OpenCV (anti-aliased lines, Hershey text). Lives in `dzr_io` (the engine library
/// takes a PlotRasterizer from the application instead); builds without OpenCV throw dzr::Error.
Image render_plot_png(const PlotSpec& spec);

}  // namespace dzr::io
