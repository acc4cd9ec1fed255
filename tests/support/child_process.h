#pragma once
/// A child process for end-to-end tests of the dzr binary: stdout to /dev/null, stderr on a pipe that the
/// test reads (all of it, or until a line it waits for). A child the test did not wait for is stopped
/// (SIGTERM) and reaped when the object dies.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace dzr::test {

class Child {
public:
    /// Starts args[0] (a path, or a name looked up in PATH) with the rest as its arguments.
    explicit Child(const std::vector<std::string>& args) {
        int fds[2];
        REQUIRE(pipe(fds) == 0);
        std::vector<char*> argv;
        for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
        argv.push_back(nullptr);
        pid_ = fork();
        REQUIRE(pid_ >= 0);
        if (pid_ == 0) {
            dup2(fds[1], STDERR_FILENO);
            const int devnull = open("/dev/null", O_RDWR);
            dup2(devnull, STDOUT_FILENO);
            dup2(devnull, STDIN_FILENO);
            close(fds[0]);
            close(fds[1]);
            execvp(argv[0], argv.data());
            _exit(127);
        }
        close(fds[1]);
        err_fd_ = fds[0];
    }
    ~Child() {
        if (pid_ > 0) {
            kill(pid_, SIGTERM);
            int status = 0;
            waitpid(pid_, &status, 0);
        }
        if (err_fd_ >= 0) close(err_fd_);
    }
    Child(const Child&) = delete;
    Child& operator=(const Child&) = delete;

    pid_t pid() const { return pid_; }
    /// Everything read from stderr so far.
    const std::string& err() const { return err_; }

    /// Reads stderr until `needle` appears after offset `from` (true) or the pipe closes (false).
    bool read_until(const std::string& needle, size_t from = 0) {
        char buf[4096];
        while (err_.find(needle, from) == std::string::npos) {
            const ssize_t n = read(err_fd_, buf, sizeof(buf));
            if (n <= 0) return false;
            err_.append(buf, size_t(n));
        }
        return true;
    }
    void read_all() {
        char buf[4096];
        ssize_t n;
        while ((n = read(err_fd_, buf, sizeof(buf))) > 0) err_.append(buf, size_t(n));
    }
    /// Reads the rest of stderr, waits, and returns the exit code (-signal when killed).
    int wait_exit_code() {
        read_all();
        int status = 0;
        REQUIRE(waitpid(pid_, &status, 0) == pid_);
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
    }

private:
    pid_t pid_ = -1;
    int err_fd_ = -1;
    std::string err_;
};

/// The full path of `name` in PATH, or empty.
inline std::filesystem::path find_in_path(const std::string& name) {
    const char* path = std::getenv("PATH");
    if (!path) return {};
    std::string p = path;
    size_t pos = 0;
    while (pos <= p.size()) {
        const size_t end = std::min(p.find(':', pos), p.size());
        const std::filesystem::path candidate = std::filesystem::path(p.substr(pos, end - pos)) / name;
        if (!candidate.empty() && access(candidate.c_str(), X_OK) == 0) return candidate;
        pos = end + 1;
    }
    return {};
}

}  // namespace dzr::test
