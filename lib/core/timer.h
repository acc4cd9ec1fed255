#pragma once
/// Host wall-clock timing. Device work is timed by the backend (events) or after synchronize().
#include <chrono>

namespace dzr {

class Timer {
public:
    Timer() : start_(std::chrono::steady_clock::now()) {}
    void reset() { start_ = std::chrono::steady_clock::now(); }
    double seconds() const {
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    }
    double ms() const { return seconds() * 1e3; }

private:
    std::chrono::steady_clock::time_point start_;
};

}  // namespace dzr
