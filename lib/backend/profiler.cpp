#include "backend/profiler.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "backend/backend.h"
#include "core/error.h"

namespace dzr {

struct Profiler::OpRecord {
    std::string key;
    int region = -1;
    Event* begin = nullptr;
    Event* end = nullptr;
};

struct Profiler::RegionTotals {
    int64_t calls = 0;  // calls in which the region ran
    int64_t entries = 0;
    int64_t ops = 0;
    double op_ms = 0;
    double op_gap_ms = 0;
    KernelStats kernels;
    bool traced = false;
};

struct Profiler::OpTotals {
    int64_t count = 0;
    double ms = 0;
};

namespace {

void add(KernelStats& a, const KernelStats& b) {
    a.kernels += b.kernels;
    a.launches += b.launches;
    a.instances += b.instances;
    a.kernel_ms += b.kernel_ms;
    a.busy_ms += b.busy_ms;
    a.span_ms += b.span_ms;
    a.gap_ms += b.gap_ms;
}

nlohmann::ordered_json kernel_json(const KernelStats& k, double per) {
    nlohmann::ordered_json j;
    j["kernels"] = double(k.kernels) / per;
    j["launches"] = double(k.launches) / per;
    j["kernel_ms"] = k.kernel_ms / per;
    j["busy_ms"] = k.busy_ms / per;
    j["span_ms"] = k.span_ms / per;
    j["kernel_gap_ms"] = k.gap_ms / per;
    j["instances"] = double(k.instances) / per;
    return j;
}

/// Merged [start, end) intervals, sorted.
using Intervals = std::vector<std::pair<uint64_t, uint64_t>>;

Intervals merged(const std::vector<TracedKernel>& sorted) {
    Intervals out;
    for (const TracedKernel& k : sorted) {
        if (!out.empty() && k.start <= out.back().second)
            out.back().second = std::max(out.back().second, k.end);
        else
            out.emplace_back(k.start, k.end);
    }
    return out;
}

/// Length of [s, e) covered by the merged intervals.
uint64_t covered(const Intervals& busy, uint64_t s, uint64_t e) {
    uint64_t n = 0;
    auto it = std::lower_bound(busy.begin(), busy.end(), s,
                               [](const std::pair<uint64_t, uint64_t>& iv, uint64_t v) { return iv.second < v; });
    for (; it != busy.end() && it->first < e; ++it) n += std::min(e, it->second) - std::max(s, it->first);
    return n;
}

}  // namespace

std::map<int, KernelStats> kernel_stats(std::vector<TracedKernel> kernels) {
    std::sort(kernels.begin(), kernels.end(),
              [](const TracedKernel& a, const TracedKernel& b) { return a.start < b.start; });
    const Intervals device_busy = merged(kernels);  // any region's kernels: what "idle" is measured against
    std::map<std::pair<int, int64_t>, std::vector<TracedKernel>> by_instance;
    for (const TracedKernel& k : kernels) by_instance[{k.region, k.instance}].push_back(k);
    std::map<int, KernelStats> out;
    std::map<int, std::set<uint32_t>> launches;
    for (const auto& [key, v] : by_instance) {
        KernelStats& s = out[key.first];
        ++s.instances;
        s.kernels += int64_t(v.size());
        uint64_t first = v.front().start, last = 0, own_busy = 0;
        for (const TracedKernel& k : v) {
            s.kernel_ms += double(k.end - k.start) * 1e-6;
            if (k.counted_launch) launches[key.first].insert(k.correlation);
            last = std::max(last, k.end);
        }
        for (const auto& iv : merged(v)) own_busy += iv.second - iv.first;
        s.busy_ms += double(own_busy) * 1e-6;
        s.span_ms += double(last - first) * 1e-6;
        s.gap_ms += double((last - first) - covered(device_busy, first, last)) * 1e-6;
    }
    for (auto& [region, s] : out) s.launches = int64_t(launches[region].size());
    return out;
}

Profiler::Profiler(Stream& stream, std::unique_ptr<KernelTracer> tracer, bool time_ops)
    : stream_(stream), tracer_(std::move(tracer)), time_ops_(time_ops) {}

Profiler::~Profiler() = default;

void Profiler::push_region(std::string_view name) {
    std::string full = stack_.empty() ? std::string(name) : fmt::format("{}.{}", stack_.back(), name);
    auto [it, inserted] = region_ids_.try_emplace(full, int(region_names_.size()));
    if (inserted) {
        region_names_.push_back(full);
        region_entries_.push_back(0);
    }
    ++region_entries_[size_t(it->second)];
    stack_.push_back(std::move(full));
    instance_stack_.push_back(next_instance_++);
    if (tracer_) tracer_->set_region(it->second, instance_stack_.back());
}

void Profiler::pop_region() {
    DZR_CHECK(!stack_.empty(), "profiler: pop_region without a region");
    stack_.pop_back();
    instance_stack_.pop_back();
    if (!tracer_) return;
    if (stack_.empty())
        tracer_->set_region(-1, -1);
    else
        tracer_->set_region(region_ids_.at(stack_.back()), instance_stack_.back());
}

Event& Profiler::next_event() {
    // NOTE: the pool grows during the first profiled call (event creation may allocate) and is reused after
    if (next_event_ == events_.size()) events_.push_back(stream_.make_event());
    return *events_[next_event_++];
}

void Profiler::begin_op(std::string key) {
    if (!time_ops_) return;
    DZR_CHECK(open_op_ < 0, "profiler: op '{}' begins inside op '{}'", key, ops_[size_t(open_op_)].key);
    OpRecord r;
    r.key = std::move(key);
    if (stack_.empty()) {
        // NOTE: ops outside every region are kept under "(none)"
        auto [it, inserted] = region_ids_.try_emplace("(none)", int(region_names_.size()));
        if (inserted) {
            region_names_.push_back("(none)");
            region_entries_.push_back(0);
        }
        r.region = it->second;
    } else {
        r.region = region_ids_.at(stack_.back());
    }
    r.begin = &next_event();
    stream_.record(*r.begin);
    open_op_ = int(ops_.size());
    ops_.push_back(std::move(r));
}

void Profiler::end_op() {
    if (!time_ops_) return;
    DZR_CHECK(open_op_ >= 0, "profiler: end_op without begin_op");
    OpRecord& r = ops_[size_t(open_op_)];
    r.end = &next_event();
    stream_.record(*r.end);
    open_op_ = -1;
}

void Profiler::end_call() {
    stream_.synchronize();
    std::map<int, KernelStats> kstats;
    if (tracer_) kstats = tracer_->collect();

    struct Acc {
        int64_t ops = 0;
        double op_ms = 0, gap_ms = 0;
        std::map<std::string, OpTotals> by_key;
    };
    std::map<int, Acc> acc;
    const OpRecord* prev = nullptr;
    for (const OpRecord& r : ops_) {
        if (!r.end) continue;
        Acc& a = acc[r.region];
        const double ms = stream_.elapsed_ms(*r.begin, *r.end);
        ++a.ops;
        a.op_ms += ms;
        OpTotals& t = a.by_key[r.key];
        ++t.count;
        t.ms += ms;
        if (prev) a.gap_ms += std::max(0.0, stream_.elapsed_ms(*prev->end, *r.begin));
        prev = &r;
    }

    nlohmann::ordered_json call;
    call["call"] = calls_done_;
    nlohmann::ordered_json regions = nlohmann::ordered_json::object();
    for (size_t id = 0; id < region_names_.size(); ++id) {
        const int64_t entries = region_entries_[id];
        const auto a = acc.find(int(id));
        const auto k = kstats.find(int(id));
        if (entries == 0 && a == acc.end() && k == kstats.end()) continue;
        const std::string& name = region_names_[id];
        nlohmann::ordered_json j;
        j["entries"] = entries;
        RegionTotals& tot = totals_[name];
        ++tot.calls;
        tot.entries += entries;
        if (a != acc.end()) {
            j["ops"] = a->second.ops;
            j["op_ms"] = a->second.op_ms;
            j["op_gap_ms"] = a->second.gap_ms;
            tot.ops += a->second.ops;
            tot.op_ms += a->second.op_ms;
            tot.op_gap_ms += a->second.gap_ms;
            auto& ops = op_totals_[name];
            for (const auto& [key, t] : a->second.by_key) {
                ops[key].count += t.count;
                ops[key].ms += t.ms;
            }
        }
        if (k != kstats.end()) {
            j["device"] = kernel_json(k->second, 1.0);
            add(tot.kernels, k->second);
            tot.traced = true;
        }
        regions[name] = std::move(j);
    }
    call["regions"] = std::move(regions);
    calls_.push_back(std::move(call));

    ops_.clear();
    next_event_ = 0;
    std::fill(region_entries_.begin(), region_entries_.end(), 0);
    ++calls_done_;
}

std::vector<std::pair<std::string, Profiler::OpTotals>> Profiler::by_time(const std::map<std::string, OpTotals>& ops) {
    std::vector<std::pair<std::string, OpTotals>> sorted(ops.begin(), ops.end());
    std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
    return sorted;
}

void Profiler::reset() {
    calls_ = nlohmann::ordered_json::array();
    totals_.clear();
    op_totals_.clear();
    calls_done_ = 0;
}

nlohmann::ordered_json Profiler::to_json() const {
    nlohmann::ordered_json j;
    j["calls_profiled"] = calls_done_;
    j["kernel_tracer"] = tracer_ != nullptr;
    j["ops_timed"] = time_ops_;
    j["note"] =
        "op_ms: device time between the events around each backend op; op_gap_ms: device time between one op's end "
        "and the next op's start (the device waiting for the host); per_entry: divided by the region's entries "
        "(one entry = one forward for the DiT regions); device: CUPTI kernel records (kernels, host launches, "
        "kernel time, busy time, and the device idle inside each region instance's span, summed over the instances: "
        "per_entry gives the mean per instance)";
    nlohmann::ordered_json regions = nlohmann::ordered_json::object();
    for (const auto& [name, t] : totals_) {
        nlohmann::ordered_json r;
        r["calls"] = t.calls;
        r["entries"] = t.entries;
        const double per = t.entries > 0 ? double(t.entries) : 1.0;
        r["ops"] = t.ops;
        r["op_ms"] = t.op_ms;
        r["op_gap_ms"] = t.op_gap_ms;
        nlohmann::ordered_json pe;
        pe["ops"] = double(t.ops) / per;
        pe["op_ms"] = t.op_ms / per;
        pe["op_gap_ms"] = t.op_gap_ms / per;
        if (t.traced) pe["device"] = kernel_json(t.kernels, per);
        r["per_entry"] = std::move(pe);
        if (t.traced) r["device"] = kernel_json(t.kernels, 1.0);
        const auto ops = op_totals_.find(name);
        if (ops != op_totals_.end()) {
            const auto sorted = by_time(ops->second);
            nlohmann::ordered_json list = nlohmann::ordered_json::array();
            for (const auto& [key, o] : sorted)
                list.push_back({{"op", key}, {"count", o.count}, {"ms", o.ms}, {"ms_per_entry", o.ms / per}});
            r["ops_by_time"] = std::move(list);
        }
        regions[name] = std::move(r);
    }
    j["totals"] = std::move(regions);
    j["calls"] = calls_;
    return j;
}

std::string Profiler::table(int top_ops) const {
    std::string s = fmt::format("profile over {} calls (per entry = per forward for the DiT regions){}\n", calls_done_,
                                time_ops_ ? "" : "; ops untimed (CUDA graphs replayed): kernels and launches only");
    s += fmt::format("{:<28} {:>8} {:>9} {:>11} {:>11} {:>9} {:>9} {:>11}\n", "region", "entries", "ops/ent",
                     "op ms/ent", "gap ms/ent", "kern/ent", "launch/e", "kgap ms/ent");
    for (const auto& [name, t] : totals_) {
        const double per = t.entries > 0 ? double(t.entries) : 1.0;
        s += fmt::format("{:<28} {:>8} {:>9.1f} {:>11.3f} {:>11.3f}", name, t.entries, double(t.ops) / per,
                         t.op_ms / per, t.op_gap_ms / per);
        if (t.traced)
            s += fmt::format(" {:>9.1f} {:>9.1f} {:>11.3f}\n", double(t.kernels.kernels) / per,
                             double(t.kernels.launches) / per, t.kernels.gap_ms / per);
        else
            s += fmt::format(" {:>9} {:>9} {:>11}\n", "-", "-", "-");
    }
    for (const auto& [name, ops] : op_totals_) {
        const auto t = totals_.find(name);
        const double per = t != totals_.end() && t->second.entries > 0 ? double(t->second.entries) : 1.0;
        const auto sorted = by_time(ops);
        s += fmt::format("-- {}: top ops by time (ms per entry, calls per entry)\n", name);
        for (int i = 0; i < int(sorted.size()) && i < top_ops; ++i)
            s += fmt::format("   {:>9.3f} ms {:>7.1f}x  {}\n", sorted[size_t(i)].second.ms / per,
                             double(sorted[size_t(i)].second.count) / per, sorted[size_t(i)].first);
    }
    return s;
}

#ifndef DZR_HAVE_CUDA
std::unique_ptr<KernelTracer> make_kernel_tracer(const Backend&) { return nullptr; }
#endif

ProfileScope::ProfileScope(Backend& be, std::string_view name) : profiler_(be.profiler()) {
    if (profiler_) profiler_->push_region(name);
}

ProfileScope::~ProfileScope() {
    if (profiler_) profiler_->pop_region();
}

}  // namespace dzr
