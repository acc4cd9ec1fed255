#pragma once
/// dzr::Error is the one exception library code throws. Its message is what the user reads:
/// name the file, key, frame or tensor, say what was expected and what was found.
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace dzr {

class Error : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// Thrown when a run is interrupted (Ctrl-C) between calls; apps map it to exit code 130.
class Interrupted : public Error {
public:
    using Error::Error;
};

}  // namespace dzr

/// Throw a user-facing error: DZR_THROW("shard {}: tensor {}: ...", path, name).
#define DZR_THROW(...) throw ::dzr::Error(::fmt::format(__VA_ARGS__))

/// Check a user-facing condition; the message is for the user (no file:line).
#define DZR_CHECK(cond, ...)                                      \
    do {                                                          \
        if (!(cond)) throw ::dzr::Error(::fmt::format(__VA_ARGS__)); \
    } while (0)

/// Check an internal invariant (a bug if it fails); the message carries file:line.
#define DZR_ASSERT(cond)                                                                         \
    do {                                                                                         \
        if (!(cond))                                                                             \
            throw ::dzr::Error(::fmt::format("internal error: {} failed at {}:{}", #cond, __FILE__, \
                                             __LINE__));                                        \
    } while (0)
