#pragma once
/// A policy call's observation, and the host-side work on it that needs no model state (prepare_observation:
/// validation, frames -> canvases -> the model's [-1, 1] input, the prompt tokens). The rollout runs it on a
/// second thread while the previous call steps.
#include <array>
#include <span>
#include <cstdint>
#include <string>
#include <vector>

#include "config/embodiment.h"
#include "config/model_config.h"
#include "core/tensor.h"
#include "policy/preprocess.h"
#include "policy/tokenizer.h"

namespace dzr {

class Umt5Tokenizer;

/// One policy call's observation. Frames are host uint8 [T, H, W, 3] RGB (T = 1 on a session's first
/// call, else 4; 8 and 9 are accepted as the reference does), one tensor per camera of the embodiment in
/// its order (Embodiment::cameras; DROID: exterior_image_1_left, exterior_image_2_left, wrist_image_left);
/// the state is raw (un-normalized): the embodiment's state keys concatenated in order (DROID: 7 joint
/// positions, then the gripper).
struct Observation {
    std::vector<TensorView> views;
    std::vector<double> state;
    std::string prompt;
};

/// DROID's observation from its three cameras (RoboArena exterior_image_0_left is exterior_1), the 7 joint
/// positions and the gripper.
Observation droid_observation(const TensorView& exterior_1, const TensorView& exterior_2, const TensorView& wrist,
                              std::span<const double> joint_position, double gripper_position, std::string prompt);

/// An observation after the host-side work that needs no model state: the canvases converted to the
/// model's [-1, 1] input (the reference frame and, for T > 1, the commit clip), the prompt tokens and
/// the raw state. prepare() is const and may run on another thread while the previous call's step()
/// runs (the rollout overlaps them).
struct PreparedObservation {
    int frames = 0;                       ///< T
    /// The model inputs in f32 (CPU backend) or, when the backend computes in bf16, in bf16 only (the bits
    /// of f32_to_bf16 of the f32 values: the call uploads half the bytes and converts nothing).
    HostFloats reference_input;           ///< [3, H, W]: frame T-1 when T is 4 or 9, else frame 0
    HostFloats clip_input;                ///< [3, 9, H, W]: the commit clip (empty when T == 1)
    std::vector<uint16_t, UninitAllocator<uint16_t>> reference_input_bf16, clip_input_bf16;  ///< same, bf16
    PromptTokens tokens;
    std::vector<double> state;            ///< the raw state (the embodiment's keys concatenated)
    double prepare_ms = 0.0;              ///< host time prepare() took
    ObservationPreprocessor::Scratch canvas_scratch;  ///< the canvases (host scratch kept for reuse)
};

/// Engine::prepare() without an engine (`dzr bench prepare` times it): validation against the embodiment, the
/// frames -> model inputs (`preprocessor` making the model's canvas) and the prompt tokens. With
/// `bf16_inputs` the model inputs are written as bf16 only (reference_input_bf16 / clip_input_bf16),
/// as a bf16 backend uploads them; else as f32 only. `reuse` (optional): a used PreparedObservation whose
/// buffers are taken over.
PreparedObservation prepare_observation(const Observation& obs, const ModelConfig& model, const Embodiment& embodiment,
                                        const ObservationPreprocessor& preprocessor, const Umt5Tokenizer& tokenizer,
                                        bool bf16_inputs = false, PreparedObservation* reuse = nullptr);

/// The frames of a commit clip, as indices into the call's T frames (the reference's repeat and
/// prepend, wan_flow_matching_action_tf.py:1080-1100).
std::vector<int> commit_clip_indices(int T, int frames_per_block);

}  // namespace dzr
