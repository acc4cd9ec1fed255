#include "io/synth_episode.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <numbers>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/episode.h"
#include "io/image.h"
#include "io/npy.h"

namespace dzr::io {

namespace fs = std::filesystem;

namespace {

constexpr double kTwoPi = 2.0 * std::numbers::pi;

/// splitmix64: a tiny, fully specified generator (std:: distributions differ between libraries).
class SplitMix {
public:
    explicit SplitMix(uint64_t seed) : s_(seed) {}
    uint64_t next() {
        uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    /// Uniform in [lo, hi).
    double uniform(double lo, double hi) { return lo + (hi - lo) * double(next() >> 11) * 0x1.0p-53; }

private:
    uint64_t s_;
};

// A Franka-like resting pose (radians) that the synthetic joints oscillate around.
constexpr std::array<double, kJointDims> kJointCenter = {0.0, -0.6, 0.0, -2.3, 0.0, 1.7, 0.8};

constexpr const char* kPrompts[] = {
    "Put the blue block in the bowl",
    "Pick up the blue block and move it to the left",
    "Push the blue block towards the robot",
    "Lift the blue block and put it down gently",
};

struct Trajectory {
    std::array<double, kJointDims> amp{}, freq{}, phase{};
    double grip_freq = 0, grip_phase = 0;
    double obj_phase = 0, obj_x = 0, obj_y = 0;
    std::array<Rgb, 3> tint{};
};

Trajectory make_trajectory(uint64_t seed) {
    SplitMix rng(seed * 0x2545f4914f6cdd1dull + 1);
    Trajectory tr;
    for (int j = 0; j < kJointDims; ++j) {
        tr.amp[size_t(j)] = rng.uniform(0.15, 0.45);
        tr.freq[size_t(j)] = rng.uniform(0.015, 0.05);  // radians per frame: 8 to 28 s periods at 15 fps
        tr.phase[size_t(j)] = rng.uniform(0, kTwoPi);
    }
    tr.grip_freq = rng.uniform(0.02, 0.05);
    tr.grip_phase = rng.uniform(0, kTwoPi);
    tr.obj_phase = rng.uniform(0, kTwoPi);
    tr.obj_x = rng.uniform(0.3, 0.7);
    tr.obj_y = rng.uniform(0.6, 0.8);
    for (auto& t : tr.tint) t = Rgb{uint8_t(rng.uniform(90, 200)), uint8_t(rng.uniform(90, 200)), uint8_t(rng.uniform(90, 200))};
    return tr;
}

std::array<double, kActionDims> state_at(const Trajectory& tr, int64_t t) {
    std::array<double, kActionDims> s{};
    for (int j = 0; j < kJointDims; ++j)
        s[size_t(j)] = kJointCenter[size_t(j)] + tr.amp[size_t(j)] * std::sin(tr.freq[size_t(j)] * double(t) + tr.phase[size_t(j)]);
    s[kJointDims] = 0.5 - 0.5 * std::cos(tr.grip_freq * double(t) + tr.grip_phase);  // 0 open .. 1 closed
    return s;
}

Rgb mix(Rgb a, Rgb b, double f) {
    auto m = [f](uint8_t x, uint8_t y) { return uint8_t(std::lround(double(x) + (double(y) - double(x)) * f)); };
    return {m(a.r, b.r), m(a.g, b.g), m(a.b, b.b)};
}

void fill_circle(Image& img, int cx, int cy, int r, Rgb c) {
    for (int y = cy - r; y <= cy + r; ++y)
        for (int x = cx - r; x <= cx + r; ++x)
            if ((x - cx) * (x - cx) + (y - cy) * (y - cy) <= r * r) img.set(x, y, c);
}

/// Where the end effector appears in an exterior view, in [0, 1]^2, from the joint angles.
std::pair<double, double> effector_xy(const std::array<double, kActionDims>& s) {
    const double x = 0.5 + 0.32 * std::sin(s[0] + 0.4 * s[2]) * std::cos(s[1] + 0.6) + 0.08 * std::sin(s[4]);
    const double y = 0.45 - 0.25 * std::sin(s[1] + 0.6) + 0.12 * std::cos(s[3] + 2.3) + 0.05 * std::sin(s[5]);
    return {std::clamp(x, 0.05, 0.95), std::clamp(y, 0.08, 0.92)};
}

/// An exterior camera: wall and table, the block, the arm from its base to the gripper.
void draw_exterior(Image& img, const Trajectory& tr, const std::array<double, kActionDims>& s, int64_t t, bool mirror,
                   Rgb tint) {
    const int w = img.width(), h = img.height();
    const int horizon = h * 2 / 5;
    for (int y = 0; y < h; ++y) {
        const Rgb wall = mix(Rgb{225, 228, 232}, tint, 0.25);
        const Rgb table = mix(Rgb{150, 118, 86}, tint, 0.15);
        for (int x = 0; x < w; ++x) {
            if (y < horizon) {
                img.set(x, y, mix(wall, kWhite, double(y) / horizon * 0.3));
            } else {
                const bool check = ((x / 20) + (y / 20)) % 2 == 0;
                img.set(x, y, check ? table : mix(table, kBlack, 0.08));
            }
        }
    }
    auto sx = [&](double fx) { return int(std::lround((mirror ? 1.0 - fx : fx) * (w - 1))); };
    auto sy = [&](double fy) { return int(std::lround(fy * (h - 1))); };
    // The block drifts slowly on the table.
    const double ox = tr.obj_x + 0.12 * std::cos(0.021 * double(t) + tr.obj_phase);
    const double oy = tr.obj_y + 0.05 * std::sin(0.017 * double(t) + tr.obj_phase);
    const int bs = std::max(4, h / 10);
    img.fill_rect(sx(ox) - bs / 2, sy(oy) - bs / 2, bs, bs, Rgb{40, 80, 200});
    // A bowl that stays put.
    fill_circle(img, sx(0.8), sy(0.75), std::max(5, h / 12), Rgb{235, 235, 240});
    fill_circle(img, sx(0.8), sy(0.75), std::max(3, h / 16), Rgb{200, 60, 60});
    // Arm: base at the bottom, elbow, gripper; the gripper shrinks and reddens as it closes.
    const auto [ex, ey] = effector_xy(s);
    const int bx = sx(0.12), by = h - 1;
    const int elx = (bx + sx(ex)) / 2 + int(std::lround(20 * std::sin(s[3]))), ely = sy(ey) / 2 + h / 4;
    const int thick = std::max(2, h / 30);
    img.line(bx, by, elx, ely, Rgb{70, 70, 75}, thick + 2);
    img.line(elx, ely, sx(ex), sy(ey), Rgb{90, 90, 96}, thick);
    const double g = s[kJointDims];
    fill_circle(img, sx(ex), sy(ey), std::max(3, int(std::lround(h / 18.0 * (1.4 - 0.6 * g)))),
                mix(Rgb{40, 200, 90}, Rgb{220, 50, 40}, g));
}

/// The wrist camera: a close-up whose texture scrolls and turns with the wrist joints, the block
/// seen relative to the gripper, and the two fingers opening and closing at the bottom.
void draw_wrist(Image& img, const Trajectory& tr, const std::array<double, kActionDims>& s, int64_t t, Rgb tint) {
    const int w = img.width(), h = img.height();
    const double angle = s[6] - kJointCenter[6];
    const double ca = std::cos(angle), sa = std::sin(angle);
    const double shift = 40.0 * (s[5] - kJointCenter[5]) + 25.0 * (s[0] - kJointCenter[0]);
    const Rgb base = mix(Rgb{150, 118, 86}, tint, 0.2);
    for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
            const double u = (x - w / 2.0) * ca - (y - h / 2.0) * sa + shift;
            const bool stripe = int(std::floor(u / 24.0)) % 2 == 0;
            img.set(x, y, stripe ? base : mix(base, kWhite, 0.18));
        }
    const auto [ex, ey] = effector_xy(s);
    const double ox = tr.obj_x + 0.12 * std::cos(0.021 * double(t) + tr.obj_phase);
    const double oy = tr.obj_y + 0.05 * std::sin(0.017 * double(t) + tr.obj_phase);
    const int bx = int(std::lround(w / 2.0 + (ox - ex) * w * 2.5));
    const int by = int(std::lround(h / 2.0 + (oy - ey) * h * 2.5));
    const int bs = h / 3;
    img.fill_rect(bx - bs / 2, by - bs / 2, bs, bs, Rgb{40, 80, 200});
    const double g = s[kJointDims];
    const int gap = int(std::lround((1.0 - g) * w * 0.25)) + 4;
    const int fw = w / 14, fh = h / 3;
    img.fill_rect(w / 2 - gap / 2 - fw, h - fh, fw, fh, Rgb{60, 60, 64});
    img.fill_rect(w / 2 + gap / 2, h - fh, fw, fh, Rgb{60, 60, 64});
}

}  // namespace

namespace {

bool is_droid_layout(const EpisodeLayout& l) {
    const EpisodeLayout droid;
    return l.cameras == droid.cameras && l.state == droid.state && l.action_dim == droid.action_dim;
}

bool gripper_like(const std::string& key) {
    return key.find("gripper") != std::string::npos || key.find("effector") != std::string::npos;
}

/// Element i of a generic state key at pose `s`: grippers and effectors follow the gripper, other keys the
/// arm's joints (cycled), each with its own small offset.
double generic_state(const std::string& key, int key_index, int i, const std::array<double, kActionDims>& s) {
    if (gripper_like(key)) return s[kJointDims];
    const int j = (key_index * 3 + i) % kJointDims;
    return s[size_t(j)] + 0.05 * double(key_index) - 0.02 * double(i);
}

}  // namespace

SynthEpisode make_synth_episode(const SynthOptions& opt) {
    DZR_CHECK(opt.frames > 0 && opt.frames <= 100000, "synthetic episode: frames must be in 1..100000, got {}",
              opt.frames);
    DZR_CHECK(opt.width >= 16 && opt.height >= 16 && opt.width <= 4096 && opt.height <= 4096,
              "synthetic episode: image size {}x{} is out of range (16..4096)", opt.width, opt.height);
    DZR_CHECK(opt.fps > 0, "synthetic episode: fps must be positive, got {}", opt.fps);
    const EpisodeLayout& layout = opt.layout;
    DZR_CHECK(!layout.cameras.empty(), "synthetic episode: the layout of {} has no cameras", layout.embodiment);
    const bool droid = is_droid_layout(layout);
    const Trajectory tr = make_trajectory(opt.seed);
    SynthEpisode ep;
    ep.prompt = kPrompts[opt.seed % std::size(kPrompts)];
    const int64_t T = opt.frames;
    std::vector<std::array<double, kActionDims>> states;
    for (int64_t t = 0; t < T; ++t) states.push_back(state_at(tr, t));
    // The state keys at frame t.
    const auto keys_at = [&](int64_t t) {
        std::vector<std::vector<double>> v;
        const auto& s = states[size_t(std::clamp<int64_t>(t, 0, T - 1))];
        for (size_t k = 0; k < layout.state.size(); ++k) {
            const auto& [key, dim] = layout.state[k];
            std::vector<double> x(static_cast<size_t>(dim));
            for (int i = 0; i < dim; ++i)
                x[size_t(i)] = droid ? s[size_t((k == 0 ? 0 : kJointDims) + i)] : generic_state(key, int(k), i, s);
            v.push_back(std::move(x));
        }
        return v;
    };
    ep.state.resize(layout.state.size());
    for (int64_t t = 0; t < T; ++t) {
        const auto now = keys_at(t);
        for (size_t k = 0; k < now.size(); ++k) ep.state[k].insert(ep.state[k].end(), now[k].begin(), now[k].end());
        // The commanded target is the state reached one frame later.
        const auto next = keys_at(std::min(t + 1, T - 1));
        std::vector<double> row;
        for (const auto& x : next) row.insert(row.end(), x.begin(), x.end());
        // Action dims past the state (velocities): a smooth signal.
        for (int d = int(row.size()); d < layout.action_dim; ++d)
            row.push_back(0.3 * std::sin(0.05 * double(t) + 0.7 * double(d) + tr.obj_phase));
        row.resize(size_t(layout.action_dim));
        ep.actions.insert(ep.actions.end(), row.begin(), row.end());
    }
    const size_t frame_bytes = size_t(opt.width) * size_t(opt.height) * 3;
    for (size_t v = 0; v < layout.cameras.size(); ++v) {
        Tensor frames = Tensor::host({T, opt.height, opt.width, 3}, DType::U8);
        Image img(opt.width, opt.height);
        // DROID: exteriors 0 and 1 (the second mirrored), the wrist 2; other layouts: a scene view first, then
        // close-ups.
        const bool close_up = droid ? v == 2 : v >= 1;
        const Rgb tint = tr.tint[v % tr.tint.size()];
        for (int64_t t = 0; t < T; ++t) {
            const auto& s = states[size_t(t)];
            if (close_up) {
                draw_wrist(img, tr, s, t, v >= 3 ? mix(tint, kWhite, 0.3) : tint);
            } else {
                draw_exterior(img, tr, s, t, v == 1, tint);
            }
            std::memcpy(frames.ptr<uint8_t>() + size_t(t) * frame_bytes, img.pixels().data(), frame_bytes);
        }
        ep.views.push_back(std::move(frames));
    }
    return ep;
}

std::string episode_yaml_text(const std::string& prompt, double fps, const std::string& comment) {
    YAML::Emitter e;
    e << YAML::BeginMap << YAML::Key << "prompt" << YAML::Value << YAML::DoubleQuoted << prompt << YAML::Key << "fps"
      << YAML::Value << fps << YAML::EndMap;
    std::string text = comment.empty() ? std::string() : "# " + comment + "\n";
    return text + e.c_str() + "\n";
}

std::vector<std::string> write_synth_episode(const fs::path& dir, const SynthOptions& opt) {
    DZR_CHECK(opt.write_npy_frames || opt.write_video, "synthetic episode: choose .npy frames, video, or both");
    const SynthEpisode ep = make_synth_episode(opt);
    const EpisodeLayout& layout = opt.layout;
    std::error_code ec;
    fs::create_directories(dir, ec);
    DZR_CHECK(!ec && fs::is_directory(dir), "cannot create episode directory {}: {}", dir.string(),
              ec ? ec.message() : "a file of that name exists");
    std::vector<std::string> files;
    for (size_t v = 0; v < layout.cameras.size(); ++v) {
        const std::string& cam = layout.cameras[v];
        if (opt.write_npy_frames) {
            write_npy(dir / (cam + ".npy"), ep.views[v].view());
            files.push_back(cam + ".npy");
        }
        if (opt.write_video) {
            opt.write_video(dir / (cam + ".mp4"), ep.views[v].view(), opt.fps);
            files.push_back(cam + ".mp4");
        }
    }
    const int64_t T = opt.frames;
    for (size_t k = 0; k < layout.state.size(); ++k) {
        const auto& [key, dim] = layout.state[k];
        write_npy_f64(dir / (key + ".npy"), {T, dim}, ep.state[k]);
        files.push_back(key + ".npy");
    }
    write_npy_f64(dir / kActionsFile, {T, layout.action_dim}, ep.actions);
    files.emplace_back(kActionsFile);
    const std::string embodiment = is_droid_layout(layout) ? "" : " --embodiment " + layout.embodiment;
    const std::string comment = fmt::format("synthetic episode: dzr episode synth{} --frames {} --seed {} --width {} "
                                            "--height {} --fps {}", embodiment, opt.frames, opt.seed, opt.width,
                                            opt.height, opt.fps);
    write_file_atomic(dir / kEpisodeYaml, episode_yaml_text(ep.prompt, opt.fps, comment));
    files.emplace_back(kEpisodeYaml);
    return files;
}

void append_parity_frame(int camera, int index, int height, int width, std::vector<uint8_t>& out) {
    const auto mix32 = [](uint32_t x) {  // lowbias32 (a public-domain integer hash)
        x ^= x >> 16;
        x *= 0x7feb352dU;
        x ^= x >> 15;
        x *= 0x846ca68bU;
        x ^= x >> 16;
        return x;
    };
    const int H = height, W = width;
    const int sx = (37 * index + 90 * camera) % (W - 48), sy = (23 * index + 50 * camera) % (H - 48);
    const int bar = (11 * index + 60 * camera) % W;
    for (int y = 0; y < H; ++y)
        for (int x = 0; x < W; ++x)
            for (int c = 0; c < 3; ++c) {
                int v = (x * (90 + 30 * c)) / W + (y * (60 + 40 * camera)) / H + 20 * c + 15 * camera;
                if (x >= sx && x < sx + 48 && y >= sy && y < sy + 48) v = 230 - 70 * c - 20 * camera;
                if (std::abs(x - bar) < 6) v = 40 + 60 * c;
                v += int(mix32(uint32_t(((index * 3 + camera) * H + y) * W + x) * 3u + uint32_t(c)) % 13u) - 6;
                out.push_back(uint8_t(std::clamp(v, 0, 255)));
            }
}

}  // namespace dzr::io
