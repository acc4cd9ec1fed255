#include "backend/backend.h"

#include "core/error.h"

namespace dzr {

void Backend::paged_attention(const AttentionParams&, const TensorView&, const PagedKvView&, int, const TensorView&,
                              const TensorView&, const TensorView&) {
    DZR_THROW("backend {} has no paged attention", name());
}

void Backend::scatter_kv(const PagedKvView&, int, const TensorView&, const TensorView&, const TensorView&, int64_t) {
    DZR_THROW("backend {} has no KV scatter", name());
}

std::unique_ptr<Backend> make_backend(const Device& device, size_t workspace_bytes) {
    if (device.is_cpu()) return make_cpu_backend(workspace_bytes);
    return make_cuda_backend(device.index, workspace_bytes);
}

#ifndef DZR_HAVE_CUDA
std::unique_ptr<Backend> make_cuda_backend(int, size_t) {
    DZR_THROW("this dzr was built without CUDA (-DDZR_CUDA=OFF); use --device cpu");
}

bool cuda_device_available() { return false; }
#endif

}  // namespace dzr
