#pragma once
/// CUDA graphs and the small-upload ring of a CudaStream.
///
/// Capture: cudaStreamBeginCapture in thread-local mode (an unsafe call from this thread, such as cudaMalloc or a
/// synchronizing copy, fails the capture instead of running), cudaStreamEndCapture, cudaGraphInstantiate. A capture
/// that fails is ended and dropped (abort_capture) and the sticky-free error state is cleared, so the caller can go
/// on eagerly.
///
/// Small uploads (block tables, slot mappings, states: a few KiB each, several per forward) go through a ring of
/// pinned slots, one slot per upload: the copy reads its own slot when the stream reaches it, so the host never
/// waits for the device unless it runs a whole ring ahead (PinnedUploadRing::kSlots uploads). Before, two shared
/// staging buffers made every upload wait for the one two uploads back, which pinned the host to the device's
/// pace (and left the device waiting on the host between forwards).
#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <memory>

#include "backend/backend.h"

namespace dzr::cuda_detail {

/// An instantiated graph, launched on the stream it was captured from.
class CudaGraph final : public Graph {
public:
    CudaGraph(cudaGraphExec_t exec, cudaStream_t stream, int device) : exec_(exec), stream_(stream), device_(device) {}
    ~CudaGraph() override;
    CudaGraph(const CudaGraph&) = delete;
    CudaGraph& operator=(const CudaGraph&) = delete;
    void launch() override;

private:
    cudaGraphExec_t exec_;
    cudaStream_t stream_;
    int device_;
};

/// Starts capturing `stream`'s work (thread-local mode). Throws when the stream is already capturing.
void begin_capture(cudaStream_t stream, int device);
/// Ends the capture and instantiates it; on failure (an invalidated capture, an instantiation error) the capture is
/// dropped, the error cleared and dzr::Error thrown naming the CUDA error.
std::unique_ptr<Graph> end_capture(cudaStream_t stream, int device);
/// Ends a capture in progress, if any, discarding it, and clears the error it left. Never throws.
void abort_capture(cudaStream_t stream, int device) noexcept;
/// True while `stream` is capturing (active or invalidated).
bool is_capturing(cudaStream_t stream) noexcept;

/// A ring of pinned host slots for small uploads (see the file comment). Not thread-safe (one per stream).
class PinnedUploadRing {
public:
    static constexpr int kSlots = 64;
    static constexpr size_t kSlotBytes = size_t(64) << 10;

    explicit PinnedUploadRing(int device);
    ~PinnedUploadRing();
    PinnedUploadRing(const PinnedUploadRing&) = delete;
    PinnedUploadRing& operator=(const PinnedUploadRing&) = delete;

    /// The next slot's host memory (kSlotBytes), once the copy queued from it a ring ago has finished.
    void* acquire();
    /// Queues the copy of the acquired slot's first `bytes` bytes to `dst` on `stream` and releases the slot.
    void copy(void* dst, size_t bytes, cudaStream_t stream);
    /// Uploads started so far (each took one slot).
    long long uploads() const { return uploads_; }

private:
    void release() noexcept;

    int device_;
    void* base_ = nullptr;
    std::array<cudaEvent_t, kSlots> done_{};
    int next_ = 0;
    int acquired_ = -1;
    long long uploads_ = 0;
};

}  // namespace dzr::cuda_detail
