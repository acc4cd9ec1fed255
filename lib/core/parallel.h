#pragma once
/// A few host threads over independent items (checkpoint shards): `fn(i)` for i in [0, n), at most `threads`
/// at a time. The first exception any item throws is rethrown after every thread has stopped; the items not
/// yet started are then skipped.
#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace dzr {

template <class Fn>
void parallel_for(size_t n, size_t threads, Fn&& fn) {
    threads = std::max<size_t>(1, std::min(threads, n));
    if (threads == 1) {
        for (size_t i = 0; i < n; ++i) fn(i);
        return;
    }
    std::atomic<size_t> next{0};
    std::atomic<bool> failed{false};
    std::exception_ptr first;
    std::mutex mu;
    auto work = [&] {
        for (size_t i; !failed.load() && (i = next.fetch_add(1)) < n;) {
            try {
                fn(i);
            } catch (...) {
                std::lock_guard<std::mutex> lock(mu);
                if (!first) first = std::current_exception();
                failed.store(true);
            }
        }
    };
    std::vector<std::thread> pool;
    for (size_t t = 0; t < threads; ++t) pool.emplace_back(work);
    for (auto& t : pool) t.join();
    if (first) std::rethrow_exception(first);
}

/// Threads for `n` items: the hardware's, at most `cap` and at most n.
inline size_t worker_threads(size_t n, size_t cap = 8) {
    const size_t hw = std::max(1u, std::thread::hardware_concurrency());
    return std::max<size_t>(1, std::min({hw, cap, n}));
}

}  // namespace dzr
