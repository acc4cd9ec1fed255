#pragma once
/// Shared by the libFuzzer targets: a per-process scratch directory (a fuzz input that is a file goes there)
/// and the rule every target checks: dzr::Error is the only way a parser may refuse an input.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

#include "core/log.h"

namespace dzr::fuzz {

/// A directory of this process under the temp dir, created once, removed at exit.
inline const std::filesystem::path& scratch_dir() {
    static const std::filesystem::path dir = [] {
        auto d = std::filesystem::temp_directory_path() / ("dzr-fuzz-" + std::to_string(::getpid()));
        std::filesystem::create_directories(d);
        std::atexit([] {
            std::error_code ec;
            std::filesystem::remove_all(
                std::filesystem::temp_directory_path() / ("dzr-fuzz-" + std::to_string(::getpid())), ec);
        });
        // NOTE: warnings about the (random) inputs would flood the fuzzer's output.
        dzr::set_log_level("off");
        return d;
    }();
    return dir;
}

inline void write_bytes(const std::filesystem::path& p, const uint8_t* data, size_t size) {
    std::FILE* f = std::fopen(p.c_str(), "wb");
    if (!f) std::abort();
    if (size && std::fwrite(data, 1, size, f) != size) std::abort();
    std::fclose(f);
}

}  // namespace dzr::fuzz
