#pragma once
/// checksums.sha256 in a checkpoint directory: one `<64 hex digits>  <relative path>` line per file, the
/// format `sha256sum` writes and `sha256sum -c` reads. `dzr ckpt make` writes it; `dzr ckpt validate --hash`
/// computes every shard's SHA-256 and compares it with the file when the directory has one.
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace dzr {

inline constexpr const char* kChecksumsFile = "checksums.sha256";

/// Hashes `files` (paths relative to `dir`, in parallel) and writes dir/checksums.sha256, sorted by path.
void write_checksums(const std::filesystem::path& dir, const std::vector<std::string>& files);

/// Parses checksums.sha256 text: relative path -> lowercase hex digest. Throws dzr::Error naming `source` and
/// the line on anything else (a blank line and a `#` comment are skipped; a `*` binary marker is accepted).
std::map<std::string, std::string> parse_checksums(const std::string& text, const std::string& source);

/// The result of `dzr ckpt validate --hash`.
struct ChecksumReport {
    std::map<std::string, std::string> computed;  ///< every hashed file -> its digest
    bool had_list = false;                        ///< the directory has checksums.sha256
    std::vector<std::string> problems;            ///< mismatches, missing or unlisted files
    size_t matched = 0;
};

/// Hashes `files` (relative to `dir`; the shards) and, when dir/checksums.sha256 exists, every file it lists,
/// comparing each with its line. A listed file that is missing or differs, and a hashed shard the list lacks,
/// is a problem.
ChecksumReport verify_checksums(const std::filesystem::path& dir, const std::vector<std::string>& files);

}  // namespace dzr
