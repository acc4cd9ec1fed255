// libFuzzer target: a checkpoint's config.json text through the model-geometry reader and the consistency
// checks a checkpoint gets.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

#include "config/model_fields.h"
#include "config/model_json.h"
#include "core/error.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    dzr::fuzz::scratch_dir();  // logging off
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(reinterpret_cast<const char*>(data),
                                  reinterpret_cast<const char*>(data) + size);
    } catch (const nlohmann::json::exception&) {
        return 0;
    }
    try {
        const auto r = dzr::config::model_config_from_json(j, "config.json");
        dzr::config::check_model_config(r.model);
    } catch (const dzr::Error&) {
    }
    return 0;
}
