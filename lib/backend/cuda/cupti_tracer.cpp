// The profiler's kernel tracer on CUDA (backend/profiler.h): CUPTI activity records of kernels, copies and fills,
// each attributed to the host region that launched it through the launch's correlation id (a callback on every
// runtime and driver API call notes the region of the calling thread). Built only where CUPTI is found.
#include "backend/profiler.h"

#include "backend/backend.h"

#ifdef DZR_HAVE_CUPTI
#include <cupti.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "core/log.h"

namespace dzr {

namespace {

struct Interval {
    uint64_t start, end;
    uint32_t correlation;
};

/// A region instance (Profiler::push_region's).
struct RegionInstance {
    int region = -1;
    int64_t instance = -1;
};

/// The state CUPTI's C callbacks reach (one tracer at a time).
struct TraceState {
    std::mutex mu;
    std::vector<Interval> records;
    std::unordered_map<uint32_t, RegionInstance> region_of;  // correlation id -> region instance
    std::unordered_map<uint32_t, bool> counted_launch;  // correlation id -> issued by a launch-like API call
    RegionInstance region;
    std::atomic<bool> active{false};
};
TraceState* g_state = nullptr;

constexpr size_t kBufferBytes = 8u << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
    *size = kBufferBytes;
    *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
    CUpti_Activity* rec = nullptr;
    if (g_state) {
        std::lock_guard<std::mutex> lock(g_state->mu);
        while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
            switch (rec->kind) {
                case CUPTI_ACTIVITY_KIND_KERNEL:
                case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
                    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
                    g_state->records.push_back({k->start, k->end, k->correlationId});
                    break;
                }
                case CUPTI_ACTIVITY_KIND_MEMCPY: {
                    const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(rec);
                    g_state->records.push_back({m->start, m->end, m->correlationId});
                    break;
                }
                case CUPTI_ACTIVITY_KIND_MEMSET: {
                    const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(rec);
                    g_state->records.push_back({m->start, m->end, m->correlationId});
                    break;
                }
                default: break;
            }
        }
    }
    std::free(buffer);
}

/// True for the API calls that put device work on a stream (kernels, graphs, copies, fills).
bool launch_like(CUpti_CallbackDomain domain, CUpti_CallbackId id, const char* name) {
    (void)domain;
    (void)id;
    if (!name) return false;
    const std::string_view n(name);
    return n.find("Launch") != std::string_view::npos || n.find("Memcpy") != std::string_view::npos ||
           n.find("Memset") != std::string_view::npos;
}

void CUPTIAPI on_api(void*, CUpti_CallbackDomain domain, CUpti_CallbackId id, const void* data) {
    const auto* info = static_cast<const CUpti_CallbackData*>(data);
    if (!g_state || !g_state->active.load(std::memory_order_relaxed) || info->callbackSite != CUPTI_API_ENTER) return;
    std::lock_guard<std::mutex> lock(g_state->mu);
    g_state->region_of[info->correlationId] = g_state->region;
    if (launch_like(domain, id, info->functionName)) g_state->counted_launch[info->correlationId] = true;
}

class CuptiTracer final : public KernelTracer {
public:
    CuptiTracer() {
        DZR_CHECK(g_state == nullptr, "profiler: only one CUPTI kernel tracer at a time");
        g_state = &state_;
        check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks");
        check(cuptiSubscribe(&subscriber_, on_api, nullptr), "cuptiSubscribe");
        check(cuptiEnableDomain(1, subscriber_, CUPTI_CB_DOMAIN_RUNTIME_API), "cuptiEnableDomain(runtime)");
        check(cuptiEnableDomain(1, subscriber_, CUPTI_CB_DOMAIN_DRIVER_API), "cuptiEnableDomain(driver)");
        check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "cuptiActivityEnable(kernel)");
        check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "cuptiActivityEnable(memcpy)");
        check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET), "cuptiActivityEnable(memset)");
        state_.active = true;
    }
    ~CuptiTracer() override {
        state_.active = false;
        cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
        cuptiActivityDisable(CUPTI_ACTIVITY_KIND_MEMCPY);
        cuptiActivityDisable(CUPTI_ACTIVITY_KIND_MEMSET);
        cuptiActivityFlushAll(1);
        cuptiUnsubscribe(subscriber_);
        g_state = nullptr;
    }

    void set_region(int id, int64_t instance) override {
        std::lock_guard<std::mutex> lock(state_.mu);
        state_.region = {id, instance};
    }

    std::map<int, KernelStats> collect() override {
        cuptiActivityFlushAll(1);
        std::vector<Interval> recs;
        std::unordered_map<uint32_t, RegionInstance> region_of;
        std::unordered_map<uint32_t, bool> counted;
        {
            std::lock_guard<std::mutex> lock(state_.mu);
            recs.swap(state_.records);
            region_of.swap(state_.region_of);
            counted.swap(state_.counted_launch);
        }
        std::vector<TracedKernel> kernels;
        kernels.reserve(recs.size());
        for (const Interval& r : recs) {
            const auto it = region_of.find(r.correlation);
            const RegionInstance ri = it == region_of.end() ? RegionInstance{} : it->second;
            kernels.push_back({r.start, r.end, ri.region, ri.instance, r.correlation, counted.count(r.correlation) > 0});
        }
        return kernel_stats(std::move(kernels));
    }

private:
    static void check(CUptiResult r, const char* what) {
        if (r == CUPTI_SUCCESS) return;
        const char* msg = nullptr;
        cuptiGetResultString(r, &msg);
        DZR_THROW("profiler: {} failed: {}", what, msg ? msg : "unknown CUPTI error");
    }

    TraceState state_;
    CUpti_SubscriberHandle subscriber_ = nullptr;
};

}  // namespace

std::unique_ptr<KernelTracer> make_kernel_tracer(const Backend& backend) {
    if (backend.device().is_cpu()) return nullptr;
    try {
        return std::make_unique<CuptiTracer>();
    } catch (const Error& e) {
        log()->warn("{}; profiling without kernel counts", e.what());
        return nullptr;
    }
}

}  // namespace dzr

#else

namespace dzr {
std::unique_ptr<KernelTracer> make_kernel_tracer(const Backend&) { return nullptr; }
}  // namespace dzr

#endif
