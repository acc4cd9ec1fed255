#include "io/svg.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/error.h"

namespace dzr::io {

namespace {

constexpr std::string_view kGrid = "#e8e8e8";
constexpr std::string_view kAxis = "#3c3c3c";

/// Two decimals are plenty at screen resolution and keep the files small.
std::string num(double v) {
    std::string s = fmt::format("{:.2f}", v);
    while (s.back() == '0') s.pop_back();
    if (s.back() == '.') s.pop_back();
    return s == "-0" ? "0" : s;
}

/// <svg> start, background, grid, ticks, frame, title and axis labels.
void open_axes(std::string& out, const std::string& title, const std::string& x_label, const std::string& y_label,
               int width, int height, const PlotFrame& f) {
    out += fmt::format(R"(<svg xmlns="http://www.w3.org/2000/svg" class="plot" viewBox="0 0 {0} {1}" width="{0}" )"
                       R"(height="{1}" font-family="sans-serif" font-size="11">)",
                       width, height);
    out += fmt::format(R"(<title>{}</title><rect width="{}" height="{}" fill="#fff"/>)", xml_escape(title), width,
                       height);
    const double x0 = f.left, x1 = f.left + f.width - 1, y0 = f.top, y1 = f.top + f.height - 1;
    out += fmt::format(R"(<g stroke="{}" stroke-width="1">)", kGrid);
    for (double t : f.x_ticks) out += fmt::format(R"(<line x1="{0}" y1="{1}" x2="{0}" y2="{2}"/>)", num(f.px(t)), num(y0), num(y1));
    for (double t : f.y_ticks) out += fmt::format(R"(<line x1="{1}" y1="{0}" x2="{2}" y2="{0}"/>)", num(f.py(t)), num(x0), num(x1));
    out += "</g>";
    out += fmt::format(R"(<g fill="{}" text-anchor="middle">)", kAxis);
    for (double t : f.x_ticks)
        out += fmt::format(R"(<text x="{}" y="{}">{}</text>)", num(f.px(t)), num(y1 + 14), format_tick(t, f.x_step));
    out += R"(</g><g fill=")" + std::string(kAxis) + R"(" text-anchor="end">)";
    for (double t : f.y_ticks)
        out += fmt::format(R"(<text x="{}" y="{}">{}</text>)", num(x0 - 5), num(f.py(t) + 4), format_tick(t, f.y_step));
    out += "</g>";
    out += fmt::format(R"(<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="{}"/>)", num(x0), num(y0),
                       num(x1 - x0), num(y1 - y0), kAxis);
    out += fmt::format(R"(<text x="{}" y="16" text-anchor="middle" font-size="12" font-weight="bold">{}</text>)",
                       num((x0 + x1) / 2), xml_escape(title));
    if (!x_label.empty())
        out += fmt::format(R"(<text x="{}" y="{}" text-anchor="middle" fill="{}">{}</text>)", num((x0 + x1) / 2),
                           height - 6, kAxis, xml_escape(x_label));
    if (!y_label.empty())
        out += fmt::format(R"svg(<text x="12" y="{}" text-anchor="middle" fill="{}" transform="rotate(-90 12 {})">{}</text>)svg",
                           num((y0 + y1) / 2), kAxis, num((y0 + y1) / 2), xml_escape(y_label));
}

struct LegendEntry {
    std::string label;
    Rgb color;
};

/// Legend in the top-right corner of the plot area, or right of it when `outside`.
void legend(std::string& out, const PlotFrame& f, const std::vector<LegendEntry>& entries, bool outside = false) {
    if (entries.empty()) return;
    size_t chars = 0;
    for (const auto& e : entries) chars = std::max(chars, e.label.size());
    const double w = 30 + 6.2 * double(chars), h = 6 + 14 * double(entries.size());
    const double x = outside ? f.left + f.width + 6 : f.left + f.width - 8 - w, y = outside ? f.top : f.top + 6;
    out += fmt::format(R"(<g class="legend"><rect x="{}" y="{}" width="{}" height="{}" fill="#fff" fill-opacity="0.85" )"
                       R"(stroke="#ccc"/>)",
                       num(x), num(y), num(w), num(h));
    for (size_t i = 0; i < entries.size(); ++i) {
        const double ly = y + 11 + 14 * double(i);
        out += fmt::format(R"(<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="{}" stroke-width="2"/>)", num(x + 5),
                           num(ly - 3), num(x + 21), num(ly - 3), hex_color(entries[i].color));
        out += fmt::format(R"(<text x="{}" y="{}">{}</text>)", num(x + 26), num(ly + 1), xml_escape(entries[i].label));
    }
    out += "</g>";
}

}  // namespace

std::string xml_escape(std::string_view text) {
    std::string out;
    out.reserve(text.size());
    for (char c : text) {
        switch (c) {
            case '&': out += "&amp;"; break;
            case '<': out += "&lt;"; break;
            case '>': out += "&gt;"; break;
            case '"': out += "&quot;"; break;
            case '\'': out += "&#39;"; break;
            default: out += c;
        }
    }
    return out;
}

std::string hex_color(Rgb c) { return fmt::format("#{:02x}{:02x}{:02x}", c.r, c.g, c.b); }

std::string plot_svg(const PlotSpec& spec) {
    const PlotFrame f = plot_frame(spec);
    std::string out;
    open_axes(out, spec.title, spec.x_label, spec.y_label, spec.width, spec.height, f);
    // NOTE: a nested <svg> over the plot area with the same coordinates clips the data to it (a wild
    // value must not draw over the labels) without an id that would have to be unique in the page.
    out += fmt::format(R"(<svg x="{0}" y="{1}" width="{2}" height="{3}" viewBox="{0} {1} {2} {3}">)", f.left, f.top,
                       f.width, f.height);
    out += R"(<g fill="none" stroke-linejoin="round">)";
    std::vector<LegendEntry> entries;
    for (const auto& s : spec.series) {
        out += fmt::format(R"(<g class="series" stroke="{}" stroke-width="{}">)", hex_color(s.color), num(s.width));
        if (!s.tooltip.empty()) out += "<title>" + xml_escape(s.tooltip) + "</title>";
        std::string points;
        std::string markers;
        auto flush = [&] {
            if (!points.empty()) out += R"(<polyline points=")" + points + R"("/>)";
            points.clear();
        };
        for (size_t i = 0; i < s.x.size(); ++i) {
            if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) {
                flush();
                continue;
            }
            const double x = f.px(s.x[i]), y = f.py(s.y[i]);
            if (!points.empty()) points += ' ';
            points += num(x);
            points += ',';
            points += num(y);
            if (s.markers)
                markers += fmt::format(R"(<rect x="{}" y="{}" width="4" height="4"/>)", num(x - 2), num(y - 2));
        }
        flush();
        if (!markers.empty()) out += fmt::format(R"(<g fill="{}" stroke="none">{}</g>)", hex_color(s.color), markers);
        out += "</g>";
        if (!s.label.empty()) entries.push_back({s.label, s.color});
    }
    out += "</g></svg>";
    legend(out, f, entries);
    out += "</svg>";
    return out;
}

std::string stacked_bars_svg(const StackedBarSpec& spec) {
    const size_t n = spec.x.size();
    for (const auto& s : spec.stacks)
        DZR_CHECK(s.values.size() == n, "bar chart '{}': stack '{}' has {} values for {} bars", spec.title, s.label,
                  s.values.size(), n);
    auto part = [](double v) { return std::isfinite(v) && v > 0 ? v : 0.0; };
    // The frame is that of a plot through the bar tops, half a slot wider on each side.
    PlotSpec frame_spec{spec.title, spec.x_label, spec.y_label, {}, spec.width, spec.height};
    PlotSeries tops;
    double slot = 1.0;
    for (size_t i = 1; i < n; ++i) slot = std::min(slot, std::abs(spec.x[i] - spec.x[i - 1]));
    if (!(slot > 0)) slot = 1.0;
    for (size_t i = 0; i < n; ++i) {
        double total = 0;
        for (const auto& s : spec.stacks) total += part(s.values[i]);
        tops.x.insert(tops.x.end(), {spec.x[i] - slot / 2, spec.x[i] + slot / 2});
        tops.y.insert(tops.y.end(), {total, total});
    }
    frame_spec.series.push_back(tops);
    frame_spec.integer_x = true;
    size_t chars = 0;
    for (const auto& s : spec.stacks) chars = std::max(chars, s.label.size());
    const PlotFrame f = plot_frame(frame_spec, /*y_from_zero=*/true, /*right_margin=*/int(44 + 6.2 * double(chars)));
    std::string out;
    open_axes(out, spec.title, spec.x_label, spec.y_label, spec.width, spec.height, f);
    const double bar_w = std::max(1.0, (f.px(slot) - f.px(0)) * 0.8);
    for (size_t i = 0; i < n; ++i) {
        std::string tip = fmt::format("{} {}", spec.x_label.empty() ? "x" : spec.x_label, format_tick(spec.x[i], 1));
        double base = 0;
        std::string rects;
        for (const auto& s : spec.stacks) {
            const double v = part(s.values[i]);
            tip += fmt::format("\n{}: {:.4g}", s.label, v);
            if (v <= 0) continue;
            const double y_top = f.py(base + v), y_bot = f.py(base);
            rects += fmt::format(R"(<rect x="{}" y="{}" width="{}" height="{}" fill="{}"/>)", num(f.px(spec.x[i]) - bar_w / 2),
                                 num(y_top), num(bar_w), num(std::max(0.0, y_bot - y_top)), hex_color(s.color));
            base += v;
        }
        out += "<g class=\"bar\"><title>" + xml_escape(tip) + "</title>" + rects + "</g>";
    }
    std::vector<LegendEntry> entries;
    // Top segment first, as the bars read.
    for (auto it = spec.stacks.rbegin(); it != spec.stacks.rend(); ++it) entries.push_back({it->label, it->color});
    legend(out, f, entries, /*outside=*/true);
    out += "</svg>";
    return out;
}

}  // namespace dzr::io
