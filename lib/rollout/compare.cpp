#include "rollout/compare.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>

#include "core/error.h"
#include "core/json_text.h"
#include "io/atomic_file.h"
#include "io/npy.h"
#include "io/output_guard.h"
#include "io/result_writer.h"
#include "io/svg.h"
#include "rollout/progress.h"
#include "rollout/reports.h"
#include "rollout/summarize.h"

namespace dzr::rollout {
namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

bool starts_with(const std::string& s, std::string_view prefix) { return s.rfind(prefix, 0) == 0; }

/// The checkpoint, dzr version, tokenizer and the CPU's BLAS kernel table are what a regression run is
/// expected to change; everything else in the fingerprint is a setting of the run.
bool is_environment(const std::string& key) {
    return starts_with(key, "checkpoint") || key == "dzr_version" || key == "tokenizer_sha256" ||
           key == "numerics.blas_core";
}

std::string num(double v) {
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    return fmt::format("{:.6g}", v);
}

std::string opt_num(const std::optional<double>& v) { return v ? num(*v) : "-"; }

/// An action value as float32 holds it (9 significant digits round-trip), so a last-bit drift is visible.
std::string exact(double v) { return std::isfinite(v) ? fmt::format("{:.9g}", v) : num(v); }

Json json_num(double v) { return std::isfinite(v) ? Json(v) : Json(num(v)); }

Json read_done_fingerprint(const fs::path& dir) {
    const fs::path file = dir / std::string(io::kDoneMarker);
    const Json done = parse_json_strict<Json>(io::read_file(file), file.string());
    return done.contains("fingerprint") ? done["fingerprint"] : Json(nullptr);
}

/// Compares the actions value by value; records drift per call.
void compare_actions(const io::NpyArray& a, const io::NpyArray& b, const CompareOptions& opt,
                     EpisodeComparison& e) {
    const std::vector<double> va = a.to_f64(), vb = b.to_f64();
    const int64_t calls = a.dim(0), steps = a.dim(1), dims = a.dim(2);
    e.calls = calls;
    e.values = int64_t(va.size());
    double worst_excess = -1;
    for (int64_t c = 0; c < calls; ++c) {
        CallDrift drift;
        drift.call = c;
        double call_excess = -1;
        for (int64_t i = c * steps * dims; i < (c + 1) * steps * dims; ++i) {
            const double x = va[size_t(i)], y = vb[size_t(i)];
            if (std::isnan(x) && std::isnan(y)) continue;
            const double abs = x == y ? 0 : std::fabs(y - x);
            const double d = std::isnan(abs) ? kInf : abs;
            const double rel = d == 0 ? 0 : (x == 0 ? kInf : d / std::fabs(x));
            const double allowed = opt.atol + opt.rtol * std::fabs(x);
            e.max_abs = std::max(e.max_abs, d);
            e.max_rel = std::max(e.max_rel, rel);
            drift.max_abs = std::max(drift.max_abs, d);
            drift.max_rel = std::max(drift.max_rel, rel);
            if (d <= allowed) continue;
            ++drift.out_of_tolerance;
            const double excess = d - allowed;
            const int64_t within = i - c * steps * dims;
            const ValueDiff v{c, within / dims, within % dims, x, y, d, rel};
            if (excess > call_excess) call_excess = excess, drift.worst = v;
            if (excess > worst_excess) worst_excess = excess, e.worst = v;
        }
        if (drift.out_of_tolerance) {
            e.out_of_tolerance += drift.out_of_tolerance;
            e.drifting_calls.push_back(drift);
        }
    }
    if (e.out_of_tolerance)
        e.problems.push_back(fmt::format(
            "actions: {} of {} values beyond |new - base| <= {} + {} * |base| in {} of {} calls; worst: call {} step {} "
            "dim {}: base {} new {} (|diff| {}, rel {})",
            e.out_of_tolerance, e.values, num(opt.atol), num(opt.rtol), e.drifting_calls.size(), calls, e.worst->call,
            e.worst->step, e.worst->dim, exact(e.worst->base), exact(e.worst->now), num(e.worst->abs), num(e.worst->rel)));
}

void compare_scalar(const std::string& name, std::optional<double> base, std::optional<double> now, double tol,
                    std::vector<ScalarDiff>& out) {
    ScalarDiff d{name, base, now, true};
    const bool nan_a = base && std::isnan(*base), nan_b = now && std::isnan(*now);
    if (base.has_value() != now.has_value())
        d.ok = false;
    else if (base && !(nan_a && nan_b))
        d.ok = !nan_a && !nan_b && std::fabs(*now - *base) <= tol;
    out.push_back(d);
}

/// One line for the metrics beyond tolerance: how many, and the one furthest apart.
void metric_problem(const EpisodeComparison& e, double tol, std::vector<std::string>& problems) {
    const ScalarDiff* worst = nullptr;
    double worst_diff = -1;
    size_t bad = 0;
    for (const auto& m : e.metrics) {
        if (m.ok) continue;
        ++bad;
        const double d = m.base && m.now ? std::fabs(*m.now - *m.base) : kInf;
        if (!(d <= worst_diff)) worst_diff = d, worst = &m;
    }
    if (!worst) return;
    problems.push_back(fmt::format("metrics: {} of {} beyond |new - base| <= {}; {}: base {} new {}", bad,
                                   e.metrics.size(), num(tol), worst->name, exact(worst->base.value_or(kNaN)),
                                   exact(worst->now.value_or(kNaN))));
}

void compare_metrics(const EpisodeSummary& a, const EpisodeSummary& b, const CompareOptions& opt,
                     EpisodeComparison& e) {
    if (!a.metrics && !b.metrics) return;
    if (a.metrics.has_value() != b.metrics.has_value()) {
        e.problems.push_back(fmt::format("metrics: metrics.json only in {}", a.metrics ? "base" : "new"));
        return;
    }
    const Metrics &ma = *a.metrics, &mb = *b.metrics;
    compare_scalar("overall_mse", ma.overall_mse, mb.overall_mse, opt.metric_tol, e.metrics);
    std::map<std::string, std::pair<std::optional<double>, std::optional<double>>> keys;
    for (const auto& [k, v] : ma.per_key) keys[k].first = v;
    for (const auto& [k, v] : mb.per_key) keys[k].second = v;
    for (const auto& [k, v] : keys)
        compare_scalar("per_key_mse." + k, v.first, v.second, opt.metric_tol, e.metrics);
    const size_t dims = std::max(ma.per_dim.size(), mb.per_dim.size());
    for (size_t d = 0; d < dims; ++d) {
        auto at = [d](const std::vector<double>& v) { return d < v.size() ? std::optional(v[d]) : std::nullopt; };
        compare_scalar(fmt::format("per_dim_mse[{}]", d), at(ma.per_dim), at(mb.per_dim), opt.metric_tol, e.metrics);
    }
    metric_problem(e, opt.metric_tol, e.problems);
}

void compare_timing(const EpisodeSummary& a, const EpisodeSummary& b, const CompareOptions& opt,
                    EpisodeComparison& e) {
    if (!opt.time_tol) return;
    ScalarDiff t{"median_call_ms", std::nullopt, std::nullopt, true};
    if (!a.call_ms.empty()) t.base = compute_stats(a.call_ms).median;
    if (!b.call_ms.empty()) t.now = compute_stats(b.call_ms).median;
    if (!t.base || !t.now) {
        t.ok = false;
        e.problems.push_back(fmt::format("timing: no timed calls in {}", t.base ? "new" : "base"));
    } else if (*t.now > *t.base * (1 + *opt.time_tol)) {
        t.ok = false;
        e.problems.push_back(fmt::format("timing: median call {} ms against {} ms ({:+.1f}%, tolerance +{:.1f}%)",
                                         num(*t.now), num(*t.base), 100 * (*t.now / *t.base - 1),
                                         100 * *opt.time_tol));
    }
    e.timing = t;
}

/// Sorts fingerprint differences into the run's settings, its environment and the episode's inputs.
void classify_fingerprints(const Json& fa, const Json& fb, RunComparison& run, EpisodeComparison& e,
                           std::set<std::string>& seen) {
    for (auto& d : json_differences(fa, fb)) {
        if (starts_with(d.key, "episode")) {
            // NOTE: outputs of a dzr that recorded no input hash compare on frame count and prompt only
            if (d.key == "episode.inputs_sha256" && (d.base == "absent" || d.now == "absent")) continue;
            e.input_differences.push_back(d);
            e.problems.push_back(fmt::format("inputs: {}: base {} new {}", d.key, d.base, d.now));
            continue;
        }
        if (!seen.insert(d.key + "\n" + d.base + "\n" + d.now).second) continue;
        (is_environment(d.key) ? run.environment : run.settings).push_back(std::move(d));
    }
}

/// One episode present on both sides.
EpisodeComparison compare_episode(const std::string& name, RunComparison& run, std::set<std::string>& seen) {
    EpisodeComparison e;
    e.name = name;
    const fs::path da = run.base / name, db = run.now / name;
    // NOTE: a baseline keeps only actions.npy, metrics.json and done.json (docs/CI.md)
    const EpisodeSummary a = episode_from_outputs(da, name, false), b = episode_from_outputs(db, name, false);
    e.base_status = a.status;
    e.new_status = b.status;
    for (const auto& [side, s] : {std::pair{"base", &a}, std::pair{"new", &b}})
        if (s->status != "ok")
            e.problems.push_back(fmt::format("{}: episode {}{}", side, s->status, s->error.empty() ? "" : ": " + s->error));
    if (!e.problems.empty()) {
        e.verdict = Verdict::Fail;
        return e;
    }
    try {
        classify_fingerprints(read_done_fingerprint(da), read_done_fingerprint(db), run, e, seen);
        const io::NpyArray pa = io::read_npy(da / "actions.npy"), pb = io::read_npy(db / "actions.npy");
        DZR_CHECK(pa.rank() == 3 && pb.rank() == 3, "{}: actions.npy is {} and {}, expected [calls, steps, dims]",
                  name, pa.shape_str(), pb.shape_str());
        if (pa.dim(2) != pb.dim(2) || pa.dim(1) != pb.dim(1)) {
            e.verdict = Verdict::Error;
            e.problems.push_back(fmt::format("actions: {} against {}: different action horizons or widths "
                                             "(another embodiment or schedule) cannot be compared",
                                             pa.shape_str(), pb.shape_str()));
            return e;
        }
        if (pa.dim(0) != pb.dim(0))
            e.problems.push_back(fmt::format("actions: {} calls in base, {} in new", pa.dim(0), pb.dim(0)));
        else
            compare_actions(pa, pb, run.options, e);
        compare_metrics(a, b, run.options, e);
        compare_timing(a, b, run.options, e);
    } catch (const std::exception& ex) {
        e.verdict = Verdict::Error;
        e.problems.push_back(ex.what());
        return e;
    }
    e.verdict = e.problems.empty() ? Verdict::Pass : Verdict::Fail;
    return e;
}

std::vector<std::string> episode_names(const fs::path& dir, const char* side, std::vector<std::string>& errors) {
    try {
        std::vector<std::string> names = run_episode_names(dir);
        for (const auto& n : names)
            if (!io::is_plain_name(n)) {
                errors.push_back(fmt::format("{} ({}): episode name '{}' is not a directory name", dir.string(),
                                             side, n));
                return {};
            }
        return names;
    } catch (const std::exception& ex) {
        errors.push_back(fmt::format("{}: {}", side, ex.what()));
        return {};
    }
}

EpisodeComparison one_sided(const std::string& name, bool in_base) {
    EpisodeComparison e;
    e.name = name;
    e.verdict = Verdict::Fail;
    e.base_status = in_base ? "listed" : "absent";
    e.new_status = in_base ? "absent" : "listed";
    e.problems.push_back(in_base ? "missing in new" : "not in base (an extra episode)");
    return e;
}

/// io::xml_escape, after the control characters XML 1.0 forbids (all but tab, newline, return) become spaces.
std::string xml_escape(const std::string& s) {
    std::string clean = s;
    for (char& ch : clean)
        if (static_cast<unsigned char>(ch) < 0x20 && ch != '\t' && ch != '\n' && ch != '\r') ch = ' ';
    return io::xml_escape(clean);
}

std::string settings_line(const FieldDifference& d) { return fmt::format("{}: base {} new {}", d.key, d.base, d.now); }

}  // namespace

const char* verdict_name(Verdict v) {
    switch (v) {
        case Verdict::Pass: return "pass";
        case Verdict::Fail: return "fail";
        case Verdict::Error: return "error";
    }
    return "?";
}

Verdict RunComparison::verdict() const {
    Verdict v = Verdict::Pass;
    if (!errors.empty()) return Verdict::Error;
    for (const auto& e : episodes) {
        if (e.verdict == Verdict::Error) return Verdict::Error;
        if (e.verdict == Verdict::Fail) v = Verdict::Fail;
    }
    if (!settings.empty() && !options.allow_settings) v = Verdict::Fail;
    return v;
}

int RunComparison::exit_code() const {
    const Verdict v = verdict();
    return v == Verdict::Pass ? 0 : v == Verdict::Fail ? 1 : 2;
}

RunComparison compare_runs(const fs::path& base, const fs::path& now, const CompareOptions& options) {
    RunComparison run;
    run.base = base;
    run.now = now;
    run.options = options;
    const std::vector<std::string> na = episode_names(base, "base", run.errors),
                                   nb = episode_names(now, "new", run.errors);
    if (!run.errors.empty()) return run;
    const std::set<std::string> in_b(nb.begin(), nb.end()), in_a(na.begin(), na.end());
    std::set<std::string> seen;
    for (const auto& name : na)
        run.episodes.push_back(in_b.count(name) ? compare_episode(name, run, seen) : one_sided(name, true));
    for (const auto& name : nb)
        if (!in_a.count(name)) run.episodes.push_back(one_sided(name, false));
    return run;
}

std::string compare_text(const RunComparison& c) {
    std::string out;
    std::vector<std::vector<std::string>> rows;
    for (const auto& e : c.episodes) {
        const ScalarDiff* mse = e.metrics.empty() ? nullptr : &e.metrics.front();
        rows.push_back({e.name, verdict_name(e.verdict), e.base_status + "/" + e.new_status, std::to_string(e.calls),
                        std::to_string(e.out_of_tolerance), num(e.max_abs), num(e.max_rel),
                        mse ? opt_num(mse->base) + " -> " + opt_num(mse->now) : "-",
                        e.timing ? opt_num(e.timing->base) + " -> " + opt_num(e.timing->now) : "-"});
    }
    out += format_table({"episode", "result", "status", "calls", "beyond tol", "max |diff|", "max rel", "mse",
                         "median ms"}, rows);
    for (const auto& e : c.episodes) {
        for (const auto& p : e.problems) out += fmt::format("{}: {}\n", e.name, p);
        size_t listed = 0;
        for (const auto& d : e.drifting_calls) {
            if (listed++ == c.options.max_calls_listed) {
                out += fmt::format("{}:   ... and {} more drifting calls\n", e.name,
                                   e.drifting_calls.size() - c.options.max_calls_listed);
                break;
            }
            out += fmt::format("{}:   call {}: {} values beyond tolerance, max |diff| {}, max rel {}; worst step {} "
                               "dim {}: {} -> {}\n", e.name, d.call, d.out_of_tolerance, num(d.max_abs),
                               num(d.max_rel), d.worst.step, d.worst.dim, exact(d.worst.base), exact(d.worst.now));
        }
    }
    for (const auto& d : c.settings)
        out += fmt::format("settings differ{}: {}\n", c.options.allow_settings ? " (allowed)" : "", settings_line(d));
    for (const auto& d : c.environment) out += fmt::format("changed: {}\n", settings_line(d));
    for (const auto& err : c.errors) out += fmt::format("cannot compare: {}\n", err);
    size_t pass = 0, fail = 0, error = 0;
    for (const auto& e : c.episodes)
        (e.verdict == Verdict::Pass ? pass : e.verdict == Verdict::Fail ? fail : error) += 1;
    out += fmt::format("compare: {} ({} episodes: {} pass, {} fail, {} cannot be compared; actions atol {} rtol {}, "
                       "metrics tol {}{})\n",
                       verdict_name(c.verdict()), c.episodes.size(), pass, fail, error, num(c.options.atol),
                       num(c.options.rtol), num(c.options.metric_tol),
                       c.options.time_tol ? fmt::format(", time +{:.1f}%", 100 * *c.options.time_tol) : "");
    return out;
}

Json compare_json(const RunComparison& c) {
    auto diffs = [](const std::vector<FieldDifference>& v) {
        Json a = Json::array();
        for (const auto& d : v) a.push_back({{"key", d.key}, {"base", d.base}, {"new", d.now}});
        return a;
    };
    auto scalar = [](const ScalarDiff& s) {
        return Json{{"name", s.name}, {"base", s.base ? json_num(*s.base) : Json(nullptr)},
                    {"new", s.now ? json_num(*s.now) : Json(nullptr)}, {"ok", s.ok}};
    };
    auto value = [](const ValueDiff& v) {
        return Json{{"call", v.call}, {"step", v.step}, {"dim", v.dim}, {"base", json_num(v.base)},
                    {"new", json_num(v.now)}, {"abs", json_num(v.abs)}, {"rel", json_num(v.rel)}};
    };
    Json eps = Json::array();
    for (const auto& e : c.episodes) {
        Json calls = Json::array(), metrics = Json::array();
        for (const auto& d : e.drifting_calls)
            calls.push_back({{"call", d.call}, {"beyond_tolerance", d.out_of_tolerance},
                             {"max_abs", json_num(d.max_abs)}, {"max_rel", json_num(d.max_rel)},
                             {"worst", value(d.worst)}});
        for (const auto& m : e.metrics) metrics.push_back(scalar(m));
        eps.push_back({{"name", e.name}, {"result", verdict_name(e.verdict)}, {"base_status", e.base_status},
                       {"new_status", e.new_status}, {"calls", e.calls}, {"values", e.values},
                       {"beyond_tolerance", e.out_of_tolerance}, {"max_abs", json_num(e.max_abs)},
                       {"max_rel", json_num(e.max_rel)}, {"worst", e.worst ? value(*e.worst) : Json(nullptr)},
                       {"drifting_calls", calls}, {"metrics", metrics},
                       {"timing", e.timing ? scalar(*e.timing) : Json(nullptr)},
                       {"input_differences", diffs(e.input_differences)}, {"problems", e.problems}});
    }
    const auto& o = c.options;
    return Json{{"result", verdict_name(c.verdict())}, {"exit_code", c.exit_code()}, {"base", c.base.string()},
                {"new", c.now.string()},
                {"tolerances", {{"atol", o.atol}, {"rtol", o.rtol}, {"metric_tol", o.metric_tol},
                                {"time_tol", o.time_tol ? Json(*o.time_tol) : Json(nullptr)},
                                {"allow_settings", o.allow_settings}}},
                {"settings_differences", diffs(c.settings)}, {"environment_differences", diffs(c.environment)},
                {"errors", c.errors}, {"episodes", eps}};
}

std::string compare_junit(const RunComparison& c) {
    struct Case {
        std::string name, kind, message, body;  // kind: "" pass, "failure", "error"
    };
    std::vector<Case> cases;
    for (const auto& err : c.errors) cases.push_back({"run", "error", err, err});
    Case settings{"settings", "", "", ""};
    for (const auto& d : c.settings) settings.body += settings_line(d) + "\n";
    if (!c.settings.empty() && !c.options.allow_settings)
        settings.kind = "failure", settings.message = fmt::format("{} run settings differ", c.settings.size());
    if (c.errors.empty()) cases.push_back(settings);
    for (const auto& e : c.episodes) {
        Case k{e.name, "", e.problems.empty() ? "" : e.problems.front(), ""};
        for (const auto& p : e.problems) k.body += p + "\n";
        if (e.verdict != Verdict::Pass) k.kind = e.verdict == Verdict::Error ? "error" : "failure";
        cases.push_back(k);
    }
    size_t failures = 0, errors = 0;
    for (const auto& k : cases) failures += k.kind == "failure", errors += k.kind == "error";
    std::string out = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
    out += fmt::format("<testsuites name=\"dzr compare\" tests=\"{}\" failures=\"{}\" errors=\"{}\">\n", cases.size(),
                       failures, errors);
    out += fmt::format("  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"{}\">\n",
                       xml_escape("dzr compare " + c.base.string() + " " + c.now.string()), cases.size(), failures,
                       errors);
    for (const auto& k : cases) {
        out += fmt::format("    <testcase classname=\"dzr.compare\" name=\"{}\"", xml_escape(k.name));
        if (k.kind.empty() && k.body.empty()) {
            out += "/>\n";
            continue;
        }
        out += ">\n";
        if (!k.kind.empty())
            out += fmt::format("      <{} message=\"{}\">{}</{}>\n", k.kind, xml_escape(k.message), xml_escape(k.body),
                               k.kind);
        else
            out += fmt::format("      <system-out>{}</system-out>\n", xml_escape(k.body));
        out += "    </testcase>\n";
    }
    out += "  </testsuite>\n</testsuites>\n";
    return out;
}

void write_compare_reports(const RunComparison& c, const fs::path& json_file, const fs::path& junit_file) {
    if (!json_file.empty()) io::write_file_atomic(json_file, dump_json(compare_json(c)) + "\n");
    if (!junit_file.empty()) io::write_file_atomic(junit_file, compare_junit(c));
}

double parse_fraction(const std::string& text, const std::string& flag) {
    std::string t = text;
    const bool percent = !t.empty() && t.back() == '%';
    if (percent) t.pop_back();
    size_t used = 0;
    double v = -1;
    try {
        v = std::stod(t, &used);
    } catch (const std::exception&) {
        used = 0;
    }
    DZR_CHECK(used == t.size() && used > 0 && std::isfinite(v) && v >= 0,
              "{} {}: expected a non-negative fraction (0.1) or percentage (10%)", flag, text);
    return percent ? v / 100 : v;
}

}  // namespace dzr::rollout
