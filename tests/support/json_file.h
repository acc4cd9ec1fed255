#pragma once
/// Reads a JSON file the code under test wrote (timing.json, manifest.json, ...).
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

namespace dzr::test {

inline nlohmann::json read_json(const std::filesystem::path& p) {
    std::ifstream f(p);
    return nlohmann::json::parse(f);
}

}  // namespace dzr::test
