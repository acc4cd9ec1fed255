// PNG plots drawn by OpenCV: anti-aliased lines and Hershey text, on the layout of io/plots.h.
#include <cmath>
#include <cstring>

// NOTE: OpenCV 4.6's headers mix enum types in arithmetic, which C++20 deprecates (see video_reader_cv.cpp).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-enum-enum-conversion"
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>
#pragma GCC diagnostic pop

#include "io/plots.h"

namespace dzr::io {

namespace {

constexpr int kFont = cv::FONT_HERSHEY_SIMPLEX;
constexpr double kFontScale = 0.38;
// NOTE: the Mat holds RGB (not OpenCV's usual BGR): we pick every colour ourselves and copy the
// pixels out as RGB.
const cv::Scalar kGrid(232, 232, 232), kAxis(60, 60, 60), kBlackRgb(0, 0, 0), kWhiteRgb(255, 255, 255);

cv::Scalar rgb(Rgb c) { return cv::Scalar(c.r, c.g, c.b); }

/// Fixed-point coordinates (4 fractional bits) so anti-aliased lines keep sub-pixel positions.
constexpr int kShift = 4;
cv::Point fixed(double x, double y) { return {int(std::lround(x * (1 << kShift))), int(std::lround(y * (1 << kShift)))}; }

enum class Align { Left, Center, Right };

void text(cv::Mat& m, const std::string& s, double x, double y_baseline, Align align, const cv::Scalar& c,
          double scale = kFontScale, int thickness = 1) {
    if (s.empty()) return;
    int base = 0;
    const cv::Size size = cv::getTextSize(s, kFont, scale, thickness, &base);
    const double x0 = align == Align::Left ? x : align == Align::Center ? x - size.width / 2.0 : x - size.width;
    cv::putText(m, s, cv::Point(int(std::lround(x0)), int(std::lround(y_baseline))), kFont, scale, c, thickness,
                cv::LINE_AA);
}

}  // namespace

Image render_plot_png(const PlotSpec& spec) {
    const PlotFrame f = plot_frame(spec);
    cv::Mat m(spec.height, spec.width, CV_8UC3, kWhiteRgb);
    const double x0 = f.left, x1 = f.left + f.width - 1, y0 = f.top, y1 = f.top + f.height - 1;
    for (double t : f.x_ticks) {
        cv::line(m, fixed(f.px(t), y0), fixed(f.px(t), y1), kGrid, 1, cv::LINE_AA, kShift);
        text(m, format_tick(t, f.x_step), f.px(t), y1 + 15, Align::Center, kAxis);
    }
    for (double t : f.y_ticks) {
        cv::line(m, fixed(x0, f.py(t)), fixed(x1, f.py(t)), kGrid, 1, cv::LINE_AA, kShift);
        text(m, format_tick(t, f.y_step), x0 - 5, f.py(t) + 4, Align::Right, kAxis);
    }
    cv::rectangle(m, cv::Point(int(x0), int(y0)), cv::Point(int(x1), int(y1)), kAxis, 1);
    text(m, spec.title, (x0 + x1) / 2, 17, Align::Center, kBlackRgb, 0.45);
    text(m, spec.x_label, (x0 + x1) / 2, spec.height - 8, Align::Center, kAxis);
    text(m, spec.y_label, 4, 17, Align::Left, kAxis);

    // Series inside the plot area only.
    cv::Mat area = m(cv::Rect(f.left, f.top, f.width, f.height));
    for (const auto& s : spec.series) {
        const int thickness = std::max(1, int(std::lround(s.width)));
        bool have_prev = false;
        cv::Point prev;
        for (size_t i = 0; i < s.x.size(); ++i) {
            if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) {
                have_prev = false;
                continue;
            }
            const cv::Point p = fixed(f.px(s.x[i]) - f.left, f.py(s.y[i]) - f.top);
            if (have_prev) cv::line(area, prev, p, rgb(s.color), thickness, cv::LINE_AA, kShift);
            if (s.markers) {
                const cv::Point c(p.x >> kShift, p.y >> kShift);
                cv::rectangle(area, c - cv::Point(1, 1), c + cv::Point(1, 1), rgb(s.color), cv::FILLED);
            }
            prev = p;
            have_prev = true;
        }
    }
    // Legend in the top-right corner of the plot area.
    int rows = 0;
    int label_w = 0;
    for (const auto& s : spec.series) {
        if (s.label.empty()) continue;
        ++rows;
        int base = 0;
        label_w = std::max(label_w, cv::getTextSize(s.label, kFont, kFontScale, 1, &base).width);
    }
    if (rows > 0) {
        const int w = label_w + 32, h = 6 + 14 * rows;
        const int lx = int(x1) - 8 - w, ly = int(y0) + 6;
        cv::rectangle(m, cv::Point(lx, ly), cv::Point(lx + w, ly + h), kWhiteRgb, cv::FILLED);
        cv::rectangle(m, cv::Point(lx, ly), cv::Point(lx + w, ly + h), cv::Scalar(204, 204, 204), 1);
        int row = 0;
        for (const auto& s : spec.series) {
            if (s.label.empty()) continue;
            const int y = ly + 11 + 14 * row++;
            cv::line(m, cv::Point(lx + 5, y - 3), cv::Point(lx + 21, y - 3), rgb(s.color), 2, cv::LINE_AA);
            text(m, s.label, lx + 26, y + 1, Align::Left, kBlackRgb);
        }
    }
    std::vector<uint8_t> pixels(size_t(spec.width) * size_t(spec.height) * 3);
    for (int y = 0; y < spec.height; ++y) std::memcpy(pixels.data() + size_t(y) * size_t(spec.width) * 3, m.ptr(y), size_t(spec.width) * 3);
    return Image(spec.width, spec.height, std::move(pixels));
}

}  // namespace dzr::io
