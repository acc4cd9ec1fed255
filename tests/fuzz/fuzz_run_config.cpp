// libFuzzer target: a run config (configs/*.yaml) through the strict reader: sections, types, bounds, the DiT
// step plan, the KV settings and the swallowed-key check.
#include <cstdint>
#include <string>

#include "config/run_config.h"
#include "core/error.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    dzr::fuzz::scratch_dir();  // logging off
    const std::string text(reinterpret_cast<const char*>(data), size);
    try {
        dzr::config::parse_run_config(text, "run.yaml");
    } catch (const dzr::Error&) {
    }
    return 0;
}
