// GPU telemetry (backend/gpu_telemetry.h) on a real GPU: the CUDA device names its PCI bus id, NVML finds the GPU
// there, and sampling while the GPU multiplies matrices reads a clock, a power draw and the limits. Where the driver
// has no NVML the summary says so (and the checks of the readings do not apply).
#include <doctest/doctest.h>

#include <chrono>
#include <regex>
#include <string>

#include "backend/backend.h"
#include "backend/gpu_telemetry.h"
#include "support/test_support.h"

DZR_TEST_REQUIRES_GPU()

using namespace dzr;

TEST_CASE("the CUDA device's PCI bus id, and NVML's readings of that GPU under load") {
    auto be = make_backend(Device::cuda(0));
    const std::string id = be->context().pci_bus_id();
    CHECK(std::regex_match(id, std::regex("[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\\.[0-9A-Fa-f]")));

    const int64_t n = 4096;
    Tensor a = be->alloc({n, n}, DType::BF16), b = be->alloc({n, n}, DType::BF16), c = be->alloc({n, n}, DType::BF16);
    be->fill(a.view(), 0.01f);
    be->fill(b.view(), 0.02f);
    GpuTelemetry telemetry({id}, 20);
    telemetry.start();
    const auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(400)) {
        for (int i = 0; i < 20; ++i) be->linear(a, b, Tensor{}, c);
        be->synchronize();
    }
    const auto s = telemetry.stop();
    REQUIRE(s.size() == 1);
    CHECK(s[0].device == id);
    if (!s[0].unavailable.empty()) {
        MESSAGE("NVML unavailable here: " << s[0].unavailable);
        return;
    }
    CHECK(s[0].samples >= 5);
    CHECK(s[0].sm_clock_median_mhz > 0);
    CHECK(s[0].sm_clock_max_mhz <= s[0].sm_clock_limit_mhz);
    CHECK(s[0].power_median_w > 0);
    CHECK(s[0].power_limit_w > 0);
    CHECK(s[0].seconds >= 0.4);
    if (s[0].energy_j) CHECK(*s[0].energy_j > 0);
    MESSAGE(s[0].line());
}
