// libFuzzer target: experiment_cfg/metadata.json text through the statistics reader and the checks a rollout
// makes of the statistics it normalizes with.
#include <cstdint>
#include <string>

#include "core/error.h"
#include "fuzz_support.h"
#include "policy/normalization.h"
#include "weights/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    dzr::fuzz::scratch_dir();  // logging off
    const std::string text(reinterpret_cast<const char*>(data), size);
    try {
        for (const auto& [name, stats] : dzr::parse_metadata_json(text, "metadata.json"))
            dzr::check_policy_statistics(stats, "metadata.json");
    } catch (const dzr::Error&) {
    }
    return 0;
}
