#pragma once
/// The device context and stream of host (CPU) memory: tensors on the heap, one calloc'ed workspace, and a
/// "stream" on which every op has finished when it returns (events are host timestamps). The CPU backend runs on
/// them, and so can any other host backend (tests build small ones).
#include <chrono>
#include <memory>

#include "backend/backend.h"

namespace dzr {

class HostDevice final : public DeviceContext {
public:
    /// workspace_bytes = 0: 1 GiB, reserved lazily by the OS (untouched pages cost nothing).
    explicit HostDevice(size_t workspace_bytes = 0) { reserve_workspace(workspace_bytes); }
    Device device() const override { return Device::cpu(); }
    Tensor alloc(Shape shape, DType dtype) override { return Tensor::host(shape, dtype); }
    Arena& workspace() override { return arena_; }
    void reserve_workspace(size_t bytes) override;
    Capabilities capabilities() const override { return caps_; }
    void set_capabilities(const Capabilities& caps) { caps_ = caps; }

private:
    struct Free {
        void operator()(char* p) const;
    };
    std::unique_ptr<char, Free> buffer_;
    Arena arena_;
    Capabilities caps_;
};

class HostStream final : public Stream {
public:
    void upload(const TensorView& src, const TensorView& dst) override;
    void download(const TensorView& src, const TensorView& dst) override;
    void synchronize() override {}
    std::unique_ptr<Event> make_event() override;
    void record(Event& e) override;
    void wait(const Event&) override {}
    double elapsed_ms(const Event& from, const Event& to) override;
    void copy_pinned(const void* pinned_src, const TensorView& dst) override;
};

/// Host copy converting dtype; same-dtype copies of any layout take a fast strided path.
void host_copy(const TensorView& src, const TensorView& dst);

}  // namespace dzr
