#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/image.h"
#include "io/plots.h"
#include "io/png.h"
#include "support/test_support.h"

using namespace dzr;
using namespace dzr::io;
namespace fs = std::filesystem;

namespace {

using Bytes = std::vector<uint8_t>;

Bytes to_bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }

/// Bit-at-a-time CRC-32 (no table): an independent check of the encoder's table-driven one.
uint32_t slow_crc32(const uint8_t* p, size_t n) {
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; ++i) {
        c ^= p[i];
        for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
    }
    return ~c;
}

uint32_t be32(const Bytes& b, size_t off) {
    return uint32_t(b[off]) << 24 | uint32_t(b[off + 1]) << 16 | uint32_t(b[off + 2]) << 8 | b[off + 3];
}

/// A minimal inflater (RFC 1951) for stored and fixed-Huffman blocks, written from the RFC.
class Inflater {
public:
    explicit Inflater(const Bytes& in, size_t start) : in_(in), pos_(start) {}

    Bytes run() {
        Bytes out;
        bool final = false;
        while (!final) {
            final = bits(1) == 1;
            const uint32_t type = bits(2);
            if (type == 0) {
                if (bit_ != 0) bit_ = 0, ++pos_;  // skip to the byte boundary
                const uint32_t len = in_.at(pos_) | in_.at(pos_ + 1) << 8;
                const uint32_t nlen = in_.at(pos_ + 2) | in_.at(pos_ + 3) << 8;
                REQUIRE(len == (~nlen & 0xffffu));
                out.insert(out.end(), in_.begin() + long(pos_ + 4), in_.begin() + long(pos_ + 4 + len));
                pos_ += 4 + len;
            } else {
                REQUIRE(type == 1);  // our encoder never writes dynamic-Huffman blocks
                fixed_block(out);
            }
        }
        if (bit_ != 0) ++pos_;
        end_ = pos_;
        return out;
    }
    size_t end() const { return end_; }

private:
    uint32_t bits(int n) {
        uint32_t v = 0;
        for (int i = 0; i < n; ++i) {
            v |= uint32_t((in_.at(pos_) >> bit_) & 1) << i;
            if (++bit_ == 8) bit_ = 0, ++pos_;
        }
        return v;
    }
    uint32_t huff_bits(int n) {  // Huffman codes arrive most-significant bit first
        uint32_t v = 0;
        for (int i = 0; i < n; ++i) v = (v << 1) | bits(1);
        return v;
    }
    uint32_t fixed_litlen() {
        uint32_t c = huff_bits(7);
        if (c <= 0x17) return 256 + c;  // 0000000 .. 0010111
        c = (c << 1) | bits(1);
        if (c >= 0x30 && c <= 0xbf) return c - 0x30;
        if (c >= 0xc0 && c <= 0xc7) return 280 + (c - 0xc0);
        c = (c << 1) | bits(1);
        REQUIRE((c >= 0x190 && c <= 0x1ff));
        return 144 + (c - 0x190);
    }
    void fixed_block(Bytes& out) {
        static const int len_base[] = {3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27,
                                       31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
        static const int len_extra[] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2,
                                        2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
        while (true) {
            const uint32_t sym = fixed_litlen();
            if (sym < 256) {
                out.push_back(uint8_t(sym));
                continue;
            }
            if (sym == 256) return;
            const int li = int(sym - 257);
            REQUIRE(li < 29);
            const int length = len_base[li] + int(bits(len_extra[li]));
            const uint32_t dcode = huff_bits(5);
            REQUIRE(dcode < 30);
            // distance base and extra bits follow the RFC's table: pairs of codes per extra-bit count
            int dist = 1, extra = 0;
            if (dcode < 4) {
                dist = int(dcode) + 1;
            } else {
                extra = int(dcode / 2) - 1;
                dist = (1 << (extra + 1)) + 1 + int(dcode % 2) * (1 << extra);
            }
            dist += int(bits(extra));
            REQUIRE(size_t(dist) <= out.size());
            for (int k = 0; k < length; ++k) out.push_back(out[out.size() - size_t(dist)]);
        }
    }

    const Bytes& in_;
    size_t pos_;
    int bit_ = 0;
    size_t end_ = 0;
};

struct Decoded {
    uint32_t width = 0, height = 0;
    int bit_depth = 0, color_type = 0, compression = 0, filter = 0, interlace = 0;
    Bytes rgb;
    std::vector<std::string> chunk_types;
};

/// Decodes a PNG produced by our encoder, checking every structural field on the way.
Decoded decode_png(const Bytes& png) {
    Decoded d;
    REQUIRE(png.size() > 8);
    const uint8_t sig[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    REQUIRE(std::memcmp(png.data(), sig, 8) == 0);
    Bytes idat;
    size_t p = 8;
    while (p < png.size()) {
        REQUIRE(p + 12 <= png.size());
        const uint32_t len = be32(png, p);
        const std::string type(png.begin() + long(p + 4), png.begin() + long(p + 8));
        REQUIRE(p + 12 + len <= png.size());
        CHECK(be32(png, p + 8 + len) == slow_crc32(png.data() + p + 4, len + 4));
        d.chunk_types.push_back(type);
        const uint8_t* data = png.data() + p + 8;
        if (type == "IHDR") {
            REQUIRE(len == 13);
            d.width = be32(png, p + 8);
            d.height = be32(png, p + 12);
            d.bit_depth = data[8], d.color_type = data[9], d.compression = data[10];
            d.filter = data[11], d.interlace = data[12];
        } else if (type == "IDAT") {
            idat.insert(idat.end(), data, data + len);
        }
        p += 12 + len;
    }
    REQUIRE(idat.size() >= 6);
    CHECK((idat[0] * 256 + idat[1]) % 31 == 0);
    CHECK((idat[0] & 0x0f) == 8);  // deflate
    Inflater inf(idat, 2);
    const Bytes raw = inf.run();
    REQUIRE(inf.end() + 4 == idat.size());
    // Adler-32 written out from RFC 1950's definition.
    uint64_t a = 1, b = 0;
    for (uint8_t x : raw) a = (a + x) % 65521, b = (b + a) % 65521;
    CHECK(be32(idat, inf.end()) == uint32_t(b << 16 | a));
    const size_t stride = 1 + size_t(d.width) * 3;
    REQUIRE(raw.size() == stride * d.height);
    for (uint32_t y = 0; y < d.height; ++y) {
        CHECK(raw[y * stride] == 0);
        d.rgb.insert(d.rgb.end(), raw.begin() + long(y * stride + 1), raw.begin() + long((y + 1) * stride));
    }
    return d;
}

void check_round_trip(const Image& img, PngCompression mode) {
    const Decoded d = decode_png(to_bytes(encode_png(img, mode)));
    CHECK(d.width == uint32_t(img.width()));
    CHECK(d.height == uint32_t(img.height()));
    CHECK(d.bit_depth == 8);
    CHECK(d.color_type == 2);
    CHECK(d.compression == 0);
    CHECK(d.filter == 0);
    CHECK(d.interlace == 0);
    CHECK(d.chunk_types == std::vector<std::string>{"IHDR", "IDAT", "IEND"});
    CHECK(d.rgb == img.pixels());
}

int count_color(const Image& img, Rgb c) {
    int n = 0;
    for (int y = 0; y < img.height(); ++y)
        for (int x = 0; x < img.width(); ++x) n += img.at(x, y) == c;
    return n;
}

}  // namespace

TEST_CASE("crc32 and adler32 match their published check values") {
    const std::string s = "123456789";
    const auto* p = reinterpret_cast<const uint8_t*>(s.data());
    CHECK(crc32({p, s.size()}) == 0xcbf43926u);
    // CRC continues across pieces.
    CHECK(crc32({p + 4, 5}, crc32({p, 4})) == 0xcbf43926u);
    const std::string w = "Wikipedia";
    CHECK(adler32({reinterpret_cast<const uint8_t*>(w.data()), w.size()}) == 0x11e60398u);
    CHECK(adler32({}) == 1u);
}

TEST_CASE("png files decode to the same pixels with stored and fixed-Huffman deflate") {
    Image img(37, 23);
    for (int y = 0; y < img.height(); ++y)
        for (int x = 0; x < img.width(); ++x) img.set(x, y, {uint8_t(x * 7), uint8_t(y * 11), uint8_t((x ^ y) * 5)});
    check_round_trip(img, PngCompression::Stored);
    check_round_trip(img, PngCompression::FixedHuffman);

    // Pseudo-random pixels (nothing to match) and a large flat image (long matches).
    Image noise(64, 64);
    uint32_t state = 12345;
    for (int y = 0; y < 64; ++y)
        for (int x = 0; x < 64; ++x) {
            state = state * 1664525u + 1013904223u;
            noise.set(x, y, {uint8_t(state >> 24), uint8_t(state >> 16), uint8_t(state >> 8)});
        }
    check_round_trip(noise, PngCompression::FixedHuffman);
    // 200x200 RGB is 120,200 bytes of scanlines: more than one stored block.
    Image flat(200, 200, Rgb{10, 20, 30});
    flat.fill_rect(50, 50, 100, 30, Rgb{200, 0, 0});
    check_round_trip(flat, PngCompression::Stored);
    check_round_trip(flat, PngCompression::FixedHuffman);
    CHECK(encode_png(flat, PngCompression::FixedHuffman).size() * 20 < encode_png(flat, PngCompression::Stored).size());
}

TEST_CASE("zlib stream of empty input is a single final stored block") {
    const std::string z = zlib_compress({}, PngCompression::Stored);
    const Bytes b = to_bytes(z);
    REQUIRE(b.size() == 2 + 5 + 4);
    CHECK(b[2] == 1);  // BFINAL, stored
    CHECK(b[3] == 0);
    CHECK(b[4] == 0);
    CHECK(b[5] == 0xff);
    CHECK(b[6] == 0xff);
    CHECK(be32(b, 7) == 1u);  // Adler-32 of nothing
    const Bytes fixed = to_bytes(zlib_compress({}, PngCompression::FixedHuffman));
    CHECK(fixed.size() == 2 + 2 + 4);  // 3 header bits + 7-bit end-of-block code
    Inflater inf(fixed, 2);
    CHECK(inf.run().empty());
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
    l.line(0, 0, 0, 9, red, 1, 2);  // dashed: 2 on, 2 off
    CHECK(l.at(0, 0) == red);
    CHECK(l.at(0, 2) == kWhite);
    CHECK(l.at(0, 4) == red);
    l.line(-100000, 5, 100000, 5, red);  // far endpoints terminate
    CHECK(l.at(10, 5) == red);

    // '1' is ..#.. / .##.. / ..#.. x4 / .###. in the 5x7 font.
    Image t(6, 8);
    t.text(0, 0, "1", kBlack);
    CHECK(t.at(2, 0) == kBlack);
    CHECK(t.at(1, 0) == kWhite);
    CHECK(t.at(1, 1) == kBlack);
    CHECK(t.at(1, 6) == kBlack);
    CHECK(t.at(3, 6) == kBlack);
    CHECK(count_color(t, kBlack) == 1 + 2 + 4 + 3);
    CHECK(std::memcmp(glyph_5x7('a'), glyph_5x7('A'), 7) == 0);
    CHECK(std::memcmp(glyph_5x7('~'), glyph_5x7('\x7f'), 7) == 0);  // no glyph: the box
    CHECK(Image::text_width("abc", 2) == 36);
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

TEST_CASE("plots draw each series in its colour and skip NaN gaps") {
    PlotSpec spec;
    spec.title = "dim 0 (MSE=0.01)";
    spec.x_label = "frame";
    PlotSeries gt{"gt", kPlotBlue, {0, 1, 2, 3, 4}, {0, 1, 0, 1, 0}, 1, false};
    PlotSeries pred{"pred", kPlotOrange, {0, 1, NAN, 3, 4}, {0.5, 0.5, NAN, 0.5, 0.5}, 2, true};
    PlotSeries nothing{"", Rgb{0, 200, 0}, {0, 1}, {NAN, NAN}, 1, false};
    spec.series = {gt, pred, nothing};
    const Image img = render_plot(spec);
    CHECK(img.width() == 640);
    CHECK(img.height() == 300);
    CHECK(count_color(img, kPlotBlue) > 200);
    CHECK(count_color(img, kPlotOrange) > 200);
    CHECK(count_color(img, Rgb{0, 200, 0}) == 0);
    // The gap: the middle of the x range (x = 2) has no orange pixel.
    const int mid = 64 + (640 - 64 - 12 - 1) / 2;
    int orange_in_gap = 0;
    for (int y = 0; y < img.height(); ++y) orange_in_gap += img.at(mid, y) == kPlotOrange;
    CHECK(orange_in_gap == 0);
    const Image grid = tile_images({img, img, img}, 2, 8);
    CHECK(grid.width() == 2 * 640 + 3 * 8);
    CHECK(grid.height() == 2 * 300 + 3 * 8);
    CHECK_THROWS_AS(render_plot(PlotSpec{"t", "", "", {PlotSeries{"bad", kBlack, {1, 2}, {1}}}}), Error);
}

TEST_CASE("png writes are atomic and decodable from disk") {
    test::TempDir dir;
    Image img(16, 8, Rgb{1, 2, 3});
    write_png(dir / "a.png", img);
    std::ifstream in(dir / "a.png", std::ios::binary);
    const Bytes bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    CHECK(decode_png(bytes).rgb == img.pixels());
    for (const auto& e : fs::directory_iterator(dir.path()))
        CHECK(e.path().filename().string().find(kTempMarker) == std::string::npos);
    CHECK_THROWS_AS(write_png(dir / "no_dir" / "b.png", img), Error);
}
