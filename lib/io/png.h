#pragma once
/// PNG files through libpng (its "simplified" API): 8-bit RGB in, 8-bit RGB out.
#include <filesystem>
#include <string>

#include "io/image.h"

namespace dzr::io {

/// True when dzr was built with libpng; without it the functions below throw dzr::Error.
bool png_available();
/// The bytes of a PNG file showing `image`.
std::string encode_png(const Image& image);
/// Writes `image` as a PNG file, atomically.
void write_png(const std::filesystem::path& path, const Image& image);
/// Reads an 8-bit RGB (or convertible) PNG file; throws dzr::Error naming the file.
Image read_png(const std::filesystem::path& path);

}  // namespace dzr::io
