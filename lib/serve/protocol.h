#pragma once
/// The wire protocol of the official DreamZero server (dreamzero-reference.md §1.2): RoboArena's
/// policy-server protocol (eval_utils/policy_server.py) with DROID's observation keys
/// (socket_test_optimized_AR.py). Every message is one websocket binary frame holding one msgpack value;
/// numpy arrays use openpi_client's encoding (msgpack_numpy.py): an array is a map {b"__ndarray__": true,
/// b"data": raw bytes, b"dtype": "<f4", b"shape": [..]} and a numpy scalar a map {b"__npgeneric__": true,
/// b"data": value, b"dtype": "<f4"}, the marker keys packed as msgpack bin (Python bytes).
///
///   server -> client on connect   the PolicyServerConfig map (encode_server_config)
///   client -> server              {"endpoint": "infer", observation keys..., "prompt", "session_id"}
///                                 {"endpoint": "reset", ...anything}
///   server -> client              infer: the actions, a float32 ndarray [24, 8];
///                                 reset: the text "reset successful";
///                                 an error: a text frame with the message, then the server closes
///
/// decode_request() validates a whole message before anything acts on it, so a bad message changes no state.
#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"

namespace dzr::serve {

/// A message that breaks the protocol (the client's fault); its text goes back to the client.
class ProtocolError : public Error {
  public:
    using Error::Error;
};

/// RoboArena's PolicyServerConfig, sent on connect, with the official DROID server's values
/// (socket_test_optimized_AR.py:440-447). The image resolution is the embodiment's recorded frame size.
struct ServerConfig {
    int image_height = 180;
    int image_width = 320;
    bool needs_wrist_camera = true;
    int n_external_cameras = 2;
    bool needs_stereo_camera = false;
    bool needs_session_id = true;
    std::string action_space = "joint_position";
};

/// The config as Python's packer writes dataclasses.asdict(config): a map of str keys in field order,
/// image_resolution as the array [height, width].
std::string encode_server_config(const ServerConfig& config);

/// The text reply to the reset endpoint (eval_utils/policy_server.py:99).
inline constexpr std::string_view kResetReply = "reset successful";

/// The RoboArena camera keys of a DROID observation, and dzr's camera names for them (the model's video keys:
/// RoboArena counts the exterior cameras from 0, DreamZero from 1; socket_test_optimized_AR.py:108-112).
inline constexpr size_t kNumCameras = 3;
inline constexpr std::array<std::string_view, kNumCameras> kCameraKeys = {
    "observation/exterior_image_0_left", "observation/exterior_image_1_left", "observation/wrist_image_left"};
inline constexpr std::array<std::string_view, kNumCameras> kModelCameras = {
    "exterior_image_1_left", "exterior_image_2_left", "wrist_image_left"};
inline constexpr std::string_view kJointKey = "observation/joint_position";
inline constexpr std::string_view kGripperKey = "observation/gripper_position";
inline constexpr int kJointDims = 7;

/// One camera's frames of an infer request, uint8 [frames, height, width, 3] RGB, pointing into the message.
struct WireFrames {
    const uint8_t* data = nullptr;
    int64_t frames = 0, height = 0, width = 0;

    size_t frame_bytes() const { return size_t(height * width * 3); }
    std::span<const uint8_t> frame(int64_t i) const {
        return {data + size_t(i) * frame_bytes(), frame_bytes()};
    }
};

struct InferRequest {
    std::array<WireFrames, kNumCameras> cameras;  ///< in kCameraKeys' order
    std::array<double, kJointDims> joint_position{};
    double gripper_position = 0.0;
    std::string prompt;
    std::optional<std::string> session_id;
};

enum class Endpoint : uint8_t { Infer, Reset };

struct Request {
    Endpoint endpoint = Endpoint::Infer;
    InferRequest infer;  ///< endpoint Infer only
};

struct ProtocolLimits {
    int image_height = 180;
    int image_width = 320;
};

/// Decodes and validates one message; throws ProtocolError saying which key is wrong, what was expected and
/// what came. The request's frames point into `message`, which must outlive them.
///
/// Rules (stricter than the official server where its leniency would give the robot wrong actions):
/// - `endpoint` is "infer" or "reset" (the official server runs anything but "reset" as infer);
/// - infer needs the three cameras, uint8 [H, W, 3] or [T, H, W, 3] at the advertised resolution, the same
///   T for each; `observation/joint_position` 7 finite floats ([7] or [1, 7]) and
///   `observation/gripper_position` 1 finite float (an array of one element or a numpy float scalar) — the
///   official server silently uses zeros for a missing state, which makes its actions relative to a zero
///   state; `prompt` a non-blank UTF-8 str; `session_id` an optional str; other keys
///   (observation/cartesian_position) are ignored;
/// - float arrays may be float16, float32 or float64, little- or big-endian.
Request decode_request(std::string_view message, const ProtocolLimits& limits);

/// A float32 array as openpi_client packs a numpy array (the infer reply: shape [horizon, action width]).
std::string encode_float32_array(std::span<const float> values, const std::vector<int64_t>& shape);

}  // namespace dzr::serve
