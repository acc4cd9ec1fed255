#include "rollout/report_html.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/json_text.h"
#include "io/atomic_file.h"
#include "io/npy.h"
#include "io/png.h"
#include "io/result_writer.h"
#include "io/svg.h"
#include "rollout/report_assets.h"
#include "rollout/reports.h"

namespace dzr::rollout {

namespace fs = std::filesystem;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr std::string_view kReportDir = "report";
/// Frames per row of a frame strip, and the widest a strip frame is drawn.
constexpr int64_t kStripFrames = 8;
constexpr int64_t kStripMaxWidth = 320;

/// Phases stacked in the timing chart, bottom to top, with their colours.
const std::array<io::Rgb, kNumPhases> kPhaseColors = {{{199, 199, 199},
                                                        {148, 103, 189},
                                                        {197, 176, 213},
                                                        {44, 160, 44},
                                                        {255, 127, 14},
                                                        {31, 119, 180},
                                                        {214, 39, 40},
                                                        {127, 127, 127}}};

std::string esc(std::string_view s) { return io::xml_escape(s); }

/// A file name as one URL path segment (RFC 3986 unreserved characters kept, the rest %XX).
std::string url_segment(std::string_view s) {
    std::string out;
    for (unsigned char c : s) {
        if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') out += char(c);
        else out += fmt::format("%{:02X}", c);
    }
    return out;
}

std::string fmt_num(double v, const char* spec) { return std::isfinite(v) ? fmt::format(fmt::runtime(spec), v) : "–"; }
/// The raw value for the table's sort (empty sorts last).
std::string sort_key(double v) { return std::isfinite(v) ? fmt::format("{}", v) : ""; }

std::optional<Json> load_json(const fs::path& p, std::string& problem) {
    std::error_code ec;
    if (!fs::is_regular_file(p, ec)) return std::nullopt;
    try {
        return parse_json_strict<Json>(io::read_file(p), p.string());
    } catch (const Json::exception& e) {
        problem = fmt::format("{}: invalid JSON ({})", p.filename().string(), e.what());
    } catch (const Error& e) {
        problem = e.what();
    }
    return std::nullopt;
}

struct Video {
    std::string predicted, observed;  // file names in the episode directory
    bool npy = false;                 // .npy frames (no encoder): shown as a frame strip
};

/// Everything the report shows of one episode.
struct Episode {
    std::string name;
    fs::path dir;
    std::string status;  // ok, failed, incomplete
    std::vector<std::string> notes;
    int64_t num_frames = 0;
    int64_t num_calls = 0;
    std::optional<Json> manifest;
    std::optional<Metrics> metrics;
    // timing.json
    std::vector<int64_t> call_index, call_anchor;
    std::vector<double> call_ms;  // every call's total
    std::vector<bool> call_timed;
    std::array<std::vector<double>, kNumPhases> phase_ms;
    std::optional<Json> timing_extra;  // device, load, warm-up, video, peak memory
    TimingStats stats;                 // over the timed calls
    // actions.npy and gt_actions.npy
    std::optional<io::ActionChunks> actions;
    std::vector<double> gt;
    int64_t gt_rows = 0;
    Video video;
};

/// What the summary table keeps of an episode (the rest is dropped once its page is written).
struct Row {
    std::string name, status, notes;
    int64_t num_frames = 0, num_calls = 0;
    double median_s = kNaN, p90_s = kNaN, overall_mse = kNaN;
    std::vector<double> per_dim_mse;
};

void note_problem(Episode& e, std::string problem) {
    if (e.status == "ok") e.status = "incomplete";
    e.notes.push_back(std::move(problem));
}

void read_timing(Episode& e, const Json& t) {
    std::vector<double> timed;
    for (const auto& c : t.at("calls")) {
        e.call_index.push_back(c.at("call").get<int64_t>());
        e.call_anchor.push_back(c.value("anchor", int64_t(0)));
        const double total = c.at("total_ms").get<double>();
        e.call_ms.push_back(total);
        const bool is_timed = c.value("timed", true);
        e.call_timed.push_back(is_timed);
        if (is_timed) timed.push_back(total);
        const Json& ph = c.at("phases_ms");
        for (int p = 0; p < kNumPhases; ++p) {
            const auto it = ph.find(std::string(kPhaseNames[size_t(p)]));
            e.phase_ms[size_t(p)].push_back(it != ph.end() && it->is_number() ? it->get<double>() : kNaN);
        }
    }
    e.stats = compute_stats(timed);
    Json extra = Json::object();
    for (const char* k : {"device", "checkpoint_load_ms", "warmup", "peak_gpu_memory_bytes",
                          "planned_peak_gpu_memory_bytes", "video", "gpu_telemetry"})
        if (t.contains(k)) extra[k] = t.at(k);
    e.timing_extra = extra;
}

void read_actions(Episode& e) {
    const fs::path p = e.dir / "actions.npy";
    std::error_code ec;
    if (!fs::is_regular_file(p, ec)) return;
    try {
        const io::NpyArray a = io::read_npy(p);
        DZR_CHECK(a.rank() == 3 && a.dim(0) == int64_t(e.call_anchor.size()),
                  "{}: expected [calls, horizon, dims] with {} calls (timing.json), got {}", p.filename().string(),
                  e.call_anchor.size(), a.shape_str());
        io::ActionChunks chunks;
        chunks.horizon = a.dim(1);
        chunks.dims = a.dim(2);
        const std::vector<float> v = a.to_f32();
        const size_t per_call = size_t(chunks.horizon * chunks.dims);
        for (int64_t c = 0; c < a.dim(0); ++c)
            chunks.append(e.call_anchor[size_t(c)], std::span<const float>(v).subspan(size_t(c) * per_call, per_call));
        e.actions = std::move(chunks);
    } catch (const Error& err) {
        note_problem(e, err.what());
        return;
    }
    const fs::path g = e.dir / std::string(kGtActionsFile);
    if (!fs::is_regular_file(g, ec)) return;
    try {
        const io::NpyArray a = io::read_npy(g);
        DZR_CHECK(a.rank() == 2 && a.dim(1) == e.actions->dims, "{}: expected [frames, {}], got {}",
                  g.filename().string(), e.actions->dims, a.shape_str());
        e.gt = a.to_f64();
        e.gt_rows = a.dim(0);
    } catch (const Error& err) {
        note_problem(e, err.what());
    }
}

void find_videos(Episode& e) {
    std::error_code ec;
    for (const char* ext : {".webm", ".mp4", ".npy"}) {
        const std::string p = std::string("predicted_video") + ext, o = std::string("observed_video") + ext;
        if (fs::is_regular_file(e.dir / p, ec) && fs::is_regular_file(e.dir / o, ec)) {
            e.video = Video{p, o, std::string(ext) == ".npy"};
            return;
        }
    }
}

/// Reads one episode's outputs; problems become notes and the status "incomplete", never errors.
Episode read_episode(const fs::path& out_dir, const std::string& name, const Json* summary_entry) {
    Episode e;
    e.name = name;
    e.dir = out_dir / name;
    e.status = "ok";
    std::string summary_status;
    if (summary_entry) {
        summary_status = summary_entry->value("status", "");
        e.num_frames = summary_entry->value("num_frames", int64_t(0));
        e.num_calls = summary_entry->value("num_calls", int64_t(0));
    }
    if (summary_status == "failed") {
        e.status = "failed";
        e.notes.push_back(summary_entry->value("error", "failed"));
    }
    std::error_code ec;
    if (!fs::is_directory(e.dir, ec)) {
        if (e.status != "failed") note_problem(e, "no output directory");
        return e;
    }
    std::string problem;
    const auto done = load_json(e.dir / std::string(io::kDoneMarker), problem);
    e.manifest = load_json(e.dir / "manifest.json", problem);
    if (!problem.empty()) note_problem(e, std::exchange(problem, {}));
    if (!done) {
        std::string why = fmt::format("no {}: the run did not finish this episode", io::kDoneMarker);
        if (e.manifest && e.manifest->contains("interrupted")) {
            const Json& i = e.manifest->at("interrupted");
            why = fmt::format("interrupted after {} of {} calls", i.value("calls_done", int64_t(0)),
                              i.value("calls_scheduled", int64_t(0)));
        }
        if (e.status != "failed") note_problem(e, why);
    } else {
        e.num_frames = done->value("num_frames", e.num_frames);
        e.num_calls = done->value("num_calls", e.num_calls);
        std::vector<std::string> missing;
        if (done->contains("files") && done->at("files").is_array())
            for (const auto& f : done->at("files"))
                if (f.is_string() && !fs::exists(e.dir / f.get<std::string>(), ec)) missing.push_back(f.get<std::string>());
        if (!missing.empty()) note_problem(e, fmt::format("missing: {}", fmt::join(missing, ", ")));
    }
    if (auto t = load_json(e.dir / "timing.json", problem)) {
        try {
            read_timing(e, *t);
        } catch (const Json::exception& ex) {
            note_problem(e, fmt::format("timing.json: not a timing report ({})", ex.what()));
            e.call_index.clear(), e.call_anchor.clear(), e.call_ms.clear(), e.call_timed.clear();
            for (auto& p : e.phase_ms) p.clear();
        }
    } else if (!problem.empty()) {
        note_problem(e, std::exchange(problem, {}));
    }
    if (auto m = load_json(e.dir / "metrics.json", problem)) {
        try {
            e.metrics = Metrics::from_json(*m, "metrics.json");
        } catch (const Error& err) {
            note_problem(e, err.what());
        }
    } else if (!problem.empty()) {
        note_problem(e, std::exchange(problem, {}));
    }
    read_actions(e);
    if (e.num_calls == 0) e.num_calls = int64_t(e.call_ms.size());
    find_videos(e);
    return e;
}

/// Episode names: summary.json's order, then any other subdirectory that holds an episode's files.
std::vector<std::string> episode_names(const fs::path& out_dir, const std::optional<Json>& summary) {
    std::vector<std::string> names;
    std::set<std::string> seen;
    if (summary && summary->contains("episodes") && summary->at("episodes").is_array())
        for (const auto& e : summary->at("episodes"))
            if (e.is_object() && e.contains("name") && e.at("name").is_string() && seen.insert(e.at("name")).second)
                names.push_back(e.at("name").get<std::string>());
    std::vector<std::string> found;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(out_dir, ec)) {
        if (!entry.is_directory(ec)) continue;
        const std::string n = entry.path().filename().string();
        if (n == kReportDir || seen.count(n)) continue;
        for (const char* marker : {"done.json", "manifest.json", "actions.npy"})
            if (fs::is_regular_file(entry.path() / marker, ec)) {
                found.push_back(n);
                break;
            }
    }
    std::sort(found.begin(), found.end());
    names.insert(names.end(), found.begin(), found.end());
    return names;
}

// ---- page pieces --------------------------------------------------------------------------------------

std::string page_head(const std::string& title, std::string_view page_kind) {
    return fmt::format(R"(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{}</title>
<script>{}</script>
<style>{}</style>
</head><body data-page="{}">
)",
                       esc(title), kReportErrorHook, kReportCss, page_kind);
}

std::string page_tail() { return fmt::format("<script>{}</script>\n</body></html>\n", kReportJs); }

/// A row of the run table, when the value is there.
void info_row(std::string& out, std::string_view key, const std::string& value) {
    if (value.empty()) return;
    out += fmt::format("<tr><th>{}</th><td>{}</td></tr>\n", esc(key), esc(value));
}

std::string json_text(const Json& j) { return j.is_string() ? j.get<std::string>() : j.dump(); }

/// A checkpoint of random weights (manifest.json's `random_weights`) is said first, on every page.
std::string random_weights_banner(const Json* manifest) {
    if (!manifest || !manifest->contains("random_weights") || !manifest->at("random_weights").is_string()) return "";
    return fmt::format("<p class=\"random-weights\"><strong>{}:</strong> the checkpoint was made by <code>dzr ckpt "
                       "make</code>; its actions are noise and its MSE means nothing.</p>\n",
                       esc(manifest->at("random_weights").get<std::string>()));
}

/// The run: from the first episode manifest that has one (a --resume run may mix several; each
/// episode page shows its own).
std::string run_table(const Json* manifest, const std::string& out_dir, const std::string& generated_at) {
    std::string out = "<table class=\"kv\">\n";
    info_row(out, "output", out_dir);
    if (manifest) {
        const Json& m = *manifest;
        auto get = [&](const char* k) { return m.contains(k) ? json_text(m.at(k)) : std::string(); };
        info_row(out, "checkpoint", get("checkpoint"));
        if (m.contains("config") && m.at("config").is_object()) {
            const Json& c = m.at("config");
            info_row(out, "config", c.contains("config_file") ? json_text(c.at("config_file")) : "");
            for (const char* k : {"sampling", "kv", "rollout", "embodiment", "numerics", "precision"})
                if (c.contains(k)) info_row(out, k, json_text(c.at(k)));
        }
        for (const char* k : {"numerics", "precision", "policy", "device", "seed", "start_time"}) info_row(out, k, get(k));
        const std::string version = get("dzr_version");
        if (!version.empty()) info_row(out, "dzr", fmt::format("{} ({})", version, get("git_hash")));
        if (m.contains("command_line") && m.at("command_line").is_array()) {
            std::vector<std::string> args;
            for (const auto& a : m.at("command_line")) args.push_back(json_text(a));
            info_row(out, "command", fmt::format("{}", fmt::join(args, " ")));
        }
    }
    info_row(out, "report written", generated_at);
    return out + "</table>\n";
}

Row summary_row(const Episode& e) {
    Row r;
    r.name = e.name;
    r.status = e.status;
    r.notes = fmt::format("{}", fmt::join(e.notes, "; "));
    r.num_frames = e.num_frames;
    r.num_calls = e.num_calls;
    if (e.stats.count > 0) r.median_s = e.stats.median / 1e3, r.p90_s = e.stats.p90 / 1e3;
    if (e.metrics) r.overall_mse = e.metrics->overall_mse, r.per_dim_mse = e.metrics->per_dim;
    return r;
}

/// One <tr> of the summary table, `dims` MSE columns wide.
std::string row_html(const Row& r, size_t index, size_t dims) {
    auto cell = [](double v, const char* spec) { return fmt::format(R"(<td data-v="{}">{}</td>)", sort_key(v), fmt_num(v, spec)); };
    std::string row = fmt::format(R"(<tr><td data-v="{0}">{0}</td><td data-v="{1}"><a href="{2}/{3}.html">{1}</a></td>)"
                                  R"(<td data-v="{4}"><span class="status {4}">{4}</span></td>)",
                                  index, esc(r.name), kReportDir, url_segment(r.name), r.status);
    row += fmt::format(R"(<td data-v="{0}">{0}</td><td data-v="{1}">{1}</td>)", r.num_frames, r.num_calls);
    row += cell(r.median_s, "{:.3f}") + cell(r.p90_s, "{:.3f}") + cell(r.overall_mse, "{:.4g}");
    for (size_t d = 0; d < dims; ++d) row += cell(d < r.per_dim_mse.size() ? r.per_dim_mse[d] : kNaN, "{:.4g}");
    return row + fmt::format("<td class=\"note\">{}</td></tr>\n", esc(r.notes));
}

/// Up to kStripFrames frames of the predicted video over the same frames observed, as one PNG.
void write_frame_strip(const Episode& e, const fs::path& png) {
    const io::NpyArray pred = io::read_npy(e.dir / e.video.predicted);
    const io::NpyArray obs = io::read_npy(e.dir / e.video.observed);
    DZR_CHECK(pred.dtype() == io::NpyDType::U1 && pred.rank() == 4 && pred.dim(3) == 3 && pred.shape() == obs.shape(),
              "{}: expected uint8 [T, H, W, 3] the shape of {}, got {} and {}", e.video.predicted, e.video.observed,
              pred.describe(), obs.describe());
    const int64_t T = pred.dim(0), H = pred.dim(1), W = pred.dim(2);
    DZR_CHECK(T > 0, "{}: no frames", e.video.predicted);
    const int64_t step = (W + kStripMaxWidth - 1) / kStripMaxWidth;  // integer downscale, nearest pixel
    const int64_t h = (H + step - 1) / step, w = (W + step - 1) / step;
    const int64_t n = std::min(T, kStripFrames);
    std::vector<io::Image> tiles;
    for (const io::NpyArray* video : {&pred, &obs})
        for (int64_t k = 0; k < n; ++k) {
            const int64_t t = n == 1 ? 0 : k * (T - 1) / (n - 1);
            const auto* src = video->ptr<uint8_t>() + size_t(t * H * W * 3);
            std::vector<uint8_t> px(size_t(h * w * 3));
            for (int64_t y = 0; y < h; ++y)
                for (int64_t x = 0; x < w; ++x)
                    for (int c = 0; c < 3; ++c) px[size_t((y * w + x) * 3 + c)] = src[((y * step) * W + x * step) * 3 + c];
            tiles.emplace_back(int(w), int(h), std::move(px));
        }
    io::write_png(png, io::tile_images(tiles, int(n), 4));
}

std::string video_section(const Episode& e, const std::string& up, const fs::path& report_dir) {
    if (e.video.predicted.empty()) return {};
    std::string out = "<section><h2>Predicted and observed video</h2>\n";
    if (!e.video.npy) {
        out += R"(<div class="videos" data-sync>)";
        for (const auto& [label, file] : {std::pair{"predicted", e.video.predicted}, std::pair{"observed", e.video.observed}})
            out += fmt::format(R"(<figure><video src="{}{}/{}" preload="auto" muted loop playsinline></video>)"
                               R"(<figcaption>{}</figcaption></figure>)",
                               up, url_segment(e.name), url_segment(file), label);
        out += R"(</div><p class="controls"><button type="button" class="play">play both</button> )"
               R"(<input type="range" class="seek" min="0" max="1000" value="0" aria-label="position"> )"
               R"(<select class="rate" aria-label="speed"><option value="0.25">0.25x</option><option value="0.5">0.5x</option>)"
               R"(<option value="1" selected>1x</option><option value="2">2x</option></select> <span class="time"></span></p>)";
        out += "\n</section>\n";
        return out;
    }
    const std::string strip = e.name + "_frames.png";
    try {
        write_frame_strip(e, report_dir / strip);
        out += fmt::format(R"(<p>This build writes no video a browser plays; {} frames of {} (top) and {} (bottom):</p>)"
                           R"(<img class="strip" src="{}" alt="frame strip">)",
                           kStripFrames, esc(e.video.predicted), esc(e.video.observed), url_segment(strip));
    } catch (const Error& err) {
        out += fmt::format("<p class=\"note\">frame strip not drawn: {}</p>", esc(err.what()));
    }
    return out + "\n</section>\n";
}

std::string metrics_section(const Episode& e) {
    if (!e.metrics) return "<section><h2>Metrics</h2><p>No metrics.json (the episode has no ground-truth actions, "
                           "or did not finish).</p></section>\n";
    const Metrics& m = *e.metrics;
    std::string out = "<section><h2>Metrics</h2>\n<table class=\"kv\">\n";
    info_row(out, "overall MSE", fmt_num(m.overall_mse, "{:.6g}"));
    for (const auto& [k, v] : m.per_key) info_row(out, k + " MSE", fmt_num(v, "{:.6g}"));
    info_row(out, "compared steps", fmt::format("{} (skipped {}: no ground-truth row)", m.compared_steps, m.skipped_steps));
    info_row(out, "alignment", fmt::format("step s of the call at anchor a vs ground-truth row a + {} + s; steps {}",
                                           m.options.gt_offset, m.options.steps < 0 ? "all" : std::to_string(m.options.steps)));
    out += "</table>\n<div class=\"plots\">\n";
    io::PlotSpec calls{"MSE per call", "call", "MSE", {}, 640, 260};
    io::PlotSeries s{"", io::kPlotBlue, {}, {}, 1.5, true, "MSE of each call over all dims"};
    for (size_t c = 0; c < m.per_call.size(); ++c) {
        s.x.push_back(double(c));
        s.y.push_back(m.per_call[c]);
    }
    calls.series.push_back(s);
    calls.integer_x = true;
    out += io::plot_svg(calls) + "\n";
    io::PlotSpec steps{"MSE per step of the chunk", "step", "MSE", {}, 640, 260};
    io::PlotSeries st{"", io::kPlotOrange, {}, {}, 1.5, true, "MSE of each step within the chunk"};
    for (size_t k = 0; k < m.per_step.size(); ++k) {
        st.x.push_back(double(k));
        st.y.push_back(m.per_step[k]);
    }
    steps.series.push_back(st);
    steps.integer_x = true;
    out += io::plot_svg(steps) + "\n</div></section>\n";
    return out;
}

std::string timing_section(const Episode& e) {
    if (e.call_ms.empty()) return "<section><h2>Timing</h2><p>No timing.json.</p></section>\n";
    std::string out = "<section><h2>Timing</h2>\n<table class=\"kv\">\n";
    info_row(out, "per call (timed)", e.stats.count > 0 ? fmt::format("median {:.3f} s, p90 {:.3f} s, max {:.3f} s over {} calls",
                                                                      e.stats.median / 1e3, e.stats.p90 / 1e3,
                                                                      e.stats.max / 1e3, e.stats.count)
                                                        : "no timed calls");
    if (e.timing_extra) {
        const Json& t = *e.timing_extra;
        if (t.contains("device")) info_row(out, "device", json_text(t.at("device")));
        if (t.contains("checkpoint_load_ms") && t.at("checkpoint_load_ms").is_number())
            info_row(out, "checkpoint load", fmt::format("{:.2f} s", t.at("checkpoint_load_ms").get<double>() / 1e3));
        if (t.contains("warmup") && t.at("warmup").is_object())
            info_row(out, "warm-up", fmt::format("{} calls, {:.2f} s", t.at("warmup").value("calls", int64_t(0)),
                                                 t.at("warmup").value("total_ms", 0.0) / 1e3));
        if (t.contains("peak_gpu_memory_bytes") && t.at("peak_gpu_memory_bytes").is_number())
            info_row(out, "peak GPU memory",
                     fmt::format("{:.2f} GiB", t.at("peak_gpu_memory_bytes").get<double>() / double(1ull << 30)));
        if (t.contains("planned_peak_gpu_memory_bytes") && t.at("planned_peak_gpu_memory_bytes").is_number())
            info_row(out, "planned GPU memory",
                     fmt::format("{:.2f} GiB (dzr plan)",
                                 t.at("planned_peak_gpu_memory_bytes").get<double>() / double(1ull << 30)));
        if (t.contains("gpu_telemetry") && t.at("gpu_telemetry").is_array()) {
            for (const Json& g : t.at("gpu_telemetry")) {
                if (!g.is_object()) continue;
                const std::string label = "GPU " + g.value("device", std::string());
                if (g.contains("unavailable")) {
                    info_row(out, label, "not measured: " + json_text(g.at("unavailable")));
                    continue;
                }
                const auto num = [&](const char* a, const char* b) {
                    return g.contains(a) && g.at(a).is_object() && g.at(a).contains(b) && g.at(a).at(b).is_number()
                               ? g.at(a).at(b).get<double>()
                               : 0.0;
                };
                std::string text = fmt::format("SM clock median {:.0f} MHz (max {:.0f}), power median {:.0f} W of {:.0f} W, "
                                               "power-capped in {:.0f}% of the samples",
                                               num("sm_clock_mhz", "median"), num("sm_clock_mhz", "limit"),
                                               num("power_w", "median"), num("power_w", "limit"),
                                               100.0 * g.value("power_capped_fraction", 0.0));
                if (g.contains("energy_j_per_call") && g.at("energy_j_per_call").is_number())
                    text += fmt::format(", {:.0f} J per call", g.at("energy_j_per_call").get<double>());
                info_row(out, label, text);
            }
        }
        if (t.contains("video") && t.at("video").is_object())
            info_row(out, "video", fmt::format("{} frames at {} fps; decode {:.2f} s, write {:.2f} s",
                                               t.at("video").value("frames", int64_t(0)), t.at("video").value("fps", 0.0),
                                               t.at("video").value("decode_ms", 0.0) / 1e3,
                                               t.at("video").value("write_ms", 0.0) / 1e3));
    }
    out += "</table>\n<div class=\"plots\">\n";
    io::StackedBarSpec bars{"phase time per call", "call", "ms", {}, {}, 640, 300};
    for (int64_t c : e.call_index) bars.x.push_back(double(c));
    for (int p = 0; p < kNumPhases; ++p)
        bars.stacks.push_back({std::string(kPhaseNames[size_t(p)]), kPhaseColors[size_t(p)], e.phase_ms[size_t(p)]});
    out += io::stacked_bars_svg(bars) + "\n";
    io::PlotSpec total{"call total", "call", "ms", {}, 640, 300};
    io::PlotSeries s{"", io::kPlotBlue, {}, {}, 1.5, true, "total time of each call (untimed calls included)"};
    for (size_t i = 0; i < e.call_ms.size(); ++i) {
        s.x.push_back(double(e.call_index[i]));
        s.y.push_back(e.call_ms[i]);
    }
    total.series.push_back(s);
    total.integer_x = true;
    out += io::plot_svg(total) + "\n</div></section>\n";
    return out;
}

std::string actions_section(const Episode& e) {
    if (!e.actions) return "<section><h2>Actions</h2><p>No actions.npy.</p></section>\n";
    std::string out = fmt::format("<section><h2>Actions</h2>\n<p>{} calls of {} steps x {} dims; {}each call's chunk "
                                  "in its own colour (hover a line for its call).</p>\n<div class=\"plots\">\n",
                                  e.actions->num_calls(), e.actions->horizon, e.actions->dims,
                                  e.gt_rows > 0 ? "the ground truth in black, " : "no ground truth (gt_actions.npy); ");
    const Metrics* m = e.metrics ? &*e.metrics : nullptr;
    for (const io::PlotSpec& spec : action_plot_specs(*e.actions, e.gt, e.gt_rows, m)) out += io::plot_svg(spec) + "\n";
    return out + "</div></section>\n";
}

std::string episode_page(const Episode& e, const std::string& prev, const std::string& next, const fs::path& report_dir) {
    std::string out = page_head("dzr report: " + e.name, "episode");
    out += "<nav><a href=\"../report.html\">all episodes</a>";
    if (!prev.empty()) out += fmt::format(" · <a href=\"{}.html\">previous: {}</a>", url_segment(prev), esc(prev));
    if (!next.empty()) out += fmt::format(" · <a href=\"{}.html\">next: {}</a>", url_segment(next), esc(next));
    out += "</nav>\n";
    out += fmt::format("<h1>{} <span class=\"status {}\">{}</span></h1>\n", esc(e.name), e.status, e.status);
    out += random_weights_banner(e.manifest ? &*e.manifest : nullptr);
    out += "<table class=\"kv\">\n";
    info_row(out, "frames", std::to_string(e.num_frames));
    info_row(out, "calls", std::to_string(e.num_calls));
    if (!e.notes.empty()) info_row(out, "notes", fmt::format("{}", fmt::join(e.notes, "; ")));
    if (e.manifest) {
        for (const char* k : {"episode", "prompt", "checkpoint", "device", "policy", "numerics", "precision", "start_time"})
            if (e.manifest->contains(k)) info_row(out, k, json_text(e.manifest->at(k)));
        if (e.manifest->contains("warnings") && !e.manifest->at("warnings").empty())
            info_row(out, "warnings", json_text(e.manifest->at("warnings")));
    }
    out += "</table>\n";
    out += video_section(e, "../", report_dir);
    out += actions_section(e);
    out += metrics_section(e);
    out += timing_section(e);
    return out + page_tail();
}

}  // namespace

ReportInfo write_report(const fs::path& out_dir, const ReportOptions& options) {
    std::error_code ec;
    DZR_CHECK(fs::is_directory(out_dir, ec), "{}: no such directory", out_dir.string());
    std::string problem;
    const std::optional<Json> summary = load_json(out_dir / "summary.json", problem);
    const std::vector<std::string> names = episode_names(out_dir, summary);
    DZR_CHECK(summary || !names.empty(),
              "{} is not a dzr rollout output: it has no summary.json and no episode directory (one with done.json, "
              "manifest.json or actions.npy){}",
              out_dir.string(), problem.empty() ? "" : fmt::format("; {}", problem));

    std::map<std::string, const Json*> entries;
    if (summary && summary->contains("episodes") && summary->at("episodes").is_array())
        for (const auto& e : summary->at("episodes"))
            if (e.is_object() && e.contains("name") && e.at("name").is_string()) entries[e.at("name")] = &e;

    const fs::path report_dir = out_dir / std::string(kReportDir);
    fs::create_directories(report_dir, ec);
    DZR_CHECK(!ec, "cannot create {}: {}", report_dir.string(), ec.message());

    ReportInfo info;
    info.path = out_dir / "report.html";
    std::optional<Json> run_manifest;
    std::vector<Row> rows;
    std::vector<double> all_ms;
    size_t dims = 0;
    // One episode at a time: its page is written and only its table row is kept.
    for (size_t i = 0; i < names.size(); ++i) {
        const auto it = entries.find(names[i]);
        const Episode e = read_episode(out_dir, names[i], it == entries.end() ? nullptr : it->second);
        if (!run_manifest && e.manifest) run_manifest = e.manifest;
        for (size_t k = 0; k < e.call_ms.size(); ++k)
            if (e.call_timed[k]) all_ms.push_back(e.call_ms[k]);
        if (e.metrics) dims = std::max(dims, e.metrics->per_dim.size());
        const std::string prev = i > 0 ? names[i - 1] : "", next = i + 1 < names.size() ? names[i + 1] : "";
        io::write_file_atomic(report_dir / (e.name + ".html"), episode_page(e, prev, next, report_dir));
        rows.push_back(summary_row(e));
        info.incomplete += e.status == "incomplete";
        info.failed += e.status == "failed";
    }
    info.episodes = int64_t(rows.size());

    const std::string generated = options.generated_at.empty() ? iso8601_utc(std::chrono::system_clock::now())
                                                               : options.generated_at;
    std::string out = page_head("dzr report: " + out_dir.filename().string(), "index");
    out += "<h1>dzr rollout report</h1>\n";
    out += random_weights_banner(run_manifest ? &*run_manifest : nullptr);
    out += "<section><h2>Run</h2>\n";
    out += run_table(run_manifest ? &*run_manifest : nullptr, out_dir.string(), generated);
    out += "</section>\n<section><h2>Episodes</h2>\n<p class=\"totals\">";
    out += fmt::format("{} episodes: {} ok, {} failed, {} incomplete", info.episodes,
                       info.episodes - info.failed - info.incomplete, info.failed, info.incomplete);
    if (summary && summary->contains("totals") && summary->at("totals").contains("overall_mse") &&
        summary->at("totals").at("overall_mse").is_number())
        out += fmt::format("; pooled MSE {:.6g}", summary->at("totals").at("overall_mse").get<double>());
    if (!all_ms.empty()) {
        const TimingStats t = compute_stats(all_ms);
        out += fmt::format("; {:.3f} s/call median, {:.3f} s p90 over {} timed calls", t.median / 1e3, t.p90 / 1e3, t.count);
    }
    if (!problem.empty()) out += fmt::format("; {}", esc(problem));
    out += "</p>\n";
    out += fmt::format(R"(<div class="table-tools"><input type="search" class="filter" placeholder="filter episodes" )"
                       R"(aria-label="filter"> <span class="pager"></span></div>)"
                       "\n<table class=\"summary\" data-page-size=\"{}\"><thead><tr><th>#</th><th>episode</th>"
                       "<th>status</th><th>frames</th><th>calls</th><th>median s/call</th><th>p90 s/call</th>"
                       "<th>MSE</th>",
                       std::max(1, options.page_size));
    for (size_t d = 0; d < dims; ++d) out += fmt::format("<th>MSE dim {}</th>", d);
    out += "<th>notes</th></tr></thead>\n<tbody>\n";
    for (size_t i = 0; i < rows.size(); ++i) out += row_html(rows[i], i, dims);
    out += "</tbody></table>\n</section>\n" + page_tail();
    io::write_file_atomic(info.path, out);
    return info;
}

}  // namespace dzr::rollout
