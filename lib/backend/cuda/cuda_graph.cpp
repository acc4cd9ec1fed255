// CUDA graph capture and replay, and the pinned ring of small uploads (cuda_graph.h).
#include "backend/cuda/cuda_graph.h"

#include "backend/cuda/cuda_internal.h"
#include "core/error.h"

namespace dzr::cuda_detail {

CudaGraph::~CudaGraph() {
    if (exec_) cudaGraphExecDestroy(exec_);
}

void CudaGraph::launch() {
    DeviceGuard guard(device_);
    DZR_CUDA_CHECK(cudaGraphLaunch(exec_, stream_));
}

bool is_capturing(cudaStream_t stream) noexcept {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return status != cudaStreamCaptureStatusNone;
}

void begin_capture(cudaStream_t stream, int device) {
    DeviceGuard guard(device);
    DZR_CHECK(!is_capturing(stream), "cuda:{}: begin_capture on a stream that is already capturing", device);
    // NOTE: thread-local mode: a call from this thread that could implicitly synchronize (cudaMalloc, a pageable
    // copy, cudaStreamSynchronize) makes the capture fail rather than run unordered; other threads (the rollout's
    // prefetching host thread) are not affected.
    DZR_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
}

void abort_capture(cudaStream_t stream, int device) noexcept {
    int prev = 0;
    if (cudaGetDevice(&prev) != cudaSuccess) prev = device;
    cudaSetDevice(device);
    if (is_capturing(stream)) {
        cudaGraph_t graph = nullptr;
        cudaStreamEndCapture(stream, &graph);
        if (graph) cudaGraphDestroy(graph);
    }
    // NOTE: an invalidated capture leaves a (non-sticky) error behind; later checks must not see it
    cudaGetLastError();
    cudaSetDevice(prev);
}

std::unique_ptr<Graph> end_capture(cudaStream_t stream, int device) {
    DeviceGuard guard(device);
    cudaGraph_t graph = nullptr;
    const cudaError_t end = cudaStreamEndCapture(stream, &graph);
    if (end != cudaSuccess) {
        if (graph) cudaGraphDestroy(graph);
        cudaGetLastError();
        DZR_THROW("cuda:{}: the graph capture failed ({}: {})", device, cudaGetErrorName(end), cudaGetErrorString(end));
    }
    DZR_CHECK(graph != nullptr, "cuda:{}: the graph capture returned no graph", device);
    cudaGraphExec_t exec = nullptr;
    const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    if (inst != cudaSuccess) {
        cudaGetLastError();
        DZR_THROW("cuda:{}: cannot instantiate the captured graph ({}: {})", device, cudaGetErrorName(inst),
                  cudaGetErrorString(inst));
    }
    return std::make_unique<CudaGraph>(exec, stream, device);
}

PinnedUploadRing::PinnedUploadRing(int device) : device_(device) {
    DeviceGuard guard(device_);
    DZR_CUDA_CHECK(cudaHostAlloc(&base_, kSlotBytes * size_t(kSlots), cudaHostAllocDefault));
    for (auto& e : done_) {
        const cudaError_t st = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
        if (st != cudaSuccess) {
            e = nullptr;
            release();
            DZR_CUDA_CHECK(st);
        }
    }
}

PinnedUploadRing::~PinnedUploadRing() { release(); }

void PinnedUploadRing::release() noexcept {
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(device_);
    for (auto& e : done_) {
        if (e) {
            cudaEventSynchronize(e);
            cudaEventDestroy(e);
        }
        e = nullptr;
    }
    if (base_) cudaFreeHost(base_);
    base_ = nullptr;
    cudaSetDevice(prev);
}

void* PinnedUploadRing::acquire() {
    DZR_CHECK(acquired_ < 0, "pinned upload ring: a slot is already acquired");
    DeviceGuard guard(device_);
    const int s = next_;
    next_ = (next_ + 1) % kSlots;
    // NOTE: an event never recorded counts as complete, so the first pass through the ring never waits
    DZR_CUDA_CHECK(cudaEventSynchronize(done_[size_t(s)]));
    acquired_ = s;
    return static_cast<char*>(base_) + size_t(s) * kSlotBytes;
}

void PinnedUploadRing::copy(void* dst, size_t bytes, cudaStream_t stream) {
    DZR_CHECK(acquired_ >= 0 && bytes <= kSlotBytes, "pinned upload ring: copy of {} bytes without a slot", bytes);
    DeviceGuard guard(device_);
    const int s = acquired_;
    acquired_ = -1;
    ++uploads_;
    DZR_CUDA_CHECK(cudaMemcpyAsync(dst, static_cast<char*>(base_) + size_t(s) * kSlotBytes, bytes,
                                   cudaMemcpyHostToDevice, stream));
    DZR_CUDA_CHECK(cudaEventRecord(done_[size_t(s)], stream));
}

}  // namespace dzr::cuda_detail
