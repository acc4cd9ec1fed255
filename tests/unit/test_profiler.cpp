// The profiling mode (backend/profiler.h) on the CPU: regions nest by name, ops are counted per region and
// per op key, reset() drops earlier calls, an op's own inner ops are part of it, and every op the Backend
// interface declares runs in the bracket (backend_ops.cpp) that profiling and workspace planning rely on.
#include <doctest/doctest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "backend/backend.h"
#include "backend/measuring_backend.h"
#include "backend/profiler.h"
#include "support/test_support.h"

using namespace dzr;

namespace {

/// The names matched by `pattern`'s first group in a file of lib/backend.
std::set<std::string> names_in(const std::string& file, const std::string& pattern) {
    std::ifstream in(test::source_dir() / "lib" / "backend" / file);
    REQUIRE(in.good());
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    std::set<std::string> names;
    const std::regex decl(pattern);
    for (auto it = std::sregex_iterator(text.begin(), text.end(), decl); it != std::sregex_iterator(); ++it)
        names.insert((*it)[1]);
    return names;
}

/// A profiled CPU backend with a 1 MiB workspace.
std::unique_ptr<Backend> profiled_cpu(bool time_ops = true) {
    std::unique_ptr<Backend> be = make_cpu_backend(size_t(1) << 20);
    be->attach_profiler(time_ops);
    return be;
}

}  // namespace

TEST_CASE("every op the Backend interface declares runs in the ops' bracket") {
    const std::set<std::string> implemented = names_in("backend.h", R"(virtual\s+void\s+do_(\w+)\s*\()");
    const std::set<std::string> bracketed = names_in("backend_ops.cpp", R"(void\s+Backend::(\w+)\s*\()");
    CHECK(implemented.size() > 20);  // the regex found the interface
    for (const std::string& op : implemented) {
        CAPTURE(op);
        CHECK(bracketed.count(op) == 1);
    }
}

TEST_CASE("an op that a backend runs as other ops is recorded once, under its own key") {
    // the CPU runs ada_layer_norm as layer_norm, scale, mul and add: the profile holds the op the caller
    // asked for
    std::unique_ptr<Backend> be = profiled_cpu();
    Tensor x = be->alloc(Shape{4, 8}, DType::F32), out = be->alloc(Shape{4, 8}, DType::F32);
    Tensor w = be->alloc(Shape{8}, DType::F32), mod = be->alloc(Shape{1, 8}, DType::F32);
    be->ada_layer_norm({}, x, w, w, mod, mod, out);
    Profiler& p = *be->profiler();
    p.end_call();
    const auto t = p.to_json()["totals"]["(none)"];
    CHECK(t["ops"].get<int64_t>() == 1);
    REQUIRE(t["ops_by_time"].size() == 1);
    CHECK(t["ops_by_time"][0]["op"].get<std::string>() == "ada_layer_norm f32[4,8] affine mod");
}

TEST_CASE("a measuring backend skips the plain ops and runs a fused op's composition for its scratch") {
    std::unique_ptr<Backend> cpu = make_cpu_backend(size_t(1) << 20);
    MeasuringBackend m(DType::F32, cpu.get());
    // fake addresses: computing anything here would fault
    Tensor x = m.alloc(Shape{4, 8}, DType::F32), out = m.alloc(Shape{4, 8}, DType::F32);
    Tensor q = m.alloc(Shape{4, 8}, DType::F8_E4M3), scales = m.alloc(Shape{4}, DType::F32);
    m.gemm({}, x, x, {}, out);
    m.layer_norm({}, x, {}, {}, out);
    CHECK(m.workspace().high_water() == 0);
    // the base composition: the normalized rows in the workspace, then quantize_fp8
    m.ada_layer_norm_fp8({}, x, {}, {}, {}, {}, q, scales);
    CHECK(m.workspace().high_water() >= size_t(4 * 8 * 4));
    CHECK(m.workspace().used() == 0);
}

TEST_CASE("the profiler counts ops per nested region and per op key, and reset drops the calls so far") {
    std::unique_ptr<Backend> owned = profiled_cpu();
    Backend& be = *owned;
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
    std::unique_ptr<Backend> owned = profiled_cpu(/*time_ops=*/false);
    Backend& be = *owned;
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
    // the ops still ran
    CHECK(b.ptr<float>()[0] == 1.0f);
}
