#include "config/kv_config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>

#include "backend/options.h"
#include "core/error.h"
#include "config/model_config.h"

namespace dzr {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::string lower(std::string s) {
    for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

std::string trim(const std::string& s) {
    const auto b = s.find_first_not_of(" \t");
    if (b == std::string::npos) return {};
    const auto e = s.find_last_not_of(" \t");
    return s.substr(b, e - b + 1);
}

/// The whole of `text` as a finite non-negative double, or nothing.
bool parse_number(const std::string& text, double& out) {
    if (text.empty()) return false;
    const char* end = text.data() + text.size();
    auto [ptr, ec] = std::from_chars(text.data(), end, out);
    return ec == std::errc() && ptr == end && std::isfinite(out) && out >= 0.0;
}

}  // namespace

KvGeometry KvGeometry::from_model(const ModelConfig& model, DType dtype, int num_branches) {
    KvGeometry g;
    g.num_layers = model.dit.num_layers;
    g.num_kv_heads = model.dit.num_heads;
    g.head_dim = model.dit.head_dim();
    g.tokens_per_frame = model.dit.frame_seqlen;
    g.chunk_frames = model.dit.num_frame_per_block;
    g.prefill_frames = 1;
    g.register_tokens = model.dit.num_action_per_block + model.dit.num_state_per_block;
    g.text_tokens = model.dit.text_len;
    g.image_tokens = model.clip.num_tokens();
    g.num_branches = num_branches;
    g.dtype = dtype;
    return g;
}

void KvGeometry::validate() const {
    const std::pair<const char*, int> positive[] = {
        {"num_layers", num_layers},         {"num_kv_heads", num_kv_heads},
        {"head_dim", head_dim},             {"tokens_per_frame", tokens_per_frame},
        {"chunk_frames", chunk_frames},     {"prefill_frames", prefill_frames},
        {"num_branches", num_branches},     {"sessions", sessions},
    };
    for (const auto& [name, value] : positive)
        DZR_CHECK(value >= 1, "kv geometry: {} must be >= 1, got {}", name, value);
    const std::pair<const char*, int> non_negative[] = {
        {"register_tokens", register_tokens}, {"text_tokens", text_tokens}, {"image_tokens", image_tokens}};
    for (const auto& [name, value] : non_negative)
        DZR_CHECK(value >= 0, "kv geometry: {} must be >= 0, got {}", name, value);
    DZR_CHECK(dtype_is_float(dtype), "kv geometry: the cache dtype must be a float type, got {}", dtype_name(dtype));
}

std::string KvBudget::str() const {
    switch (kind) {
        case KvBudgetKind::Auto:
            return "auto (one session)";
        case KvBudgetKind::Bytes:
            return fmt::format("{} ({} bytes)", format_bytes(bytes), bytes);
        case KvBudgetKind::Fraction:
            return fmt::format("{:g}% of free device memory", fraction * 100.0);
    }
    return "?";
}

KvBudget parse_kv_budget(const std::string& text) {
    const std::string t = lower(trim(text));
    const auto fail = [&](const char* why) {
        DZR_THROW("kv.memory_budget: cannot read '{}': {} (expected \"auto\", a byte count such as 13421772800 "
                  "or \"12.5GiB\", or a fraction of free device memory such as \"40%\" or 0.4)",
                  text, why);
    };
    if (t == "auto") return {};
    KvBudget b;
    double value = 0.0;
    if (!t.empty() && t.back() == '%') {
        if (!parse_number(trim(t.substr(0, t.size() - 1)), value)) fail("not a number before '%'");
        b.kind = KvBudgetKind::Fraction;
        b.fraction = value / 100.0;
    } else {
        static const std::pair<const char*, double> kUnits[] = {
            {"kib", 1024.0}, {"mib", 1048576.0}, {"gib", 1073741824.0}, {"tib", 1099511627776.0},
            {"kb", 1e3},     {"mb", 1e6},        {"gb", 1e9},           {"tb", 1e12},
            {"b", 1.0}};
        double unit = 0.0;
        std::string number = t;
        for (const auto& [suffix, factor] : kUnits) {
            const std::string s(suffix);
            if (t.size() > s.size() && t.compare(t.size() - s.size(), s.size(), s) == 0) {
                number = trim(t.substr(0, t.size() - s.size()));
                unit = factor;
                break;
            }
        }
        if (!parse_number(number, value)) fail("not a number");
        if (unit > 0.0) {
            b.kind = KvBudgetKind::Bytes;
            b.bytes = uint64_t(std::llround(value * unit));
        } else if (number.find_first_of(".e") != std::string::npos) {
            b.kind = KvBudgetKind::Fraction;  // a plain decimal: a fraction of free memory
            b.fraction = value;
        } else {
            b.kind = KvBudgetKind::Bytes;
            b.bytes = uint64_t(std::llround(value));
        }
    }
    if (b.kind == KvBudgetKind::Fraction && !(b.fraction > 0.0 && b.fraction <= 1.0))
        fail("a fraction of free memory must lie in (0, 1]");
    if (b.kind == KvBudgetKind::Bytes && b.bytes == 0) fail("a byte budget must be positive");
    return b;
}

namespace {
// A real window is 9 latent frames; this bound only refuses sizes no device could hold
constexpr int kMaxWindowFrames = 1024;
}  // namespace

void KvConfig::validate(const KvGeometry& g) const {
    g.validate();
    // NOTE: bounded so that an absurd window is refused here, not by a pool allocation after the weights load
    DZR_CHECK(window_frames >= 1 && window_frames <= kMaxWindowFrames, "kv.window_frames: must lie in [1, {}], got {}",
              kMaxWindowFrames, window_frames);
    DZR_CHECK(frames_per_block >= 1, "kv.frames_per_block: must be >= 1, got {}", frames_per_block);
    DZR_CHECK(sink_frames >= 0 && sink_frames < window_frames,
              "kv.sink_frames: must lie in [0, window_frames = {}), got {}", window_frames, sink_frames);
    const int max_current = int(g.max_current_video_frames());
    DZR_CHECK(window_frames >= max_current,
              "kv.window_frames: {} frames cannot hold one forward's {} current frames", window_frames, max_current);
    if (memory_budget.kind == KvBudgetKind::Bytes)
        DZR_CHECK(memory_budget.bytes > 0, "kv.memory_budget: a byte budget must be positive");
    if (memory_budget.kind == KvBudgetKind::Fraction)
        DZR_CHECK(memory_budget.fraction > 0.0 && memory_budget.fraction <= 1.0,
                  "kv.memory_budget: a fraction of free memory must lie in (0, 1], got {}", memory_budget.fraction);
    if (reset_at_boundary) {
        DZR_CHECK(sink_frames == 0,
                  "kv.sink_frames: {} sink frames need sliding eviction; set kv.reset_at_boundary: false to use them",
                  sink_frames);
        // NOTE: the owner resets before a chunk would not fit, so a branch holds at most window - chunk frames;
        // the window's first (prefill) forward must fit in that.
        DZR_CHECK(window_frames - g.chunk_frames >= g.prefill_frames,
                  "kv.window_frames: {} frames leave no room for a {}-frame prefill plus a {}-frame chunk",
                  window_frames, g.prefill_frames, g.chunk_frames);
    } else {
        // NOTE: sliding eviction drops whole blocks, so every frame count it works with must be whole blocks.
        const std::pair<const char*, int> aligned[] = {{"kv.sink_frames", sink_frames},
                                                       {"kv.window_frames", window_frames},
                                                       {"the model's chunk frames", g.chunk_frames},
                                                       {"the model's prefill frames", g.prefill_frames}};
        for (const auto& [name, value] : aligned)
            DZR_CHECK(value % frames_per_block == 0,
                      "{}: {} is not a multiple of kv.frames_per_block = {} (needed by sliding eviction)", name,
                      value, frames_per_block);
    }
}

const char* kv_mode_name(KvMode mode) { return mode == KvMode::Paged ? "paged" : "dense"; }

KvMode parse_kv_mode(const std::string& text, const std::string& what) {
    if (text == "paged") return KvMode::Paged;
    if (text == "dense") return KvMode::Dense;
    DZR_THROW("{}: expected paged or dense, got '{}'", what, text);
}

KvConfig parse_kv_config(const YAML::Node& kv) {
    KvConfig c;
    if (!kv || kv.IsNull()) return c;
    DZR_CHECK(kv.IsMap(), "kv: expected a map of settings, got a {}", kv.IsSequence() ? "list" : "scalar");
    for (const auto& item : kv) {
        const std::string key = item.first.as<std::string>();
        const YAML::Node& value = item.second;
        const std::string text = value.IsScalar() ? value.Scalar() : std::string("<not a scalar>");
        try {
            if (key == "window_frames") {
                c.window_frames = value.as<int>();
            } else if (key == "sink_frames") {
                c.sink_frames = value.as<int>();
            } else if (key == "frames_per_block") {
                c.frames_per_block = value.as<int>();
            } else if (key == "reset_at_boundary") {
                c.reset_at_boundary = value.as<bool>();
            } else if (key == "memory_budget") {
                DZR_CHECK(value.IsScalar(), "kv.memory_budget: expected a scalar");
                c.memory_budget = parse_kv_budget(value.Scalar());
            } else if (key == "dtype") {
                DZR_CHECK(value.IsScalar(), "kv.dtype: expected bf16 or fp8");
                c.dtype = parse_precision(value.Scalar(), "kv.dtype");
            } else if (key == "mode") {
                DZR_CHECK(value.IsScalar(), "kv.mode: expected paged or dense");
                c.mode = parse_kv_mode(value.Scalar(), "kv.mode");
            } else if (key == "in_place") {
                DZR_CHECK(value.IsScalar(), "kv.in_place: expected auto, true or false");
                c.in_place = parse_kv_in_place(value.Scalar(), "kv.in_place");
            } else {
                DZR_THROW("kv.{}: unknown key (known: window_frames, sink_frames, frames_per_block, memory_budget, "
                          "reset_at_boundary, dtype, in_place, mode)",
                          key);
            }
        } catch (const YAML::Exception&) {
            DZR_THROW("kv.{}: cannot read '{}' as {}", key, text,
                      key == "reset_at_boundary" ? "true/false" : "an integer");
        }
    }
    return c;
}

KvLimits kv_limits(const KvGeometry& g, const KvConfig& c) {
    c.validate(g);
    KvLimits l;
    const int64_t tpf = g.tokens_per_frame;
    l.block_tokens = int64_t(c.frames_per_block) * tpf;
    l.scratch_tokens = g.max_current_video_frames() * tpf + g.register_tokens;
    if (c.reset_at_boundary) {
        l.sink_blocks = 0;
        l.max_committed_tokens = int64_t(c.window_frames - g.chunk_frames) * tpf;
        l.max_blocks_per_branch = int(ceil_div(l.max_committed_tokens, l.block_tokens));
        l.max_history_tokens = l.max_committed_tokens;
        l.table_width = l.max_blocks_per_branch;
    } else {
        const int64_t min_current = std::min(g.prefill_frames, g.chunk_frames);
        l.sink_blocks = c.sink_frames / c.frames_per_block;
        l.max_committed_tokens = int64_t(c.sink_frames + c.window_frames) * tpf;
        l.max_blocks_per_branch = int(l.max_committed_tokens / l.block_tokens);
        l.max_history_tokens = (c.sink_frames + c.window_frames - min_current) * tpf;
        l.table_width = int(l.max_history_tokens / l.block_tokens);
    }
    if (g.lanes) {
        const std::string why = kv_lanes_refusal(c, g);
        DZR_CHECK(why.empty(), "kv.in_place: lanes need {}", why);
        if (g.num_branches == 1) {
            // NOTE: the longest history a forward sees, then its current rows (video, then register) right after it
            l.lane_blocks = std::max(l.max_blocks_per_branch,
                                     int(ceil_div(l.max_history_tokens + l.scratch_tokens, l.block_tokens)));
            l.lane_ids = l.lane_blocks;
        } else {
            // NOTE: mirrored: [branch 0's history | its current rows | branch 1's current rows | branch 1's history],
            // the current rows of both where one batched forward's K and V rows lie one after the other
            const int64_t middle_rows = 2 * l.scratch_tokens;
            l.lane_blocks = l.max_blocks_per_branch;
            l.middle_blocks = int(middle_rows / l.block_tokens);
            l.shift_rows = middle_rows % l.block_tokens;
            l.lane_ids = 2 * l.lane_blocks + l.middle_blocks + (l.shift_rows > 0 ? 1 : 0);
        }
    }
    return l;
}

const char* kv_in_place_name(KvInPlace mode) {
    switch (mode) {
        case KvInPlace::Auto:
            return "auto";
        case KvInPlace::On:
            return "true";
        case KvInPlace::Off:
            return "false";
    }
    return "?";
}

KvInPlace parse_kv_in_place(const std::string& text, const std::string& what) {
    std::string t;
    for (char ch : text) t += char(std::tolower(static_cast<unsigned char>(ch)));
    if (t == "auto") return KvInPlace::Auto;
    try {
        return parse_switch(t) ? KvInPlace::On : KvInPlace::Off;  // the DZR_* switches' spellings
    } catch (const Error&) {
        DZR_THROW("{}: expected auto, true or false, got '{}'", what, text);
    }
}

std::string kv_lanes_refusal(const KvConfig& config, const KvGeometry& geometry) {
    if (!config.reset_at_boundary)
        return "kv.reset_at_boundary: true (sliding eviction moves the history's first block out of its lane)";
    if (geometry.fp8_pool) return "a bf16 pool, not kv.dtype fp8 (the attention dequantizes an fp8 pool's rows by a gather)";
    if (geometry.num_branches > 2)
        return fmt::format("one or two CFG branches on the device, not {}", geometry.num_branches);
    if (geometry.sessions > 1)
        return fmt::format("one session in the cache, not {} (max_sessions; the lanes lay out one session's blocks)",
                           geometry.sessions);
    return {};
}

bool resolve_kv_lanes(const KvConfig& config, const KvGeometry& geometry, bool fast_device) {
    if (config.in_place == KvInPlace::Off) return false;
    const std::string why = kv_lanes_refusal(config, geometry);
    if (config.in_place == KvInPlace::Auto) return fast_device && why.empty();
    DZR_CHECK(why.empty(), "kv.in_place: true needs {}", why);
    return true;
}

std::string format_bytes(uint64_t bytes) {
    static const char* kNames[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = double(bytes);
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        ++u;
    }
    if (u == 0) return fmt::format("{} B", bytes);
    std::string s = fmt::format("{:.2f}", v);
    while (s.back() == '0') s.pop_back();
    if (s.back() == '.') s.pop_back();
    return s + " " + kNames[u];
}

}  // namespace dzr
