#pragma once
/// Where a forward's time goes: the profiling mode of `dzr rollout --profile` and `dzr bench rollout --profile`.
///
/// A Profiler attached to a backend (Backend::attach_profiler) brackets every op with two stream events (the ops'
/// bracket, backend_ops.cpp); it keeps those records and, once per call (end_call, after the device has caught up),
/// turns them into
///  - per region (a named stretch of work: "denoise.cond", "commit.uncond", "vae_encode", ...): how many times it
///    ran, its ops, the device time inside ops, the idle time between consecutive ops (the device waiting for the
///    host), and, where a KernelTracer exists (CUPTI), its kernels, host launches and the idle gaps between kernels;
///  - per op kind and shape ("gemm bf16 [1785,5120]x[5120,5120]"), within each region kind: calls and time.
/// Regions nest by name ("denoise.cond" inside "denoise"); an op belongs to the innermost open region.
/// Profiling adds two event records per op and host work per op: timings are for finding where time goes,
/// not for the headline numbers (those come from an unprofiled `dzr bench rollout`).
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace dzr {

class Backend;
class Event;
class Stream;

/// What a kernel tracer (CUPTI) saw in one region over one call.
/// Spans and gaps are per region instance (one entry of the region: one forward), summed over the instances, so
/// regions that interleave (the CFG branches' forwards, step by step) do not count each other's time as idle.
struct KernelStats {
    int64_t kernels = 0;    ///< kernels (and memcpy/memset) executed
    int64_t launches = 0;   ///< host launch calls that issued them (a graph launch counts once)
    int64_t instances = 0;  ///< region instances that ran kernels
    double kernel_ms = 0;   ///< sum of kernel durations
    double busy_ms = 0;     ///< per instance, the union of its kernels' intervals; summed
    double span_ms = 0;     ///< per instance, its first kernel's start to its last kernel's end; summed
    double gap_ms = 0;      ///< per instance, the device idle inside its span (no kernel of any region running); summed
};

/// One traced kernel (or copy, fill): device times in ns, the region instance that launched it.
struct TracedKernel {
    uint64_t start = 0, end = 0;
    int region = -1;
    int64_t instance = -1;
    uint32_t correlation = 0;  ///< the launch's correlation id (a graph's kernels share one)
    bool counted_launch = false;  ///< issued by a launch-like API call
};

/// The KernelStats of every region in `kernels` (any order).
std::map<int, KernelStats> kernel_stats(std::vector<TracedKernel> kernels);

/// Device-side kernel tracing, attributed to host regions (backend/cuda/cupti_tracer.cpp).
class KernelTracer {
public:
    virtual ~KernelTracer() = default;
    /// Work launched by this thread from now on belongs to instance `instance` of region `id` (-1: none).
    virtual void set_region(int id, int64_t instance) = 0;
    /// After a device synchronize: the stats of every region id seen since the last collect.
    virtual std::map<int, KernelStats> collect() = 0;
};

/// A tracer for the device of `backend` where one is built in (CUPTI), else null. Only one may exist at a time.
std::unique_ptr<KernelTracer> make_kernel_tracer(const Backend& backend);

class Profiler {
public:
    /// stream: where op events are recorded (the wrapped backend's); tracer: optional; time_ops false: begin_op and
    /// end_op record nothing (regions and the tracer only, so CUDA graphs may run: policy/forward_graphs.h).
    Profiler(Stream& stream, std::unique_ptr<KernelTracer> tracer, bool time_ops = true);
    ~Profiler();
    Profiler(const Profiler&) = delete;
    Profiler& operator=(const Profiler&) = delete;

    /// Opens a region named `name` inside the current one ("denoise" + "cond" -> "denoise.cond").
    void push_region(std::string_view name);
    void pop_region();

    /// Brackets of one op: begin_op before it is queued, end_op after. `key`: its kind and shapes.
    void begin_op(std::string key);
    void end_op();

    /// Waits for the device, turns this call's records into its breakdown and adds them to the totals.
    void end_call();
    /// Forgets the calls so far (e.g. the warm-up's); regions keep their ids.
    void reset();

    /// The per-call breakdowns and the totals over all calls (regions and ops), as JSON.
    nlohmann::ordered_json to_json() const;
    /// The totals as a table: regions, then the top ops of each region kind by time.
    std::string table(int top_ops = 12) const;
    bool has_tracer() const { return tracer_ != nullptr; }
    /// True when every op is timed with events (a forward must then run op by op, not as a graph replay).
    bool ops_timed() const { return time_ops_; }

private:
    struct OpRecord;
    struct RegionTotals;
    struct OpTotals;
    Event& next_event();
    /// An op-key map's entries, longest total time first.
    static std::vector<std::pair<std::string, OpTotals>> by_time(const std::map<std::string, OpTotals>& ops);

    Stream& stream_;
    std::unique_ptr<KernelTracer> tracer_;
    bool time_ops_ = true;
    std::vector<std::unique_ptr<Event>> events_;  // a pool reused every call
    size_t next_event_ = 0;
    std::vector<OpRecord> ops_;                   // this call's
    std::vector<std::string> stack_;              // open region names (full)
    std::vector<int64_t> instance_stack_;         // their instances (numbered over the profiler's life)
    int64_t next_instance_ = 0;
    std::map<std::string, int> region_ids_;       // full name -> id (stable over calls)
    std::vector<std::string> region_names_;
    std::vector<int64_t> region_entries_;         // this call's entries per id
    int open_op_ = -1;
    nlohmann::ordered_json calls_ = nlohmann::ordered_json::array();
    std::map<std::string, RegionTotals> totals_;
    std::map<std::string, std::map<std::string, OpTotals>> op_totals_;  // region kind -> op key -> totals
    int64_t calls_done_ = 0;
};

/// Opens a region on `be`'s profiler for its lifetime; does nothing when `be` is not profiled.
class ProfileScope {
public:
    ProfileScope(Backend& be, std::string_view name);
    ~ProfileScope();
    ProfileScope(const ProfileScope&) = delete;
    ProfileScope& operator=(const ProfileScope&) = delete;

private:
    Profiler* profiler_;
};

}  // namespace dzr
