#include "io/png.h"

#include <algorithm>
#include <array>
#include <vector>

#include "core/error.h"
#include "io/atomic_file.h"

namespace dzr::io {

namespace {

constexpr size_t kMaxStored = 65535;   // bytes in one stored deflate block
constexpr size_t kMinMatch = 3;
constexpr size_t kMaxMatch = 258;
constexpr size_t kWindow = 32768;

// RFC 1951 3.2.5: length codes 257..285 and distance codes 0..29 (base value, extra bits).
constexpr std::array<uint16_t, 29> kLenBase = {3,  4,  5,  6,  7,  8,  9,  10, 11,  13,  15,  17,  19,  23, 27,
                                               31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
constexpr std::array<uint8_t, 29> kLenExtra = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2,
                                               2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
constexpr std::array<uint16_t, 30> kDistBase = {1,   2,   3,   4,   5,    7,    9,    13,   17,   25,
                                                33,  49,  65,  97,  129,  193,  257,  385,  513,  769,
                                                1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
constexpr std::array<uint8_t, 30> kDistExtra = {0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6,
                                                6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};

/// Deflate's bit order: values go in least-significant bit first; Huffman codes most-significant
/// bit first (so they are reversed on the way in).
class BitWriter {
public:
    explicit BitWriter(std::string& out) : out_(out) {}
    void bits(uint32_t value, int count) {
        for (int i = 0; i < count; ++i) push((value >> i) & 1u);
    }
    void code(uint32_t code, int length) {
        for (int i = length - 1; i >= 0; --i) push((code >> i) & 1u);
    }
    void flush() {
        if (nbits_ > 0) out_.push_back(char(acc_));
        acc_ = 0;
        nbits_ = 0;
    }

private:
    void push(uint32_t bit) {
        acc_ |= uint8_t(bit << nbits_);
        if (++nbits_ == 8) flush();
    }
    std::string& out_;
    uint8_t acc_ = 0;
    int nbits_ = 0;
};

/// RFC 1951 3.2.6: the fixed literal/length code.
void put_litlen(BitWriter& w, uint32_t sym) {
    if (sym <= 143) w.code(0x30 + sym, 8);
    else if (sym <= 255) w.code(0x190 + (sym - 144), 9);
    else if (sym <= 279) w.code(sym - 256, 7);
    else w.code(0xc0 + (sym - 280), 8);
}

void put_match(BitWriter& w, size_t length, size_t distance) {
    size_t li = kLenBase.size() - 1;
    while (kLenBase[li] > length) --li;
    put_litlen(w, uint32_t(257 + li));
    w.bits(uint32_t(length - kLenBase[li]), kLenExtra[li]);
    size_t di = kDistBase.size() - 1;
    while (kDistBase[di] > distance) --di;
    w.code(uint32_t(di), 5);
    w.bits(uint32_t(distance - kDistBase[di]), kDistExtra[di]);
}

void put_be32(std::string& out, uint32_t v) {
    for (int s = 24; s >= 0; s -= 8) out.push_back(char((v >> s) & 0xff));
}

void put_chunk(std::string& png, const char* type, const std::string& data) {
    put_be32(png, uint32_t(data.size()));
    const size_t start = png.size();
    png.append(type, 4);
    png += data;
    const auto* p = reinterpret_cast<const uint8_t*>(png.data()) + start;
    put_be32(png, crc32({p, data.size() + 4}));
}

}  // namespace

uint32_t crc32(std::span<const uint8_t> data, uint32_t crc) {
    static const std::array<uint32_t, 256> table = [] {
        std::array<uint32_t, 256> t{};
        for (uint32_t n = 0; n < 256; ++n) {
            uint32_t c = n;
            for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
            t[n] = c;
        }
        return t;
    }();
    crc = ~crc;
    for (uint8_t b : data) crc = table[(crc ^ b) & 0xff] ^ (crc >> 8);
    return ~crc;
}

uint32_t adler32(std::span<const uint8_t> data) {
    constexpr uint32_t kMod = 65521;
    uint32_t a = 1, b = 0;
    for (uint8_t x : data) {
        a = (a + x) % kMod;
        b = (b + a) % kMod;
    }
    return (b << 16) | a;
}

std::string zlib_compress(std::span<const uint8_t> data, PngCompression mode, size_t match_distance) {
    std::string out;
    out.push_back(char(0x78));  // CMF: deflate, 32 KiB window
    out.push_back(char(0x01));  // FLG: no dictionary, "fastest"; 0x7801 is a multiple of 31
    if (mode == PngCompression::Stored) {
        size_t pos = 0;
        do {
            const size_t n = std::min(kMaxStored, data.size() - pos);
            const bool last = pos + n == data.size();
            out.push_back(char(last ? 1 : 0));  // BFINAL, BTYPE = 00, then byte alignment
            out.push_back(char(n & 0xff));
            out.push_back(char(n >> 8));
            out.push_back(char(~n & 0xff));
            out.push_back(char((~n >> 8) & 0xff));
            out.append(reinterpret_cast<const char*>(data.data()) + pos, n);
            pos += n;
        } while (pos < data.size());
    } else {
        BitWriter w(out);
        w.bits(1, 1);  // BFINAL
        w.bits(1, 2);  // BTYPE = 01, fixed Huffman codes
        std::vector<size_t> candidates = {1, 3};
        if (match_distance > 3 && match_distance <= kWindow) candidates.push_back(match_distance);
        size_t i = 0;
        while (i < data.size()) {
            size_t best_len = 0, best_dist = 0;
            for (size_t d : candidates) {
                if (d > i) continue;
                size_t len = 0;
                while (len < kMaxMatch && i + len < data.size() && data[i + len] == data[i + len - d]) ++len;
                if (len > best_len) {
                    best_len = len;
                    best_dist = d;
                }
            }
            if (best_len >= kMinMatch) {
                put_match(w, best_len, best_dist);
                i += best_len;
            } else {
                put_litlen(w, data[i]);
                ++i;
            }
        }
        put_litlen(w, 256);  // end of block
        w.flush();
    }
    put_be32(out, adler32(data));
    return out;
}

std::string encode_png(const Image& image, PngCompression mode) {
    const size_t stride = 1 + size_t(image.width()) * 3;
    std::vector<uint8_t> raw(stride * size_t(image.height()));
    for (int y = 0; y < image.height(); ++y) {
        raw[size_t(y) * stride] = 0;  // filter type 0 (None)
        std::copy_n(image.pixels().begin() + ptrdiff_t(size_t(y) * (stride - 1)), stride - 1,
                    raw.begin() + ptrdiff_t(size_t(y) * stride + 1));
    }
    std::string png = "\x89PNG\r\n\x1a\n";
    std::string ihdr;
    put_be32(ihdr, uint32_t(image.width()));
    put_be32(ihdr, uint32_t(image.height()));
    ihdr += std::string{char(8), char(2), char(0), char(0), char(0)};  // 8-bit, RGB, deflate, filter 0, no interlace
    put_chunk(png, "IHDR", ihdr);
    put_chunk(png, "IDAT", zlib_compress(raw, mode, stride));
    put_chunk(png, "IEND", "");
    return png;
}

void write_png(const std::filesystem::path& path, const Image& image, PngCompression mode) {
    DZR_CHECK(image.width() > 0 && image.height() > 0, "{}: cannot write an empty image", path.string());
    write_file_atomic(path, encode_png(image, mode));
}

}  // namespace dzr::io
