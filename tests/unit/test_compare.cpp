// `dzr compare` on output directories made by hand: identical runs pass, one drifting value fails naming its
// episode and call, tolerances at their edges, missing/extra/unfinished episodes, settings and environment
// differences, metrics and timing, runs that cannot be compared, and the JSON and JUnit reports (JUnit parsed by
// Python's XML parser, as a CI system would).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "io/atomic_file.h"
#include "io/npy.h"
#include "io/result_writer.h"
#include "rollout/compare.h"
#include "rollout/reports.h"
#include "support/cli.h"
#include "support/test_support.h"

using namespace dzr;
using namespace dzr::rollout;
using dzr::test::contains;
using dzr::test::TempDir;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kCalls = 3, kSteps = 24, kDims = 8;

struct EpisodeSpec {
    std::vector<float> actions = std::vector<float>(size_t(kCalls * kSteps * kDims), 0.25f);
    int64_t dims = kDims;
    double mse = 0.5;
    int seed = 0;
    std::string checkpoint_sha = "aaaa";
    std::vector<double> call_ms = {1000.0, 1000.0, 1000.0};
    bool done = true;
};

float& at(EpisodeSpec& s, int64_t call, int64_t step, int64_t dim) {
    return s.actions[size_t((call * kSteps + step) * s.dims + dim)];
}

Json fingerprint(const EpisodeSpec& s) {
    return Json{{"dzr_version", "0.1 (abc)"},
                {"checkpoint", {{"shards", {{{"name", "model.safetensors"}, {"header_sha256", s.checkpoint_sha}}}}}},
                {"run", {{"sampling", {{"cfg_scale", 5.0}}}}},
                {"seed", s.seed},
                {"numerics", {{"backend", "cpu"}, {"blas_core", "haswell"}}},
                {"episode", {{"num_frames", 48}, {"prompt", "pick"}}}};
}

void write_episode(const fs::path& dir, const EpisodeSpec& s) {
    io::ResultWriter w(dir);
    io::write_npy_f32(dir / "actions.npy", {kCalls, kSteps, s.dims}, s.actions);
    Metrics m;
    m.overall_mse = s.mse;
    m.per_key = {{"joint_position", s.mse}};
    m.per_dim = std::vector<double>(size_t(s.dims), s.mse);
    m.per_call = std::vector<double>(size_t(kCalls), s.mse);
    m.compared_steps = kCalls * kSteps;
    w.write_json("metrics.json", m.to_json());
    TimingReport t;
    t.device = "cpu";
    for (size_t c = 0; c < s.call_ms.size(); ++c) {
        CallTiming ct;
        ct.call = int64_t(c);
        ct.total_ms = s.call_ms[c];
        t.calls.push_back(ct);
    }
    w.write_json("timing.json", t.to_json());
    if (s.done) w.mark_done(Json{{"num_frames", 48}, {"num_calls", kCalls}, {"fingerprint", fingerprint(s)}});
    else w.write_json("manifest.json", Json{{"episode", "x"}});
}

/// Two runs of episodes ep_0 and ep_1, the same unless a test changes one.
struct Runs {
    TempDir tmp;
    fs::path base = tmp / "base", now = tmp / "new";
    EpisodeSpec a, b;
    void write() {
        for (const char* ep : {"ep_0", "ep_1"}) {
            write_episode(base / ep, a);
            write_episode(now / ep, std::string(ep) == "ep_1" ? b : a);
        }
    }
    RunComparison compare(CompareOptions o = {}) {
        write();
        return compare_runs(base, now, o);
    }
};

/// The runs pass with a tolerance `set` to `ok` and fail with it at `bad`; the failing comparison's text.
template <class Set>
std::string tolerance_edge(Runs& r, Set set, double ok, double bad) {
    CompareOptions o;
    set(o, ok);
    CHECK(r.compare(o).exit_code() == 0);
    set(o, bad);
    const RunComparison c = r.compare(o);
    CHECK(c.exit_code() == 1);
    return compare_text(c);
}

const EpisodeComparison& episode(const RunComparison& c, const std::string& name) {
    for (const auto& e : c.episodes)
        if (e.name == name) return e;
    FAIL("no episode " << name);
    return c.episodes.front();
}

}  // namespace

TEST_CASE("identical runs pass with zero tolerance") {
    Runs r;
    const RunComparison c = r.compare();
    CHECK(c.exit_code() == 0);
    REQUIRE(c.episodes.size() == 2);
    for (const auto& e : c.episodes) {
        CHECK(e.verdict == Verdict::Pass);
        CHECK(e.values == kCalls * kSteps * kDims);
        CHECK(e.max_abs == 0);
    }
    CHECK(contains(compare_text(c), "compare: pass"));
}

TEST_CASE("one drifting value fails and names its episode, call, step and dim") {
    Runs r;
    at(r.b, 2, 5, 3) = 0.2500001f;
    const RunComparison c = r.compare();
    CHECK(c.exit_code() == 1);
    const auto& e = episode(c, "ep_1");
    CHECK(e.verdict == Verdict::Fail);
    CHECK(episode(c, "ep_0").verdict == Verdict::Pass);
    CHECK(e.out_of_tolerance == 1);
    REQUIRE(e.drifting_calls.size() == 1);
    CHECK(e.drifting_calls[0].call == 2);
    REQUIRE(e.worst.has_value());
    CHECK(e.worst->step == 5);
    CHECK(e.worst->dim == 3);
    const std::string text = compare_text(c);
    CHECK(contains(text, "ep_1:   call 2: 1 values beyond tolerance"));
    CHECK(contains(text, "worst: call 2 step 5 dim 3"));
    CHECK(contains(text, "compare: fail"));
}

TEST_CASE("the absolute tolerance holds at its edge and fails just past it") {
    Runs r;
    r.a.actions.assign(r.a.actions.size(), 1.0f);
    r.b = r.a;
    at(r.b, 0, 0, 0) = 1.5f;  // |diff| = 0.5 exactly
    tolerance_edge(r, [](CompareOptions& o, double t) { o.atol = t; }, 0.5, std::nextafter(0.5, 0.0));
}

TEST_CASE("the relative tolerance scales with the base value at its edge") {
    Runs r;
    r.a.actions.assign(r.a.actions.size(), 2.0f);
    r.b = r.a;
    at(r.b, 1, 23, 7) = 2.5f;  // |diff| = 0.5 = 0.25 * |2|
    CompareOptions o;
    o.rtol = 0.25;
    CHECK(r.compare(o).exit_code() == 0);
    o.rtol = 0.2499;
    const RunComparison c = r.compare(o);
    CHECK(c.exit_code() == 1);
    CHECK(episode(c, "ep_1").max_rel == doctest::Approx(0.25));
    // atol and rtol add up (numpy's isclose)
    o.atol = 0.01;
    CHECK(r.compare(o).exit_code() == 0);
}

TEST_CASE("NaN equals only NaN") {
    Runs r;
    at(r.a, 0, 1, 1) = std::numeric_limits<float>::quiet_NaN();
    r.b = r.a;
    CHECK(r.compare().exit_code() == 0);
    at(r.b, 0, 1, 1) = 0.25f;
    CompareOptions o;
    o.atol = 1e9;
    CHECK(r.compare(o).exit_code() == 1);
}

TEST_CASE("episodes missing in the new run or extra in it fail") {
    Runs r;
    r.write();
    fs::remove_all(r.now / "ep_1");
    RunComparison c = compare_runs(r.base, r.now, {});
    CHECK(c.exit_code() == 1);
    CHECK(episode(c, "ep_1").new_status == "absent");
    CHECK(contains(compare_text(c), "ep_1: missing in new"));

    write_episode(r.now / "ep_1", r.a);
    write_episode(r.now / "ep_2", r.a);
    c = compare_runs(r.base, r.now, {});
    CHECK(c.exit_code() == 1);
    CHECK(episode(c, "ep_2").base_status == "absent");
    CHECK(contains(compare_text(c), "ep_2: not in base"));
}

TEST_CASE("an unfinished episode fails, naming the side") {
    Runs r;
    r.b.done = false;
    const RunComparison c = r.compare();
    CHECK(c.exit_code() == 1);
    const auto& e = episode(c, "ep_1");
    CHECK(e.new_status == "incomplete");
    CHECK(contains(compare_text(c), "ep_1: new: episode incomplete"));
}

TEST_CASE("a settings change is shown and fails unless allowed; a checkpoint change is listed") {
    Runs r;
    r.b.seed = 7;
    RunComparison c = r.compare();
    CHECK(c.exit_code() == 1);
    REQUIRE(c.settings.size() == 1);
    CHECK(c.settings[0].key == "seed");
    CHECK(contains(compare_text(c), "settings differ: seed: base 0 new 7"));
    CompareOptions o;
    o.allow_settings = true;
    CHECK(r.compare(o).exit_code() == 0);

    r.b.seed = 0;
    r.b.checkpoint_sha = "bbbb";
    c = r.compare();
    CHECK(c.exit_code() == 0);
    REQUIRE(c.environment.size() == 1);
    CHECK(contains(c.environment[0].key, "header_sha256"));
    CHECK(contains(compare_text(c), "changed: checkpoint.shards[0].header_sha256"));
}

TEST_CASE("metrics are compared with their own tolerance") {
    Runs r;
    r.b.mse = 0.75;
    const std::string text = tolerance_edge(r, [](CompareOptions& o, double t) { o.metric_tol = t; }, 0.25, 0.2);
    CHECK(contains(text, "ep_1: metrics: 10 of 10 beyond |new - base| <= 0.2; overall_mse: base 0.5 new 0.75"));
}

TEST_CASE("timing fails only when asked and only when slower than the tolerance") {
    Runs r;
    r.b.call_ms = {1100.0, 1100.0, 1100.0};
    CHECK(r.compare().exit_code() == 0);
    const auto set = [](CompareOptions& o, double t) { o.time_tol = t; };
    CHECK(contains(tolerance_edge(r, set, 0.1, 0.05), "timing: median call 1100 ms against 1000 ms (+10.0%"));
    r.b.call_ms = {500.0, 500.0, 500.0};  // faster is never a failure
    CompareOptions o;
    o.time_tol = 0.05;
    CHECK(r.compare(o).exit_code() == 0);
}

TEST_CASE("runs that cannot be compared give exit code 2") {
    Runs r;
    r.b.dims = 22;
    r.b.actions.assign(size_t(kCalls * kSteps * 22), 0.25f);
    CHECK(r.compare().exit_code() == 2);

    TempDir empty;
    const RunComparison c = compare_runs(empty.path(), r.now, {});
    CHECK(c.exit_code() == 2);
    CHECK(contains(compare_text(c), "cannot compare: base:"));
    CHECK(compare_runs(r.base, empty / "absent", {}).exit_code() == 2);
}

TEST_CASE("a call count that differs fails") {
    Runs r;
    r.write();
    std::vector<float> two(size_t(2 * kSteps * kDims), 0.25f);
    io::write_npy_f32(r.now / "ep_0" / "actions.npy", {2, kSteps, kDims}, two);
    const RunComparison c = compare_runs(r.base, r.now, {});
    CHECK(c.exit_code() == 1);
    CHECK(contains(compare_text(c), "ep_0: actions: 3 calls in base, 2 in new"));
}

TEST_CASE("the JSON report carries the verdict and the drifting call") {
    Runs r;
    at(r.b, 1, 0, 0) = 9.0f;
    const Json j = compare_json(r.compare());
    CHECK(j["result"] == "fail");
    CHECK(j["exit_code"] == 1);
    const Json& e = j["episodes"][1];
    CHECK(e["name"] == "ep_1");
    CHECK(e["drifting_calls"][0]["call"] == 1);
    CHECK(e["worst"]["new"].get<double>() == 9.0);
}

TEST_CASE("the JUnit report parses and has one test case per episode plus the settings") {
    Runs r;
    at(r.b, 0, 0, 0) = 3.0f;
    r.b.seed = 1;
    TempDir out;
    const RunComparison c = r.compare();
    write_compare_reports(c, out / "c.json", out / "junit.xml");
    const std::string xml = test::slurp(out / "junit.xml");
    CHECK(contains(xml, "<testcase classname=\"dzr.compare\" name=\"ep_1\">"));
    // Python's parser: the file is well-formed, and the counts are what a CI system shows
    const std::string cmd = "python3 -c \"import sys, xml.etree.ElementTree as E; s = E.parse(sys.argv[1]).getroot()"
                            "[0]; c = s.findall('testcase'); sys.exit(0 if len(c) == 3 and s.get('failures') == '2' "
                            "and [k.get('name') for k in c] == ['settings', 'ep_0', 'ep_1'] and "
                            "c[2].find('failure') is not None and c[1].find('failure') is None else 1)\" " +
                            test::q(out / "junit.xml");
    CHECK(std::system(cmd.c_str()) == 0);
}

TEST_CASE("tolerances parse as fractions or percentages") {
    CHECK(parse_fraction("10%", "--time-tol") == doctest::Approx(0.1));
    CHECK(parse_fraction("0.25", "--time-tol") == 0.25);
    CHECK_THROWS_WITH_AS(parse_fraction("ten", "--time-tol"), doctest::Contains("--time-tol ten"), Error);
    CHECK_THROWS_AS(parse_fraction("-1%", "--time-tol"), Error);
    CHECK_THROWS_AS(parse_fraction("", "--time-tol"), Error);
}

TEST_CASE("dzr compare exits 0, 1 and 2 and writes its reports") {
    if (test::dzr_bin().empty()) return;
    Runs r;
    r.write();
    TempDir scratch;
    auto res = test::run_dzr("compare " + test::q(r.base) + " " + test::q(r.now) + " --junit " +
                             test::q(scratch / "j.xml") + " --json " + test::q(scratch / "c.json"), scratch.path());
    CHECK(res.code == 0);
    CHECK(res.has("compare: pass"));
    CHECK(fs::exists(scratch / "j.xml"));
    CHECK(fs::exists(scratch / "c.json"));

    at(r.b, 0, 3, 2) = 0.5f;
    write_episode(r.now / "ep_1", r.b);
    res = test::run_dzr("compare " + test::q(r.base) + " " + test::q(r.now), scratch.path());
    CHECK(res.code == 1);
    CHECK(res.has("ep_1:   call 0:"));
    res = test::run_dzr("compare " + test::q(r.base) + " " + test::q(r.now) + " --atol 0.25", scratch.path());
    CHECK(res.code == 0);

    res = test::run_dzr("compare " + test::q(r.base) + " " + test::q(scratch / "nothing"), scratch.path());
    CHECK(res.code == 2);
    res = test::run_dzr("compare " + test::q(r.base) + " " + test::q(r.now) + " --time-tol fast", scratch.path());
    CHECK(res.code == 2);
    CHECK(res.has("dzr: error:"));
    res = test::run_dzr("compare " + test::q(r.base), scratch.path());
    CHECK(res.code == 2);
    CHECK(res.has("dzr: error: new is required"));
}

TEST_CASE("reports are written even when a damaged file's bytes are not UTF-8") {
    // NOTE: found by fuzz_run_files: an error quoting such bytes made nlohmann's dump() throw, losing the report
    Runs r;
    r.write();
    io::write_file_atomic(r.now / "ep_1" / "done.json", std::string("{\"num_frames\": \xff\xfe}"));
    const RunComparison c = compare_runs(r.base, r.now, {});
    CHECK(c.exit_code() != 0);
    TempDir out;
    write_compare_reports(c, out / "c.json", out / "j.xml");
    CHECK(fs::file_size(out / "c.json") > 0);
}
