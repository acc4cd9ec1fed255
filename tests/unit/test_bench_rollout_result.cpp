// `dzr bench rollout`'s result: the DZR_* settings of the environment go into its JSON and its table, so a recorded
// number says which backend switches it ran under (docs/PERF.md records the commands).
#include <doctest/doctest.h>

#include <string>

#include "rollout/bench_rollout.h"

using namespace dzr;

TEST_CASE("a bench result records the environment's backend settings in its JSON and its table") {
    rollout::BenchRolloutResult r;
    r.devices = "cuda:0";
    r.numerics = "fast";
    CHECK(r.to_json()["environment"].empty());
    CHECK(r.table().find("environment:") == std::string::npos);
    r.environment = {{"DZR_GEMM_TUNE", "off"}, {"DZR_BATCHED_ATTENTION", "off"}};
    const nlohmann::ordered_json j = r.to_json();
    CHECK(j["environment"]["DZR_GEMM_TUNE"] == "off");
    CHECK(j["environment"]["DZR_BATCHED_ATTENTION"] == "off");
    CHECK(r.table().find("environment: DZR_GEMM_TUNE=off DZR_BATCHED_ATTENTION=off\n") != std::string::npos);
}

TEST_CASE("a bench result carries each GPU's telemetry (clock, power, limit reasons, energy per call)") {
    rollout::BenchRolloutResult r;
    r.devices = "cuda:0";
    r.calls.resize(4);
    CHECK(r.to_json()["gpu_telemetry"].empty());  // CPU: no GPU sampled
    CHECK(r.table().find("gpu ") == std::string::npos);

    GpuTelemetrySummary g = summarize_gpu_samples({{1700, 2619, 690, 60, kGpuSwPowerCap},
                                                   {1725, 2619, 695, 62, kGpuSwPowerCap},
                                                   {1980, 2619, 300, 58, 0}});
    g.device = "00000000:3B:00.0";
    g.sm_clock_limit_mhz = 1980;
    g.power_limit_w = 700;
    g.energy_j = 2000.0;
    g.seconds = 3.0;
    r.gpu_telemetry = {g};
    const nlohmann::ordered_json j = r.to_json()["gpu_telemetry"][0];
    CHECK(j["device"] == "00000000:3B:00.0");
    CHECK(j["samples"] == 3);
    CHECK(j["sm_clock_mhz"]["median"] == doctest::Approx(1725));
    CHECK(j["sm_clock_mhz"]["limit"] == doctest::Approx(1980));
    CHECK(j["power_w"]["limit"] == doctest::Approx(700));
    CHECK(j["power_capped_fraction"] == doctest::Approx(2.0 / 3.0));
    CHECK(j["energy_j_per_call"] == doctest::Approx(500.0));
    const std::string table = r.table();
    CHECK(table.find("gpu 00000000:3B:00.0 during the timed calls: SM clock median 1725 MHz (1700-1980, max 1980), "
                     "power median 690 W of 700 W, power-capped in 67% of 3 samples") != std::string::npos);
    CHECK(table.find("(500 J per call)") != std::string::npos);

    GpuTelemetrySummary missing;
    missing.device = "00000000:3B:00.0";
    missing.unavailable = "NVML (libnvidia-ml.so.1) not found";
    r.gpu_telemetry = {missing};
    CHECK(r.to_json()["gpu_telemetry"][0]["unavailable"] == "NVML (libnvidia-ml.so.1) not found");
    CHECK(r.table().find("not measured (NVML (libnvidia-ml.so.1) not found)") != std::string::npos);
}

TEST_CASE("GPU samples summarized: medians, extremes, and the share of power-capped and thermal samples") {
    CHECK(summarize_gpu_samples({}).samples == 0);
    CHECK_FALSE(summarize_gpu_samples({}).measured());
    const GpuTelemetrySummary s = summarize_gpu_samples({{1600, 2600, 700, 70, kGpuSwPowerCap | kGpuSwThermal},
                                                         {1700, 2600, 650, 72, kGpuSwPowerCap},
                                                         {1800, 2600, 600, 71, kGpuIdle},
                                                         {1900, 2600, 500, 69, 0}});
    CHECK(s.samples == 4);
    CHECK(s.measured());
    CHECK(s.sm_clock_median_mhz == doctest::Approx(1750));
    CHECK(s.sm_clock_min_mhz == doctest::Approx(1600));
    CHECK(s.sm_clock_max_mhz == doctest::Approx(1900));
    CHECK(s.power_median_w == doctest::Approx(625));
    CHECK(s.power_max_w == doctest::Approx(700));
    CHECK(s.temperature_median_c == doctest::Approx(70.5));
    CHECK(s.temperature_max_c == doctest::Approx(72));
    CHECK(s.power_capped_fraction == doctest::Approx(0.5));
    CHECK(s.thermal_fraction == doctest::Approx(0.25));
    CHECK_FALSE(s.energy_j.has_value());
}

TEST_CASE("GPU telemetry without a GPU or NVML says why, and never throws") {
    GpuTelemetry none({});
    none.start();
    CHECK(none.stop().empty());

    // A PCI bus id no GPU has: NVML missing (this machine) or no device there; either way one clear reason.
    GpuTelemetry bogus({"0000:FF:1F.7"}, 20);
    bogus.start();
    const auto s = bogus.stop();
    REQUIRE(s.size() == 1);
    CHECK(s[0].device == "0000:FF:1F.7");
    CHECK_FALSE(s[0].measured());
    CHECK_FALSE(s[0].unavailable.empty());
    CHECK(s[0].to_json().contains("unavailable"));
}
