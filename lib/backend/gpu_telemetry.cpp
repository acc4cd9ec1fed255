#include "backend/gpu_telemetry.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <type_traits>

#include <fmt/format.h>

namespace dzr {

namespace {

// NVML's C interface as the driver's libnvidia-ml.so.1 exports it (nvml.h; these entry points and types have been
// stable since CUDA 11). Declared here so that no NVML header or stub library is needed to build.
using NvmlReturn = int;  // nvmlReturn_t: 0 is NVML_SUCCESS
using NvmlDevice = struct NvmlDeviceOpaque*;
constexpr NvmlReturn kNvmlSuccess = 0;
constexpr int kNvmlClockSm = 1, kNvmlClockMem = 2;  // nvmlClockType_t
constexpr int kNvmlTemperatureGpu = 0;             // nvmlTemperatureSensors_t

struct Nvml {
    void* lib = nullptr;
    NvmlReturn (*init)() = nullptr;
    NvmlReturn (*shutdown)() = nullptr;
    const char* (*error_string)(NvmlReturn) = nullptr;
    NvmlReturn (*handle_by_pci)(const char*, NvmlDevice*) = nullptr;
    NvmlReturn (*name)(NvmlDevice, char*, unsigned) = nullptr;
    NvmlReturn (*clock)(NvmlDevice, int, unsigned*) = nullptr;
    NvmlReturn (*max_clock)(NvmlDevice, int, unsigned*) = nullptr;
    NvmlReturn (*power)(NvmlDevice, unsigned*) = nullptr;        // milliwatts
    NvmlReturn (*power_limit)(NvmlDevice, unsigned*) = nullptr;  // milliwatts
    NvmlReturn (*temperature)(NvmlDevice, int, unsigned*) = nullptr;
    NvmlReturn (*reasons)(NvmlDevice, unsigned long long*) = nullptr;
    NvmlReturn (*energy)(NvmlDevice, unsigned long long*) = nullptr;  // millijoules since the driver loaded

    /// Loads the library and initializes NVML; the reason it could not, or "".
    std::string open() {
        lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!lib) return "NVML (libnvidia-ml.so.1) not found";
        const auto sym = [&](auto& fn, const char* a, const char* b = nullptr) {
            void* p = dlsym(lib, a);
            if (!p && b) p = dlsym(lib, b);
            fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
            return p != nullptr;
        };
        bool ok = sym(init, "nvmlInit_v2", "nvmlInit") && sym(shutdown, "nvmlShutdown") &&
                  sym(handle_by_pci, "nvmlDeviceGetHandleByPciBusId_v2", "nvmlDeviceGetHandleByPciBusId") &&
                  sym(clock, "nvmlDeviceGetClockInfo") && sym(power, "nvmlDeviceGetPowerUsage");
        // optional ones
        sym(error_string, "nvmlErrorString");
        sym(name, "nvmlDeviceGetName");
        sym(max_clock, "nvmlDeviceGetMaxClockInfo");
        sym(power_limit, "nvmlDeviceGetEnforcedPowerLimit");
        sym(temperature, "nvmlDeviceGetTemperature");
        sym(reasons, "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons");
        sym(energy, "nvmlDeviceGetTotalEnergyConsumption");
        if (!ok) {
            close();
            return "NVML lacks the entry points dzr reads";
        }
        if (const NvmlReturn r = init(); r != kNvmlSuccess) {
            std::string why = fmt::format("nvmlInit failed ({})", error(r));
            shutdown = nullptr;  // nothing to shut down
            close();
            return why;
        }
        return {};
    }
    std::string error(NvmlReturn r) const {
        return error_string ? std::string(error_string(r)) : fmt::format("NVML error {}", r);
    }
    void close() {
        if (shutdown) shutdown();
        if (lib) dlclose(lib);
        *this = Nvml{};
    }
};

double median_of(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

GpuTelemetrySummary summarize_gpu_samples(const std::vector<GpuSample>& samples) {
    GpuTelemetrySummary s;
    s.samples = int(samples.size());
    if (samples.empty()) return s;
    std::vector<double> sm, mem, power, temp;
    int capped = 0, thermal = 0;
    for (const GpuSample& x : samples) {
        sm.push_back(x.sm_clock_mhz);
        mem.push_back(x.mem_clock_mhz);
        power.push_back(x.power_w);
        temp.push_back(x.temperature_c);
        if (x.limit_reasons & kGpuSwPowerCap) ++capped;
        if (x.limit_reasons & (kGpuSwThermal | kGpuHwThermal | kGpuHwSlowdown | kGpuHwPowerBrake)) ++thermal;
    }
    s.sm_clock_median_mhz = median_of(sm);
    s.sm_clock_min_mhz = *std::min_element(sm.begin(), sm.end());
    s.sm_clock_max_mhz = *std::max_element(sm.begin(), sm.end());
    s.mem_clock_median_mhz = median_of(mem);
    s.power_median_w = median_of(power);
    s.power_max_w = *std::max_element(power.begin(), power.end());
    s.temperature_median_c = median_of(temp);
    s.temperature_max_c = *std::max_element(temp.begin(), temp.end());
    s.power_capped_fraction = double(capped) / double(samples.size());
    s.thermal_fraction = double(thermal) / double(samples.size());
    return s;
}

std::optional<double> GpuTelemetrySummary::energy_per_call(int64_t calls) const {
    if (!energy_j || calls <= 0) return std::nullopt;
    return *energy_j / double(calls);
}

nlohmann::ordered_json GpuTelemetrySummary::to_json(int64_t calls) const {
    nlohmann::ordered_json j;
    j["device"] = device;
    if (!name.empty()) j["name"] = name;
    if (!measured()) {
        j["unavailable"] = unavailable.empty() ? "no samples" : unavailable;
        return j;
    }
    j["samples"] = samples;
    j["seconds"] = seconds;
    j["sm_clock_mhz"] = {{"median", sm_clock_median_mhz}, {"min", sm_clock_min_mhz}, {"max", sm_clock_max_mhz},
                         {"limit", sm_clock_limit_mhz}};
    j["mem_clock_mhz_median"] = mem_clock_median_mhz;
    j["power_w"] = {{"median", power_median_w}, {"max", power_max_w}, {"limit", power_limit_w}};
    j["temperature_c"] = {{"median", temperature_median_c}, {"max", temperature_max_c}};
    j["power_capped_fraction"] = power_capped_fraction;
    j["thermal_or_hw_slowdown_fraction"] = thermal_fraction;
    j["energy_j"] = energy_j ? nlohmann::ordered_json(*energy_j) : nullptr;
    if (const auto e = energy_per_call(calls)) j["energy_j_per_call"] = *e;
    return j;
}

std::string GpuTelemetrySummary::line(int64_t calls) const {
    if (!measured()) return fmt::format("{}: not measured ({})", device, unavailable.empty() ? "no samples" : unavailable);
    std::string out = fmt::format("SM clock median {:.0f} MHz ({:.0f}-{:.0f}", sm_clock_median_mhz, sm_clock_min_mhz,
                                  sm_clock_max_mhz);
    if (sm_clock_limit_mhz > 0) out += fmt::format(", max {:.0f}", sm_clock_limit_mhz);
    out += fmt::format("), power median {:.0f} W", power_median_w);
    if (power_limit_w > 0) out += fmt::format(" of {:.0f} W", power_limit_w);
    out += fmt::format(", power-capped in {:.0f}% of {} samples", 100.0 * power_capped_fraction, samples);
    if (thermal_fraction > 0) out += fmt::format(", thermal/hw slowdown in {:.0f}%", 100.0 * thermal_fraction);
    out += fmt::format(", {:.0f} C (max {:.0f})", temperature_median_c, temperature_max_c);
    if (energy_j) out += fmt::format(", {:.1f} kJ in {:.1f} s", *energy_j / 1e3, seconds);
    if (const auto e = energy_per_call(calls)) out += fmt::format(" ({:.0f} J per call)", *e);
    return out;
}

struct GpuTelemetry::Impl {
    std::vector<std::string> ids;
    int period_ms = 100;
    Nvml nvml;
    std::string unavailable;
    std::vector<NvmlDevice> devices;
    std::vector<std::string> names, device_unavailable;
    std::vector<std::vector<GpuSample>> samples;
    std::vector<std::optional<unsigned long long>> energy_start;
    std::chrono::steady_clock::time_point t0;
    std::thread thread;
    std::mutex mutex;
    std::condition_variable wake;
    bool stopping = false;
    bool running = false;

    void sample_all() {
        for (size_t i = 0; i < devices.size(); ++i) {
            if (!devices[i]) continue;
            GpuSample s;
            unsigned v = 0;
            if (nvml.clock(devices[i], kNvmlClockSm, &v) == kNvmlSuccess) s.sm_clock_mhz = v;
            if (nvml.clock(devices[i], kNvmlClockMem, &v) == kNvmlSuccess) s.mem_clock_mhz = v;
            if (nvml.power(devices[i], &v) == kNvmlSuccess) s.power_w = v / 1000.0;
            if (nvml.temperature && nvml.temperature(devices[i], kNvmlTemperatureGpu, &v) == kNvmlSuccess)
                s.temperature_c = v;
            unsigned long long r = 0;
            if (nvml.reasons && nvml.reasons(devices[i], &r) == kNvmlSuccess) s.limit_reasons = r;
            samples[i].push_back(s);
        }
    }
    std::optional<unsigned long long> energy_now(size_t i) const {
        unsigned long long e = 0;
        if (!nvml.energy || !devices[i] || nvml.energy(devices[i], &e) != kNvmlSuccess) return std::nullopt;
        return e;
    }
};

GpuTelemetry::GpuTelemetry(std::vector<std::string> pci_bus_ids, int period_ms) : impl_(std::make_unique<Impl>()) {
    impl_->ids = std::move(pci_bus_ids);
    impl_->period_ms = std::max(10, period_ms);
}

GpuTelemetry::~GpuTelemetry() {
    if (impl_->running) stop();
    impl_->nvml.close();
}

void GpuTelemetry::start() {
    Impl& m = *impl_;
    if (m.running) return;
    const size_t n = m.ids.size();
    m.devices.assign(n, nullptr);
    m.names.assign(n, {});
    m.device_unavailable.assign(n, {});
    m.samples.assign(n, {});
    m.energy_start.assign(n, std::nullopt);
    if (n == 0) {
        m.unavailable = "no GPU";
        return;
    }
    if (!m.nvml.lib) m.unavailable = m.nvml.open();
    if (!m.unavailable.empty()) return;
    for (size_t i = 0; i < n; ++i) {
        NvmlDevice d = nullptr;
        if (const NvmlReturn r = m.nvml.handle_by_pci(m.ids[i].c_str(), &d); r != kNvmlSuccess) {
            m.device_unavailable[i] = fmt::format("NVML has no device at PCI bus id {} ({})", m.ids[i], m.nvml.error(r));
            continue;
        }
        m.devices[i] = d;
        char buf[96] = {0};
        if (m.nvml.name && m.nvml.name(d, buf, sizeof(buf)) == kNvmlSuccess) m.names[i] = buf;
        m.energy_start[i] = m.energy_now(i);
    }
    m.t0 = std::chrono::steady_clock::now();
    m.stopping = false;
    m.running = true;
    m.thread = std::thread([&m] {
        std::unique_lock<std::mutex> lock(m.mutex);
        while (!m.stopping) {
            lock.unlock();
            m.sample_all();
            lock.lock();
            m.wake.wait_for(lock, std::chrono::milliseconds(m.period_ms), [&] { return m.stopping; });
        }
    });
}

std::vector<GpuTelemetrySummary> GpuTelemetry::stop() {
    Impl& m = *impl_;
    const double seconds =
        m.running ? std::chrono::duration<double>(std::chrono::steady_clock::now() - m.t0).count() : 0.0;
    if (m.running) {
        {
            std::lock_guard<std::mutex> lock(m.mutex);
            m.stopping = true;
        }
        m.wake.notify_all();
        m.thread.join();
        m.running = false;
    }
    std::vector<GpuTelemetrySummary> out;
    for (size_t i = 0; i < m.ids.size(); ++i) {
        GpuTelemetrySummary s;
        if (m.unavailable.empty() && i < m.devices.size() && m.devices[i]) {
            s = summarize_gpu_samples(m.samples[i]);
            unsigned v = 0;
            if (m.nvml.max_clock && m.nvml.max_clock(m.devices[i], kNvmlClockSm, &v) == kNvmlSuccess)
                s.sm_clock_limit_mhz = v;
            if (m.nvml.power_limit && m.nvml.power_limit(m.devices[i], &v) == kNvmlSuccess) s.power_limit_w = v / 1000.0;
            const auto e1 = m.energy_now(i);
            if (m.energy_start[i] && e1 && *e1 >= *m.energy_start[i])
                s.energy_j = double(*e1 - *m.energy_start[i]) / 1000.0;
            s.seconds = seconds;
            s.name = m.names[i];
        } else {
            s.unavailable = !m.unavailable.empty()                             ? m.unavailable
                            : i < m.device_unavailable.size() && !m.device_unavailable[i].empty()
                                ? m.device_unavailable[i]
                                : std::string("not started");
        }
        s.device = m.ids[i];
        out.push_back(std::move(s));
    }
    return out;
}

}  // namespace dzr
