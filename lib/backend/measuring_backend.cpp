#include "backend/measuring_backend.h"

#include <cstdint>

#include "core/error.h"

namespace dzr {

void* MeasuringBackend::fake_address() { return reinterpret_cast<void*>(uintptr_t(1) << 44); }

Tensor MeasuringBackend::shape_only(Shape shape, DType dtype) {
    return Tensor(nullptr, TensorView(fake_address(), dtype, shape, Device::cpu()));
}

// NOTE: the arena sits on the fake address too (not a null measuring arena), so that slicing
// activation views never does arithmetic on null pointers.
MeasuringBackend::MeasuringBackend(DType compute_dtype, Backend* planner)
    : planner_(planner), dtype_(compute_dtype), arena_(reinterpret_cast<void*>(uintptr_t(1) << 46), size_t(1) << 45, Device::cpu()),
      next_alloc_(uintptr_t(1) << 44) {}

Tensor MeasuringBackend::alloc(Shape shape, DType dtype) {
    void* p = reinterpret_cast<void*>(next_alloc_);
    next_alloc_ += (size_t(shape.numel()) * dtype_size(dtype) + 255) / 256 * 256 + 256;
    return Tensor(nullptr, TensorView(p, dtype, shape, Device::cpu()));
}

void MeasuringBackend::copy(const TensorView& src, const TensorView& dst) {
    DZR_CHECK(src.numel() == dst.numel() && dst.is_contiguous(), "measuring copy: {} -> {}", src.str(), dst.str());
}

void MeasuringBackend::conv3d(const Conv3dParams& p, const TensorView& x, const TensorView& w, const TensorView&,
                              const TensorView& out) {
    if (x.rank() != 4 || out.rank() != 4) return;
    ArenaScope scope(arena_);
    bool symmetric = true;
    Shape padded{x.dim(0), x.dim(1), x.dim(2), x.dim(3)};
    for (int i = 0; i < 3; ++i) {
        symmetric = symmetric && p.pad_before[i] == p.pad_after[i];
        padded[i + 1] += p.pad_before[i] + p.pad_after[i];
    }
    if (!symmetric) arena_.alloc_view(padded, x.dtype);
    if (p.frames_2d) {
        arena_.alloc_view(symmetric ? x.shape : padded, x.dtype);
        arena_.alloc_view(out.shape, out.dtype);
        if (p.channels_last) arena_.alloc_view(w.shape, w.dtype);  // the channels-last weight
    }
    if (planner_) {
        const size_t ws = planner_->conv3d_workspace_bytes(p, x, w, out);
        if (ws > 0) arena_.alloc(ws);
    }
}

}  // namespace dzr
