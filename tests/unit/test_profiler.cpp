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
    for (const char* not_backend : {"device", "alloc", "workspace", "reserve_workspace", "memory_in_use",
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
