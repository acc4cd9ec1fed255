#include "config/run_config.h"

#include "config/run_fields.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>

#include "config/model_fields.h"
#include "core/error.h"
#include "core/yaml_text.h"

namespace dzr::config {

namespace fs = std::filesystem;

namespace {

/// Shared by all readers of one document: the file name and the keys set from the command line.
struct Context {
    std::string source;
    std::set<std::string> overridden;
    std::string_view text;  // the document's text (for the checks the parsed tree cannot make); may be empty

    std::string origin(const std::string& path) const {
        for (const auto& o : overridden)
            if (o == path || o.rfind(path + ".", 0) == 0) return fmt::format(" (set by --set {})", o);
        return "";
    }
};

std::string scalar_text(const YAML::Node& n) {
    if (!n.IsDefined() || n.IsNull()) return "nothing";
    if (n.IsScalar()) return "'" + n.Scalar() + "'";
    if (n.IsSequence()) return "a list";
    return "a map";
}

[[noreturn]] void bad(const Context& ctx, const std::string& path, const char* expected,
                      const YAML::Node& n) {
    DZR_THROW("{}: {}: expected {}, got {}{}", ctx.source, path, expected, scalar_text(n), ctx.origin(path));
}

int64_t parse_integer(const YAML::Node& n, const Context& ctx, const std::string& path, int64_t lo,
                      int64_t hi) {
    if (!n.IsScalar()) bad(ctx, path, "an integer", n);
    const std::string& s = n.Scalar();
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || end != s.c_str() + s.size() || errno == ERANGE || v < lo || v > hi)
        bad(ctx, path, "an integer", n);
    return v;
}

void read(const YAML::Node& n, int& out, const Context& c, const std::string& p) {
    out = int(parse_integer(n, c, p, INT32_MIN, INT32_MAX));
}
void read(const YAML::Node& n, uint64_t& out, const Context& c, const std::string& p) {
    // NOTE: seeds are stored as u64 but written in YAML as non-negative int64 values.
    out = uint64_t(parse_integer(n, c, p, 0, INT64_MAX));
}
void read(const YAML::Node& n, float& out, const Context& c, const std::string& p) {
    if (!n.IsScalar()) bad(c, p, "a number", n);
    const std::string& s = n.Scalar();
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    if (s.empty() || end != s.c_str() + s.size() || !std::isfinite(v)) bad(c, p, "a number", n);
    out = float(v);
}
void read(const YAML::Node& n, bool& out, const Context& c, const std::string& p) {
    if (!n.IsScalar()) bad(c, p, "true or false", n);
    const std::string& s = n.Scalar();
    if (s == "true" || s == "True" || s == "TRUE") {
        out = true;
    } else if (s == "false" || s == "False" || s == "FALSE") {
        out = false;
    } else {
        bad(c, p, "true or false", n);
    }
}
void read(const YAML::Node& n, std::string& out, const Context& c, const std::string& p) {
    if (!n.IsScalar()) bad(c, p, "a string", n);
    out = n.Scalar();
}
void read(const YAML::Node& n, Precision& out, const Context& c, const std::string& p) {
    if (!n.IsScalar() || (n.Scalar() != "bf16" && n.Scalar() != "fp8")) bad(c, p, "bf16 or fp8", n);
    out = parse_precision(n.Scalar(), p);
}
void read(const YAML::Node& n, Numerics& out, const Context& c, const std::string& p) {
    if (!n.IsScalar() || (n.Scalar() != "fast" && n.Scalar() != "reference")) bad(c, p, "fast or reference", n);
    out = parse_numerics(n.Scalar());
}
void read(const YAML::Node& n, KvMode& out, const Context& c, const std::string& p) {
    if (!n.IsScalar() || (n.Scalar() != "paged" && n.Scalar() != "dense")) bad(c, p, "paged or dense", n);
    out = parse_kv_mode(n.Scalar(), p);
}
void read(const YAML::Node& n, KvInPlace& out, const Context& c, const std::string& p) {
    if (!n.IsScalar()) bad(c, p, "auto, true or false", n);
    out = parse_kv_in_place(n.Scalar(), p);
}
void read(const YAML::Node& n, KvBudget& out, const Context& c, const std::string& p) {
    if (!n.IsScalar()) bad(c, p, "auto, a byte size or a percentage", n);
    out = parse_kv_budget(n.Scalar());
}

/// A quoted value left open on its line runs over the keys after it (YAML folds them into the value, and a
/// double quote open to the end of the file is no syntax error for yaml-cpp): an error naming those keys.
/// Values set by --set are skipped (their marks point into the override's text).
void reject_swallowed_keys(const YAML::Node& n, const Context& c, const std::string& path, int depth = 0) {
    if (c.text.empty() || depth > 64 || !c.origin(path).empty()) return;
    if (n.IsScalar()) {
        const std::vector<std::string> keys = yaml_swallowed_keys(c.text, n.Mark().line, n.Mark().column);
        if (keys.empty()) return;
        std::string list;
        for (const auto& k : keys) list += (list.empty() ? "" : ", ") + k;
        DZR_THROW("{}: line {}: the quoted value of {} is not closed on its line and swallows the key{} {} "
                  "(close the quote)",
                  c.source, n.Mark().line + 1, path.empty() ? "the document" : path, keys.size() == 1 ? "" : "s",
                  list);
    } else if (n.IsMap()) {
        for (auto it = n.begin(); it != n.end(); ++it) {
            const std::string k = it->first.IsScalar() ? it->first.Scalar() : "?";
            reject_swallowed_keys(it->second, c, path.empty() ? k : path + "." + k, depth + 1);
        }
    } else if (n.IsSequence()) {
        for (size_t i = 0; i < n.size(); ++i) reject_swallowed_keys(n[i], c, fmt::format("{}[{}]", path, i), depth + 1);
    }
}
void read(const YAML::Node& n, std::vector<int>& out, const Context& c, const std::string& p) {
    if (!n.IsSequence()) bad(c, p, "a list of integers", n);
    out.clear();
    for (size_t i = 0; i < n.size(); ++i) {
        int v = 0;
        read(n[i], v, c, fmt::format("{}[{}]", p, i));
        out.push_back(v);
    }
}
void read(const YAML::Node& n, std::vector<bool>& out, const Context& c, const std::string& p) {
    if (!n.IsSequence()) bad(c, p, "a list of booleans", n);
    out.clear();
    for (size_t i = 0; i < n.size(); ++i) {
        bool v = false;
        read(n[i], v, c, fmt::format("{}[{}]", p, i));
        out.push_back(v);
    }
}
void read(const YAML::Node& n, std::array<int, 3>& out, const Context& c, const std::string& p) {
    if (!n.IsSequence() || n.size() != 3) bad(c, p, "a list of 3 integers", n);
    for (size_t i = 0; i < 3; ++i) read(n[i], out[i], c, fmt::format("{}[{}]", p, i));
}

/// A YAML map read key by key; finish() rejects the keys nobody asked for.
class Section {
  public:
    // NOTE: an absent section is an empty map. The node of a missing key is invalid in yaml-cpp (reset() on it
    // throws YAML::InvalidNode, which the fuzzer found), so a fresh map is made instead of reusing it.
    Section(const YAML::Node& node, std::string path, const Context& ctx)
        : node_(node.IsDefined() && !node.IsNull() ? node : YAML::Node(YAML::NodeType::Map)),
          path_(std::move(path)),
          ctx_(ctx) {
        if (!node_.IsMap()) bad(ctx_, path_, "a map", node);
    }

    std::string key_path(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

    /// The child node (undefined when absent); marks the key as known.
    YAML::Node child(const std::string& key) {
        known_.insert(key);
        const YAML::Node& n = node_;  // NOTE: const lookup, so a missing key is not inserted
        return n[key];
    }

    template <class T>
    void get(const std::string& key, T& out, bool required) {
        const YAML::Node n = child(key);
        if (!n.IsDefined()) {
            DZR_CHECK(!required, "{}: {} is missing", ctx_.source, key_path(key));
            return;
        }
        read(n, out, ctx_, key_path(key));
    }

    void finish() const {
        for (auto it = node_.begin(); it != node_.end(); ++it) {
            const std::string k = it->first.Scalar();
            if (!known_.count(k)) {
                const std::string p = key_path(k);
                DZR_THROW("{}: unknown key {}{}", ctx_.source, p, ctx_.origin(p));
            }
        }
    }

  private:
    YAML::Node node_;
    std::string path_;
    const Context& ctx_;
    std::set<std::string> known_;
};

ModelConfig read_model(const YAML::Node& node, const Context& ctx) {
    DZR_CHECK(node.IsDefined() && !node.IsNull(), "{}: the model: section is missing", ctx.source);
    ModelConfig m;
    Section top(node, "model", ctx);
    std::map<std::string, Section> subs;
    for (const char* name : {"dit", "t5", "clip", "vae"}) {
        const YAML::Node n = top.child(name);
        DZR_CHECK(n.IsDefined(), "{}: model.{} is missing", ctx.source, name);
        subs.emplace(name, Section(n, std::string("model.") + name, ctx));
    }
    for_each_model_field(m, [&](const ModelField& f, auto& value) {
        const std::string yaml(f.yaml);
        const auto dot = yaml.find('.');
        if (dot == std::string::npos) {
            top.get(yaml, value, true);
        } else {
            subs.at(yaml.substr(0, dot)).get(yaml.substr(dot + 1), value, true);
        }
    });
    for (const auto& [name, s] : subs) s.finish();
    top.finish();
    return m;
}

/// Which steps evaluate the DiT must follow from the settings without a guess: a NUM_DIT_STEPS preset (defined
/// for 16 steps), every step (num_dit_steps = num_inference_steps), an explicit mask, or the dynamic schedule.
void check_step_plan(SamplingConfig& s, bool dit_steps_given, const Context& ctx) {
    const std::string steps_origin = ctx.origin("sampling.num_inference_steps");
    const std::string dit_origin = ctx.origin("sampling.num_dit_steps");
    if (s.dynamic_schedule) {
        // NOTE: the dynamic schedule decides while it runs; num_dit_steps does not apply (the manifest says so).
        DZR_CHECK(s.dit_step_mask.empty(),
                  "{}: sampling.dit_step_mask and sampling.dynamic_schedule: true exclude each other{}", ctx.source,
                  ctx.origin("sampling.dit_step_mask") + ctx.origin("sampling.dynamic_schedule"));
        return;
    }
    if (!s.dit_step_mask.empty()) {
        DZR_CHECK(int(s.dit_step_mask.size()) == s.num_inference_steps,
                  "{}: sampling.dit_step_mask has {} entries, expected num_inference_steps = {}{}", ctx.source,
                  s.dit_step_mask.size(), s.num_inference_steps, steps_origin);
        DZR_CHECK(s.dit_step_mask[0],
                  "{}: sampling.dit_step_mask[0] must be true (the first step runs the DiT)", ctx.source);
        const int count = int(std::count(s.dit_step_mask.begin(), s.dit_step_mask.end(), true));
        DZR_CHECK(!dit_steps_given || s.num_dit_steps == count,
                  "{}: sampling.num_dit_steps = {}{} but sampling.dit_step_mask runs the DiT at {} steps; make them "
                  "agree (or leave num_dit_steps out)",
                  ctx.source, s.num_dit_steps, dit_origin, count);
        s.num_dit_steps = count;
        return;
    }
    DZR_CHECK(s.num_dit_steps > 0 && s.num_dit_steps <= s.num_inference_steps,
              "{}: sampling.num_dit_steps must be in [1, num_inference_steps = {}], got {}{}", ctx.source,
              s.num_inference_steps, s.num_dit_steps, dit_origin);
    if (s.num_dit_steps == s.num_inference_steps) return;  // every step
    if (s.num_inference_steps == kPresetInferenceSteps) {
        DZR_CHECK(s.num_dit_steps >= 5 && s.num_dit_steps <= 8,
                  "{}: sampling.num_dit_steps = {}{} has no preset for {} steps (the presets are 5, 6, 7 and 8; {} "
                  "runs every step); list the steps in sampling.dit_step_mask instead",
                  ctx.source, s.num_dit_steps, dit_origin, kPresetInferenceSteps, kPresetInferenceSteps);
        return;
    }
    DZR_THROW("{}: sampling.num_dit_steps = {}{} has a preset only for num_inference_steps = {}, but "
              "sampling.num_inference_steps = {}{}; set sampling.num_dit_steps = {} to run the DiT at every step, or "
              "list the steps in sampling.dit_step_mask",
              ctx.source, s.num_dit_steps, dit_origin, kPresetInferenceSteps, s.num_inference_steps, steps_origin,
              s.num_inference_steps);
}

void read_sampling(const YAML::Node& node, RunConfig& rc, const Context& ctx) {
    SamplingConfig& s = rc.sampling;
    Section sec(node, "sampling", ctx);
    const bool dit_steps_given = sec.child("num_dit_steps").IsDefined();
    for_each_section_field(rc, "sampling",
                           [&](const Setting& f, auto& value) { sec.get(std::string(f.field()), value, false); });
    sec.finish();
    DZR_CHECK(s.num_inference_steps >= 1 && s.num_inference_steps <= kMaxInferenceSteps,
              "{}: sampling.num_inference_steps must be in [1, {}], got {}{}", ctx.source, kMaxInferenceSteps,
              s.num_inference_steps, ctx.origin("sampling.num_inference_steps"));
    DZR_CHECK(s.sigma_shift > 0 && s.sigma_shift <= kMaxSigmaShift,
              "{}: sampling.sigma_shift must be in (0, {}], got {}{}", ctx.source, kMaxSigmaShift, s.sigma_shift,
              ctx.origin("sampling.sigma_shift"));
    DZR_CHECK(s.cfg_scale >= 0 && s.cfg_scale <= kMaxCfgScale, "{}: sampling.cfg_scale must be in [0, {}], got {}{}",
              ctx.source, kMaxCfgScale, s.cfg_scale, ctx.origin("sampling.cfg_scale"));
    check_step_plan(s, dit_steps_given, ctx);
}


void read_kv(const YAML::Node& node, KvConfig& k, const ModelConfig& model, const Context& ctx) {
    // NOTE: the `kv:` section belongs to lib/kv (parse_kv_config, KvConfig::validate); only the file
    // name and the --set origin are added here.
    try {
        k = parse_kv_config(node);
        k.validate(KvGeometry::from_model(model, DType::BF16));
    } catch (const Error& e) {
        std::string note;
        for (const auto& o : ctx.overridden)
            if (o.rfind("kv.", 0) == 0) note = fmt::format(" (kv settings changed by --set {})", o);
        DZR_THROW("{}: {}{}", ctx.source, e.what(), note);
    }
}

void read_rollout(const YAML::Node& node, RunConfig& rc, const Context& ctx) {
    const RolloutConfig& r = rc.rollout;
    Section sec(node, "rollout", ctx);
    for_each_section_field(rc, "rollout",
                           [&](const Setting& f, auto& value) { sec.get(std::string(f.field()), value, false); });
    sec.finish();
    DZR_CHECK(r.stride > 0 && r.stride <= kMaxFrameIndex, "{}: rollout.stride must be in [1, {}], got {}",
              ctx.source, kMaxFrameIndex, r.stride);
    DZR_CHECK(!r.offsets.empty(), "{}: rollout.offsets must not be empty", ctx.source);
    for (size_t i = 0; i < r.offsets.size(); ++i) {
        DZR_CHECK(r.offsets[i] <= 0 && r.offsets[i] >= -kMaxFrameIndex,
                  "{}: rollout.offsets[{}] = {} must be in [-{}, 0] (no frames after the anchor)", ctx.source, i,
                  r.offsets[i], kMaxFrameIndex);
        DZR_CHECK(i == 0 || r.offsets[i] > r.offsets[i - 1], "{}: rollout.offsets must increase strictly",
                  ctx.source);
    }
    DZR_CHECK(r.max_chunks >= 0 && r.max_chunks <= kMaxFrameIndex, "{}: rollout.max_chunks must be in [0, {}], got {}",
              ctx.source, kMaxFrameIndex, r.max_chunks);
    DZR_CHECK(r.start_frame >= 0 && r.start_frame <= kMaxFrameIndex,
              "{}: rollout.start_frame must be in [0, {}], got {}", ctx.source, kMaxFrameIndex, r.start_frame);
}

RunConfig read_run_config(YAML::Node root, const std::string& source, std::string_view text,
                          const std::vector<Override>& overrides) {
    Context ctx{source, {}, text};
    if (!root.IsDefined() || root.IsNull()) root.reset(YAML::Node(YAML::NodeType::Map));
    DZR_CHECK(root.IsMap(), "{}: expected a YAML map at the top level", source);
    for (const auto& o : overrides) {
        try {
            apply_override(root, o);
        } catch (const Error& e) {
            DZR_THROW("{}: {}", source, e.what());
        }
        ctx.overridden.insert(o.path);
    }
    reject_swallowed_keys(root, ctx, "");
    RunConfig rc;
    Section top(root, "", ctx);
    rc.model = read_model(top.child("model"), ctx);
    read_sampling(top.child("sampling"), rc, ctx);
    require_consistent_model_config(rc.model, source);
    read_kv(top.child("kv"), rc.kv, rc.model, ctx);
    read_rollout(top.child("rollout"), rc, ctx);
    for_each_section_field(rc, "", [&](const Setting& f, auto& value) {
        const std::string key(f.key);
        top.get(key, value, false);
        check_setting_value(rc, f, fmt::format("{}: {}{}", source, key, ctx.origin(key)));
    });
    top.get("description", rc.description, false);
    top.finish();
    return rc;
}

YAML::Node load_yaml_text(const std::string& text, const std::string& source) {
    YAML::Node root;
    try {
        root = YAML::Load(text);
    } catch (const YAML::Exception& e) {
        DZR_THROW("{}: YAML syntax error at line {}, column {}: {}", source, e.mark.line + 1,
                  e.mark.column + 1, e.msg);
    }
    check_yaml_unique_keys(root, source);
    return root;
}

}  // namespace

Override parse_override(const std::string& text) {
    const auto eq = text.find('=');
    DZR_CHECK(eq != std::string::npos, "--set {}: expected KEY=VALUE (e.g. sampling.cfg_scale=3.5)", text);
    Override o{text.substr(0, eq), text.substr(eq + 1)};
    DZR_CHECK(!o.path.empty() && o.path.front() != '.' && o.path.back() != '.' &&
                  o.path.find("..") == std::string::npos,
              "--set {}: invalid key '{}'", text, o.path);
    return o;
}

void apply_override(YAML::Node& root, const Override& o) {
    YAML::Node value;
    try {
        value = YAML::Load(o.value);
    } catch (const YAML::Exception& e) {
        DZR_THROW("--set {}={}: the value is not valid YAML: {}", o.path, o.value, e.msg);
    }
    DZR_CHECK(value.IsNull() || value.IsScalar() || value.IsSequence(),
              "--set {}={}: the value must be a scalar or a list", o.path, o.value);
    std::vector<std::string> parts;
    size_t start = 0;
    for (size_t dot; (dot = o.path.find('.', start)) != std::string::npos; start = dot + 1)
        parts.push_back(o.path.substr(start, dot - start));
    parts.push_back(o.path.substr(start));

    // NOTE: yaml-cpp nodes are handles; `cur = child` would overwrite the parent's content, so walk with
    // reset(), which rebinds the handle.
    YAML::Node cur;
    cur.reset(root);
    std::string walked;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
        walked += (i ? "." : "") + parts[i];
        YAML::Node next = cur[parts[i]];
        if (!next.IsDefined() || next.IsNull()) {
            cur[parts[i]] = YAML::Node(YAML::NodeType::Map);
            next.reset(cur[parts[i]]);
        }
        DZR_CHECK(next.IsMap(), "--set {}: {} is not a map", o.path, walked);
        cur.reset(next);
    }
    cur[parts.back()] = value;
}

RunConfig parse_run_config(const std::string& yaml_text, const std::string& source,
                           const std::vector<Override>& overrides) {
    return read_run_config(load_yaml_text(yaml_text, source), source, yaml_text, overrides);
}

RunConfig load_run_config(const fs::path& path, const std::vector<Override>& overrides) {
    std::FILE* f = std::fopen(path.c_str(), "rb");
    DZR_CHECK(f != nullptr, "cannot open config {}: {}", path.string(), std::strerror(errno));
    std::string text;
    char buf[65536];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, n);
    std::fclose(f);
    RunConfig rc = parse_run_config(text, path.string(), overrides);
    rc.source = path;
    return rc;
}

void set_setting(RunConfig& run, const Setting& s, const std::string& text, const std::string& where) {
    YAML::Node node;
    try {
        node = YAML::Load(text);
    } catch (const YAML::Exception&) {
        DZR_THROW("{}: expected {}, got '{}'", where, s.values, text);
    }
    const Context ctx{where, {}, {}};
    bool found = false;
    for_each_run_field(run, [&](const Setting& f, auto& value) {
        if (f.key != s.key) return;
        found = true;
        auto parsed = value;
        try {
            read(node, parsed, ctx, std::string(f.key));
        } catch (const Error&) {
            DZR_THROW("{}: expected {}, got '{}'", where, s.values, text);
        }
        value = std::move(parsed);
    });
    DZR_CHECK(found, "{}: no run setting {}", where, s.key);
    check_setting_value(run, s, where);
}

ModelConfig model_config_from_yaml(const YAML::Node& model, const std::string& source) {
    Context ctx{source, {}, {}};
    return read_model(model, ctx);
}

uint64_t parse_byte_size(const std::string& text, const std::string& what) {
    static const std::map<std::string, double> kUnits = {
        {"", 1},      {"B", 1},        {"KB", 1e3},        {"MB", 1e6},           {"GB", 1e9},
        {"TB", 1e12}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0},
    };
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    std::string unit(end ? end : "");
    while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
    auto it = kUnits.find(unit);
    DZR_CHECK(!text.empty() && end != text.c_str() && it != kUnits.end() && std::isfinite(v) && v >= 0,
              "{}: '{}' is not a byte size (examples: 1000000, 64MiB, 5GB)", what, text);
    const double bytes = v * it->second;
    DZR_CHECK(bytes < 1.8e19, "{}: '{}' is too large", what, text);
    return uint64_t(std::llround(bytes));
}

uint64_t parse_memory_budget(const std::string& text, const std::string& what) {
    DZR_CHECK(!text.empty(), "{}: empty; give a size such as 44GiB, 48GB or 32000MiB", what);
    uint64_t bytes = 0;
    try {
        bytes = parse_byte_size(text, what);
    } catch (const Error&) {
        DZR_THROW("{}: '{}' is not a memory size (examples: 44GiB, 48GB, 32000MiB, 47244640256)", what, text);
    }
    DZR_CHECK(bytes > 0, "{}: '{}' is zero bytes; give a positive size such as 44GiB", what, text);
    return bytes;
}

std::string format_count(uint64_t n) {
    const std::string digits = std::to_string(n);
    std::string s;
    for (size_t i = 0; i < digits.size(); ++i) {
        if (i > 0 && (digits.size() - i) % 3 == 0) s.push_back(',');
        s.push_back(digits[i]);
    }
    return s;
}

std::string format_bytes(uint64_t bytes) {
    const char* units[] = {"B", "KB", "MB", "GB", "TB"};
    double v = double(bytes);
    int u = 0;
    while (v >= 1000 && u < 4) {
        v /= 1000;
        ++u;
    }
    if (u == 0) return fmt::format("{} B", bytes);
    return fmt::format("{:.2f} {} ({} bytes)", v, units[u], format_count(bytes));
}

std::optional<int> parse_offload_layers(const std::string& text, const std::string& what) {
    if (text == "auto") return std::nullopt;
    int n = -1;
    const char* end = text.data() + text.size();
    const auto [ptr, ec] = std::from_chars(text.data(), end, n);
    DZR_CHECK(!text.empty() && ec == std::errc() && ptr == end && n >= 0,
              "{}: expected auto or a count of DiT layers (0, 1, ...), got '{}'", what, text);
    return n;
}

}  // namespace dzr::config
