#pragma once
/// Runs the dzr binary the way a user would (ctest sets DZR_BIN) and snapshots directory trees, so a test can
/// check an exit code, a message and that no input file changed.
#include <fmt/format.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "core/sha256.h"
#include "support/test_support.h"

namespace dzr::test {

struct CliResult {
    int code = -1;
    std::string out, err;
    bool has(const std::string& s) const {
        return err.find(s) != std::string::npos || out.find(s) != std::string::npos;
    }
};

/// The dzr binary, or empty when ctest did not provide it.
inline std::string dzr_bin() {
    const char* bin = std::getenv("DZR_BIN");
    return bin && std::filesystem::exists(bin) ? bin : "";
}

inline std::string slurp(const std::filesystem::path& p) {
    std::ifstream f(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

/// `dzr <args>` (args are shell words, quote paths with '...'); stdout and stderr captured in `scratch`.
inline CliResult run_dzr(const std::string& args, const std::filesystem::path& scratch) {
    const auto out = scratch / "cli-stdout.txt", err = scratch / "cli-stderr.txt";
    const std::string cmd = fmt::format("'{}' {} >'{}' 2>'{}'", dzr_bin(), args, out.string(), err.string());
    const int status = std::system(cmd.c_str());
    CliResult r;
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = slurp(out);
    r.err = slurp(err);
    return r;
}

/// Every regular file under `dir` (relative path -> SHA-256): equal snapshots mean nothing was added,
/// removed or changed.
inline std::map<std::string, std::string> snapshot(const std::filesystem::path& dir) {
    std::map<std::string, std::string> files;
    for (const auto& e : std::filesystem::recursive_directory_iterator(dir))
        if (e.is_regular_file())
            files[std::filesystem::relative(e.path(), dir).string()] = sha256_file(e.path());
    return files;
}

/// Single quotes for a shell word.
inline std::string q(const std::filesystem::path& p) {
    return fmt::format("'{}'", p.string());
}

}  // namespace dzr::test
