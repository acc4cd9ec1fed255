#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/image.h"
#include "io/plots.h"
#include "io/png.h"
#include "io/video_reader.h"
#include "support/test_support.h"

using namespace dzr;
using namespace dzr::io;
namespace fs = std::filesystem;

namespace {

uint32_t be32(const std::string& b, size_t off) {
    return uint32_t(uint8_t(b[off])) << 24 | uint32_t(uint8_t(b[off + 1])) << 16 | uint32_t(uint8_t(b[off + 2])) << 8 |
           uint8_t(b[off + 3]);
}

/// Encodes, checks the signature and the IHDR chunk byte by byte (PNG spec 11.2.2), decodes again.
void check_round_trip(const Image& img, const test::TempDir& dir) {
    const std::string png = encode_png(img);
    REQUIRE(png.size() > 8 + 25);
    CHECK(png.compare(0, 8, "\x89PNG\r\n\x1a\n") == 0);
    CHECK(be32(png, 8) == 13u);
    CHECK(png.compare(12, 4, "IHDR") == 0);
    CHECK(be32(png, 16) == uint32_t(img.width()));
    CHECK(be32(png, 20) == uint32_t(img.height()));
    CHECK(int(png[24]) == 8);  // bit depth
    CHECK(int(png[25]) == 2);  // colour type: RGB
    CHECK(int(png[28]) == 0);  // no interlace
    write_file_atomic(dir / "rt.png", png);
    const Image back = read_png(dir / "rt.png");
    CHECK(back.width() == img.width());
    CHECK(back.height() == img.height());
    CHECK(back.pixels() == img.pixels());
}

int count_color(const Image& img, Rgb c) {
    int n = 0;
    for (int y = 0; y < img.height(); ++y)
        for (int x = 0; x < img.width(); ++x) n += img.at(x, y) == c;
    return n;
}

/// Pixels within `tol` of `c` in every channel (anti-aliased edges shade the colour).
int count_near(const Image& img, Rgb c, int tol = 40) {
    int n = 0;
    for (int y = 0; y < img.height(); ++y)
        for (int x = 0; x < img.width(); ++x) {
            const Rgb p = img.at(x, y);
            n += std::abs(p.r - c.r) <= tol && std::abs(p.g - c.g) <= tol && std::abs(p.b - c.b) <= tol;
        }
    return n;
}

}  // namespace

TEST_CASE("png files decode through libpng to the same pixels") {
    test::TempDir dir;
    Image img(37, 23);
    for (int y = 0; y < img.height(); ++y)
        for (int x = 0; x < img.width(); ++x) img.set(x, y, {uint8_t(x * 7), uint8_t(y * 11), uint8_t((x ^ y) * 5)});
    check_round_trip(img, dir);

    // Pseudo-random pixels (nothing to compress) and a large flat image (compresses well).
    Image noise(64, 64);
    uint32_t state = 12345;
    for (int y = 0; y < 64; ++y)
        for (int x = 0; x < 64; ++x) {
            state = state * 1664525u + 1013904223u;
            noise.set(x, y, {uint8_t(state >> 24), uint8_t(state >> 16), uint8_t(state >> 8)});
        }
    check_round_trip(noise, dir);
    Image flat(200, 200, Rgb{10, 20, 30});
    flat.fill_rect(50, 50, 100, 30, Rgb{200, 0, 0});
    check_round_trip(flat, dir);
    CHECK(encode_png(flat).size() * 20 < size_t(200 * 200 * 3));
}

TEST_CASE("reading a file that is not a png names it") {
    test::TempDir dir;
    write_file_atomic(dir / "bad.png", "not a png at all");
    CHECK_THROWS_WITH_AS(read_png(dir / "bad.png"), doctest::Contains("bad.png"), Error);
    // A valid header cut short: libpng's error, with the file name.
    const std::string png = encode_png(Image(40, 40, Rgb{1, 2, 3}));
    write_file_atomic(dir / "cut.png", png.substr(0, png.size() / 2));
    CHECK_THROWS_WITH_AS(read_png(dir / "cut.png"), doctest::Contains("cut.png"), Error);
}

TEST_CASE("image drawing clips, draws lines end to end and renders glyphs") {
    Image img(20, 10);
    img.fill_rect(-5, -5, 8, 8, kBlack);  // clipped to [0, 3) x [0, 3)
    CHECK(img.at(2, 2) == kBlack);
    CHECK(img.at(3, 3) == kWhite);
    CHECK(count_color(img, kBlack) == 9);

    Image l(20, 10);
    const Rgb red{255, 0, 0};
    l.line(1, 1, 18, 8, red);
    CHECK(l.at(1, 1) == red);
    CHECK(l.at(18, 8) == red);
    CHECK(count_color(l, red) == 18);  // one pixel per column for a shallow line
    l.line(0, 0, 0, 9, red, 3);  // 3 wide: columns -1 .. 1, clipped to 0 .. 1
    CHECK(l.at(0, 4) == red);
    CHECK(l.at(1, 4) == red);
    CHECK(l.at(2, 4) == kWhite);
    l.line(-100000, 5, 100000, 5, red);  // far endpoints terminate
    CHECK(l.at(10, 5) == red);

    // Tiles: three 4x3 images in 2 columns with a 2-pixel gap.
    const Image tile(4, 3, Rgb{9, 9, 9});
    const Image grid = tile_images({tile, tile, tile}, 2, 2, kBlack);
    CHECK(grid.width() == 2 * 4 + 3 * 2);
    CHECK(grid.height() == 2 * 3 + 3 * 2);
    CHECK(count_color(grid, Rgb{9, 9, 9}) == 3 * 12);
    CHECK(grid.at(2 + 4 + 2, 2 + 3 + 2) == kBlack);  // the empty fourth cell
    CHECK_THROWS_AS(Image(2, 2, std::vector<uint8_t>(5)), Error);
}

TEST_CASE("plot ticks are round numbers inside the range") {
    CHECK(nice_ticks(0, 1, 5) == std::vector<double>{0, 0.2, 0.4, 0.6000000000000001, 0.8, 1});
    const auto t = nice_ticks(-3.3, 7.9, 5);
    CHECK(t == std::vector<double>{-2, 0, 2, 4, 6});
    CHECK(nice_ticks(5, 5, 5).empty());
    CHECK(format_tick(0.6000000000000001, 0.2) == "0.6");
    CHECK(format_tick(-2, 2) == "-2");
    CHECK(format_tick(0.025, 0.005) == "0.025");
    CHECK(format_tick(2.5e6, 5e5) == "2.5e+06");
}

TEST_CASE("png plots drawn by OpenCV show each series in its colour and skip NaN gaps") {
    PlotSpec spec;
    spec.title = "dim 0 (MSE=0.01)";
    spec.x_label = "frame";
    PlotSeries gt{"gt", kPlotBlue, {0, 1, 2, 3, 4}, {0, 1, 0, 1, 0}, 2, false, {}};
    PlotSeries pred{"pred", kPlotOrange, {0, 1, NAN, 3, 4}, {0.5, 0.5, NAN, 0.5, 0.5}, 2, true, {}};
    PlotSeries nothing{"", Rgb{0, 200, 0}, {0, 1}, {NAN, NAN}, 1, false, {}};
    spec.series = {gt, pred, nothing};
    if (!video_io_available()) {
        CHECK_THROWS_AS(render_plot_png(spec), Error);
        return;
    }
    const Image img = render_plot_png(spec);
    CHECK(img.width() == 640);
    CHECK(img.height() == 300);
    CHECK(count_near(img, kPlotBlue) > 200);
    CHECK(count_near(img, kPlotOrange) > 200);
    CHECK(count_near(img, Rgb{0, 200, 0}) == 0);
    // The gap: the middle of the x range (x = 2) has no orange pixel.
    const PlotFrame f = plot_frame(spec);
    const int mid = int(std::lround(f.px(2.0)));
    int orange_in_gap = 0;
    for (int y = f.top; y < f.top + f.height; ++y) orange_in_gap += count_near(Image(1, 1, img.at(mid, y)), kPlotOrange);
    CHECK(orange_in_gap == 0);
    // Text was drawn: dark pixels above the plot area (the title).
    int title_px = 0;
    for (int y = 0; y < f.top; ++y)
        for (int x = 0; x < img.width(); ++x) title_px += img.at(x, y).r < 100;
    CHECK(title_px > 50);
    CHECK_THROWS_AS(render_plot_png(PlotSpec{"t", "", "", {PlotSeries{"bad", kBlack, {1, 2}, {1}, 1, false, {}}}}), Error);
}

TEST_CASE("png writes are atomic and decodable from disk") {
    test::TempDir dir;
    Image img(16, 8, Rgb{1, 2, 3});
    write_png(dir / "a.png", img);
    CHECK(read_png(dir / "a.png").pixels() == img.pixels());
    for (const auto& e : fs::directory_iterator(dir.path()))
        CHECK(e.path().filename().string().find(kTempMarker) == std::string::npos);
    CHECK_THROWS_AS(write_png(dir / "no_dir" / "b.png", img), Error);
}
