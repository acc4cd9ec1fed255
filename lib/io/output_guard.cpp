#include "io/output_guard.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace dzr::io {

namespace fs = std::filesystem;

namespace {

bool identity(const fs::path& p, uint64_t& dev, uint64_t& ino) {
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0) return false;
    dev = uint64_t(st.st_dev);
    ino = uint64_t(st.st_ino);
    return true;
}

/// The absolute path with symlinks of its existing part resolved and `.`/`..` folded.
fs::path resolved(const fs::path& p) {
    std::error_code ec;
    fs::path r = fs::weakly_canonical(fs::absolute(p), ec);
    return ec ? fs::absolute(p).lexically_normal() : r;
}

}  // namespace

void InputSet::add_dir(const fs::path& dir, std::string what) {
    Entry e{resolved(dir), std::move(what)};
    if (identity(e.path, e.dev, e.ino)) dirs_.push_back(std::move(e));
}

void InputSet::add_file(const fs::path& file, std::string what) {
    Entry e{resolved(file), std::move(what)};
    if (identity(e.path, e.dev, e.ino)) files_.push_back(std::move(e));
}

void InputSet::check_output_dir(const fs::path& dir) const {
    const fs::path out = resolved(dir);
    // The directory and every existing directory above it, by identity: an input directory among them means
    // the outputs would be created inside that input.
    for (fs::path p = out;; p = p.parent_path()) {
        uint64_t dev = 0, ino = 0;
        if (identity(p, dev, ino)) {
            for (const Entry& in : dirs_)
                if (in.dev == dev && in.ino == ino)
                    DZR_THROW(
                        "output directory {} {} the {} {}: dzr never writes into its inputs; choose another "
                        "--out",
                        dir.string(), p == out ? "is" : "lies inside", in.what, in.path.string());
            for (const Entry& in : files_)
                if (in.dev == dev && in.ino == ino)
                    DZR_THROW("output directory {} is the {} {}; choose another --out", dir.string(), in.what,
                              in.path.string());
        }
        if (!p.has_parent_path() || p.parent_path() == p) break;
    }
}

void InputSet::check_output_file(const fs::path& file) const {
    const fs::path out = resolved(file);
    uint64_t dev = 0, ino = 0;
    if (identity(out, dev, ino)) {
        for (const Entry& in : files_)
            if (in.dev == dev && in.ino == ino)
                DZR_THROW(
                    "output {} would replace the {} {}: dzr never writes its inputs; choose another --out",
                    file.string(), in.what, in.path.string());
    }
    check_output_dir(out.parent_path());
}

void probe_writable_dir(const fs::path& dir) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    DZR_CHECK(!ec && fs::is_directory(dir, ec), "cannot create the output directory {}: {}", dir.string(),
              ec ? ec.message() : std::string("a file of that name exists"));
    const fs::path probe = dir / fmt::format(".dzr-probe-{}", ::getpid());
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    DZR_CHECK(fd >= 0, "cannot write into the output directory {}: {}", dir.string(), std::strerror(errno));
    const bool written = ::write(fd, "probe\n", 6) == 6;
    const int write_errno = errno;
    ::close(fd);
    ::unlink(probe.c_str());
    DZR_CHECK(written, "cannot write into the output directory {}: {}", dir.string(),
              std::strerror(write_errno));
}

bool is_plain_name(std::string_view name) {
    return !name.empty() && name != "." && name != ".." && name.find_first_of(std::string_view("/\\\0", 3)) ==
                                                                  std::string_view::npos;
}

}  // namespace dzr::io
