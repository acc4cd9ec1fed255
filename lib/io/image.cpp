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

Image::Image(int width, int height, std::vector<uint8_t> rgb) : width_(width), height_(height), rgb_(std::move(rgb)) {
    DZR_CHECK(width > 0 && height > 0 && width <= 1 << 14 && height <= 1 << 14, "image size {}x{} is out of range",
              width, height);
    DZR_CHECK(rgb_.size() == size_t(width) * size_t(height) * 3, "image {}x{}: {} bytes of RGB, expected {}", width,
              height, rgb_.size(), size_t(width) * size_t(height) * 3);
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

void Image::line(int x0, int y0, int x1, int y1, Rgb c, int thickness) {
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
    while (true) {
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

void Image::blit(const Image& src, int x, int y) {
    for (int yy = 0; yy < src.height(); ++yy)
        for (int xx = 0; xx < src.width(); ++xx) set(x + xx, y + yy, src.at(xx, yy));
}

Image tile_images(const std::vector<Image>& images, int cols, int gap, Rgb background) {
    DZR_CHECK(!images.empty() && cols > 0, "tile_images: nothing to tile");
    int cw = 0, ch = 0;
    for (const auto& im : images) {
        cw = std::max(cw, im.width());
        ch = std::max(ch, im.height());
    }
    const int n = int(images.size());
    const int rows = (n + cols - 1) / cols;
    const int used_cols = std::min(cols, n);
    Image out(used_cols * cw + (used_cols + 1) * gap, rows * ch + (rows + 1) * gap, background);
    for (int i = 0; i < n; ++i)
        out.blit(images[size_t(i)], gap + (i % cols) * (cw + gap), gap + (i / cols) * (ch + gap));
    return out;
}

}  // namespace dzr::io
