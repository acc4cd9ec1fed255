// The profiling mode (backend/profiler.h, backend/profiling_backend.h) on the CPU: regions nest by name, ops are
// counted per region and per op key, reset() drops earlier calls, and the profiling backend forwards every op the
// Backend interface declares (a missing forward would run the base implementation on the wrapper instead).
#include <doctest/doctest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "backend/backend.h"
#include "backend/profiler.h"
#include "backend/profiling_backend.h"
#include "support/test_support.h"

using namespace dzr;

namespace {

/// The names after `virtual ... name(` (and `override` names) in a header of lib/backend.
std::set<std::string> virtual_names(const std::string& header, bool overrides) {
    std::ifstream in(test::source_dir() / "lib" / "backend" / header);
    REQUIRE(in.good());
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    std::set<std::string> names;
    const std::regex decl(overrides ? R"((\w+)\s*\([^;{]*\)\s*(const\s*)?override)"
                                    : R"(virtual\s+[\w:<>&\s]+?[\s&*](\w+)\s*\()");
    for (auto it = std::sregex_iterator(text.begin(), text.end(), decl); it != std::sregex_iterator(); ++it)
        names.insert((*it)[1]);
    return names;
}

}  // namespace

TEST_CASE("the profiling backend forwards every op the Backend interface declares") {
    std::set<std::string> declared = virtual_names("backend.h", false);
    // DeviceContext, Stream, Event and Graph members (other classes of backend.h), and the profiler accessor itself
    for (const char* not_backend : {"device", "alloc", "alloc_pinned", "copy_pinned", "workspace", "reserve_workspace", "memory_in_use", "memory_free", "pci_bus_id",
                                    "capabilities", "launch", "upload", "download", "synchronize", "make_event",
                                    "record", "wait", "elapsed_ms", "begin_capture", "end_capture", "abort_capture",
                                    "capturing", "profiler"})
        declared.erase(not_backend);
    const std::set<std::string> forwarded = virtual_names("profiling_backend.h", true);
    for (const std::string& op : declared) {
        CAPTURE(op);
        CHECK(forwarded.count(op) == 1);
    }
    CHECK(declared.size() > 20);  // the regex found the interface
}

TEST_CASE("the profiler counts ops per nested region and per op key, and reset drops the calls so far") {
    ProfilingBackend be(make_cpu_backend(size_t(1) << 20));
    Tensor a = be.alloc(Shape{4, 8}, DType::F32), b = be.alloc(Shape{4, 8}, DType::F32);
    Profiler& p = *be.profiler();
    for (int call = 0; call < 2; ++call) {
        {
            ProfileScope outer(be, "denoise");
            be.add(a, b, a);
            for (int f = 0; f < 3; ++f) {
                ProfileScope inner(be, "forward");
                be.mul(a, b, a);
                be.scale({2.0f, 1.0f}, a, a);
            }
        }
        be.fill(b, 1.0f);  // outside every region
        p.end_call();
        if (call == 0) p.reset();
    }
    const auto j = p.to_json();
    CHECK(j["calls_profiled"].get<int64_t>() == 1);
    const auto& t = j["totals"];
    CHECK(t["denoise"]["entries"].get<int64_t>() == 1);
    CHECK(t["denoise"]["ops"].get<int64_t>() == 1);
    CHECK(t["denoise.forward"]["entries"].get<int64_t>() == 3);
    CHECK(t["denoise.forward"]["ops"].get<int64_t>() == 6);
    CHECK(t["denoise.forward"]["per_entry"]["ops"].get<double>() == doctest::Approx(2.0));
    CHECK(t["(none)"]["ops"].get<int64_t>() == 1);
    std::set<std::string> keys;
    for (const auto& op : t["denoise.forward"]["ops_by_time"]) {
        keys.insert(op["op"].get<std::string>());
        CHECK(op["count"].get<int64_t>() == 3);
    }
    CHECK(keys == std::set<std::string>{"mul f32[4,8] f32[4,8]", "scale f32[4,8]"});
    CHECK(p.table().find("denoise.forward") != std::string::npos);
}

TEST_CASE("kernel gaps are per region instance, so interleaved regions do not count each other's kernels as idle") {
    // Two CFG branches' forwards interleaved step by step on one stream (times in ns): cond [0, 10), uncond [10, 30),
    // cond [30, 40) with a 5 ns idle gap inside it, uncond [45, 60). Region-wide spans would call uncond's 20 ns
    // inside cond's span idle; per instance, the only idle time is the 5 ns gap and the 5 ns between instances
    // belongs to no instance.
    const int cond = 0, uncond = 1;
    std::vector<TracedKernel> k = {
        {0, 4, cond, 0, 1, true},      {4, 10, cond, 0, 2, true},      {10, 30, uncond, 1, 3, true},
        {30, 33, cond, 2, 4, true},    {38, 40, cond, 2, 5, true},     {45, 50, uncond, 3, 6, true},
        {50, 60, uncond, 3, 6, false},  // a second kernel of launch 6 (a graph): one launch
    };
    const std::map<int, KernelStats> s = kernel_stats(k);
    REQUIRE(s.size() == 2);
    const KernelStats& c = s.at(cond);
    CHECK(c.instances == 2);
    CHECK(c.kernels == 4);
    CHECK(c.launches == 4);
    CHECK(c.span_ms == doctest::Approx((10 + 10) * 1e-6));
    CHECK(c.busy_ms == doctest::Approx((10 + 5) * 1e-6));
    CHECK(c.gap_ms == doctest::Approx(5e-6));
    const KernelStats& u = s.at(uncond);
    CHECK(u.instances == 2);
    CHECK(u.kernels == 3);
    CHECK(u.launches == 2);
    CHECK(u.span_ms == doctest::Approx((20 + 15) * 1e-6));
    CHECK(u.gap_ms == doctest::Approx(0.0));
    // a parent instance's span covers its children's kernels: their time is busy, not idle
    const std::map<int, KernelStats> nested =
        kernel_stats({{0, 10, 2, 7, 1, true}, {10, 20, 3, 8, 2, true}, {20, 25, 2, 7, 3, true}});
    CHECK(nested.at(2).span_ms == doctest::Approx(25e-6));
    CHECK(nested.at(2).gap_ms == doctest::Approx(0.0));
}

TEST_CASE("a profiler that leaves the ops untimed keeps its regions and records no op (CUDA graphs may replay)") {
    ProfilingBackend be(make_cpu_backend(size_t(1) << 20), /*time_ops=*/false);
    Tensor a = be.alloc(Shape{4, 8}, DType::F32), b = be.alloc(Shape{4, 8}, DType::F32);
    Profiler& p = *be.profiler();
    CHECK_FALSE(p.ops_timed());
    {
        ProfileScope region(be, "denoise");
        be.copy(a.view(), b.view());
        be.fill(b.view(), 1.0f);
    }
    p.end_call();
    const nlohmann::ordered_json j = p.to_json();
    CHECK(j["ops_timed"] == false);
    CHECK(j["totals"]["denoise"]["entries"] == 1);
    CHECK(j["totals"]["denoise"]["ops"] == 0);
    CHECK_FALSE(j["totals"]["denoise"].contains("ops_by_time"));
    CHECK(p.table().find("ops untimed") != std::string::npos);
    // the ops still ran on the wrapped backend
    CHECK(b.ptr<float>()[0] == 1.0f);
}
