#include "io/episode.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <functional>
#include <set>

#include <fmt/ranges.h>

#include "core/error.h"
#include "core/log.h"
#include "core/yaml_text.h"
#include "io/atomic_file.h"
#include "io/npy.h"

namespace dzr::io {

namespace fs = std::filesystem;

namespace {

// NOTE: container fps is a rational (15360/1024 = 15 exactly for DROID) that OpenCV reports as a
// double; anything closer than this is the same rate.
constexpr double kFpsTolerance = 1e-3;

bool same_fps(double a, double b) { return std::abs(a - b) <= kFpsTolerance * std::max(1.0, std::abs(b)); }

/// What episode.yaml says (all fields optional).
struct EpisodeYaml {
    std::optional<std::string> prompt;
    std::optional<double> fps;
    std::map<std::string, std::string> camera_files;
};

std::string camera_list(const EpisodeLayout& layout) {
    std::string out;
    for (size_t i = 0; i < layout.cameras.size(); ++i)
        out += (i == 0 ? "" : i + 1 == layout.cameras.size() ? " and " : ", ") + layout.cameras[i];
    return out;
}

std::string describe_utf8_error(std::string_view text, size_t offset) {
    return fmt::format("byte 0x{:02x} at offset {}", uint8_t(text[offset]), offset);
}

/// A quoted value left open on its line swallows the keys after it into the value: an error naming them.
void reject_swallowed_keys(const std::string& text, const YAML::Node& v, const std::string& file,
                           const std::string& key) {
    const std::vector<std::string> keys = yaml_swallowed_keys(text, v.Mark().line, v.Mark().column);
    if (keys.empty()) return;
    std::string list;
    for (const auto& k : keys) list += (list.empty() ? "'" : ", '") + k + "'";
    DZR_THROW("{}: line {}: the quoted {} is not closed on its line and swallows the line{} starting with {} "
              "(close the quote)",
              file, v.Mark().line + 1, key, keys.size() == 1 ? "" : "s", list);
}

EpisodeYaml read_episode_yaml(const fs::path& file, const EpisodeLayout& layout) {
    EpisodeYaml y;
    const std::string text = read_file(file);
    const std::string name = file.string();
    if (auto bad = find_invalid_utf8(text))
        DZR_THROW("{}: not valid UTF-8 ({}); save the file as UTF-8", name, describe_utf8_error(text, *bad));
    YAML::Node root;
    try {
        root = YAML::Load(text);
    } catch (const YAML::Exception& e) {
        DZR_THROW("{}: invalid YAML at line {}: {}", name, e.mark.line + 1, e.msg);
    }
    check_yaml_unique_keys(root, name);
    if (root.IsNull()) return y;
    DZR_CHECK(root.IsMap(), "{}: expected a mapping with keys prompt, fps, cameras", name);
    try {
        for (const auto& kv : root) {
            const std::string key = kv.first.as<std::string>();
            const YAML::Node& v = kv.second;
            if (key == "prompt") {
                DZR_CHECK(v.IsScalar(), "{}: 'prompt' must be a string", name);
                reject_swallowed_keys(text, v, name, key);
                y.prompt = v.as<std::string>();
            } else if (key == "fps") {
                DZR_CHECK(v.IsScalar(), "{}: 'fps' must be a number", name);
                double fps = 0;
                try {
                    fps = v.as<double>();
                } catch (const YAML::Exception&) {
                    DZR_THROW("{}: 'fps' must be a number, found '{}'", name, v.as<std::string>());
                }
                DZR_CHECK(std::isfinite(fps) && fps > 0, "{}: 'fps' must be positive, found {}", name, fps);
                y.fps = fps;
            } else if (key == "cameras") {
                DZR_CHECK(v.IsMap(), "{}: 'cameras' must map camera names to file names", name);
                for (const auto& c : v) {
                    const std::string cam = c.first.as<std::string>();
                    DZR_CHECK(std::find(layout.cameras.begin(), layout.cameras.end(), cam) != layout.cameras.end(),
                              "{}: unknown camera '{}' under 'cameras' (embodiment {} has {})", name, cam,
                              layout.embodiment, camera_list(layout));
                    DZR_CHECK(c.second.IsScalar() && !c.second.as<std::string>().empty(),
                              "{}: cameras.{} must be a file name", name, cam);
                    y.camera_files[cam] = c.second.as<std::string>();
                }
            } else {
                DZR_THROW("{}: unknown key '{}' (episode.yaml has prompt, fps and cameras)", name, key);
            }
        }
    } catch (const YAML::Exception& e) {
        DZR_THROW("{}: line {}: {}", name, e.mark.line + 1, e.msg);
    }
    return y;
}


/// Finds the file of one camera: the episode.yaml override, else <name>.npy, else <name>.mp4.
fs::path find_camera_file(const fs::path& dir, std::string_view cam, const EpisodeYaml& y, const EpisodeLayout& layout) {
    if (auto it = y.camera_files.find(std::string(cam)); it != y.camera_files.end()) {
        const fs::path p = dir / it->second;
        DZR_CHECK(input_file_present(p), "{}: missing camera file for {} (named in {})", p.string(), cam,
                  (dir / kEpisodeYaml).string());
        DZR_CHECK(p.extension() == ".mp4" || p.extension() == ".npy",
                  "{}: camera file for {} must be .mp4 or .npy", p.string(), cam);
        return p;
    }
    // NOTE: .npy wins when both exist: it is exact (no codec) and needs no video support, and
    // `dzr episode convert` writes it next to the .mp4 it came from.
    for (const char* ext : {".npy", ".mp4"}) {
        const fs::path p = dir / (std::string(cam) + ext);
        if (input_file_present(p)) return p;
    }
    DZR_THROW("{}: missing camera file {} of embodiment {} (expected {}.mp4 or {}.npy)", dir.string(), cam,
              layout.embodiment, cam, cam);
}

/// Image sizes a camera may have: the preprocessing scales each view into its canvas slot keeping the aspect, so
/// a sliver (1 x 20000) would scale to no pixel at all, and a huge frame only costs memory and time.
constexpr int64_t kMaxFrameSide = 16384, kMaxAspect = 32;

void check_frame_size(const fs::path& file, int64_t height, int64_t width) {
    DZR_CHECK(height >= 1 && width >= 1 && height <= kMaxFrameSide && width <= kMaxFrameSide &&
                  std::max(height, width) <= kMaxAspect * std::min(height, width),
              "{}: camera frames are {}x{} (width x height); dzr takes sides of 1 to {} pixels and an aspect ratio of "
              "at most {}:1",
              file.string(), width, height, kMaxFrameSide, kMaxAspect);
}

CameraStream load_camera(const fs::path& file, std::string_view cam, const EpisodeOptions& opt) {
    CameraStream s;
    s.name = std::string(cam);
    s.file = file;
    if (file.extension() == ".npy") {
        const NpyArray a = read_npy(file);
        DZR_CHECK(a.dtype() == NpyDType::U1 && a.rank() == 4 && a.dim(3) == 3,
                  "{}: camera frames must be uint8 [T, H, W, 3], found {}", file.string(), a.describe());
        DZR_CHECK(a.dim(1) > 0 && a.dim(2) > 0, "{}: camera frames have an empty image size {}", file.string(),
                  a.shape_str());
        check_frame_size(file, a.dim(1), a.dim(2));
        s.frames = a.to_tensor();
    } else {
        DZR_CHECK(bool(opt.open_video), "{}: decoding .mp4 needs a video decoder, and none was given; provide "
                  "the frames as {}.npy", file.string(), cam);
        auto reader = opt.open_video(file);
        check_frame_size(file, reader->info().height, reader->info().width);
        s.frames = reader->read_all();
        s.fps = reader->info().fps;
    }
    s.file_frames = s.frames.shape()[0];
    s.height = int(s.frames.shape()[1]);
    s.width = int(s.frames.shape()[2]);
    return s;
}

/// Reads a float array [T, cols] (or [T] when cols == 1) and checks it has no NaN/Inf.
std::vector<double> load_per_frame(const fs::path& file, int64_t cols, int64_t& rows) {
    const NpyArray a = read_npy(file);
    const std::string expected = cols == 1 ? fmt::format("[T, 1] or [T]") : fmt::format("[T, {}]", cols);
    DZR_CHECK(npy_dtype_is_float(a.dtype()), "{}: expected a float array {}, found {}", file.string(), expected,
              a.describe());
    const bool ok = (a.rank() == 2 && a.dim(1) == cols) || (cols == 1 && a.rank() == 1);
    DZR_CHECK(ok, "{}: expected shape {}, found {}", file.string(), expected, a.describe());
    rows = a.dim(0);
    std::vector<double> v = a.to_f64();
    for (size_t i = 0; i < v.size(); ++i) {
        DZR_CHECK(std::isfinite(v[i]), "{}: row {}, column {} is {}", file.string(), int64_t(i) / cols,
                  int64_t(i) % cols, v[i]);
        // NOTE: the model and the reports compute in float32: a float64 value beyond its range turns into inf.
        DZR_CHECK(std::fabs(v[i]) <= double(std::numeric_limits<float>::max()),
                  "{}: row {}, column {} is {}, beyond the float32 range (|x| <= 3.4e38)",
                  file.string(), int64_t(i) / cols, int64_t(i) % cols, v[i]);
    }
    return v;
}

}  // namespace

void validate_prompt(const std::string& prompt, const std::string& source) {
    if (auto bad = find_invalid_utf8(prompt))
        DZR_THROW("{}: the prompt is not valid UTF-8 ({})", source, describe_utf8_error(prompt, *bad));
    const bool blank = std::all_of(prompt.begin(), prompt.end(), [](char c) {
        return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
    });
    DZR_CHECK(!blank, "{}: the prompt is empty", source);
}

std::optional<size_t> find_invalid_utf8(std::string_view s) {
    size_t i = 0;
    while (i < s.size()) {
        const uint8_t c = uint8_t(s[i]);
        if (c < 0x80) {
            ++i;
            continue;
        }
        size_t len = 0;
        uint32_t cp = 0;
        uint32_t min = 0;
        if ((c & 0xe0) == 0xc0) {
            len = 2, cp = c & 0x1f, min = 0x80;
        } else if ((c & 0xf0) == 0xe0) {
            len = 3, cp = c & 0x0f, min = 0x800;
        } else if ((c & 0xf8) == 0xf0) {
            len = 4, cp = c & 0x07, min = 0x10000;
        } else {
            return i;  // a continuation byte without a lead, or 0xf8..0xff
        }
        if (i + len > s.size()) return i;
        for (size_t k = 1; k < len; ++k) {
            const uint8_t cc = uint8_t(s[i + k]);
            if ((cc & 0xc0) != 0x80) return i;
            cp = (cp << 6) | (cc & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
        i += len;
    }
    return std::nullopt;
}

int EpisodeLayout::state_dim() const {
    int n = 0;
    for (const auto& [k, d] : state) n += d;
    return n;
}

std::string EpisodeLayout::expected_files() const {
    std::string s = fmt::format("cameras {} (.mp4 or .npy)", camera_list(*this));
    for (const auto& [k, d] : state) s += fmt::format(", {}.npy [T, {}]", k, d);
    return s + fmt::format(", optionally {} [T, {}]", kActionsFile, action_dim);
}

const CameraStream& Episode::camera(std::string_view cam) const {
    for (const auto& c : cameras)
        if (c.name == cam) return c;
    DZR_THROW("episode {}: no camera named {}", name, cam);
}

const StateArray& Episode::state_array(std::string_view key) const {
    for (const auto& a : state)
        if (a.name == key) return a;
    DZR_THROW("episode {}: no state array {}", name, key);
}

std::vector<double> Episode::state_at(int64_t t) const {
    DZR_CHECK(t >= 0 && t < num_frames, "episode {}: state at frame {} requested, episode has {} frames", name, t,
              num_frames);
    std::vector<double> s;
    for (const auto& a : state)
        s.insert(s.end(), a.values.begin() + ptrdiff_t(t * a.dim), a.values.begin() + ptrdiff_t((t + 1) * a.dim));
    return s;
}

std::string Episode::summary() const {
    std::string s = fmt::format("episode {} ({}, embodiment {})\n  frames: {} at {} fps ({:.2f} s)\n  prompt: {}\n",
                                name, dir.string(), embodiment, num_frames, fps, double(num_frames) / fps, prompt);
    for (const auto& c : cameras)
        s += fmt::format("  {}: {} ({}x{}, {} frames in file{})\n", c.name, c.file.filename().string(), c.width,
                         c.height, c.file_frames, c.fps > 0 ? fmt::format(", {} fps", c.fps) : "");
    for (const auto& a : state)
        s += fmt::format("  {}: {}\n", a.name, a.present ? fmt::format("[T, {}]", a.dim) : std::string("absent (zeros)"));
    s += fmt::format("  ground-truth actions: {}\n", has_actions() ? fmt::format("[T, {}]", action_dim) : "absent");
    for (const auto& w : warnings) s += "  warning: " + w + "\n";
    return s;
}

Episode read_episode(const fs::path& dir, const EpisodeOptions& opt) {
    std::error_code ec;
    DZR_CHECK(fs::is_directory(dir, ec), "{}: not an episode directory (no such directory)", dir.string());
    Episode ep;
    ep.dir = dir;
    ep.name = fs::absolute(dir).lexically_normal().filename().string();
    if (ep.name.empty()) ep.name = fs::absolute(dir).lexically_normal().parent_path().filename().string();

    const fs::path yaml_file = dir / kEpisodeYaml;
    EpisodeYaml y;
    const EpisodeLayout& layout = opt.layout;
    ep.embodiment = layout.embodiment;
    if (input_file_present(yaml_file)) y = read_episode_yaml(yaml_file, layout);

    // Prompt: the option wins over episode.yaml.
    if (opt.prompt) {
        validate_prompt(*opt.prompt, "--prompt");
        ep.prompt = *opt.prompt;
    } else {
        DZR_CHECK(y.prompt.has_value(), "{}: no prompt (add 'prompt: ...' to {} or pass --prompt)", dir.string(),
                  kEpisodeYaml);
        validate_prompt(*y.prompt, yaml_file.string());
        ep.prompt = *y.prompt;
    }

    DZR_CHECK(!layout.cameras.empty(), "episode layout of {} has no cameras", layout.embodiment);
    for (const auto& cam : layout.cameras) {
        const fs::path file = find_camera_file(dir, cam, y, layout);
        ep.cameras.push_back(load_camera(file, cam, opt));
    }

    // Frame rate: episode.yaml, else the video containers (which must agree), else DROID's 15.
    const CameraStream* fps_source = nullptr;
    for (const auto& c : ep.cameras) {
        if (c.fps <= 0) continue;
        if (y.fps) {
            DZR_CHECK(same_fps(c.fps, *y.fps), "{}: {} fps, but {} says {} fps", c.file.string(), c.fps,
                      yaml_file.string(), *y.fps);
        } else if (fps_source) {
            DZR_CHECK(same_fps(c.fps, fps_source->fps), "{}: {} fps, but {} is {} fps (cameras must share one rate)",
                      c.file.string(), c.fps, fps_source->file.string(), fps_source->fps);
        } else {
            fps_source = &c;
        }
    }
    ep.fps = y.fps ? *y.fps : fps_source ? fps_source->fps : layout.fps;

    // Per-frame arrays: state (optional, zeros with a warning) and ground-truth actions (optional).
    struct PerFrame {
        fs::path file;
        int64_t rows = 0;
    };
    std::vector<PerFrame> per_frame;
    int64_t rows = 0;
    for (const auto& [key, dim] : layout.state) {
        StateArray a;
        a.name = key;
        a.dim = dim;
        const fs::path file = dir / (key + ".npy");
        if (input_file_present(file)) {
            a.values = load_per_frame(file, dim, rows);
            a.present = true;
            per_frame.push_back({file, rows});
        } else {
            DZR_CHECK(layout.zero_fill_missing_state, "{}: missing state file {}.npy of embodiment {} (state.{}: "
                      "[T, {}])", dir.string(), key, layout.embodiment, key, dim);
        }
        ep.state.push_back(std::move(a));
    }
    ep.action_dim = layout.action_dim;
    if (input_file_present(dir / kActionsFile)) {
        ep.actions = load_per_frame(dir / kActionsFile, layout.action_dim, rows);
        per_frame.push_back({dir / kActionsFile, rows});
    }

    // Lengths: every camera and per-frame array must agree, or be cut to the shortest.
    int64_t t_min = ep.cameras[0].file_frames;
    int64_t t_max = t_min;
    for (const auto& c : ep.cameras) {
        t_min = std::min(t_min, c.file_frames);
        t_max = std::max(t_max, c.file_frames);
    }
    if (t_min != t_max) {
        std::string counts;
        for (const auto& c : ep.cameras)
            counts += fmt::format("{}{} has {}", counts.empty() ? "" : ", ", c.file.filename().string(), c.file_frames);
        DZR_CHECK(opt.allow_truncate, "{}: cameras have different frame counts: {} (use --allow-truncate to cut "
                  "them to the shortest)", dir.string(), counts);
        ep.warnings.push_back(fmt::format("cameras have different frame counts ({}); truncated to {}", counts, t_min));
    }
    const int64_t t_video = t_min;
    for (const auto& p : per_frame) {
        if (p.rows == t_video) continue;
        DZR_CHECK(opt.allow_truncate, "{}: {} rows, but the videos have {} frames (one row per frame expected)",
                  p.file.string(), p.rows, t_video);
        t_min = std::min(t_min, p.rows);
    }
    for (const auto& p : per_frame)
        if (p.rows != t_min)
            ep.warnings.push_back(fmt::format("{} has {} rows; truncated to {}", p.file.filename().string(), p.rows,
                                              t_min));
    if (t_min < t_video)
        ep.warnings.push_back(fmt::format("videos truncated from {} to {} frames to match the per-frame arrays",
                                          t_video, t_min));
    ep.num_frames = t_min;
    DZR_CHECK(ep.num_frames >= opt.min_frames, "{}: {} frames, but one call needs at least {}", dir.string(),
              ep.num_frames, opt.min_frames);

    for (auto& c : ep.cameras)
        if (c.file_frames != ep.num_frames) c.frames = Tensor(c.frames.storage(), c.frames.view().slice(0, 0, ep.num_frames));
    for (auto& a : ep.state) {
        a.values.resize(size_t(ep.num_frames * a.dim), 0.0);
        if (!a.present) ep.warnings.push_back(fmt::format("no {}.npy: state {} is all zeros", a.name, a.name));
    }
    if (ep.has_actions()) ep.actions.resize(size_t(ep.num_frames * layout.action_dim));

    for (const auto& c : ep.cameras)
        if (layout.frame_height > 0 && (c.width != layout.frame_width || c.height != layout.frame_height))
            ep.warnings.push_back(fmt::format("{}: frames are {}x{}, not {}'s {}x{}; the model's preprocessing "
                                              "resizes them with padding", c.file.filename().string(), c.width,
                                              c.height, layout.display_name, layout.frame_width,
                                              layout.frame_height));
    if (opt.log_warnings)
        for (const auto& w : ep.warnings) log()->warn("episode {}: {}", ep.name, w);
    return ep;
}

std::optional<int64_t> count_episode_frames(const fs::path& dir, const EpisodeOptions& opt) {
    const EpisodeLayout& layout = opt.layout;
    std::error_code ec;
    DZR_CHECK(fs::is_directory(dir, ec), "{}: not an episode directory (no such directory)", dir.string());
    EpisodeYaml y;
    if (input_file_present(dir / kEpisodeYaml)) y = read_episode_yaml(dir / kEpisodeYaml, layout);
    std::optional<int64_t> frames;
    const auto take = [&](int64_t n) { frames = frames ? std::min(*frames, n) : n; };
    for (const auto& cam : layout.cameras) {
        const fs::path file = find_camera_file(dir, cam, y, layout);
        if (file.extension() == ".npy") {
            const NpyHeader h = read_npy_header(file);
            DZR_CHECK(h.shape.size() == 4, "{}: camera frames must be uint8 [T, H, W, 3], found {} dimensions",
                      file.string(), h.shape.size());
            take(h.shape[0]);
        } else {
            if (!opt.open_video) return std::nullopt;
            const int64_t n = opt.open_video(file)->info().frame_count;
            if (n <= 0) return std::nullopt;
            take(n);
        }
    }
    std::vector<std::string> arrays;
    for (const auto& [key, dim] : layout.state) arrays.push_back(key + ".npy");
    arrays.emplace_back(kActionsFile);
    for (const auto& name : arrays) {
        if (!input_file_present(dir / name)) continue;
        const NpyHeader h = read_npy_header(dir / name);
        DZR_CHECK(!h.shape.empty(), "{}: expected one row per frame, found a scalar", (dir / name).string());
        take(h.shape[0]);
    }
    return frames;
}

bool is_episode_dir(const fs::path& dir, const EpisodeLayout& layout) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) return false;
    // NOTE: any entry counts (a dangling camera symlink too): the episode is then found and its reader names it
    const auto there = [&](const fs::path& p) { return fs::exists(fs::symlink_status(p, ec)); };
    if (there(dir / kEpisodeYaml)) return true;
    for (const auto& cam : layout.cameras)
        for (const char* ext : {".mp4", ".npy"})
            if (there(dir / (cam + ext))) return true;
    return false;
}

std::vector<std::string> check_episode_layout(const fs::path& dir, const EpisodeLayout& layout) {
    std::vector<std::string> problems;
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) return {fmt::format("{}: not an episode directory (no such directory)", dir.string())};
    const auto guard = [&](const std::function<void()>& f) {
        try {
            f();
        } catch (const Error& e) {
            problems.push_back(e.what());
        }
    };
    EpisodeYaml y;
    guard([&] {
        if (input_file_present(dir / kEpisodeYaml)) y = read_episode_yaml(dir / kEpisodeYaml, layout);
    });
    for (const auto& cam : layout.cameras)
        guard([&] {
            const fs::path file = find_camera_file(dir, cam, y, layout);
            if (file.extension() != ".npy") return;
            const NpyHeader h = read_npy_header(file);
            DZR_CHECK(h.dtype == NpyDType::U1 && h.shape.size() == 4 && h.shape[3] == 3,
                      "{}: camera {} frames must be uint8 [T, H, W, 3], found {} [{}]", file.string(), cam,
                      npy_dtype_name(h.dtype), fmt::join(h.shape, ", "));
            check_frame_size(file, h.shape[1], h.shape[2]);
        });
    const auto check_width = [&](const fs::path& file, int64_t dim, const std::string& what) {
        const NpyHeader h = read_npy_header(file);
        const bool ok = npy_dtype_is_float(h.dtype) &&
                        ((h.shape.size() == 2 && h.shape[1] == dim) || (dim == 1 && h.shape.size() == 1));
        DZR_CHECK(ok, "{}: expected shape [T, {}], found {} [{}] ({} of embodiment {} is {} wide, a float array)",
                  file.string(), dim, npy_dtype_name(h.dtype), fmt::join(h.shape, ", "), what, layout.embodiment, dim);
    };
    for (const auto& entry : layout.state)
        guard([&] {
            // NOTE: clang before 16 cannot capture a structured binding
            const auto& [key, dim] = entry;
            const fs::path file = dir / (key + ".npy");
            if (!input_file_present(file)) {
                DZR_CHECK(layout.zero_fill_missing_state, "{}: missing state file {}.npy of embodiment {} (state.{}: "
                          "[T, {}])", dir.string(), key, layout.embodiment, key, dim);
                return;
            }
            check_width(file, dim, "state." + key);
        });
    guard([&] {
        if (input_file_present(dir / kActionsFile)) check_width(dir / kActionsFile, layout.action_dim, "the action");
    });
    return problems;
}

std::vector<fs::path> list_episodes(const fs::path& path, const EpisodeLayout& layout) {
    std::error_code ec;
    std::vector<fs::path> out;
    if (fs::is_regular_file(path, ec)) {
        const std::string text = read_file(path);
        if (auto bad = find_invalid_utf8(text))
            DZR_THROW("{}: not valid UTF-8 ({})", path.string(), describe_utf8_error(text, *bad));
        size_t line_no = 0;
        size_t pos = 0;
        while (pos <= text.size()) {
            size_t end = text.find('\n', pos);
            if (end == std::string::npos) end = text.size();
            std::string line = text.substr(pos, end - pos);
            pos = end + 1;
            ++line_no;
            const auto first = line.find_first_not_of(" \t\r");
            if (first == std::string::npos || line[first] == '#') continue;
            line = line.substr(first, line.find_last_not_of(" \t\r") - first + 1);
            fs::path p = fs::path(line).is_absolute() ? fs::path(line) : path.parent_path() / line;
            DZR_CHECK(fs::is_directory(p, ec), "{}: line {}: {} is not a directory", path.string(), line_no,
                      p.string());
            out.push_back(p);
        }
        DZR_CHECK(!out.empty(), "{}: the episode list is empty", path.string());
        return out;
    }
    DZR_CHECK(fs::is_directory(path, ec), "{}: no such episode directory or list file", path.string());
    if (is_episode_dir(path, layout)) return {path};
    for (const auto& e : fs::directory_iterator(path, ec))
        if (e.is_directory() && is_episode_dir(e.path(), layout)) out.push_back(e.path());
    std::sort(out.begin(), out.end());
    DZR_CHECK(!out.empty(), "{}: no episodes found (an episode directory of embodiment {} holds {} as .mp4 or .npy, "
              "and {})", path.string(), layout.embodiment, camera_list(layout), kEpisodeYaml);
    return out;
}

}  // namespace dzr::io
