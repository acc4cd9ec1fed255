#pragma once
/// Plots as SVG text, to inline in HTML reports or save as .svg files: line plots (io/plots.h) and
/// stacked bar charts. Text is real SVG text (the browser's font), every series carries a tooltip.
#include <string>
#include <string_view>
#include <vector>

#include "io/plots.h"

namespace dzr::io {

/// Text with &, <, >, " and ' escaped for HTML and XML.
std::string xml_escape(std::string_view text);

/// "#1f77b4".
std::string hex_color(Rgb c);

/// A line plot: grid, ticks, title, axis labels, legend and the series (polylines broken at NaN).
std::string plot_svg(const PlotSpec& spec);

/// One segment kind of a stacked bar chart: its value in every bar.
struct BarStack {
    std::string label;
    Rgb color = kPlotBlue;
    std::vector<double> values;  // one per bar; NaN or negative draws nothing
};

struct StackedBarSpec {
    std::string title;
    std::string x_label;
    std::string y_label;
    std::vector<double> x;        // the bar positions (call indices, say)
    std::vector<BarStack> stacks;  // bottom to top
    int width = 640;
    int height = 300;
};

/// Bars at `x`, each the stack of its segments from 0 up; a tooltip per bar lists the segments.
std::string stacked_bars_svg(const StackedBarSpec& spec);

}  // namespace dzr::io
