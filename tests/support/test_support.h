#pragma once
/// Helpers shared by the tests: temp dirs, test-data paths, random fills.
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace dzr::test {

inline constexpr int kSkipExitCode = 77;  // ctest SKIP_RETURN_CODE

/// A fresh directory under the system temp dir, removed when the object dies.
class TempDir {
public:
    TempDir() {
        std::random_device rd;
        path_ = std::filesystem::temp_directory_path() /
                ("dzr-test-" + std::to_string(rd()) + "-" + std::to_string(rd()));
        std::filesystem::create_directories(path_);
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;
    const std::filesystem::path& path() const { return path_; }
    std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

private:
    std::filesystem::path path_;
};

inline std::filesystem::path data_dir() { return DZR_TEST_DATA_DIR; }
inline std::filesystem::path source_dir() { return DZR_SOURCE_DIR; }
inline std::filesystem::path binary_dir() { return DZR_BINARY_DIR; }

/// Uniform floats in [lo, hi) from a fresh seed per call site (pass a distinct seed).
inline std::vector<float> random_floats(size_t n, uint64_t seed, float lo = -1.f, float hi = 1.f) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = dist(rng);
    return v;
}

/// The message of the dzr::Error that f() throws; "" when it throws none.
template <class F>
std::string error_of(F&& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

/// True when `part` occurs in `s`.
inline bool contains(std::string_view s, std::string_view part) { return s.find(part) != std::string_view::npos; }

}  // namespace dzr::test

/// Put at file scope in a GPU test: the binary exits 77 (ctest: skipped) when no GPU is present.
#define DZR_TEST_REQUIRES_GPU() \
    extern "C" bool dzr_test_requires_gpu() { return true; }
