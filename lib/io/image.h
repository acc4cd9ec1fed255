#pragma once
/// A small RGB8 raster with the drawing needed for report plots: filled rectangles, lines and
/// text in a built-in 5x7 bitmap font (ASCII; lower case is drawn with upper-case glyphs).
#include <cstdint>
#include <string_view>
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

    int width() const { return width_; }
    int height() const { return height_; }
    const std::vector<uint8_t>& pixels() const { return rgb_; }  // row-major RGB, 3 bytes a pixel
    Rgb at(int x, int y) const;

    /// Draw calls clip to the image.
    void set(int x, int y, Rgb c);
    void fill_rect(int x, int y, int w, int h, Rgb c);
    /// A line from (x0, y0) to (x1, y1) (Bresenham), `thickness` pixels wide; dashed draws
    /// `dash` pixels on, `dash` off.
    void line(int x0, int y0, int x1, int y1, Rgb c, int thickness = 1, int dash = 0);
    /// Text with its top-left corner at (x, y); each glyph cell is 6x8 pixels times `scale`.
    void text(int x, int y, std::string_view s, Rgb c, int scale = 1);
    /// Copy `src` with its top-left corner at (x, y).
    void blit(const Image& src, int x, int y);

    static int text_width(std::string_view s, int scale = 1) { return int(s.size()) * 6 * scale; }
    static int text_height(int scale = 1) { return 8 * scale; }

private:
    int width_ = 0;
    int height_ = 0;
    std::vector<uint8_t> rgb_;
};

/// The 5x7 glyph for `c`: 7 rows, bit 4 = leftmost column. Unknown characters give a box.
const uint8_t* glyph_5x7(char c);

}  // namespace dzr::io
