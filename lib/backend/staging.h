#pragma once
/// Host -> device transfers in bulk (loading weights): a ring of pinned host buffers ("slots") and a copy
/// stream of its own, so that filling one slot from a file overlaps with the uploads out of the others. A
/// loader fills a slot, queues the slot's copies into the final device tensors, releases it, and takes the
/// next free one; acquiring a slot again waits only for that slot's own copies.
///
/// make_staging_ring returns one for a backend whose device memory the host cannot write (CUDA). Where it can
/// (the CPU backend) there is none: a loader writes straight into the tensors.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "backend/backend.h"

namespace dzr {

struct StagingOptions {
    size_t slot_bytes = size_t(64) << 20;  ///< each slot's size (the largest read a loader makes into one)
    int slots = 8;                         ///< pinned buffers; at least one per thread that fills them
};

/// Pinned host slots and a copy stream on one device. acquire/copy/release may be called from several threads
/// at once as long as each slot is used by one thread at a time.
class StagingRing {
  public:
    virtual ~StagingRing() = default;
    virtual size_t slot_bytes() const = 0;
    virtual int slots() const = 0;
    /// Orders every later copy after the work queued on the backend's stream so far (the zero fill of the
    /// tensors the copies write). Call it once before the first copy.
    virtual void begin() = 0;
    /// The host memory of `slot` (slot_bytes() bytes; 4096-byte aligned when slot_bytes() is a multiple of
    /// 4096, as O_DIRECT reads need) once every copy queued from it has finished.
    virtual uint8_t* acquire(int slot) = 0;
    /// Queues a copy of `bytes` bytes at `offset` in `slot` to the device address `dst` (on the backend's
    /// device).
    virtual void copy(int slot, size_t offset, void* dst, size_t bytes) = 0;
    /// Ends the slot's copies: the next acquire(slot) waits for them.
    virtual void release(int slot) = 0;
    /// Waits for every queued copy. Work the backend queues afterwards sees the copied bytes.
    virtual void finish() = 0;
};

/// A ring on `be`'s device; nullptr where the host writes device tensors directly (CPU) or the backend only
/// measures. Throws dzr::Error when the pinned memory cannot be had.
std::unique_ptr<StagingRing> make_staging_ring(Backend& be, const StagingOptions& options);

/// The CUDA ring (lib/backend/cuda/cuda_staging.cpp); `be` must be a CUDA backend. Use make_staging_ring.
std::unique_ptr<StagingRing> make_cuda_staging_ring(Backend& be, const StagingOptions& options);

}  // namespace dzr
