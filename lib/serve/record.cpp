#include "serve/record.h"

#include <algorithm>
#include <cctype>
#include <cstring>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/npy.h"
#include "io/synth_episode.h"

namespace dzr::serve {

namespace fs = std::filesystem;

/// One raw file of frames per camera: every frame of every call, in call order.
struct SessionRecorder::Spool {
    std::vector<fs::path> paths;
    std::vector<std::FILE*> files;
    size_t frame_bytes = 0;

    ~Spool() { close(); }
    void close() noexcept {
        for (std::FILE*& f : files)
            if (f) std::fclose(f), f = nullptr;
    }
    void remove() noexcept {
        close();
        std::error_code ec;
        for (const auto& p : paths) fs::remove(p, ec);
    }
    void read(size_t camera, int64_t index, std::vector<uint8_t>& out) {
        out.resize(frame_bytes);
        std::FILE* f = files[camera];
        DZR_CHECK(std::fseek(f, long(index) * long(frame_bytes), SEEK_SET) == 0 &&
                      std::fread(out.data(), 1, frame_bytes, f) == frame_bytes,
                  "record: cannot read frame {} back from {}", index, paths[camera].string());
    }
};

namespace {

std::string directory_name(const std::string& label) {
    std::string s;
    for (char c : label.substr(0, 80))
        s += std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-' ? c : '_';
    if (s.empty() || s.front() == '.') s = "session" + s;
    return s;
}

}  // namespace

SessionRecorder::SessionRecorder(fs::path root, RecordLayout layout, rollout::FrameSchedule schedule)
    : root_(std::move(root)), layout_(std::move(layout)), schedule_(std::move(schedule)) {}

SessionRecorder::~SessionRecorder() {
    discard();
}

void SessionRecorder::discard() noexcept {
    if (!spool_) return;
    spool_->remove();
    spool_.reset();
    std::error_code ec;
    if (fs::is_empty(dir_, ec)) fs::remove(dir_, ec);
    calls_.clear();
    actions_.clear();
}

void SessionRecorder::begin(const std::string& label, const std::string& session_id) {
    if (spool_) finish();
    const std::string base = directory_name(label);
    fs::create_directories(root_);
    for (int k = 1;; ++k) {
        dir_ = root_ / (k == 1 ? base : fmt::format("{}-{}", base, k));
        std::error_code ec;
        if (fs::create_directory(dir_, ec)) break;
        DZR_CHECK(!ec, "record: cannot create {}: {}", dir_.string(), ec.message());
        DZR_CHECK(k < 10000, "record: too many sessions named {} in {}", base, root_.string());
    }
    auto spool = std::make_unique<Spool>();
    spool->frame_bytes = size_t(layout_.height) * size_t(layout_.width) * 3;
    for (const std::string& cam : layout_.cameras) {
        spool->paths.push_back(dir_ / (".spool-" + cam));
        spool->files.push_back(std::fopen(spool->paths.back().c_str(), "w+b"));
        if (!spool->files.back()) {
            spool->remove();
            DZR_THROW("record: cannot create {}", spool->paths.back().string());
        }
    }
    spool_ = std::move(spool);
    session_id_ = session_id;
    prompt_.clear();
    calls_.clear();
    actions_.clear();
    spooled_frames_ = 0;
}

void SessionRecorder::add_call(const std::vector<std::span<const uint8_t>>& frames, int frames_per_view,
                               std::span<const double> state, const std::string& prompt,
                               bool same_prompt_tokens, std::span<const float> actions) {
    DZR_ASSERT(spool_ && frames.size() == layout_.cameras.size());
    DZR_ASSERT(actions.size() == size_t(layout_.action_horizon) * size_t(layout_.action_dim));
    for (size_t v = 0; v < frames.size(); ++v) {
        DZR_ASSERT(frames[v].size() == size_t(frames_per_view) * spool_->frame_bytes);
        DZR_CHECK(
            std::fseek(spool_->files[v], 0, SEEK_END) == 0 &&
                std::fwrite(frames[v].data(), 1, frames[v].size(), spool_->files[v]) == frames[v].size(),
            "record: cannot write {} (disk full?)", spool_->paths[v].string());
    }
    if (calls_.empty()) prompt_ = prompt;
    calls_.push_back({frames_per_view, spooled_frames_, std::vector<double>(state.begin(), state.end()),
                      same_prompt_tokens});
    spooled_frames_ += frames_per_view;
    actions_.insert(actions_.end(), actions.begin(), actions.end());
}

bool SessionRecorder::same_spooled_frame(int64_t a, int64_t b) {
    if (a == b) return true;
    std::vector<uint8_t> fa, fb;
    for (size_t v = 0; v < layout_.cameras.size(); ++v) {
        spool_->read(v, a, fa);
        spool_->read(v, b, fb);
        if (fa != fb) return false;
    }
    return true;
}

std::vector<std::string> SessionRecorder::place_calls(const std::vector<rollout::ScheduledCall>& schedule,
                                                      std::vector<int64_t>& frame_source,
                                                      std::vector<int64_t>& state_source) {
    std::vector<std::string> problems;
    const size_t n = std::min(calls_.size(), schedule.size());
    bool prompt_noted = false;
    for (size_t c = 0; c < n; ++c) {
        const Call& call = calls_[c];
        const rollout::ScheduledCall& sc = schedule[c];
        if (!call.same_prompt && !prompt_noted) {
            problems.push_back(
                fmt::format("call {}: the prompt's tokens changed from the first call's; the episode has "
                            "the first call's prompt, so the replay differs from this call on",
                            c));
            prompt_noted = true;
        }
        if (int(sc.frames.size()) != call.frames) {
            problems.push_back(fmt::format("call {}: {} frames served, the schedule gives the call {}", c,
                                           call.frames, sc.frames.size()));
            continue;
        }
        for (size_t s = 0; s < sc.frames.size(); ++s) {
            const int64_t idx = sc.frames[s], src = call.first_frame + int64_t(s);
            if (frame_source[size_t(idx)] < 0) {
                frame_source[size_t(idx)] = src;
            } else if (!same_spooled_frame(frame_source[size_t(idx)], src)) {
                problems.push_back(
                    fmt::format("call {}: its frame {} (episode frame {}) differs from the frame an earlier "
                                "call used at that "
                                "index (the schedule gives both calls frame {}); the replay's call {} sees "
                                "the earlier one",
                                c, s, idx, idx, c));
            }
        }
        const int64_t a = sc.anchor;
        if (state_source[size_t(a)] < 0) {
            state_source[size_t(a)] = int64_t(c);
        } else if (calls_[size_t(state_source[size_t(a)])].state != call.state) {
            problems.push_back(
                fmt::format("call {}: its state differs from that of call {}, whose anchor is the same "
                            "frame {}",
                            c, state_source[size_t(a)], a));
        }
    }
    // the frames and states between the scheduled ones: the previous one written (the first one before it)
    const auto fill = [](std::vector<int64_t>& v) {
        int64_t last = -1;
        for (int64_t& x : v) {
            if (x < 0)
                x = last;
            else
                last = x;
        }
        const auto first = std::find_if(v.begin(), v.end(), [](int64_t x) { return x >= 0; });
        if (first != v.end()) std::replace(v.begin(), first, int64_t(-1), *first);
    };
    fill(frame_source);
    fill(state_source);
    return problems;
}

void SessionRecorder::write_episode(const RecordedSession& r, const std::vector<int64_t>& frame_source,
                                    const std::vector<int64_t>& state_source) {
    const int64_t F = r.frames;
    std::vector<uint8_t> frame;
    for (size_t v = 0; v < layout_.cameras.size(); ++v) {
        io::AtomicFile f(dir_ / (layout_.cameras[v] + ".npy"));
        f.write(io::encode_npy_header(io::NpyDType::U1, {F, layout_.height, layout_.width, 3}));
        int64_t loaded = -1;
        for (int64_t i = 0; i < F; ++i) {
            if (frame_source[size_t(i)] != loaded) spool_->read(v, loaded = frame_source[size_t(i)], frame);
            f.write(frame.data(), frame.size());
        }
        f.commit();
    }
    int offset = 0;
    for (const auto& [key, dim] : layout_.state) {
        std::vector<double> values;
        values.reserve(size_t(F * dim));
        for (int64_t i = 0; i < F; ++i) {
            const std::vector<double>& s = calls_[size_t(state_source[size_t(i)])].state;
            values.insert(values.end(), s.begin() + offset, s.begin() + offset + dim);
        }
        io::write_npy_f64(dir_ / (key + ".npy"), {F, dim}, values);
        offset += dim;
    }
    io::write_npy_f32(dir_ / "served_actions.npy", {r.calls, layout_.action_horizon, layout_.action_dim},
                      actions_);
    io::write_file_atomic(
        dir_ / "episode.yaml",
        io::episode_yaml_text(prompt_, layout_.fps,
                              fmt::format("recorded by dzr serve: {} calls; served_actions.npy "
                                          "holds the actions served, serve.json the session",
                                          r.calls)));
}

std::optional<RecordedSession> SessionRecorder::finish() {
    if (!spool_) return std::nullopt;
    if (calls_.empty()) {
        discard();
        return std::nullopt;
    }
    try {
        RecordedSession r;
        r.dir = dir_;
        r.calls = int64_t(calls_.size());
        const auto& cfg = schedule_.config();
        // the fewest frames whose schedule has every call: the newest frame the last call needs, plus one
        r.frames = r.calls == 1
                       ? cfg.start_frame + 1
                       : schedule_.anchor_of(r.calls - 2) + std::max<int64_t>(0, cfg.offsets.back()) + 1;
        const std::vector<rollout::ScheduledCall> schedule = schedule_.calls(r.frames);
        std::vector<int64_t> frame_source(size_t(r.frames), -1), state_source(size_t(r.frames), -1);
        r.problems = place_calls(schedule, frame_source, state_source);
        if (schedule.size() < calls_.size())
            r.problems.push_back(fmt::format("the frame schedule ({}) replays {} of the session's {} calls",
                                             schedule_.describe(), schedule.size(), calls_.size()));
        if (r.frames < schedule_.min_frames())
            r.problems.push_back(
                fmt::format("a session of one call: dzr rollout needs at least {} frames (the first "
                            "4-frame call) to replay an episode",
                            schedule_.min_frames()));
        // NOTE: the episode reader must give back the exact prompt (the tokens, so the actions, depend on it)
        const std::string yaml = io::episode_yaml_text(prompt_, layout_.fps);
        if (YAML::Load(yaml)["prompt"].as<std::string>() != prompt_)
            r.problems.push_back("the prompt does not survive episode.yaml (YAML changes it)");
        r.replay_exact = r.problems.empty();
        write_episode(r, frame_source, state_source);

        nlohmann::ordered_json j;
        j["session_id"] = session_id_;
        j["calls"] = r.calls;
        j["frames"] = r.frames;
        std::vector<int> per_call;
        for (const Call& c : calls_) per_call.push_back(c.frames);
        j["frames_per_call"] = per_call;
        j["schedule"] = schedule_.describe();
        j["replay_exact"] = r.replay_exact;
        j["problems"] = r.problems;
        j["served_actions"] = "served_actions.npy";
        io::write_file_atomic(dir_ / "serve.json",
                              j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
        spool_->remove();
        spool_.reset();
        calls_.clear();
        actions_.clear();
        return r;
    } catch (...) {
        discard();
        throw;
    }
}

}  // namespace dzr::serve
