// Packed persistent allocations on CUDA (backend/packing.h): one virtual address range per slab, physical memory
// mapped (CUDA's virtual memory management) in granules of the device's allocation granularity as the slab's
// tensors reach further. The driver entry points come through the runtime (cudaGetDriverEntryPointByVersion), so
// nothing links against libcuda itself.
#include <cuda.h>

#include <cstdlib>
#include <string_view>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_internal.h"
#include "core/error.h"
#include "core/log.h"

namespace dzr {

namespace {

struct VmmApi {
    decltype(&cuMemGetAllocationGranularity) granularity = nullptr;
    decltype(&cuMemAddressReserve) reserve = nullptr;
    decltype(&cuMemAddressFree) address_free = nullptr;
    decltype(&cuMemCreate) create = nullptr;
    decltype(&cuMemRelease) release = nullptr;
    decltype(&cuMemMap) map = nullptr;
    decltype(&cuMemUnmap) unmap = nullptr;
    decltype(&cuMemSetAccess) set_access = nullptr;
    bool ok = false;
};

template <class F>
bool entry_point(const char* name, F& fn) {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult status{};
    if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &status) != cudaSuccess ||
        status != cudaDriverEntryPointSuccess || !p) {
        cudaGetLastError();
        return false;
    }
    fn = reinterpret_cast<F>(p);
    return true;
}

const VmmApi& vmm_api() {
    static const VmmApi api = [] {
        VmmApi a;
        a.ok = entry_point("cuMemGetAllocationGranularity", a.granularity) &&
               entry_point("cuMemAddressReserve", a.reserve) && entry_point("cuMemAddressFree", a.address_free) &&
               entry_point("cuMemCreate", a.create) && entry_point("cuMemRelease", a.release) &&
               entry_point("cuMemMap", a.map) && entry_point("cuMemUnmap", a.unmap) &&
               entry_point("cuMemSetAccess", a.set_access);
        return a;
    }();
    return api;
}

}  // namespace

/// One slab: a reserved address range with physical memory mapped from its start up to `mapped_`.
class CudaSlab final : public Storage {
public:
    /// nullptr (and one warning) where the driver has no virtual memory management.
    static std::shared_ptr<CudaSlab> create(int device) {
        const VmmApi& api = vmm_api();
        if (!api.ok) {
            static bool warned = false;
            if (!warned) log()->warn("cuda:{}: no virtual memory management in the driver; weights are not packed", device);
            warned = true;
            return nullptr;
        }
        auto slab = std::shared_ptr<CudaSlab>(new CudaSlab(device));
        CUmemAllocationProp prop = slab->prop();
        if (api.granularity(&slab->granularity_, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS ||
            slab->granularity_ == 0)
            return nullptr;
        size_t free_bytes = 0, total = 0;
        {
            cuda_detail::DeviceGuard guard(device);
            if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) {
                cudaGetLastError();
                return nullptr;
            }
        }
        // NOTE: address space only (no memory): the whole device's size, so that any network fits
        slab->reserved_ = (total + slab->granularity_ - 1) / slab->granularity_ * slab->granularity_;
        if (api.reserve(&slab->base_, slab->reserved_, slab->granularity_, 0, 0) != CUDA_SUCCESS) {
            slab->base_ = 0;
            return nullptr;
        }
        return slab;
    }

    ~CudaSlab() override {
        if (!base_) return;
        const VmmApi& api = vmm_api();
        cuda_detail::DeviceGuard guard(device_);
        // NOTE: as cudaFree does, wait for work that may still read the slab's tensors
        cudaDeviceSynchronize();
        for (const Mapping& m : mappings_) {
            api.unmap(base_ + m.offset, m.bytes);
            api.release(m.handle);
        }
        api.address_free(base_, reserved_);
    }
    CudaSlab(const CudaSlab&) = delete;
    CudaSlab& operator=(const CudaSlab&) = delete;

    void* data() const override { return reinterpret_cast<void*>(base_); }
    size_t bytes() const override { return mapped_; }
    Device device() const override { return Device::cuda(device_); }

    /// `bytes` at the next 256-byte boundary, mapping granules as needed; nullptr when the range is full or the
    /// device has no memory left for them (the caller then allocates as usual, and reports that).
    void* carve(size_t bytes) {
        const size_t offset = (used_ + 255) / 256 * 256;
        const size_t end = offset + bytes;
        if (end > reserved_) return nullptr;
        if (end > mapped_ && !map_up_to(end)) return nullptr;
        used_ = end;
        return reinterpret_cast<void*>(base_ + offset);
    }

    size_t used() const { return used_; }

private:
    struct Mapping {
        size_t offset = 0, bytes = 0;
        CUmemGenericAllocationHandle handle{};
    };

    explicit CudaSlab(int device) : device_(device) {}

    CUmemAllocationProp prop() const {
        CUmemAllocationProp p{};
        p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        p.location.id = device_;
        return p;
    }

    bool map_up_to(size_t end) {
        const VmmApi& api = vmm_api();
        const size_t bytes = (end - mapped_ + granularity_ - 1) / granularity_ * granularity_;
        const CUmemAllocationProp p = prop();
        Mapping m;
        m.offset = mapped_;
        m.bytes = bytes;
        if (api.create(&m.handle, bytes, &p, 0) != CUDA_SUCCESS) return false;
        if (api.map(base_ + m.offset, bytes, 0, m.handle, 0) != CUDA_SUCCESS) {
            api.release(m.handle);
            return false;
        }
        CUmemAccessDesc access{};
        access.location = p.location;
        access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        if (api.set_access(base_ + m.offset, bytes, &access, 1) != CUDA_SUCCESS) {
            api.unmap(base_ + m.offset, bytes);
            api.release(m.handle);
            return false;
        }
        mappings_.push_back(m);
        mapped_ += bytes;
        return true;
    }

    int device_ = 0;
    CUdeviceptr base_ = 0;
    size_t reserved_ = 0, mapped_ = 0, used_ = 0, granularity_ = 0;
    std::vector<Mapping> mappings_;
};

void CudaDevice::begin_packing() {
    if (packing_depth_++ > 0) return;
    // NOTE: DZR_PACK_WEIGHTS=0 gives every tensor its own cudaMalloc again (a comparison, or a driver that misbehaves)
    if (pack_weights_) slab_ = CudaSlab::create(index_);
}

void CudaDevice::end_packing() {
    DZR_CHECK(packing_depth_ > 0, "cuda:{}: end_packing without begin_packing", index_);
    if (--packing_depth_ > 0) return;
    if (slab_)
        log()->debug("cuda:{}: packed {} bytes into {} mapped", index_, slab_->used(), slab_->bytes());
    slab_.reset();
}

Tensor CudaDevice::alloc_packed(Shape shape, DType dtype) {
    const size_t bytes = size_t(shape.numel()) * dtype_size(dtype);
    void* p = bytes > 0 ? slab_->carve(bytes) : nullptr;
    if (!p) return {};
    cuda_detail::DeviceGuard guard(index_);
    DZR_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));
    return Tensor(slab_, TensorView(p, dtype, shape, device()));
}

}  // namespace dzr
