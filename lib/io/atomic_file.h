#pragma once
/// Atomic file output: write to a temporary file beside the target, then rename over it, so a
/// reader (or a --resume run) never sees a half-written file. Temporary names start with
/// ".<target name>.tmp-" and are removed on error.
#include <cstddef>
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

/// Read a whole file; throws dzr::Error naming the file when it cannot be read.
std::string read_file(const std::filesystem::path& path);

}  // namespace dzr::io
