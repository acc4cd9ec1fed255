#include "io/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>

#include "core/error.h"
#include "core/json_text.h"

namespace dzr::io {

namespace {

std::string read_fd(int fd) {
    std::string text;
    char buf[4096];
    ::lseek(fd, 0, SEEK_SET);
    for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) text.append(buf, size_t(n));
    return text;
}

std::string holder_of(const std::string& text) {
    try {
        const auto j = nlohmann::json::parse(text);
        return fmt::format("pid {} on {} since {} ({})", j.value("pid", 0), j.value("host", std::string("?")),
                           j.value("started", std::string("?")), j.value("command", std::string("?")));
    } catch (const nlohmann::json::exception&) {
        return "another process (it has not written its details yet)";
    }
}

}  // namespace

RunLock::RunLock(const std::filesystem::path& dir, const std::string& name, const std::string& command, bool shared)
    : path_(dir / name) {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    DZR_CHECK(fd_ >= 0, "cannot open the lock file {}: {}", path_.string(), std::strerror(errno));
    if (::flock(fd_, (shared ? LOCK_SH : LOCK_EX) | LOCK_NB) != 0) {
        const int err = errno;
        // NOTE: an exclusive holder wrote its name into the file; shared holders (a sharded run's ranks) do not, and
        // a shared lock that can be had tells them apart
        std::string holder;
        if (err != EWOULDBLOCK) {
            holder = std::strerror(err);
        } else if (!shared && ::flock(fd_, LOCK_SH | LOCK_NB) == 0) {
            ::flock(fd_, LOCK_UN);
            holder = "the ranks of a sharded run (--shard, srun or mpirun)";
        } else {
            holder = holder_of(read_fd(fd_));
        }
        ::close(fd_);
        fd_ = -1;
        DZR_THROW(
            "output directory {} is in use by another dzr run: {} (lock file {}); wait for it or choose "
            "another "
            "--out",
            dir.string(), holder, path_.string());
    }
    if (shared) return;
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    std::tm tm{};
    gmtime_r(&now, &tm);
    char started[32];
    std::strftime(started, sizeof started, "%Y-%m-%dT%H:%M:%SZ", &tm);
    // NOTE: a command line may hold bytes that are not UTF-8 (a path): they are replaced, never an exception
    const std::string text =
        dump_json(nlohmann::json{
                      {"pid", int64_t(::getpid())}, {"host", host}, {"started", started}, {"command", command}},
                  -1) +
        "\n";
    // NOTE: written in place (the lock belongs to this inode; a rename would put a new, unlocked file there).
    if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, text.data(), text.size(), 0) != ssize_t(text.size())) {
        const int err = errno;
        ::close(fd_);
        fd_ = -1;
        DZR_THROW("cannot write the lock file {}: {}", path_.string(), std::strerror(err));
    }
}

RunLock::~RunLock() {
    if (fd_ >= 0) ::close(fd_);
}

}  // namespace dzr::io
