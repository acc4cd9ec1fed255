#pragma once
/// Atomic file output: write to a temporary file beside the target, then rename over it, so a
/// reader (or a --resume run) never sees a half-written file. Temporary names start with
/// ".<target name>.tmp-" and are removed on error.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>

namespace dzr::io {

/// Marker that every temporary file name contains (tests look for leftovers with it).
inline constexpr std::string_view kTempMarker = ".tmp-";

/// A file being written atomically. Nothing appears at `path` until commit(); if the object is
/// destroyed without commit() (an exception, an early return) the temporary file is deleted.
class AtomicFile {
public:
    explicit AtomicFile(std::filesystem::path path);
    ~AtomicFile();
    AtomicFile(const AtomicFile&) = delete;
    AtomicFile& operator=(const AtomicFile&) = delete;

    void write(const void* data, size_t bytes);
    void write(std::string_view text) { write(text.data(), text.size()); }
    /// Flush, close and rename onto the target path.
    void commit();

    const std::filesystem::path& path() const { return path_; }
    const std::filesystem::path& temp_path() const { return temp_; }

private:
    void discard() noexcept;

    std::filesystem::path path_;
    std::filesystem::path temp_;
    std::FILE* file_ = nullptr;
    bool committed_ = false;
};

/// A temporary path beside `path` ("dir/.name.tmp-<random><ext>") for writers that need a path
/// rather than a stream (OpenCV's VideoWriter picks the container from the extension).
std::filesystem::path temp_path_for(const std::filesystem::path& path, bool keep_extension = false);

/// Write `bytes` to `path` atomically.
void write_file_atomic(const std::filesystem::path& path, std::string_view bytes);

/// Read a whole file; throws dzr::Error naming the file when it cannot be read, is not a regular file (saying
/// what it is) or holds more than `max_bytes` (a config that is /dev/zero or a stray multi-GB file).
inline constexpr uint64_t kMaxReadFileBytes = uint64_t(256) << 20;
std::string read_file(const std::filesystem::path& path, uint64_t max_bytes = kMaxReadFileBytes);

/// What is at `path` when it is not a regular file: "nothing", "a directory", "a FIFO", "a character device",
/// "a dangling symlink to X", ... (symlinks followed). Empty for a regular file.
std::string describe_non_file(const std::filesystem::path& path);

/// Whether an optional input file is there: true for a regular file (or a symlink to one), false when there is
/// no entry of that name; throws dzr::Error naming the path and what is there instead (a directory, a device, a
/// FIFO, a dangling symlink), which must never read as "absent" and be replaced by zeros.
bool input_file_present(const std::filesystem::path& path);

}  // namespace dzr::io
