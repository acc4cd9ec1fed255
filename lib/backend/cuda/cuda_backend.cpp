// Placeholder until the CUDA backend lands: reports the device count correctly and refuses to build
// a backend.
#include <cuda_runtime.h>

#include "backend/backend.h"
#include "core/error.h"

namespace dzr {

bool cuda_device_available() {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::unique_ptr<Backend> make_cuda_backend(int, size_t) { DZR_THROW("the CUDA backend is not implemented yet"); }

}  // namespace dzr
