#pragma once
/// A small PNG encoder of our own (no zlib): 8-bit RGB, filter 0 on every row, and a zlib stream of
/// either "stored" deflate blocks or fixed-Huffman blocks whose only matches repeat the previous
/// pixel or the row above (plots are mostly flat colour, so that shrinks them ~20x). CRC-32 and
/// Adler-32 are computed here too.
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>

#include "io/image.h"

namespace dzr::io {

enum class PngCompression { Stored, FixedHuffman };

/// CRC-32 (ISO 3309, as PNG and zip use it) of `data`, continuing from `crc` (0 to start).
uint32_t crc32(std::span<const uint8_t> data, uint32_t crc = 0);
/// Adler-32 (RFC 1950) of `data`.
uint32_t adler32(std::span<const uint8_t> data);

/// A zlib stream (RFC 1950) holding `data` deflated (RFC 1951) as described above.
std::string zlib_compress(std::span<const uint8_t> data, PngCompression mode,
                          size_t match_distance = 0);

/// The bytes of a PNG file showing `image`.
std::string encode_png(const Image& image, PngCompression mode = PngCompression::FixedHuffman);
/// Writes `image` as a PNG file, atomically.
void write_png(const std::filesystem::path& path, const Image& image,
               PngCompression mode = PngCompression::FixedHuffman);

}  // namespace dzr::io
