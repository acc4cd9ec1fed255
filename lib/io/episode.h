#pragma once
/// Episode input: a directory with one video stream per camera of the embodiment, its state arrays
/// (one .npy per state key), optional ground-truth actions and episode.yaml (prompt, fps, camera-file
/// overrides). docs/FORMATS.md describes every file, per embodiment. Validation errors name the file and
/// say what was expected and found.
///
/// io knows nothing of models: what an episode holds is an EpisodeLayout (the rollout makes one from the
/// checkpoint's embodiment, config/embodiment.h). The default layout is DROID's.
#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "io/video_reader.h"

namespace dzr::io {

inline constexpr int kNumCameras = 3;
/// DROID's camera stream names in the order the model stacks them (DreamZero's video keys; the RoboArena
/// observation keys are exterior_image_0_left, exterior_image_1_left, wrist_image_left).
inline constexpr std::array<std::string_view, kNumCameras> kCameraNames = {
    "exterior_image_1_left", "exterior_image_2_left", "wrist_image_left"};
inline constexpr int kJointDims = 7;
inline constexpr int kGripperDims = 1;
inline constexpr int kActionDims = kJointDims + kGripperDims;
/// DROID recordings: 320x180 RGB at 15 fps.
inline constexpr double kDroidFps = 15.0;
inline constexpr int kDroidWidth = 320;
inline constexpr int kDroidHeight = 180;

inline constexpr std::string_view kEpisodeYaml = "episode.yaml";
inline constexpr std::string_view kJointFile = "joint_position.npy";
inline constexpr std::string_view kGripperFile = "gripper_position.npy";
inline constexpr std::string_view kActionsFile = "actions.npy";

/// What an episode directory holds for one embodiment.
struct EpisodeLayout {
    std::string embodiment = "oxe_droid";
    std::string display_name = "DROID";  ///< in messages ("not DROID's 320x180")
    /// Camera files <name>.mp4 / <name>.npy, in the order the model stacks them.
    std::vector<std::string> cameras = {std::string(kCameraNames[0]), std::string(kCameraNames[1]),
                                        std::string(kCameraNames[2])};
    /// State arrays <key>.npy [T, dim] (or [T] for dim 1), in concatenation order.
    std::vector<std::pair<std::string, int>> state = {{"joint_position", kJointDims},
                                                      {"gripper_position", kGripperDims}};
    int action_dim = kActionDims;  ///< actions.npy [T, action_dim]
    /// The action keys in actions.npy's column order (a dataset's action columns are picked by them).
    std::vector<std::pair<std::string, int>> actions = {{"joint_position", kJointDims},
                                                        {"gripper_position", kGripperDims}};
    /// The recorded frame size the model expects (other sizes are allowed, with a warning); 0: any.
    int frame_height = kDroidHeight, frame_width = kDroidWidth;
    double fps = kDroidFps;  ///< when neither episode.yaml nor the video files say
    /// A missing state file is zeros with a warning (DROID); otherwise an error.
    bool zero_fill_missing_state = true;

    int state_dim() const;
    /// "DROID's 3 cameras ..." listing of the expected files, for messages.
    std::string expected_files() const;
};

struct EpisodeOptions {
    /// Cameras (and state/action arrays) of different lengths: cut everything to the shortest with
    /// a warning instead of failing.
    bool allow_truncate = false;
    /// Fewer frames than this is an error; the caller passes FrameSchedule::min_frames().
    int64_t min_frames = 1;
    /// Replaces the prompt of episode.yaml when set.
    std::optional<std::string> prompt;
    /// Decodes .mp4 camera files; apps pass io::open_video (from dzr_io). Without it an .mp4 camera
    /// is an error that asks for .npy frames.
    VideoOpener open_video;
    /// What the episode holds (DROID's by default).
    EpisodeLayout layout;
    /// false: video cameras are checked without decoding a frame (sources that can: a LeRobot dataset's
    /// packets must put a frame near every timestamp) and CameraStream::frames stays empty. A rollout
    /// validates every episode so, and decodes each when it runs it.
    bool decode_frames = true;
    /// Log the warnings as well as keeping them in Episode::warnings (a rollout logs them once, when it
    /// validates every episode before the run, and reads quietly later).
    bool log_warnings = true;
};

struct CameraStream {
    std::string name;            // one of the layout's cameras
    std::filesystem::path file;  // the file the frames came from
    Tensor frames;               // uint8 RGB [T, H, W, 3]
    int64_t file_frames = 0;     // frames in the file (before any truncation)
    double fps = 0.0;            // the container's fps; 0 for .npy
    int height = 0;
    int width = 0;
    bool is_video() const { return file.extension() == ".mp4"; }
};

/// One state key's values over the episode.
struct StateArray {
    std::string name;            // "joint_position"
    int dim = 0;
    std::vector<double> values;  // [T, dim] row-major (zeros when absent)
    bool present = false;        // false: the file is missing and the values are zeros
};

struct Episode {
    std::string name;  // the directory name
    std::filesystem::path dir;
    std::string embodiment;  // the layout's
    std::string prompt;
    double fps = kDroidFps;
    int64_t num_frames = 0;
    std::vector<CameraStream> cameras;  // in the layout's order
    std::vector<StateArray> state;      // in the layout's order
    std::vector<double> actions;        // ground truth [T, action_dim] row-major; empty when absent
    int action_dim = 0;
    std::vector<std::string> warnings;

    bool has_actions() const { return !actions.empty(); }
    const CameraStream& camera(std::string_view name) const;
    const StateArray& state_array(std::string_view name) const;
    /// The state keys concatenated at frame t (DROID: 7 joints, then the gripper).
    std::vector<double> state_at(int64_t t) const;
    /// A few lines for `dzr episode inspect` and logs.
    std::string summary() const;
};

/// Reads and validates one episode directory. Warnings (missing DROID state, truncation, frame size)
/// are logged and kept in Episode::warnings.
Episode read_episode(const std::filesystem::path& dir, const EpisodeOptions& options);

/// Checks that `dir` holds what `layout` needs without decoding any video: every camera file (.npy frames
/// uint8 [T, H, W, 3]), every state array (.npy header: a float array of the key's width) and, when
/// present, actions.npy of the action width. Returns one line per problem, each naming the file or key and
/// the embodiment; empty when the episode fits.
std::vector<std::string> check_episode_layout(const std::filesystem::path& dir, const EpisodeLayout& layout);

/// The number of frames read_episode() would give `dir` (the shortest camera or per-frame array of
/// `options.layout`), from file headers only: .npy headers and the video containers' frame counts, no frame
/// decoded. Sharded rollouts balance their ranks by it. nullopt when a count is unknown (an .mp4 without a video
/// opener, or a container that does not say); throws dzr::Error on a missing or malformed file.
std::optional<int64_t> count_episode_frames(const std::filesystem::path& dir, const EpisodeOptions& options);

/// True when `dir` holds episode.yaml or any camera file of `layout`.
bool is_episode_dir(const std::filesystem::path& dir, const EpisodeLayout& layout = {});

/// Resolves an episode argument: an episode directory, a parent directory whose episode
/// subdirectories are taken in name order, or a list file (one directory per line, relative to the
/// list file; blank lines and lines starting with '#' are skipped).
std::vector<std::filesystem::path> list_episodes(const std::filesystem::path& path, const EpisodeLayout& layout = {});

/// Checks a prompt is well-formed UTF-8 and not blank; throws dzr::Error naming `source`.
void validate_prompt(const std::string& prompt, const std::string& source);

/// Checks `text` is well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
/// Returns the byte offset of the first bad sequence, or nullopt.
std::optional<size_t> find_invalid_utf8(std::string_view text);

}  // namespace dzr::io
