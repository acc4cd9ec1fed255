#include "io/png.h"

#include <vector>

#include "core/error.h"
#include "io/atomic_file.h"

#ifdef DZR_HAVE_PNG
#include <png.h>

namespace dzr::io {

bool png_available() { return true; }

// NOTE: png_image_write_to_memory arrived in libpng 1.6.29 (Debian 12 has 1.6.39, Ubuntu 24.04 1.6.43).
static_assert(PNG_LIBPNG_VER >= 10629, "libpng 1.6.29 or newer is needed (png_image_write_to_memory)");

std::string encode_png(const Image& image) {
    DZR_CHECK(image.width() > 0 && image.height() > 0, "cannot encode an empty image as PNG");
    png_image png{};
    png.version = PNG_IMAGE_VERSION;
    png.width = png_uint_32(image.width());
    png.height = png_uint_32(image.height());
    png.format = PNG_FORMAT_RGB;
    // The first call sizes the buffer, the second fills it.
    png_alloc_size_t size = 0;
    const void* pixels = image.pixels().data();
    DZR_CHECK(png_image_write_to_memory(&png, nullptr, &size, 0, pixels, 0, nullptr) && size > 0,
              "libpng cannot encode a {}x{} image: {}", image.width(), image.height(), png.message);
    std::string out(size, '\0');
    DZR_CHECK(png_image_write_to_memory(&png, out.data(), &size, 0, pixels, 0, nullptr),
              "libpng cannot encode a {}x{} image: {}", image.width(), image.height(), png.message);
    out.resize(size);
    return out;
}

void write_png(const std::filesystem::path& path, const Image& image) {
    DZR_CHECK(image.width() > 0 && image.height() > 0, "{}: cannot write an empty image", path.string());
    write_file_atomic(path, encode_png(image));
}

Image read_png(const std::filesystem::path& path) {
    const std::string bytes = read_file(path);
    png_image png{};
    png.version = PNG_IMAGE_VERSION;
    DZR_CHECK(png_image_begin_read_from_memory(&png, bytes.data(), bytes.size()), "{}: not a PNG file: {}",
              path.string(), png.message);
    png.format = PNG_FORMAT_RGB;
    DZR_CHECK(png.width > 0 && png.height > 0 && png.width <= (1u << 14) && png.height <= (1u << 14),
              "{}: PNG size {}x{} is out of range", path.string(), png.width, png.height);
    std::vector<uint8_t> rgb(PNG_IMAGE_SIZE(png));
    if (!png_image_finish_read(&png, nullptr, rgb.data(), 0, nullptr)) {
        const std::string message = png.message;
        png_image_free(&png);
        DZR_THROW("{}: damaged PNG file: {}", path.string(), message);
    }
    return Image(int(png.width), int(png.height), std::move(rgb));
}

}  // namespace dzr::io

#else  // no libpng

namespace dzr::io {

namespace {
[[noreturn]] void no_png() {
    DZR_THROW("this dzr was built without libpng (apt-get install libpng-dev, then rebuild): PNG files unavailable");
}
}  // namespace

bool png_available() { return false; }
std::string encode_png(const Image&) { no_png(); }
void write_png(const std::filesystem::path&, const Image&) { no_png(); }
Image read_png(const std::filesystem::path&) { no_png(); }

}  // namespace dzr::io

#endif
