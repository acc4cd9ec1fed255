#include "io/atomic_file.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>

#include "core/error.h"

namespace dzr::io {

namespace fs = std::filesystem;

fs::path temp_path_for(const fs::path& path, bool keep_extension) {
    // NOTE: random_device per call is cheap enough here (a few files per episode) and keeps
    // concurrent writers of the same target from colliding.
    std::random_device rd;
    std::string name = fmt::format(".{}{}{:08x}{:08x}", path.filename().string(), kTempMarker, rd(), rd());
    if (keep_extension) name += path.extension().string();
    return path.parent_path() / name;
}

AtomicFile::AtomicFile(fs::path path) : path_(std::move(path)) {
    DZR_CHECK(!path_.filename().empty(), "cannot write '{}': not a file path", path_.string());
    temp_ = temp_path_for(path_);
    file_ = std::fopen(temp_.c_str(), "wb");
    DZR_CHECK(file_ != nullptr, "cannot create {}: {}", temp_.string(), std::strerror(errno));
}

AtomicFile::~AtomicFile() {
    if (!committed_) discard();
}

void AtomicFile::discard() noexcept {
    if (file_) {
        std::fclose(file_);
        file_ = nullptr;
    }
    std::error_code ec;
    fs::remove(temp_, ec);
}

void AtomicFile::write(const void* data, size_t bytes) {
    DZR_CHECK(file_ != nullptr && !committed_, "{}: write after commit", path_.string());
    if (bytes == 0) return;
    if (std::fwrite(data, 1, bytes, file_) != bytes) {
        const int err = errno;
        discard();
        DZR_THROW("cannot write {}: {}", path_.string(), std::strerror(err));
    }
}

void AtomicFile::commit() {
    DZR_CHECK(file_ != nullptr && !committed_, "{}: commit called twice", path_.string());
    const bool flushed = std::fflush(file_) == 0;
    const int close_rc = std::fclose(file_);
    file_ = nullptr;
    if (!flushed || close_rc != 0) {
        const int err = errno;
        discard();
        DZR_THROW("cannot write {}: {}", path_.string(), std::strerror(err));
    }
    std::error_code ec;
    fs::rename(temp_, path_, ec);
    if (ec) {
        discard();
        DZR_THROW("cannot move {} into place as {}: {}", temp_.string(), path_.string(), ec.message());
    }
    committed_ = true;
}

void write_file_atomic(const fs::path& path, std::string_view bytes) {
    AtomicFile f(path);
    f.write(bytes);
    f.commit();
}

std::string describe_non_file(const fs::path& path) {
    std::error_code ec;
    const fs::file_status link = fs::symlink_status(path, ec);
    if (!fs::exists(link)) return "nothing";
    const fs::file_status st = fs::status(path, ec);
    if (fs::is_regular_file(st)) return "";
    if (fs::is_symlink(link) && !fs::exists(st))
        return fmt::format("a dangling symlink to {}", fs::read_symlink(path, ec).string());
    const char* kind = fs::is_directory(st)        ? "a directory"
                       : fs::is_fifo(st)           ? "a FIFO"
                       : fs::is_character_file(st) ? "a character device"
                       : fs::is_block_file(st)     ? "a block device"
                       : fs::is_socket(st)         ? "a socket"
                                                   : "not a regular file";
    return fs::is_symlink(link) ? fmt::format("a symlink to {} ({})", fs::read_symlink(path, ec).string(), kind)
                                : std::string(kind);
}

bool input_file_present(const fs::path& path) {
    const std::string what = describe_non_file(path);
    if (what.empty()) return true;
    if (what == "nothing") return false;
    DZR_THROW("{}: expected a regular file, found {}", path.string(), what);
}

std::string read_file(const fs::path& path, uint64_t max_bytes) {
    std::error_code ec;
    if (const std::string what = describe_non_file(path); !what.empty())
        DZR_THROW("{}: {}", path.string(), what == "nothing" ? "no such file" : "expected a regular file, found " + what);
    const uint64_t size = fs::file_size(path, ec);
    DZR_CHECK(ec || size <= max_bytes, "{}: {} bytes, more than the {} a file of this kind may hold", path.string(),
              size, max_bytes);
    std::ifstream in(path, std::ios::binary);
    DZR_CHECK(in.good(), "cannot open {}: {}", path.string(), std::strerror(errno));
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    DZR_CHECK(!in.bad(), "cannot read {}", path.string());
    return bytes;
}

}  // namespace dzr::io
