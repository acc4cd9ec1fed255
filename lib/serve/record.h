#pragma once
/// `dzr serve --record DIR`: each served session written as an episode directory (docs/FORMATS.md, Episode
/// input) that `dzr rollout DIR/<session> --config <the serve's config>` replays into the actions the server
/// sent, byte for byte. Call c of the session is call c of the rollout: its frames are written at the frame
/// indices the offline FrameSchedule gives call c, its state at that call's anchor, the first call's prompt
/// in episode.yaml; the indices between hold the previous written frame and state. served_actions.npy
/// (float32 [calls, horizon, action width], the layout of the rollout's actions.npy) keeps what was served;
/// serve.json says whether the replay is exact and, when not, why (a call's frame that the schedule puts on
/// an index where an earlier call's different frame lies, a prompt whose tokens changed mid-session, a
/// schedule that ends before the session did).
///
/// The session's frames are spooled to disk as the calls come (the episode directory's hidden .spool-* files)
/// and the episode is written when the session ends, one frame at a time, so a long session costs no memory.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "rollout/frame_schedule.h"

namespace dzr::serve {

/// What a recorded episode holds: the embodiment's camera and state files and the action shape.
struct RecordLayout {
    std::vector<std::string> cameras;  ///< <camera>.npy, in the observation's view order
    int height = 0, width = 0;         ///< frame size
    std::vector<std::pair<std::string, int>>
        state;  ///< <key>.npy [frames, width], concatenated in this order
    int action_horizon = 24;
    int action_dim = 8;
    double fps = 15.0;
};

/// A recorded episode, once written.
struct RecordedSession {
    std::filesystem::path dir;
    int64_t calls = 0;
    int64_t frames = 0;
    bool replay_exact = true;
    std::vector<std::string> problems;  ///< why the replay is not exact (empty when it is)
};

class SessionRecorder {
  public:
    SessionRecorder(std::filesystem::path root, RecordLayout layout, rollout::FrameSchedule schedule);
    ~SessionRecorder();
    SessionRecorder(const SessionRecorder&) = delete;
    SessionRecorder& operator=(const SessionRecorder&) = delete;

    /// Starts recording a session into root/<name>, the name made from `label` (the session id: letters,
    /// digits, '.', '_' and '-' kept, anything else '_'; "-2", "-3", ... appended when taken). A session in
    /// progress is finished first.
    void begin(const std::string& label, const std::string& session_id);
    bool recording() const { return spool_ != nullptr; }

    /// One served call: `frames[v]` view v's frames, uint8 [T, H, W, 3] contiguous; the raw state; the
    /// prompt; whether the prompt's tokens equal the session's first call's (else the replay, which has one
    /// prompt, differs); the actions served, [horizon, action_dim].
    void add_call(const std::vector<std::span<const uint8_t>>& frames, int frames_per_view,
                  std::span<const double> state, const std::string& prompt, bool same_prompt_tokens,
                  std::span<const float> actions);

    /// Writes the episode of the session in progress and stops recording; nullopt when no call was served
    /// (its directory is removed). On an error the spool is removed and the error thrown.
    std::optional<RecordedSession> finish();
    /// Stops recording and removes what the session spooled (after a write error).
    void abandon() noexcept { discard(); }

  private:
    struct Spool;
    struct Call {
        int frames = 0;           // T
        int64_t first_frame = 0;  // its first frame's index in the spool
        std::vector<double> state;
        bool same_prompt = true;
    };

    void discard() noexcept;
    std::vector<std::string> place_calls(const std::vector<rollout::ScheduledCall>& schedule,
                                         std::vector<int64_t>& frame_source,
                                         std::vector<int64_t>& state_source);
    bool same_spooled_frame(int64_t a, int64_t b);
    void write_episode(const RecordedSession& r, const std::vector<int64_t>& frame_source,
                       const std::vector<int64_t>& state_source);

    std::filesystem::path root_;
    RecordLayout layout_;
    rollout::FrameSchedule schedule_;
    std::unique_ptr<Spool> spool_;
    std::filesystem::path dir_;
    std::string session_id_;
    std::string prompt_;
    std::vector<Call> calls_;
    std::vector<float> actions_;
    int64_t spooled_frames_ = 0;
};

}  // namespace dzr::serve
