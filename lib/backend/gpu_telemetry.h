#pragma once
/// What the GPU did while a benchmark ran: SM clock, power, temperature, the driver's clock-limit reasons and the
/// energy used, sampled through NVML (loaded at run time from the driver's libnvidia-ml.so.1, so nothing is needed at
/// build time and a machine without it simply reports the telemetry as unavailable).
///
/// Why: a sustained DiT rollout on an H200 runs at the board's power cap, where the SM clock (and so every time a
/// bench reports) differs by a few percent between machines of the same kind and with the chip's temperature. A
/// time means little without the clock it ran at (docs/PERF.md, "The sustained rollout is power-capped").
///
/// Sampling runs on a thread of its own every `period_ms` between start() and stop(); the device work is not touched.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dzr {

/// One NVML reading of one GPU.
struct GpuSample {
    double sm_clock_mhz = 0;
    double mem_clock_mhz = 0;
    double power_w = 0;
    double temperature_c = 0;
    uint64_t limit_reasons = 0;  ///< nvmlClocksEventReasons bits (0x4 software power cap, 0x20/0x40 thermal, ...)
};

/// The driver's clock-limit reason bits dzr names.
enum GpuLimitReason : uint64_t {
    kGpuIdle = 0x1,
    kGpuSwPowerCap = 0x4,
    kGpuHwSlowdown = 0x8,
    kGpuSwThermal = 0x20,
    kGpuHwThermal = 0x40,
    kGpuHwPowerBrake = 0x80,
};

/// A GPU's samples over one stretch of work, summarized.
struct GpuTelemetrySummary {
    std::string device;       ///< the PCI bus id sampled ("00000000:3B:00.0")
    std::string name;         ///< the GPU's name as NVML reports it
    std::string unavailable;  ///< why nothing was measured (empty when measured)
    int samples = 0;
    double sm_clock_median_mhz = 0, sm_clock_min_mhz = 0, sm_clock_max_mhz = 0;
    double sm_clock_limit_mhz = 0;  ///< the GPU's maximum SM clock
    double mem_clock_median_mhz = 0;
    double power_median_w = 0, power_max_w = 0;
    double power_limit_w = 0;  ///< the enforced power limit
    double temperature_median_c = 0, temperature_max_c = 0;
    double power_capped_fraction = 0;  ///< samples with the software power cap among the limit reasons
    double thermal_fraction = 0;       ///< samples with a thermal or hardware slowdown reason
    std::optional<double> energy_j;    ///< energy used between start() and stop() (where the GPU reports it)
    double seconds = 0;                ///< start() to stop()

    bool measured() const { return unavailable.empty() && samples > 0; }
    /// `calls`: the calls the samples cover; when positive (and the energy was read), "energy_j_per_call" too.
    nlohmann::ordered_json to_json(int64_t calls = 0) const;
    /// One line for a report: "SM clock median 1710 MHz (1665-1725, max 1980), power 691 W of 700 W, power-capped in
    /// 98% of samples, 63 C (max 66), 1.0 kJ in 23.7 s" and, with `calls` positive, " (779 J per call)".
    std::string line(int64_t calls = 0) const;
    /// The energy per call over `calls` calls, where the energy was read and calls is positive.
    std::optional<double> energy_per_call(int64_t calls) const;
};

/// `samples` summarized (the limits and the energy come from the caller: they are not per sample).
GpuTelemetrySummary summarize_gpu_samples(const std::vector<GpuSample>& samples);

/// Samples the GPUs with the given PCI bus ids from start() to stop().
class GpuTelemetry {
public:
    explicit GpuTelemetry(std::vector<std::string> pci_bus_ids, int period_ms = 100);
    ~GpuTelemetry();
    GpuTelemetry(const GpuTelemetry&) = delete;
    GpuTelemetry& operator=(const GpuTelemetry&) = delete;

    /// Begins sampling (a no-op where NVML or a device is unavailable: stop() then says why).
    void start();
    /// Ends sampling: one summary per PCI bus id, in the constructor's order.
    std::vector<GpuTelemetrySummary> stop();

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace dzr
