#include "serve/policy_handler.h"

#include <algorithm>
#include <cctype>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "core/log.h"
#include "io/episode.h"

namespace dzr::serve {

namespace {

Reply make_reply(bool text, std::string payload, uint16_t close_code, std::string label,
                 std::string category) {
    Reply r;
    r.text = text;
    r.payload = std::move(payload);
    r.close_code = close_code;
    r.label = std::move(label);
    r.category = std::move(category);
    return r;
}

/// A client's string made safe for one log line: control characters replaced, at most 64 bytes.
std::string printable(const std::string& s) {
    std::string out = s.substr(0, 64);
    for (char& c : out)
        if (std::iscntrl(static_cast<unsigned char>(c))) c = '?';
    return s.size() > 64 ? out + "..." : out;
}

/// The state the embodiment's keys take from the request's [joint (7), gripper (1)].
constexpr int kGripperOffset = kJointDims;

}  // namespace

DroidBinding bind_droid_protocol(const Embodiment& e) {
    const auto not_droid = [&](const std::string& what) {
        return Error(
            fmt::format("dzr serve speaks the official DROID server's protocol (RoboArena): {}; the "
                        "checkpoint's embodiment {} does not fit",
                        what, e.tag));
    };
    DroidBinding b;
    if (e.cameras.size() != kNumCameras) throw not_droid(fmt::format("it takes {} cameras", kNumCameras));
    int height = 0, width = 0;
    for (size_t c = 0; c < kNumCameras; ++c) {
        const auto it = std::find_if(e.cameras.begin(), e.cameras.end(),
                                     [&](const CameraSpec& s) { return s.key == kModelCameras[c]; });
        if (it == e.cameras.end()) throw not_droid(fmt::format("it needs the camera {}", kModelCameras[c]));
        b.view_of_camera[c] = size_t(it - e.cameras.begin());
        // NOTE: an embodiment that names no resolution takes DROID's (the official server advertises 180x320)
        const int h = it->height > 0 ? it->height : io::kDroidHeight,
                  w = it->width > 0 ? it->width : io::kDroidWidth;
        if (c > 0 && (h != height || w != width))
            throw not_droid(
                fmt::format("one image resolution for all cameras, but {} records {}x{} and {} {}x{}",
                            kModelCameras[0], width, height, kModelCameras[c], w, h));
        height = h;
        width = w;
    }
    for (const ArraySpec& s : e.state) {
        if (s.key == "joint_position" && s.dim == kJointDims)
            b.state_slices.emplace_back(0, kJointDims);
        else if (s.key == "gripper_position" && s.dim == 1)
            b.state_slices.emplace_back(kGripperOffset, 1);
        else
            throw not_droid(fmt::format(
                "its state is joint_position (7) and gripper_position (1), not {} ({})", s.key, s.dim));
    }
    if (b.state_slices.size() != 2)
        throw not_droid("its state is joint_position (7) and gripper_position (1)");
    if (e.action_dim() != 8) throw not_droid("its actions are 7 joint positions and the gripper");
    b.config.image_height = height;
    b.config.image_width = width;
    return b;
}

PolicyHandler::PolicyHandler(Engine& engine, Session& session, PolicyHandlerOptions options)
    : engine_(engine),
      session_(session),
      options_(std::move(options)),
      binding_(bind_droid_protocol(engine.embodiment())) {
    const Embodiment& e = engine.embodiment();
    limits_.image_height = binding_.config.image_height;
    limits_.image_width = binding_.config.image_width;
    const int height = limits_.image_height, width = limits_.image_width;

    if (!options_.record_dir.empty()) {
        RecordLayout layout;
        for (const CameraSpec& s : e.cameras) layout.cameras.push_back(s.key);
        layout.height = height;
        layout.width = width;
        for (const ArraySpec& s : e.state) layout.state.emplace_back(s.key, s.dim);
        layout.action_horizon = engine.model().dit.num_action_per_block;
        layout.action_dim = e.action_dim();
        layout.fps = e.fps;
        std::error_code ec;
        std::filesystem::create_directories(options_.record_dir, ec);
        DZR_CHECK(!ec && std::filesystem::is_directory(options_.record_dir),
                  "--record {}: cannot create it: {}", options_.record_dir.string(),
                  ec ? ec.message() : "a file of that name exists");
        recorder_ = std::make_unique<SessionRecorder>(options_.record_dir, std::move(layout),
                                                      rollout::FrameSchedule(options_.schedule));
    }
}

PolicyHandler::~PolicyHandler() = default;

std::string PolicyHandler::greeting() {
    return encode_server_config(binding_.config);
}

Reply PolicyHandler::error_reply(const std::string& message, uint16_t close_code,
                                 const std::string& label) const {
    return make_reply(true, "dzr serve: error: " + message, close_code, label, "error");
}

Reply PolicyHandler::handle(const ClientInfo& client, std::string_view message, bool binary) {
    if (!binary)
        return error_reply("expected a binary frame holding a msgpack map, got a text frame",
                           kCloseUnsupportedData, "a text frame");
    Request req;
    try {
        req = decode_request(message, limits_);
    } catch (const ProtocolError& e) {
        log()->warn("serve: client {}: invalid request: {}", client.id, e.what());
        return error_reply(e.what(), kClosePolicyViolation, "an invalid request");
    }
    if (req.endpoint == Endpoint::Reset) {
        end_session("reset");
        return make_reply(true, std::string(kResetReply), 0, "reset", "reset");
    }
    return infer(client, req.infer);
}

void PolicyHandler::start_session(const ClientInfo& client) {
    open_ = true;
    calls_ = 0;
    frames_.clear();
    label_ = session_id_ ? printable(*session_id_) : fmt::format("client-{}", client.id);
    log()->info("serve: session '{}' started (client {})", label_, client.id);
    if (!recorder_) return;
    try {
        recorder_->begin(session_id_ ? *session_id_ : label_, session_id_.value_or(""));
    } catch (const Error& e) {
        log()->error("serve: session '{}' is not recorded: {}", label_, e.what());
    }
}

void PolicyHandler::end_session(const char* why) {
    if (!open_) return;
    open_ = false;
    if (recorder_ && recorder_->recording()) {
        try {
            if (const auto rec = recorder_->finish()) {
                const std::string calls = fmt::format("{} call{}", rec->calls, rec->calls == 1 ? "" : "s");
                if (rec->replay_exact)
                    log()->info("serve: session '{}' recorded: {}, {} frames -> {}", label_, calls,
                                rec->frames, rec->dir.string());
                else
                    log()->warn("serve: session '{}' recorded: {} -> {}; a replay will not be exact: {}",
                                label_, calls, rec->dir.string(), fmt::join(rec->problems, "; "));
            }
        } catch (const Error& e) {
            log()->error("serve: session '{}': the record was not written: {}", label_, e.what());
        }
    }
    frames_.clear();
    session_.reset();
    log()->info("serve: session '{}' ended ({}) after {} call{}", label_, why, calls_,
                calls_ == 1 ? "" : "s");
    calls_ = 0;
}

Reply PolicyHandler::infer(const ClientInfo& client, const InferRequest& req) {
    // A new session_id ends the session (socket_test_optimized_AR.py:255-263); none continues it.
    if (open_ && req.session_id && session_id_ && *req.session_id != *session_id_) {
        log()->info("serve: session '{}' -> '{}'", label_, printable(*req.session_id));
        end_session("a new session_id");
    }
    if (req.session_id) session_id_ = req.session_id;
    if (!open_) start_session(client);

    frames_.append(req.cameras);
    const bool first = calls_ == 0;
    const int T = int(frames_.select(first, call_frames_).size());
    const WireFrames& w = req.cameras[0];
    Observation obs;
    obs.views.resize(kNumCameras);
    for (size_t c = 0; c < kNumCameras; ++c)
        obs.views[binding_.view_of_camera[c]] =
            TensorView(call_frames_[c].data(), DType::U8, Shape{T, w.height, w.width, 3});
    std::array<double, kJointDims + 1> raw{};
    std::copy(req.joint_position.begin(), req.joint_position.end(), raw.begin());
    raw[kGripperOffset] = req.gripper_position;
    for (const auto& [offset, width] : binding_.state_slices)
        obs.state.insert(obs.state.end(), &raw[offset], &raw[offset] + width);
    obs.prompt = req.prompt;

    const int64_t call = calls_;
    PolicyCallResult result;
    try {
        PreparedObservation prepared = engine_.prepare(obs);
        if (first) first_prompt_ids_ = prepared.tokens.positive.ids;
        const bool same_prompt = prepared.tokens.positive.ids == first_prompt_ids_;
        result = session_.step(prepared);
        engine_.recycle(std::move(prepared));
        ++calls_;
        if (recorder_ && recorder_->recording()) {
            try {
                std::vector<std::span<const uint8_t>> views(kNumCameras);
                for (size_t c = 0; c < kNumCameras; ++c) views[binding_.view_of_camera[c]] = call_frames_[c];
                recorder_->add_call(views, T, obs.state, obs.prompt, same_prompt, result.actions);
            } catch (const Error& e) {
                log()->error("serve: session '{}' is no longer recorded: {}", label_, e.what());
                recorder_->abandon();
            }
        }
    } catch (const Error& e) {
        log()->error("serve: session '{}' call {}: {}", label_, call, e.what());
        end_session("a failed call");
        return error_reply(fmt::format("the policy call failed: {}", e.what()), kCloseInternalError,
                           fmt::format("session '{}' call {}: failed", label_, call));
    }
    const int horizon = engine_.model().dit.num_action_per_block;
    const int dims = engine_.embodiment().action_dim();
    std::string label = fmt::format(
        "session '{}' call {}: {} frame{}{}, engine {:.1f} ms", label_, call, T, T == 1 ? "" : "s",
        result.reset ? fmt::format(", window reset ({})", result.reset_reason) : "", result.times.total);
    return make_reply(false, encode_float32_array(result.actions, {horizon, dims}), 0, std::move(label),
                      T == 1 ? "infer, 1 frame" : fmt::format("infer, {} frames", T));
}

void PolicyHandler::client_done(const ClientInfo& client) {
    if (open_) log()->debug("serve: client {} gone", client.id);
    end_session("the client disconnected");
    session_id_.reset();
}

void PolicyHandler::shutdown() {
    end_session("the server stopped");
}

}  // namespace dzr::serve
