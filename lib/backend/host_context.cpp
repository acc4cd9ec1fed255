#include "backend/host_context.h"

#include <cstdlib>
#include <cstring>

#include "backend/cpu/cpu_kernels.h"
#include "core/convert.h"
#include "core/error.h"

namespace dzr {

namespace {

struct HostEvent final : Event {
    std::chrono::steady_clock::time_point at{};
};

const HostEvent& host_event(const Event& e) {
    const auto* h = dynamic_cast<const HostEvent*>(&e);
    DZR_CHECK(h != nullptr, "host stream: the event was not made by a host stream");
    return *h;
}

}  // namespace

void HostDevice::Free::operator()(char* p) const { std::free(p); }

void HostDevice::reserve_workspace(size_t bytes) {
    // NOTE: a generous default: the host path is not graph-captured, and untouched pages cost nothing
    if (bytes == 0) bytes = size_t(1) << 30;
    buffer_.reset(static_cast<char*>(std::calloc(bytes, 1)));
    DZR_CHECK(buffer_ != nullptr, "host: cannot reserve a {} byte workspace", bytes);
    arena_ = Arena(buffer_.get(), bytes, Device::cpu());
}

void host_copy(const TensorView& src, const TensorView& dst) {
    if (src.dtype == dst.dtype && src.device.is_cpu() && dst.device.is_cpu() && src.numel() == dst.numel() &&
        dst.is_contiguous() && cpu::copy_same_dtype(src, dst))
        return;
    convert_copy_host(src, dst);  // conversions, and the checks with their messages
}

void HostStream::upload(const TensorView& src, const TensorView& dst) { host_copy(src, dst); }

void HostStream::download(const TensorView& src, const TensorView& dst) { host_copy(src, dst); }

std::unique_ptr<Event> HostStream::make_event() { return std::make_unique<HostEvent>(); }

void HostStream::copy_pinned(const void* pinned_src, const TensorView& dst) {
    DZR_CHECK(dst.is_contiguous(), "copy_pinned: the destination must be contiguous, got {}", dst.str());
    std::memcpy(dst.data, pinned_src, dst.nbytes());
}

void HostStream::record(Event& e) {
    const_cast<HostEvent&>(host_event(e)).at = std::chrono::steady_clock::now();
}

double HostStream::elapsed_ms(const Event& from, const Event& to) {
    return std::chrono::duration<double, std::milli>(host_event(to).at - host_event(from).at).count();
}

}  // namespace dzr
