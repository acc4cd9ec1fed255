#pragma once
/// A bump allocator over one preallocated buffer (host or device). Forwards take their activations
/// from an arena, so they never call malloc/cudaMalloc. An arena with no buffer only measures: it
/// hands out null pointers and records the high-water mark, which sizes the real arena at load.
#include <cstddef>
#include <cstdint>

#include "core/tensor.h"

namespace dzr {

class Arena {
public:
    Arena() = default;
    /// base == nullptr: measuring arena (capacity unlimited, pointers are null).
    Arena(void* base, size_t capacity, Device device) : base_(static_cast<char*>(base)), capacity_(capacity), device_(device) {}

    static constexpr size_t kAlign = 256;

    /// Reserve `bytes` (rounded up to kAlign). Throws dzr::Error naming the sizes when full.
    void* alloc(size_t bytes);
    /// A contiguous view of the given shape carved from the arena.
    TensorView alloc_view(Shape shape, DType dtype);

    size_t mark() const { return used_; }
    void release(size_t mark);
    void reset() { used_ = 0; }

    size_t used() const { return used_; }
    size_t high_water() const { return high_water_; }
    size_t capacity() const { return capacity_; }
    bool measuring() const { return base_ == nullptr; }
    /// The buffer's start (null when measuring): with mark(), where the next allocation lands.
    const void* base() const { return base_; }
    Device device() const { return device_; }

private:
    char* base_ = nullptr;
    size_t capacity_ = 0;
    size_t used_ = 0;
    size_t high_water_ = 0;
    Device device_;
};

/// Releases everything allocated after its construction when it goes out of scope.
class ArenaScope {
public:
    explicit ArenaScope(Arena& a) : arena_(a), mark_(a.mark()) {}
    ~ArenaScope() { arena_.release(mark_); }
    ArenaScope(const ArenaScope&) = delete;
    ArenaScope& operator=(const ArenaScope&) = delete;

private:
    Arena& arena_;
    size_t mark_;
};

}  // namespace dzr
