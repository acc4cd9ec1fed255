#include "backend/staging.h"

#include "core/error.h"

namespace dzr {

std::unique_ptr<StagingRing> make_staging_ring(Backend& be, const StagingOptions& options) {
    DZR_CHECK(options.slot_bytes > 0 && options.slots > 0, "staging: {} slots of {} bytes is no staging",
              options.slots, options.slot_bytes);
    if (be.capabilities().measuring || be.device().is_cpu()) return nullptr;
    return make_cuda_staging_ring(be, options);
}

#ifndef DZR_HAVE_CUDA
std::unique_ptr<StagingRing> make_cuda_staging_ring(Backend& be, const StagingOptions&) {
    DZR_THROW("staging for {}: this dzr was built without CUDA", be.device().str());
}
#endif

}  // namespace dzr
