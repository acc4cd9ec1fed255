#include "core/arena.h"

#include <algorithm>

#include "core/error.h"

namespace dzr {

void* Arena::alloc(size_t bytes) {
    const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
    if (!measuring() && used_ + rounded > capacity_) {
        DZR_THROW("workspace arena on {} exhausted: {} bytes in use, {} more requested, capacity {} bytes",
                  device_.str(), used_, rounded, capacity_);
    }
    void* p = measuring() ? nullptr : base_ + used_;
    used_ += rounded;
    high_water_ = std::max(high_water_, used_);
    return p;
}

TensorView Arena::alloc_view(Shape shape, DType dtype) {
    void* p = alloc(size_t(shape.numel()) * dtype_size(dtype));
    return TensorView(p, dtype, shape, device_);
}

void Arena::release(size_t mark) {
    DZR_ASSERT(mark <= used_);
    used_ = mark;
}

}  // namespace dzr
