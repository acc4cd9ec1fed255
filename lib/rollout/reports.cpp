#include "rollout/reports.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <limits>
#include <numeric>

#include <fmt/format.h>

#include "core/error.h"
#include "core/json_text.h"
#include "core/log.h"
#include "core/version.h"
#include "io/atomic_file.h"
#include "io/npy.h"
#include "io/plots.h"

namespace dzr::rollout {

namespace fs = std::filesystem;

double ms_us(double ms) { return std::round(ms * 1000.0) / 1000.0; }

Json stats_json(const TimingStats& s) {
    return {{"count", s.count}, {"mean", ms_us(s.mean)}, {"median", ms_us(s.median)}, {"p90", ms_us(s.p90)},
            {"min", ms_us(s.min)},  {"max", ms_us(s.max)}};
}

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

/// NaN and infinities have no JSON spelling: they become null.
Json number_or_null(double v) { return std::isfinite(v) ? Json(v) : Json(nullptr); }


Json numbers_or_null(const std::vector<double>& v) {
    Json a = Json::array();
    for (double x : v) a.push_back(number_or_null(x));
    return a;
}

double number_from(const Json& j) { return j.is_number() ? j.get<double>() : kNaN; }

std::string csv_number(double v) { return std::isfinite(v) ? fmt::format("{}", v) : std::string("nan"); }

/// Quotes a CSV field when it holds a comma, quote or line break.
std::string csv_field(const std::string& s) {
    if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
    std::string q = "\"";
    for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
}

}  // namespace

// ---- timing ----

double percentile(std::span<const double> sorted, double q) {
    DZR_ASSERT(!sorted.empty() && q >= 0 && q <= 1);
    const double h = q * double(sorted.size() - 1);
    const size_t lo = size_t(std::floor(h));
    const size_t hi = std::min(lo + 1, sorted.size() - 1);
    return sorted[lo] + (h - double(lo)) * (sorted[hi] - sorted[lo]);
}

TimingStats compute_stats(std::span<const double> values) {
    TimingStats s;
    if (values.empty()) return s;
    std::vector<double> v(values.begin(), values.end());
    std::sort(v.begin(), v.end());
    s.count = int64_t(v.size());
    s.mean = std::accumulate(v.begin(), v.end(), 0.0) / double(v.size());
    s.median = percentile(v, 0.5);
    s.p90 = percentile(v, 0.9);
    s.min = v.front();
    s.max = v.back();
    return s;
}

TimingStats TimingReport::total_stats() const {
    std::vector<double> t;
    for (const auto& c : calls)
        if (c.timed) t.push_back(c.total_ms);
    return compute_stats(t);
}

Json TimingReport::to_json() const {
    Json j;
    j["device"] = device;
    j["checkpoint_load_ms"] = ms_us(checkpoint_load_ms);
    j["warmup"] = {{"calls", warmup_calls}, {"total_ms", ms_us(warmup_ms)}};
    j["peak_gpu_memory_bytes"] = peak_gpu_memory_bytes ? Json(*peak_gpu_memory_bytes) : Json(nullptr);
    // NOTE: beside the measured peak, so a GPU run can check the plan holds (docs/MEMORY.md)
    j["planned_peak_gpu_memory_bytes"] =
        memory_plan && memory_plan->cuda ? Json(memory_plan->peak_bytes) : Json(nullptr);
    if (memory_plan) {
        j["memory_plan"] = {{"device", memory_plan->cuda ? "cuda" : "cpu"},
                            {"peak_bytes", memory_plan->peak_bytes},
                            {"peak_phase", memory_plan->peak_phase},
                            {"phases", memory_plan->phases}};
    } else {
        j["memory_plan"] = nullptr;
    }
    j["gpu_telemetry"] = gpu_telemetry;
    if (video) {
        j["video"] = {{"latent_frames", video->latent_frames}, {"frames", video->frames}, {"fps", video->fps},
                      {"decode_ms", ms_us(video->decode_ms)}, {"write_ms", ms_us(video->write_ms)}};
    } else {
        j["video"] = nullptr;
    }
    j["phases"] = kPhaseNames;
    Json calls_j = Json::array();
    std::array<std::vector<double>, kNumPhases> phase_values;
    std::vector<double> prepare_values;
    for (const auto& c : calls) {
        if (c.timed) prepare_values.push_back(c.host_prepare_ms);
        Json phases;
        for (int p = 0; p < kNumPhases; ++p) {
            phases[std::string(kPhaseNames[size_t(p)])] = ms_us(c.phase_ms[size_t(p)]);
            if (c.timed) phase_values[size_t(p)].push_back(c.phase_ms[size_t(p)]);
        }
        calls_j.push_back({{"call", c.call}, {"anchor", c.anchor}, {"frames", c.frames}, {"timed", c.timed},
                           {"total_ms", ms_us(c.total_ms)}, {"phases_ms", phases},
                           {"host_prepare_ms", ms_us(c.host_prepare_ms)}, {"dit_evaluations", c.dit_evaluations}});
    }
    j["calls"] = calls_j;
    const TimingStats total = total_stats();
    Json summary = {{"timed_calls", total.count}, {"total_ms", stats_json(total)}};
    for (int p = 0; p < kNumPhases; ++p)
        summary["phases_ms"][std::string(kPhaseNames[size_t(p)])] = stats_json(compute_stats(phase_values[size_t(p)]));
    summary["host_prepare_ms"] = stats_json(compute_stats(prepare_values));
    j["summary"] = summary;
    return j;
}

// ---- manifest ----

std::string iso8601_utc(std::chrono::system_clock::time_point t) {
    const std::time_t tt = std::chrono::system_clock::to_time_t(t);
    std::tm tm{};
    gmtime_r(&tt, &tm);
    char buf[32];
    std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
}

Json RunManifest::to_json() const {
    Json j;
    j["dzr_version"] = version();
    j["git_hash"] = git_hash();
    j["episode"] = episode;
    j["checkpoint"] = checkpoint;
    j["config"] = config;
    j["overrides"] = overrides;
    j["seed"] = seed;
    j["device"] = device;
    j["command_line"] = command_line;
    j["start_time"] = start_time;
    for (const auto& [k, v] : extra.items()) j[k] = v;
    return j;
}

// ---- metrics ----

Metrics compute_metrics(const io::ActionChunks& pred, std::span<const double> gt, int64_t gt_rows,
                        const MetricsOptions& opt, std::span<const ActionKey> keys) {
    const int64_t dims = pred.dims;
    DZR_CHECK(int64_t(gt.size()) == gt_rows * dims, "ground-truth actions: {} values for {} rows of {} dims",
              gt.size(), gt_rows, dims);
    DZR_CHECK(opt.steps >= -1 && opt.steps != 0, "metrics: steps must be positive or -1 (all), got {}", opt.steps);
    DZR_CHECK(opt.gt_offset >= -kMaxMetricOffset && opt.gt_offset <= kMaxMetricOffset,
              "metrics: the ground-truth offset must be in [-{}, {}], got {}", kMaxMetricOffset, kMaxMetricOffset,
              opt.gt_offset);
    for (const auto& k : keys)
        DZR_CHECK(k.begin >= 0 && k.begin < k.end && k.end <= dims, "metrics: action key {} [{}, {}) does not fit {} dims",
                  k.name, k.begin, k.end, dims);
    const int64_t steps = opt.steps < 0 ? pred.horizon : std::min(opt.steps, pred.horizon);

    Metrics m;
    m.options = opt;
    std::vector<double> dim_sum(size_t(dims), 0.0);
    std::vector<double> step_sum(size_t(steps), 0.0), call_sum(size_t(pred.num_calls()), 0.0);
    std::vector<int64_t> step_n(size_t(steps), 0), call_n(size_t(pred.num_calls()), 0);
    for (int64_t c = 0; c < pred.num_calls(); ++c)
        for (int64_t s = 0; s < steps; ++s) {
            // NOTE: anchors are frame indices and |gt_offset| <= kMaxMetricOffset, so the sum cannot overflow.
            const int64_t row = pred.anchors[size_t(c)] + opt.gt_offset + s;
            if (row < 0 || row >= gt_rows) {
                ++m.skipped_steps;
                continue;
            }
            ++m.compared_steps;
            double sq_sum = 0;
            for (int64_t d = 0; d < dims; ++d) {
                const double e = double(pred.at(c, s, d)) - gt[size_t(row * dims + d)];
                dim_sum[size_t(d)] += e * e;
                sq_sum += e * e;
            }
            step_sum[size_t(s)] += sq_sum;
            ++step_n[size_t(s)];
            call_sum[size_t(c)] += sq_sum;
            ++call_n[size_t(c)];
        }
    const double n = double(m.compared_steps);
    m.per_dim.resize(size_t(dims));
    for (int64_t d = 0; d < dims; ++d) m.per_dim[size_t(d)] = n > 0 ? dim_sum[size_t(d)] / n : kNaN;
    m.overall_mse = n > 0 ? std::accumulate(dim_sum.begin(), dim_sum.end(), 0.0) / (n * double(dims)) : kNaN;
    for (const auto& k : keys) {
        double sum = 0;
        for (int d = k.begin; d < k.end; ++d) sum += dim_sum[size_t(d)];
        m.per_key.emplace_back(std::string(k.name), n > 0 ? sum / (n * double(k.end - k.begin)) : kNaN);
    }
    for (int64_t s = 0; s < steps; ++s)
        m.per_step.push_back(step_n[size_t(s)] ? step_sum[size_t(s)] / double(step_n[size_t(s)] * dims) : kNaN);
    for (int64_t c = 0; c < pred.num_calls(); ++c)
        m.per_call.push_back(call_n[size_t(c)] ? call_sum[size_t(c)] / double(call_n[size_t(c)] * dims) : kNaN);
    return m;
}

Json Metrics::to_json() const {
    Json j;
    j["alignment"] = {{"gt_offset", options.gt_offset},
                      {"steps", options.steps},
                      {"rule", "predicted step s of the call anchored at frame a vs ground-truth row a + gt_offset + s"}};
    j["overall_mse"] = number_or_null(overall_mse);
    Json keys = Json::object();
    for (const auto& [k, v] : per_key) keys[k] = number_or_null(v);
    j["per_key_mse"] = keys;
    j["per_dim_mse"] = numbers_or_null(per_dim);
    j["per_step_mse"] = numbers_or_null(per_step);
    j["per_call_mse"] = numbers_or_null(per_call);
    j["compared_steps"] = compared_steps;
    j["skipped_steps"] = skipped_steps;
    return j;
}

Metrics Metrics::from_json(const Json& j, const std::string& source) {
    Metrics m;
    try {
        m.options.gt_offset = j.at("alignment").at("gt_offset").get<int64_t>();
        m.options.steps = j.at("alignment").at("steps").get<int64_t>();
        m.overall_mse = number_from(j.at("overall_mse"));
        for (const auto& [k, v] : j.at("per_key_mse").items()) m.per_key.emplace_back(k, number_from(v));
        for (const auto& v : j.at("per_dim_mse")) m.per_dim.push_back(number_from(v));
        for (const auto& v : j.at("per_step_mse")) m.per_step.push_back(number_from(v));
        for (const auto& v : j.at("per_call_mse")) m.per_call.push_back(number_from(v));
        m.compared_steps = j.at("compared_steps").get<int64_t>();
        m.skipped_steps = j.at("skipped_steps").get<int64_t>();
    } catch (const Json::exception& e) {
        DZR_THROW("{}: not a metrics report: {}", source, e.what());
    }
    return m;
}

std::string Metrics::mse_csv() const {
    std::string out = fmt::format("overall_mse,{}\n", csv_number(overall_mse));
    for (const auto& [k, v] : per_key) out += fmt::format("action.{},{}\n", k, csv_number(v));
    for (size_t d = 0; d < per_dim.size(); ++d) out += fmt::format("dim_{},{}\n", d, csv_number(per_dim[d]));
    return out;
}

std::vector<io::PlotSpec> action_plot_specs(const io::ActionChunks& pred, std::span<const double> gt, int64_t gt_rows,
                                            const Metrics* metrics, std::span<const ActionKey> keys) {
    const int keys_end = keys.empty() ? 0 : keys.back().end;
    const int64_t dims = pred.dims;
    DZR_CHECK(int64_t(gt.size()) == gt_rows * dims, "ground-truth actions: {} values for {} rows of {} dims", gt.size(),
              gt_rows, dims);
    const int64_t offset = metrics ? metrics->options.gt_offset : 0;
    const int64_t steps =
        metrics && metrics->options.steps > 0 ? std::min(metrics->options.steps, pred.horizon) : pred.horizon;
    // NOTE: a legend entry per call is readable up to a handful of calls; beyond that the tooltips
    // (SVG) name them.
    const bool label_calls = pred.num_calls() <= 6;
    std::vector<io::PlotSpec> specs;
    for (int64_t d = 0; d < dims; ++d) {
        io::PlotSpec spec;
        if (gt_rows > 0) {
            io::PlotSeries g{"ground truth", io::kPlotDark, {}, {}, 2.0, false, "ground truth"};
            for (int64_t r = 0; r < gt_rows; ++r) {
                g.x.push_back(double(r));
                g.y.push_back(gt[size_t(r * dims + d)]);
            }
            spec.series.push_back(std::move(g));
        }
        for (int64_t c = 0; c < pred.num_calls(); ++c) {
            io::PlotSeries p{label_calls ? fmt::format("call {}", c) : "", io::palette_color(size_t(c)), {}, {}, 1.5, false, {}};
            const int64_t anchor = pred.anchors[size_t(c)];
            p.tooltip = fmt::format("call {} (anchor frame {})", c, anchor);
            if (metrics && size_t(c) < metrics->per_call.size() && std::isfinite(metrics->per_call[size_t(c)]))
                p.tooltip += fmt::format(": MSE {:.6g} over all dims", metrics->per_call[size_t(c)]);
            for (int64_t s = 0; s < steps; ++s) {
                // NOTE: only where there is ground truth to compare with: the x axis ends at the last frame.
                const int64_t row = anchor + offset + s;
                if (gt_rows > 0 && (row < 0 || row >= gt_rows)) continue;
                p.x.push_back(double(row));
                p.y.push_back(pred.at(c, s, d));
            }
            spec.series.push_back(std::move(p));
        }
        std::string key;
        for (const auto& k : keys)
            if (dims == keys_end && d >= k.begin && d < k.end)
                key = k.end - k.begin == 1 ? fmt::format(" {}", k.name) : fmt::format(" {}[{}]", k.name, d - k.begin);
        const double mse = metrics && size_t(d) < metrics->per_dim.size() ? metrics->per_dim[size_t(d)] : kNaN;
        spec.title = std::isfinite(mse) ? fmt::format("action dim {}{}  (MSE={:.6f})", d, key, mse)
                                        : fmt::format("action dim {}{}", d, key);
        spec.x_label = "frame";
        specs.push_back(std::move(spec));
    }
    return specs;
}

void write_action_plots(io::ResultWriter& out, const io::ActionChunks& pred, std::span<const double> gt,
                        int64_t gt_rows, const Metrics& metrics, const io::PlotRasterizer& png,
                        std::span<const ActionKey> keys) {
    std::vector<io::Image> panels;
    int64_t d = 0;
    for (const io::PlotSpec& spec : action_plot_specs(pred, gt, gt_rows, &metrics, keys)) {
        panels.push_back(png(spec));
        out.write_png(fmt::format("action_dim_{}.png", d++), panels.back());
    }
    out.write_png("all_action_dims.png", io::tile_images(panels, 2));
}

Metrics write_metrics(io::ResultWriter& out, const io::ActionChunks& pred, std::span<const double> gt,
                      int64_t gt_rows, const MetricsOptions& options, const io::PlotRasterizer& png,
                      std::span<const ActionKey> keys) {
    Metrics m = compute_metrics(pred, gt, gt_rows, options, keys);
    if (m.compared_steps == 0)
        log()->warn("{}: no predicted step has a ground-truth row ({} rows, --metric-offset {}): the MSE is undefined "
                    "(null in metrics.json)",
                    out.dir().string(), gt_rows, options.gt_offset);
    out.write_json("metrics.json", m.to_json());
    out.write_text("mse.csv", m.mse_csv());
    out.write_with(kGtActionsFile, [&](const fs::path& p) { io::write_npy_f64(p, {gt_rows, pred.dims}, gt); });
    if (png) write_action_plots(out, pred, gt, gt_rows, m, png, keys);
    return m;
}

// ---- summary ----

EpisodeSummary summary_from_outputs(const fs::path& dir, const std::string& name) {
    EpisodeSummary e;
    e.name = name;
    e.status = "skipped";
    auto load = [](const fs::path& p) -> std::optional<Json> {
        std::error_code ec;
        if (!fs::is_regular_file(p, ec)) return std::nullopt;
        try {
            return parse_json_strict<Json>(io::read_file(p), p.string());
        } catch (const Json::exception& ex) {
            DZR_THROW("{}: invalid JSON: {}", p.string(), ex.what());
        }
    };
    const fs::path done_path = dir / std::string(io::kDoneMarker);
    const auto done = load(done_path);
    DZR_CHECK(done.has_value(), "{}: the episode has no {} (it did not finish)", dir.string(), io::kDoneMarker);
    try {
        e.num_frames = done->value("num_frames", int64_t(0));
        e.num_calls = done->value("num_calls", int64_t(0));
    } catch (const Json::exception& ex) {
        DZR_THROW("{}: {}", done_path.string(), ex.what());
    }
    if (auto m = load(dir / "metrics.json")) e.metrics = Metrics::from_json(*m, (dir / "metrics.json").string());
    read_call_timings(dir, e);
    return e;
}

void set_gpu_energy(const Json& telemetry, int64_t calls, EpisodeSummary& e) {
    e.gpu_energy_j.reset();
    e.gpu_energy_calls = 0;
    if (!telemetry.is_array() || telemetry.empty()) return;
    double sum = 0;
    for (const Json& g : telemetry) {
        const auto en = g.find("energy_j");
        if (en == g.end() || !en->is_number()) return;  // one GPU unmeasured: no total
        sum += en->get<double>();
    }
    e.gpu_energy_j = sum;
    e.gpu_energy_calls = calls;
}

void read_call_timings(const fs::path& dir, EpisodeSummary& e) {
    const fs::path path = dir / "timing.json";
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) return;
    Json t;
    try {
        t = parse_json_strict<Json>(io::read_file(path), path.string());
    } catch (const Json::exception& ex) {
        DZR_THROW("{}: invalid JSON: {}", path.string(), ex.what());
    }
    try {
        for (const auto& c : t.at("calls")) {
            if (!c.at("timed").get<bool>()) continue;
            e.call_ms.push_back(c.at("total_ms").get<double>());
            const Json& ph = c.at("phases_ms");
            for (int p = 0; p < kNumPhases; ++p) {
                const auto it = ph.find(std::string(kPhaseNames[size_t(p)]));
                if (it != ph.end()) e.phase_ms[size_t(p)].push_back(it->get<double>());
            }
            if (c.contains("host_prepare_ms")) e.host_prepare_ms.push_back(c.at("host_prepare_ms").get<double>());
        }
        if (const auto g = t.find("gpu_telemetry"); g != t.end()) set_gpu_energy(*g, int64_t(t.at("calls").size()), e);
    } catch (const Json::exception& ex) {
        DZR_THROW("{}: not a timing report: {}", path.string(), ex.what());
    }
}

Json summary_json(std::span<const EpisodeSummary> episodes) {
    Json list = Json::array();
    int64_t ok = 0, failed = 0, skipped = 0, interrupted = 0, incomplete = 0, invalid = 0;
    double pooled_sum = 0;
    int64_t pooled_n = 0;
    std::vector<std::pair<std::string, double>> key_sum;
    std::vector<double> all_calls;
    double energy_sum = 0;
    int64_t energy_calls = 0, energy_episodes = 0;
    for (const auto& e : episodes) {
        ok += e.status == "ok";
        failed += e.status == "failed";
        skipped += e.status == "skipped";
        interrupted += e.status == "interrupted";
        incomplete += e.status == "incomplete";
        invalid += e.status == "invalid";
        Json j = {{"name", e.name}, {"status", e.status}, {"num_frames", e.num_frames}, {"num_calls", e.num_calls}};
        if (!e.error.empty()) j["error"] = e.error;
        if (e.metrics) {
            j["overall_mse"] = number_or_null(e.metrics->overall_mse);
            Json keys = Json::object();
            for (const auto& [k, v] : e.metrics->per_key) keys[k] = number_or_null(v);
            j["per_key_mse"] = keys;
            j["compared_steps"] = e.metrics->compared_steps;
            if (e.metrics->compared_steps > 0 && std::isfinite(e.metrics->overall_mse)) {
                // Every compared step weighs the same, whichever episode it came from.
                const double w = double(e.metrics->compared_steps);
                pooled_sum += e.metrics->overall_mse * w;
                pooled_n += e.metrics->compared_steps;
                for (const auto& [k, v] : e.metrics->per_key) {
                    // NOTE: a named copy: clang before 16 cannot capture a structured binding.
                    const std::string& key = k;
                    auto it = std::find_if(key_sum.begin(), key_sum.end(), [&](auto& p) { return p.first == key; });
                    if (it == key_sum.end()) it = key_sum.insert(key_sum.end(), {k, 0.0});
                    it->second += v * w;
                }
            }
        }
        if (!e.call_ms.empty()) j["call_ms"] = stats_json(compute_stats(e.call_ms));
        all_calls.insert(all_calls.end(), e.call_ms.begin(), e.call_ms.end());
        if (e.gpu_energy_j) {
            j["gpu_energy_j"] = *e.gpu_energy_j;
            if (e.gpu_energy_calls > 0) j["gpu_energy_j_per_call"] = *e.gpu_energy_j / double(e.gpu_energy_calls);
            energy_sum += *e.gpu_energy_j;
            energy_calls += e.gpu_energy_calls;
            ++energy_episodes;
        }
        list.push_back(j);
    }
    Json totals = {{"episodes", int64_t(episodes.size())}, {"ok", ok}, {"failed", failed}, {"skipped", skipped}};
    if (interrupted > 0) totals["interrupted"] = interrupted;
    if (incomplete > 0) totals["incomplete"] = incomplete;
    if (invalid > 0) totals["invalid"] = invalid;
    if (pooled_n > 0) {
        totals["overall_mse"] = pooled_sum / double(pooled_n);
        Json keys = Json::object();
        for (const auto& [k, v] : key_sum) keys[k] = v / double(pooled_n);
        totals["per_key_mse"] = keys;
        totals["compared_steps"] = pooled_n;
    }
    if (!all_calls.empty()) totals["call_ms"] = stats_json(compute_stats(all_calls));
    if (energy_episodes > 0) {
        // NOTE: over the episodes that measured it (totals.gpu_energy_episodes says how many)
        totals["gpu_energy_j"] = energy_sum;
        totals["gpu_energy_episodes"] = energy_episodes;
        if (energy_calls > 0) totals["gpu_energy_j_per_call"] = energy_sum / double(energy_calls);
    }
    return {{"episodes", list}, {"totals", totals}};
}

std::string summary_csv(std::span<const EpisodeSummary> episodes) {
    std::string out = "episode,status,frames,calls,overall_mse,joint_position_mse,gripper_position_mse,"
                      "call_ms_median,call_ms_p90,call_ms_max,gpu_energy_j_per_call,error\n";
    for (const auto& e : episodes) {
        auto key = [&](std::string_view k) {
            if (!e.metrics) return std::string();
            for (const auto& [name, v] : e.metrics->per_key)
                if (name == k) return csv_number(v);
            return std::string();
        };
        const TimingStats t = compute_stats(e.call_ms);
        const bool timed = !e.call_ms.empty();
        const bool energy = e.gpu_energy_j && e.gpu_energy_calls > 0;
        out += fmt::format("{},{},{},{},{},{},{},{},{},{},{},{}\n", csv_field(e.name), e.status, e.num_frames,
                           e.num_calls, e.metrics ? csv_number(e.metrics->overall_mse) : "", key("joint_position"),
                           key("gripper_position"), timed ? fmt::format("{:.3f}", t.median) : "",
                           timed ? fmt::format("{:.3f}", t.p90) : "", timed ? fmt::format("{:.3f}", t.max) : "",
                           energy ? fmt::format("{:.1f}", *e.gpu_energy_j / double(e.gpu_energy_calls)) : "",
                           csv_field(e.error));
    }
    return out;
}

void write_summary(const fs::path& out_dir, std::span<const EpisodeSummary> episodes) {
    io::write_file_atomic(out_dir / "summary.json", dump_json(summary_json(episodes)) + "\n");
    io::write_file_atomic(out_dir / "summary.csv", summary_csv(episodes));
}

}  // namespace dzr::rollout
