#pragma once
/// The server's Handler on a DreamZero engine: the official server's session semantics
/// (ARDroidRoboarenaPolicy, socket_test_optimized_AR.py:44-357; dreamzero-reference.md §1.3) on engine Sessions,
/// through the same Engine::prepare() and Session::step() the rollout calls. Each client being served has a slot of
/// its own (an engine Session, the frame buffers, the recorder) for as long as it is connected; with several
/// sessions the clients' calls interleave on the one engine.
///
/// A served session is a run of infer calls of one client: a new `session_id`, the reset endpoint or the
/// client's disconnect ends it (the frame buffers are cleared and Session::reset() runs; the official server
/// keeps the model and its buffers across connections, which lets one client's calls leak into the next). A
/// call that carries no session_id continues the session, as the official server does. Any error ends the
/// session too: the server closes the connection after the error text, as the official one does.
#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "policy/engine.h"
#include "rollout/frame_schedule.h"
#include "serve/protocol.h"
#include "serve/record.h"
#include "serve/server.h"
#include "serve/session_frames.h"

namespace dzr::serve {

/// How the protocol's DROID observation maps onto an embodiment.
struct DroidBinding {
    ServerConfig config;                               ///< the image resolution the embodiment records
    std::array<size_t, kNumCameras> view_of_camera{};  ///< kCameraKeys[c] -> the embodiment's view index
    std::vector<std::pair<int, int>>
        state_slices;  ///< its state keys -> (offset, width) in [joint (7), gripper]
};

/// Throws dzr::Error when the embodiment is not DROID's (the protocol's three cameras at one resolution, 7
/// joint positions and the gripper, 8 action values). `dzr serve` checks it before loading the weights.
DroidBinding bind_droid_protocol(const Embodiment& embodiment);

struct PolicyHandlerOptions {
    /// --record: every session written as an episode under this directory (record.h); empty: none.
    std::filesystem::path record_dir;
    /// The schedule the recorded episodes follow: the run config's (its rollout section), which the replay
    /// must use too.
    rollout::FrameScheduleConfig schedule;
};

class PolicyHandler final : public Handler {
  public:
    /// `sessions`: open sessions of `engine`, one per client served at once (ServerOptions::max_sessions). Throws
    /// dzr::Error when the engine's embodiment is not DROID's (bind_droid_protocol).
    PolicyHandler(Engine& engine, std::vector<Session*> sessions, PolicyHandlerOptions options);
    ~PolicyHandler() override;

    /// The config the protocol sends on connect.
    const ServerConfig& server_config() const { return binding_.config; }

    std::string greeting() override;
    Reply handle(const ClientInfo& client, std::string_view message, bool binary) override;
    void client_done(const ClientInfo& client) override;
    void shutdown() override;

  private:
    struct Slot;

    /// The client's slot, a free one taken on its first message; throws when none is free.
    Slot& slot_of(const ClientInfo& client);
    Slot* find_slot(uint64_t client);
    Reply infer(Slot& slot, const ClientInfo& client, const InferRequest& req);
    void start_session(Slot& slot, const ClientInfo& client);
    /// Ends the slot's session in progress (if any): its record written, the buffers cleared, Session::reset().
    void end_session(Slot& slot, const char* why);
    Reply error_reply(const std::string& message, uint16_t close_code, const std::string& label) const;

    Engine& engine_;
    PolicyHandlerOptions options_;
    DroidBinding binding_;
    ProtocolLimits limits_;
    std::vector<std::unique_ptr<Slot>> slots_;
};

}  // namespace dzr::serve
