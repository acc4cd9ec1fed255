#pragma once
/// A Backend that computes nothing and only measures: allocations return views of a fake, never
/// dereferenced address, and the workspace arena records its high-water mark. Running a model's
/// forwards on it (with shape-only weights) sizes the real backend's workspace at load. Its ops are the measuring
/// bracket's (backend.h): every op that takes workspace of its own (a convolution's cuDNN scratch, a paged
/// attention's gathered rows) asks the backend that will run the calls (the planner) how much, so nothing here
/// mirrors another backend's internals, and nothing here is per op.
#include <cstdint>
#include <functional>
#include <optional>

#include "backend/backend.h"

namespace dzr {

class MeasuringBackend final : public Backend {
public:
    /// planner: the backend that will run the calls, asked for the workspace of its ops (may be null: the ops'
    /// own workspace is then not counted). assumed: the capabilities the measured calls see when there is no
    /// planner (a plan for a device this machine lacks); the planner's own otherwise. numerics: the mode the
    /// measured calls run in without a planner (the planner's own otherwise).
    explicit MeasuringBackend(DType compute_dtype, Backend* planner = nullptr,
                              std::optional<Capabilities> assumed = std::nullopt,
                              Numerics numerics = Numerics::Reference);

    /// Bytes of every alloc() so far (persistent tensors: weights, tables, KV pools, buffers), as requested
    /// (no alignment or rounding).
    size_t allocated_bytes() const { return device_.allocated_bytes(); }

    /// A fake address for data-less tensors: never dereferenced, but arithmetic on it is defined.
    static void* fake_address();
    /// A data-less tensor of the given shape (for shape-only weight sources).
    static Tensor shape_only(Shape shape, DType dtype);

    std::string name() const override { return "measuring"; }
    DType compute_dtype() const override { return dtype_; }
    DeviceContext& context() override { return device_; }
    const DeviceContext& context() const override { return device_; }
    Stream& stream() override { return stream_; }
    std::unique_ptr<Stream> make_copy_stream() override { return std::make_unique<Queue>(); }

    /// The planner's answers (0 without one): conv3d and paged_attention take what they will take on the planner,
    /// and a measurement over this backend (measure_workspace) asks the backend that will run the calls.
    size_t conv3d_workspace_bytes(const Conv3dParams& p, const TensorView& x, const TensorView& w,
                                  const TensorView& out) override;
    size_t paged_attention_workspace_bytes(const PagedKvView& history, const TensorView& k_cur) override;
    size_t paged_attention_batched_workspace_bytes(std::span<const PagedKvView> histories,
                                                   const TensorView& k_cur) override;

private:
    /// Fake allocations at distinct addresses; an arena on a fake address.
    class Device final : public DeviceContext {
    public:
        Device(Backend* planner, std::optional<Capabilities> assumed);
        dzr::Device device() const override { return dzr::Device::cpu(); }
        Tensor alloc(Shape shape, DType dtype) override;
        /// Host memory: data-less, and not counted (the plan is of device memory).
        Tensor alloc_pinned(Shape shape, DType dtype) override { return shape_only(shape, dtype); }
        Arena& workspace() override { return arena_; }
        void reserve_workspace(size_t) override {}
        Capabilities capabilities() const override;
        size_t allocated_bytes() const { return allocated_; }

    private:
        Backend* planner_;
        std::optional<Capabilities> assumed_;
        Arena arena_;
        uintptr_t next_alloc_ = 0;
        size_t allocated_ = 0;
    };
    /// Nothing is queued; events measure nothing.
    class Queue final : public Stream {
    public:
        void upload(const TensorView&, const TensorView&) override {}
        void download(const TensorView&, const TensorView&) override {}
        void synchronize() override {}
        std::unique_ptr<Event> make_event() override { return std::make_unique<Event>(); }
        void record(Event&) override {}
        void wait(const Event&) override {}
        double elapsed_ms(const Event&, const Event&) override { return 0.0; }
        void copy_pinned(const void*, const TensorView&) override {}
    };

    Backend* planner_ = nullptr;
    DType dtype_;
    Device device_;
    Queue stream_;
};

/// The workspace `call` takes when `planner` runs it: `call` runs on a MeasuringBackend over `planner` (its compute
/// dtype, its capabilities, its ops' own workspace) from an empty arena, and the arena's high-water mark is returned.
/// The networks and caches size their calls with it (no data is read or written: build the call's tensors with the
/// measuring backend's alloc(), and run the network's weights as they are, or shape-only).
size_t measure_workspace(Backend& planner, const std::function<void(Backend& measuring)>& call);

}  // namespace dzr
