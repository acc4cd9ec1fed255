// The CUDA StagingRing (backend/staging.h): one page-aligned host block, pinned with cudaHostRegister and cut
// into slots, a non-blocking copy stream of the ring's own and one event per slot that the next acquire of
// the slot waits for.
#include <cuda_runtime.h>

#include <cstdlib>
#include <vector>

#include "backend/cuda/cuda_internal.h"
#include "backend/staging.h"

namespace dzr {

namespace {

using cuda_detail::DeviceGuard;

constexpr size_t kPage = 4096;

class CudaStagingRing final : public StagingRing {
  public:
    CudaStagingRing(CudaBackend& be, const StagingOptions& o)
        : index_(be.index()), compute_stream_(be.cuda_stream()), slot_bytes_(o.slot_bytes), slots_(o.slots) {
        DeviceGuard guard(index_);
        // NOTE: one block for every slot, so pinning is paid once. Ordinary page-aligned memory pinned in
        // place (rather than cudaHostAlloc's) is what O_DIRECT reads into a slot need: aligned, and pages the
        // kernel can pin for the read like any other.
        const size_t total = (slot_bytes_ * size_t(slots_) + kPage - 1) / kPage * kPage;
        base_ = std::aligned_alloc(kPage, total);
        DZR_CHECK(base_ != nullptr, "cuda:{}: cannot allocate {} bytes of host memory for {} staging buffers",
                  index_, total, slots_);
        const cudaError_t st = cudaHostRegister(base_, total, cudaHostRegisterDefault);
        if (st != cudaSuccess) {
            cudaGetLastError();
            std::free(base_);
            base_ = nullptr;
            DZR_THROW("cuda:{}: cannot pin {} bytes of host memory for {} staging buffers of {} bytes ({})",
                      index_, total, slots_, slot_bytes_, cudaGetErrorString(st));
        }
        try {
            DZR_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
            DZR_CUDA_CHECK(cudaEventCreateWithFlags(&start_, cudaEventDisableTiming));
            done_.assign(size_t(slots_), nullptr);
            for (auto& e : done_) DZR_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        } catch (...) {
            release_all();
            throw;
        }
    }
    ~CudaStagingRing() override { release_all(); }
    CudaStagingRing(const CudaStagingRing&) = delete;
    CudaStagingRing& operator=(const CudaStagingRing&) = delete;

    size_t slot_bytes() const override { return slot_bytes_; }
    int slots() const override { return slots_; }

    void begin() override {
        DeviceGuard guard(index_);
        DZR_CUDA_CHECK(cudaEventRecord(start_, compute_stream_));
        DZR_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, start_, 0));
    }

    uint8_t* acquire(int slot) override {
        DeviceGuard guard(index_);
        DZR_CUDA_CHECK(cudaEventSynchronize(done_.at(size_t(slot))));
        return static_cast<uint8_t*>(base_) + size_t(slot) * slot_bytes_;
    }

    void copy(int slot, size_t offset, void* dst, size_t bytes) override {
        DZR_CHECK(offset + bytes <= slot_bytes_, "staging: copy of {} bytes at {} runs past a {}-byte slot",
                  bytes, offset, slot_bytes_);
        DeviceGuard guard(index_);
        const uint8_t* src = static_cast<const uint8_t*>(base_) + size_t(slot) * slot_bytes_ + offset;
        DZR_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, copy_stream_));
    }

    void release(int slot) override {
        DeviceGuard guard(index_);
        DZR_CUDA_CHECK(cudaEventRecord(done_.at(size_t(slot)), copy_stream_));
    }

    void finish() override {
        DeviceGuard guard(index_);
        DZR_CUDA_CHECK(cudaStreamSynchronize(copy_stream_));
    }

  private:
    /// Waits for the copies still reading the slots before the pinned memory goes.
    void release_all() noexcept {
        int prev = 0;
        cudaGetDevice(&prev);
        cudaSetDevice(index_);
        if (copy_stream_) cudaStreamSynchronize(copy_stream_);
        for (auto& e : done_)
            if (e) cudaEventDestroy(e);
        done_.clear();
        if (start_) cudaEventDestroy(start_);
        if (copy_stream_) cudaStreamDestroy(copy_stream_);
        if (base_) {
            cudaHostUnregister(base_);
            std::free(base_);
        }
        start_ = nullptr, copy_stream_ = nullptr, base_ = nullptr;
        cudaSetDevice(prev);
    }

    int index_ = 0;
    cudaStream_t compute_stream_ = nullptr;  // the backend's (not owned)
    size_t slot_bytes_ = 0;
    int slots_ = 0;
    void* base_ = nullptr;
    cudaStream_t copy_stream_ = nullptr;
    cudaEvent_t start_ = nullptr;
    std::vector<cudaEvent_t> done_;
};

}  // namespace

std::unique_ptr<StagingRing> make_cuda_staging_ring(Backend& be, const StagingOptions& options) {
    auto* cuda = dynamic_cast<CudaBackend*>(&be);
    DZR_CHECK(cuda != nullptr, "staging for {}: backend {} is not a CUDA backend", be.device().str(),
              be.name());
    return std::make_unique<CudaStagingRing>(*cuda, options);
}

}  // namespace dzr
