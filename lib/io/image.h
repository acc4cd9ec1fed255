#pragma once
/// A small RGB8 raster with the drawing the synthetic sample episode needs (filled rectangles and
/// lines) and tiling for frame strips. Plots are SVG (io/svg.h), or drawn by OpenCV for PNG.
#include <cstdint>
#include <vector>

namespace dzr::io {

struct Rgb {
    uint8_t r = 0, g = 0, b = 0;
    bool operator==(const Rgb&) const = default;
};

inline constexpr Rgb kWhite{255, 255, 255};
inline constexpr Rgb kBlack{0, 0, 0};

class Image {
public:
    Image() = default;
    Image(int width, int height, Rgb fill = kWhite);
    /// Takes row-major RGB pixels (width * height * 3 bytes).
    Image(int width, int height, std::vector<uint8_t> rgb);

    int width() const { return width_; }
    int height() const { return height_; }
    const std::vector<uint8_t>& pixels() const { return rgb_; }  // row-major RGB, 3 bytes a pixel
    Rgb at(int x, int y) const;

    /// Draw calls clip to the image.
    void set(int x, int y, Rgb c);
    void fill_rect(int x, int y, int w, int h, Rgb c);
    /// A line from (x0, y0) to (x1, y1) (Bresenham), `thickness` pixels wide.
    void line(int x0, int y0, int x1, int y1, Rgb c, int thickness = 1);
    /// Copy `src` with its top-left corner at (x, y).
    void blit(const Image& src, int x, int y);

private:
    int width_ = 0;
    int height_ = 0;
    std::vector<uint8_t> rgb_;
};

/// Images placed left to right, top to bottom in `cols` columns with `gap` pixels between them.
Image tile_images(const std::vector<Image>& images, int cols, int gap = 8, Rgb background = kWhite);

}  // namespace dzr::io
