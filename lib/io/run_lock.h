#pragma once
/// One run per output directory: an exclusive lock file (flock) held for the whole run, so a second run
/// writing into the same directory fails at once, naming the process that holds it, instead of both runs
/// overwriting each other's episodes and summary. The kernel releases the lock when the holder exits (even on
/// SIGKILL); the file stays behind and names its last holder.
#include <filesystem>
#include <string>

namespace dzr::io {

class RunLock {
  public:
    /// Opens (creates) `dir`/`name` and takes the lock without waiting; writes this process's pid, host,
    /// start time and `command` into it. Throws dzr::Error naming the holder (pid, host, command, start time)
    /// when another process has it.
    /// `shared`: a shared lock, taken by each rank of a sharded run (which write one --out together), so that an
    /// unsharded run and a sharded one exclude each other; a shared holder does not write the file.
    RunLock(const std::filesystem::path& dir, const std::string& name, const std::string& command, bool shared = false);
    ~RunLock();
    RunLock(const RunLock&) = delete;
    RunLock& operator=(const RunLock&) = delete;

    const std::filesystem::path& path() const { return path_; }

  private:
    std::filesystem::path path_;
    int fd_ = -1;
};

}  // namespace dzr::io
