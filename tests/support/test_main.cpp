#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "backend/backend.h"
#include "backend/blas_kernels.h"
#include "support/test_support.h"

// Defined (strongly) by DZR_TEST_REQUIRES_GPU() in GPU test files.
extern "C" __attribute__((weak)) bool dzr_test_requires_gpu();

int main(int argc, char** argv) {
    dzr::use_best_blas_kernels(argv);
    if (dzr_test_requires_gpu && dzr_test_requires_gpu() && !dzr::cuda_device_available()) {
        std::puts("skipped: no CUDA device on this machine");
        return dzr::test::kSkipExitCode;
    }
    doctest::Context ctx(argc, argv);
    return ctx.run();
}
