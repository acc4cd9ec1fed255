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

/// One client being served: its engine session, the served session's state, the recorder.
struct PolicyHandler::Slot {
    Session* session = nullptr;
    std::unique_ptr<SessionRecorder> recorder;  // --record
    uint64_t client = 0;                        // the client it serves (0: free)

    // the served session in progress
    bool open = false;
    std::optional<std::string> session_id;  // kept after a reset, as the official server keeps it
    std::string label;                      // for logs: the session id or "client N"
    int64_t calls = 0;
    std::vector<int64_t> first_prompt_ids;
    FrameAccumulator frames;
    std::vector<std::vector<uint8_t>> call_frames;  // per wire camera, the call's [T, H, W, 3]
};

PolicyHandler::PolicyHandler(Engine& engine, std::vector<Session*> sessions, PolicyHandlerOptions options)
    : engine_(engine), options_(std::move(options)), binding_(bind_droid_protocol(engine.embodiment())) {
    DZR_CHECK(!sessions.empty(), "serve: the policy handler needs a session");
    const Embodiment& e = engine.embodiment();
    limits_.image_height = binding_.config.image_height;
    limits_.image_width = binding_.config.image_width;
    RecordLayout layout;
    if (!options_.record_dir.empty()) {
        for (const CameraSpec& s : e.cameras) layout.cameras.push_back(s.key);
        layout.height = limits_.image_height;
        layout.width = limits_.image_width;
        for (const ArraySpec& s : e.state) layout.state.emplace_back(s.key, s.dim);
        layout.action_horizon = engine.model().dit.num_action_per_block;
        layout.action_dim = e.action_dim();
        layout.fps = e.fps;
        std::error_code ec;
        std::filesystem::create_directories(options_.record_dir, ec);
        DZR_CHECK(!ec && std::filesystem::is_directory(options_.record_dir),
                  "--record {}: cannot create it: {}", options_.record_dir.string(),
                  ec ? ec.message() : "a file of that name exists");
    }
    for (Session* session : sessions) {
        auto slot = std::make_unique<Slot>();
        slot->session = session;
        // NOTE: a recorder per slot: the sessions of clients served at once are recorded side by side
        if (!options_.record_dir.empty())
            slot->recorder = std::make_unique<SessionRecorder>(options_.record_dir, layout,
                                                               rollout::FrameSchedule(options_.schedule));
        slots_.push_back(std::move(slot));
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

PolicyHandler::Slot* PolicyHandler::find_slot(uint64_t client) {
    for (auto& s : slots_)
        if (s->client == client) return s.get();
    return nullptr;
}

PolicyHandler::Slot& PolicyHandler::slot_of(const ClientInfo& client) {
    if (Slot* s = find_slot(client.id)) return *s;
    Slot* free = find_slot(0);
    DZR_CHECK(free != nullptr, "serve: client {}: all {} sessions are taken (the server serves more clients at once "
              "than the handler has sessions)", client.id, slots_.size());
    free->client = client.id;
    return *free;
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
    Slot& slot = slot_of(client);
    if (req.endpoint == Endpoint::Reset) {
        end_session(slot, "reset");
        return make_reply(true, std::string(kResetReply), 0, "reset", "reset");
    }
    return infer(slot, client, req.infer);
}

void PolicyHandler::start_session(Slot& slot, const ClientInfo& client) {
    slot.open = true;
    slot.calls = 0;
    slot.frames.clear();
    slot.label = slot.session_id ? printable(*slot.session_id) : fmt::format("client-{}", client.id);
    log()->info("serve: session '{}' started (client {})", slot.label, client.id);
    if (!slot.recorder) return;
    try {
        slot.recorder->begin(slot.session_id ? *slot.session_id : slot.label, slot.session_id.value_or(""));
    } catch (const Error& e) {
        log()->error("serve: session '{}' is not recorded: {}", slot.label, e.what());
    }
}

void PolicyHandler::end_session(Slot& slot, const char* why) {
    if (!slot.open) return;
    slot.open = false;
    if (slot.recorder && slot.recorder->recording()) {
        try {
            if (const auto rec = slot.recorder->finish()) {
                const std::string calls = fmt::format("{} call{}", rec->calls, rec->calls == 1 ? "" : "s");
                if (rec->replay_exact)
                    log()->info("serve: session '{}' recorded: {}, {} frames -> {}", slot.label, calls,
                                rec->frames, rec->dir.string());
                else
                    log()->warn("serve: session '{}' recorded: {} -> {}; a replay will not be exact: {}",
                                slot.label, calls, rec->dir.string(), fmt::join(rec->problems, "; "));
            }
        } catch (const Error& e) {
            log()->error("serve: session '{}': the record was not written: {}", slot.label, e.what());
        }
    }
    slot.frames.clear();
    slot.session->reset();
    log()->info("serve: session '{}' ended ({}) after {} call{}", slot.label, why, slot.calls,
                slot.calls == 1 ? "" : "s");
    slot.calls = 0;
}

Reply PolicyHandler::infer(Slot& slot, const ClientInfo& client, const InferRequest& req) {
    // A new session_id ends the session (socket_test_optimized_AR.py:255-263); none continues it.
    if (slot.open && req.session_id && slot.session_id && *req.session_id != *slot.session_id) {
        log()->info("serve: session '{}' -> '{}'", slot.label, printable(*req.session_id));
        end_session(slot, "a new session_id");
    }
    if (req.session_id) slot.session_id = req.session_id;
    if (!slot.open) start_session(slot, client);

    slot.frames.append(req.cameras);
    const bool first = slot.calls == 0;
    const int T = int(slot.frames.select(first, slot.call_frames).size());
    const WireFrames& w = req.cameras[0];
    Observation obs;
    obs.views.resize(kNumCameras);
    for (size_t c = 0; c < kNumCameras; ++c)
        obs.views[binding_.view_of_camera[c]] =
            TensorView(slot.call_frames[c].data(), DType::U8, Shape{T, w.height, w.width, 3});
    std::array<double, kJointDims + 1> raw{};
    std::copy(req.joint_position.begin(), req.joint_position.end(), raw.begin());
    raw[kGripperOffset] = req.gripper_position;
    for (const auto& [offset, width] : binding_.state_slices)
        obs.state.insert(obs.state.end(), &raw[offset], &raw[offset] + width);
    obs.prompt = req.prompt;

    const int64_t call = slot.calls;
    PolicyCallResult result;
    try {
        PreparedObservation prepared = engine_.prepare(obs);
        if (first) slot.first_prompt_ids = prepared.tokens.positive.ids;
        const bool same_prompt = prepared.tokens.positive.ids == slot.first_prompt_ids;
        result = slot.session->step(prepared);
        engine_.recycle(std::move(prepared));
        ++slot.calls;
        if (slot.recorder && slot.recorder->recording()) {
            try {
                std::vector<std::span<const uint8_t>> views(kNumCameras);
                for (size_t c = 0; c < kNumCameras; ++c) views[binding_.view_of_camera[c]] = slot.call_frames[c];
                slot.recorder->add_call(views, T, obs.state, obs.prompt, same_prompt, result.actions);
            } catch (const Error& e) {
                log()->error("serve: session '{}' is no longer recorded: {}", slot.label, e.what());
                slot.recorder->abandon();
            }
        }
    } catch (const Error& e) {
        log()->error("serve: session '{}' call {}: {}", slot.label, call, e.what());
        end_session(slot, "a failed call");
        return error_reply(fmt::format("the policy call failed: {}", e.what()), kCloseInternalError,
                           fmt::format("session '{}' call {}: failed", slot.label, call));
    }
    const int horizon = engine_.model().dit.num_action_per_block;
    const int dims = engine_.embodiment().action_dim();
    std::string label = fmt::format(
        "session '{}' call {}: {} frame{}{}, engine {:.1f} ms", slot.label, call, T, T == 1 ? "" : "s",
        result.reset ? fmt::format(", window reset ({})", result.reset_reason) : "", result.times.total);
    return make_reply(false, encode_float32_array(result.actions, {horizon, dims}), 0, std::move(label),
                      T == 1 ? "infer, 1 frame" : fmt::format("infer, {} frames", T));
}

void PolicyHandler::client_done(const ClientInfo& client) {
    Slot* slot = find_slot(client.id);
    if (!slot) return;  // it sent nothing
    if (slot->open) log()->debug("serve: client {} gone", client.id);
    end_session(*slot, "the client disconnected");
    slot->session_id.reset();
    slot->client = 0;  // free for the next client
}

void PolicyHandler::shutdown() {
    for (auto& slot : slots_) end_session(*slot, "the server stopped");
}

}  // namespace dzr::serve
