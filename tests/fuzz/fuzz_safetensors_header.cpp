// libFuzzer target: a whole .safetensors file (header length, JSON header, data) through the strict reader,
// then every tensor view it hands out read end to end (a view past the mapping would show under ASan).
#include <cstdint>

#include "core/error.h"
#include "fuzz_support.h"
#include "weights/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const auto path = dzr::fuzz::scratch_dir() / "input.safetensors";
    dzr::fuzz::write_bytes(path, data, size);
    try {
        const auto file = dzr::SafetensorsFile::open(path);
        uint64_t sum = 0;
        for (const auto& e : file->entries()) {
            const auto view = file->find(e.name);
            if (!view) std::abort();  // an entry the reader listed but cannot find
            const auto* bytes = static_cast<const uint8_t*>(view->data);
            for (uint64_t i = 0; i < e.nbytes(); ++i) sum += bytes[i];
        }
        (void)sum;
    } catch (const dzr::Error&) {
    }
    return 0;
}
