// libFuzzer target: .npy bytes through the header parser and, when the header is accepted, the whole reader.
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "fuzz_support.h"
#include "io/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string_view bytes(reinterpret_cast<const char*>(data), size);
    try {
        dzr::io::parse_npy_header(bytes, "input.npy");
    } catch (const dzr::Error&) {
        return 0;
    }
    const auto path = dzr::fuzz::scratch_dir() / "input.npy";
    dzr::fuzz::write_bytes(path, data, size);
    try {
        const dzr::io::NpyArray a = dzr::io::read_npy(path);
        if (a.numel() <= (int64_t(1) << 20)) a.to_f64();
    } catch (const dzr::Error&) {
    }
    return 0;
}
