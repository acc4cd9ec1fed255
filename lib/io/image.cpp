#include "io/image.h"

#include <algorithm>
#include <cstdlib>

#include "core/error.h"

namespace dzr::io {

Image::Image(int width, int height, Rgb fill) : width_(width), height_(height) {
    DZR_CHECK(width > 0 && height > 0 && width <= 1 << 14 && height <= 1 << 14, "image size {}x{} is out of range",
              width, height);
    rgb_.resize(size_t(width) * size_t(height) * 3);
    for (size_t i = 0; i < rgb_.size(); i += 3) {
        rgb_[i] = fill.r;
        rgb_[i + 1] = fill.g;
        rgb_[i + 2] = fill.b;
    }
}

Rgb Image::at(int x, int y) const {
    DZR_ASSERT(x >= 0 && y >= 0 && x < width_ && y < height_);
    const size_t i = (size_t(y) * size_t(width_) + size_t(x)) * 3;
    return {rgb_[i], rgb_[i + 1], rgb_[i + 2]};
}

void Image::set(int x, int y, Rgb c) {
    if (x < 0 || y < 0 || x >= width_ || y >= height_) return;
    const size_t i = (size_t(y) * size_t(width_) + size_t(x)) * 3;
    rgb_[i] = c.r;
    rgb_[i + 1] = c.g;
    rgb_[i + 2] = c.b;
}

void Image::fill_rect(int x, int y, int w, int h, Rgb c) {
    const int x0 = std::max(x, 0), y0 = std::max(y, 0);
    const int x1 = std::min(x + w, width_), y1 = std::min(y + h, height_);
    for (int yy = y0; yy < y1; ++yy)
        for (int xx = x0; xx < x1; ++xx) set(xx, yy, c);
}

void Image::line(int x0, int y0, int x1, int y1, Rgb c, int thickness, int dash) {
    // NOTE: endpoints far outside the image (a wild value in a plot) would make Bresenham walk for
    // ages; clamp them to a generous margin first (this bends such lines, which only happens off-plot).
    const int m = 4 * std::max(width_, height_);
    auto clamp = [m](int v) { return std::clamp(v, -m, m); };
    x0 = clamp(x0), y0 = clamp(y0), x1 = clamp(x1), y1 = clamp(y1);
    const int dx = std::abs(x1 - x0), sx = x0 < x1 ? 1 : -1;
    const int dy = -std::abs(y1 - y0), sy = y0 < y1 ? 1 : -1;
    int err = dx + dy;
    const int lo = -(thickness - 1) / 2;
    const int hi = thickness / 2;
    for (int step = 0;; ++step) {
        if (dash <= 0 || (step / dash) % 2 == 0)
            for (int oy = lo; oy <= hi; ++oy)
                for (int ox = lo; ox <= hi; ++ox) set(x0 + ox, y0 + oy, c);
        if (x0 == x1 && y0 == y1) break;
        const int e2 = 2 * err;
        if (e2 >= dy) {
            err += dy;
            x0 += sx;
        }
        if (e2 <= dx) {
            err += dx;
            y0 += sy;
        }
    }
}

void Image::text(int x, int y, std::string_view s, Rgb c, int scale) {
    for (size_t k = 0; k < s.size(); ++k) {
        const uint8_t* g = glyph_5x7(s[k]);
        const int gx = x + int(k) * 6 * scale;
        for (int r = 0; r < 7; ++r)
            for (int col = 0; col < 5; ++col)
                if (g[r] & (0x10 >> col)) fill_rect(gx + col * scale, y + r * scale, scale, scale, c);
    }
}

void Image::blit(const Image& src, int x, int y) {
    for (int yy = 0; yy < src.height(); ++yy)
        for (int xx = 0; xx < src.width(); ++xx) set(x + xx, y + yy, src.at(xx, yy));
}

}  // namespace dzr::io
