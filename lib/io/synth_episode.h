#pragma once
/// Synthetic episodes for samples and tests, for any episode layout (DROID's by default): camera views of
/// simple moving shapes driven by smooth joint and gripper trajectories, every state key of the layout,
/// ground-truth actions consistent with them and a prompt. Everything derives from the seed through our own generator, so the same options give the
/// same bytes on every machine (the .mp4 files depend on the local encoder).
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/episode.h"

namespace dzr::io {

/// Encodes uint8 RGB frames [T, H, W, 3] at `fps` into a video file; returns the codec used.
using VideoWriterFn = std::function<std::string(const std::filesystem::path&, const TensorView&, double)>;

struct SynthOptions {
    int64_t frames = 100;
    uint64_t seed = 0;
    int width = 320;
    int height = 180;
    double fps = 15.0;
    bool write_npy_frames = true;  // <camera>.npy
    VideoWriterFn write_video;     // <camera>.mp4 when set (apps pass io::write_video_mp4)
    /// Cameras, state keys and action width (DROID's by default). Other layouts: camera 0 is a scene view,
    /// the others close-ups; each state key follows the arm's joints (grippers and effectors the gripper);
    /// action keys without a state key of that name (velocities) are smooth signals.
    EpisodeLayout layout;
};

struct SynthEpisode {
    std::vector<Tensor> views;               // uint8 [T, H, W, 3] per camera, in the layout's order
    std::vector<std::vector<double>> state;  // [T, dim] per state key, in the layout's order
    std::vector<double> actions;             // [T, action_dim]: a state key's action[t] = its state[t + 1]
                                             // (the last row repeats)
    std::string prompt;
};

/// Generates the episode in memory.
SynthEpisode make_synth_episode(const SynthOptions& options);

/// Generates and writes an episode directory (created if missing): camera files, one <key>.npy per state
/// key, actions.npy and episode.yaml. Returns the names of the files written.
std::vector<std::string> write_synth_episode(const std::filesystem::path& dir, const SynthOptions& options);

/// Frame `index` of camera `camera` of the parity inputs (`dzr parity make-inputs`, the CI golden test),
/// [height, width, 3] uint8 appended to `out`: a per-camera colour gradient, a square and a bar that move
/// with the frame index, and a low-amplitude hashed texture (lowbias32), so that every call, frame and
/// camera differs and every canvas pixel carries signal.
void append_parity_frame(int camera, int index, int height, int width, std::vector<uint8_t>& out);

/// episode.yaml text with a prompt, an fps and an optional leading comment line.
std::string episode_yaml_text(const std::string& prompt, double fps, const std::string& comment = {});

}  // namespace dzr::io
