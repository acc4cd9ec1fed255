#pragma once
/// Episode input: a directory with the three DROID camera streams, optional robot state and
/// ground-truth actions, and episode.yaml (prompt, fps, camera-file overrides). docs/FORMATS.md
/// describes every file. Validation errors name the file and say what was expected and found.
#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "io/video_reader.h"

namespace dzr::io {

inline constexpr int kNumCameras = 3;
/// Camera stream names in the order the model stacks them (DreamZero's video keys; the RoboArena
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
    /// Log the warnings as well as keeping them in Episode::warnings (a rollout logs them once, when it
    /// validates every episode before the run, and reads quietly later).
    bool log_warnings = true;
};

struct CameraStream {
    std::string name;            // one of kCameraNames
    std::filesystem::path file;  // the file the frames came from
    Tensor frames;               // uint8 RGB [T, H, W, 3]
    int64_t file_frames = 0;     // frames in the file (before any truncation)
    double fps = 0.0;            // the container's fps; 0 for .npy
    int height = 0;
    int width = 0;
    bool is_video() const { return file.extension() == ".mp4"; }
};

struct Episode {
    std::string name;  // the directory name
    std::filesystem::path dir;
    std::string prompt;
    double fps = kDroidFps;
    int64_t num_frames = 0;
    std::array<CameraStream, kNumCameras> cameras;
    std::vector<double> joint_position;    // [T, 7] row-major, radians (zeros when absent)
    std::vector<double> gripper_position;  // [T, 1], 0 = open .. 1 = closed (zeros when absent)
    bool has_joint_position = false;
    bool has_gripper_position = false;
    std::vector<double> actions;  // ground truth [T, 8] row-major; empty when absent
    std::vector<std::string> warnings;

    bool has_actions() const { return !actions.empty(); }
    const CameraStream& camera(std::string_view name) const;
    /// The 8-D state (7 joints + gripper) at frame t.
    std::array<double, kActionDims> state_at(int64_t t) const;
    /// A few lines for `dzr episode inspect` and logs.
    std::string summary() const;
};

/// Reads and validates one episode directory. Warnings (missing state, truncation, frame size)
/// are logged and kept in Episode::warnings.
Episode read_episode(const std::filesystem::path& dir, const EpisodeOptions& options);

/// True when `dir` holds episode.yaml or any camera file.
bool is_episode_dir(const std::filesystem::path& dir);

/// Resolves an episode argument: an episode directory, a parent directory whose episode
/// subdirectories are taken in name order, or a list file (one directory per line, relative to the
/// list file; blank lines and lines starting with '#' are skipped).
std::vector<std::filesystem::path> list_episodes(const std::filesystem::path& path);

/// Output names for a list of episode directories: the directory name, with "_2", "_3", ...
/// appended when names repeat.
std::vector<std::string> unique_episode_names(const std::vector<std::filesystem::path>& dirs);

/// Checks `text` is well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
/// Returns the byte offset of the first bad sequence, or nullopt.
std::optional<size_t> find_invalid_utf8(std::string_view text);

}  // namespace dzr::io
