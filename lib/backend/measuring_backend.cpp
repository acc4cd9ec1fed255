#include "backend/measuring_backend.h"

#include <cstdint>

#include "core/error.h"

namespace dzr {

void* MeasuringBackend::fake_address() { return reinterpret_cast<void*>(uintptr_t(1) << 44); }

Tensor MeasuringBackend::shape_only(Shape shape, DType dtype) {
    return Tensor(nullptr, TensorView(fake_address(), dtype, shape, dzr::Device::cpu()));
}

// NOTE: the arena sits on the fake address too (not a null measuring arena), so that slicing
// activation views never does arithmetic on null pointers.
MeasuringBackend::Device::Device(Backend* planner, std::optional<Capabilities> assumed)
    : planner_(planner),
      assumed_(assumed),
      arena_(reinterpret_cast<void*>(uintptr_t(1) << 46), size_t(1) << 45, dzr::Device::cpu()),
      next_alloc_(uintptr_t(1) << 44) {}

Tensor MeasuringBackend::Device::alloc(Shape shape, DType dtype) {
    void* p = reinterpret_cast<void*>(next_alloc_);
    const size_t bytes = size_t(shape.numel()) * dtype_size(dtype);
    next_alloc_ += (bytes + 255) / 256 * 256 + 256;
    allocated_ += bytes;
    return Tensor(nullptr, TensorView(p, dtype, shape, dzr::Device::cpu()));
}

Capabilities MeasuringBackend::Device::capabilities() const {
    // NOTE: the planner's capabilities, so the measured calls take the paths the real ones will take
    Capabilities c = planner_ ? planner_->capabilities() : assumed_.value_or(Capabilities{});
    c.measuring = true;
    c.graphs = false;
    return c;
}

MeasuringBackend::MeasuringBackend(DType compute_dtype, Backend* planner, std::optional<Capabilities> assumed,
                                   Numerics numerics)
    : Backend(planner ? planner->numerics() : numerics, /*measuring=*/true), planner_(planner), dtype_(compute_dtype),
      device_(planner, assumed) {}

size_t MeasuringBackend::conv3d_workspace_bytes(const Conv3dParams& p, const TensorView& x, const TensorView& w,
                                               const TensorView& out) {
    return planner_ ? planner_->conv3d_workspace_bytes(p, x, w, out) : 0;
}

size_t MeasuringBackend::paged_attention_workspace_bytes(const PagedKvView& history, const TensorView& k_cur) {
    return planner_ ? planner_->paged_attention_workspace_bytes(history, k_cur) : 0;
}

size_t MeasuringBackend::paged_attention_batched_workspace_bytes(std::span<const PagedKvView> histories,
                                                                const TensorView& k_cur) {
    return planner_ ? planner_->paged_attention_batched_workspace_bytes(histories, k_cur) : 0;
}

size_t measure_workspace(Backend& planner, const std::function<void(Backend& measuring)>& call) {
    MeasuringBackend measuring(planner.compute_dtype(), &planner);
    call(measuring);
    return measuring.workspace().high_water();
}

}  // namespace dzr
