#pragma once
/// Line plots for reports (predicted vs ground-truth actions), drawn into an Image and saved as PNG.
#include <string>
#include <vector>

#include "io/image.h"

namespace dzr::io {

inline constexpr Rgb kPlotBlue{31, 119, 180};
inline constexpr Rgb kPlotOrange{255, 127, 14};
inline constexpr Rgb kPlotGrey{200, 200, 200};

struct PlotSeries {
    std::string label;
    Rgb color = kPlotBlue;
    std::vector<double> x;
    std::vector<double> y;  // a NaN (in x or y) breaks the line
    int thickness = 1;
    bool markers = false;  // a small square at every point
};

struct PlotSpec {
    std::string title;
    std::string x_label;
    std::string y_label;
    std::vector<PlotSeries> series;
    int width = 640;
    int height = 300;
};

/// Axes, grid, tick labels, title, legend and the series, scaled to the finite data.
Image render_plot(const PlotSpec& spec);

/// Images placed left to right, top to bottom in `cols` columns with `gap` pixels between them.
Image tile_images(const std::vector<Image>& images, int cols, int gap = 8);

/// Axis ticks inside [lo, hi] at a step of 1, 2 or 5 times a power of ten, about `target` of them.
std::vector<double> nice_ticks(double lo, double hi, int target = 5);

/// A tick label with just enough decimals for `step` ("0.25", "-3", "1.5e+06").
std::string format_tick(double value, double step);

}  // namespace dzr::io
