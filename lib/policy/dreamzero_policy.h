#pragma once
/// The DreamZero policy: one call per observation (dreamzero-reference.md §1.4-§1.6, §3.6).
///
/// Per call: preprocess the frames into canvases; apply the reset rules (first call, prompt change,
/// a 1-frame call, start frame >= the attention window); on a reset encode the reference frame with
/// CLIP and the VAE (`ys`) and run the prefill forward of both CFG branches; otherwise VAE-encode the
/// clip and commit its two newest latent frames to both branches' KV caches; then denoise 2 latent
/// frames jointly with the 24-step action chunk (FlowUniPC ×2, CFG on video only, the step mask);
/// post-process the actions to 24×8 robot targets.
///
/// Everything numerical goes through a Backend. Persistent buffers and the KV pool are allocated at
/// construction and the workspace arena is sized there too (by running the same calls on a
/// MeasuringBackend), so calls make no device allocation.
#include <array>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "config/embodiment.h"
#include "config/run_config.h"
#include "kv/kv_cache_manager.h"
#include "policy/preprocess.h"
#include "policy/tokenizer.h"
#include "sampling/noise.h"
#include "weights/checkpoint.h"
#include "weights/weight_source.h"

namespace dzr {

class Umt5Tokenizer;
class Umt5Encoder;
class ClipVision;
class WanVae;
class CausalDit;
class FlowUniPC;
class StepSchedule;
class DenseSelfAttentionCache;
class PagedSelfAttentionCache;
struct DitCrossKv;

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

/// Wall time of one call's phases in milliseconds (device work is synchronized at phase ends).
/// `preprocess` is the in-call part of preprocessing (state normalization, the model-input upload);
/// `host_prepare` is prepare()'s host time (frames -> model inputs, tokens), which a prefetching caller
/// overlaps with the previous call, so it is not inside `total`.
struct PhaseTimes {
    double preprocess = 0, text_encoder = 0, image_encoder = 0, vae_encode = 0, kv_commit = 0, dit = 0,
           scheduler = 0, postprocess = 0, total = 0;
    double host_prepare = 0;
};

struct PolicyCallResult {
    std::vector<float> actions;          ///< [horizon, D] robot actions, D = the embodiment's action width
                                         ///< (DROID: 7 absolute joints, 1 gripper)
    std::vector<float> actions_normalized;  ///< [24, action_dim] the model's normalized output
    PhaseTimes times;
    int call_index = 0;                  ///< 0-based calls since construction
    int start_frame = 0;                 ///< the denoised block's start frame (latent frames)
    bool reset = false;                  ///< this call started a new attention window
    std::string reset_reason;            ///< "first call", "prompt changed", "1-frame call", "window full"
    int64_t kv_tokens = 0;               ///< committed tokens the denoising forwards attended to
    int dit_evaluations = 0;             ///< network evaluations of the denoising loop (per branch)
};

/// How the self-attention history is kept.
enum class KvMode : uint8_t { Paged, Dense };

struct PolicyOptions {
    config::SamplingConfig sampling;
    KvConfig kv;
    KvMode kv_mode = KvMode::Paged;
    std::string tokenizer;               ///< spiece.model or a dir holding one; empty: from the checkpoint
    std::shared_ptr<NoiseSource> noise;  ///< null: SeededNoise(sampling.seed)
    UnitRangeMode unit_range = UnitRangeMode::F32;
    bool check_finite = false;           ///< debug: check every stage (synchronizes) and name the culprit
    size_t free_device_bytes = 0;        ///< for a fractional kv.memory_budget (0 = unknown)
    bool video_decode = false;           ///< also plan the workspace for decode_video() (needs the decoder)
};

/// Named intermediates for parity dumps: (stage, call index, tensor on the backend; valid only during
/// the callback). Stages: "input.video" (the model input in [-1, 1]: the reference frame on a reset,
/// else the commit clip), "state", "text.pos", "text.neg", "clip", "ys", "vae.clip", "noise.video",
/// "noise.action", "dit.<prefill|commit|denoise>.<pos|neg>.<name>[.<layer>]" (CausalDit's trace
/// names), "sample.video.<step>" / "sample.action.<step>" (what the DiT sees at an evaluated step),
/// "velocity.cond.<step>", "velocity.uncond.<step>", "velocity.action.<step>", "x", "actions", and the
/// encoders' internals "umt5.<pos|neg>.<name>[.<layer>]", "clip.<name>[.<layer>]" and the VAE encoder's first
/// chunk "vae.conv_in", "vae.block.<i>", "vae.head" and second chunk "vae.chunk1.*" (their trace names).
using PolicyTraceFn = std::function<void(std::string_view stage, int call, const TensorView& t)>;

/// Parity diagnostics: (stage, call index, the live buffer on the backend). Called at every policy
/// stage of PolicyTraceFn except the DiT's "dit.*" internals, right before that stage is traced and
/// before anything consumes the buffer, so a callback may overwrite it (be.upload into `t`) and the
/// rest of the call, the trace included, sees the new values. `t` is contiguous.
using PolicyOverrideFn = std::function<void(std::string_view stage, int call, const TensorView& t)>;

class DreamZeroPolicy {
public:
    /// Loads every network from `weights` (geometry `model`) onto `be`, plans the workspace, allocates
    /// the KV pool. `embodiment` (with its metadata.json statistics) says what the observations and actions
    /// are; it is checked against the model (check_embodiment).
    DreamZeroPolicy(const ModelConfig& model, const WeightSource& weights, const Embodiment& embodiment,
                    const std::filesystem::path& tokenizer, const PolicyOptions& options, Backend& be);
    ~DreamZeroPolicy();
    DreamZeroPolicy(const DreamZeroPolicy&) = delete;
    DreamZeroPolicy& operator=(const DreamZeroPolicy&) = delete;

    /// Host-side preprocessing of an observation (validation, views -> canvases -> model input,
    /// tokenization). Thread-safe with respect to a concurrent step().
    /// The buffers of a recycled PreparedObservation are reused (see recycle()).
    PreparedObservation prepare(const Observation& obs) const;
    /// Hands a prepared observation's buffers back after its step(), so the next prepare() writes into
    /// memory that is already mapped instead of allocating some 3 MB per call. Thread-safe.
    void recycle(PreparedObservation&& used) const;
    /// One policy call. On failure the session fails closed: the next call starts a new window.
    PolicyCallResult step(const PreparedObservation& obs);
    PolicyCallResult step(const Observation& obs);
    /// Forget the session (the next call is a first call). The KV pool is returned whole.
    void reset();

    const ModelConfig& model() const { return model_; }
    const Embodiment& embodiment() const { return embodiment_; }
    Backend& backend() { return be_; }
    /// Workspace bytes reserved on the backend (planned at construction).
    size_t workspace_bytes() const { return workspace_bytes_; }
    /// The KV memory plan (paged mode) or the dense caches' bytes.
    size_t kv_bytes() const;
    const KvCacheManager* kv_manager() const { return kv_manager_.get(); }
    /// The 2 denoised latent frames of the last call, [z, 2, h, w] on the backend.
    TensorView last_video_latent() const;
    /// The last call's video prediction as the reference returns it (`video_pred`,
    /// wan_flow_matching_action_tf.py:1311): host f32 [z, f, h, w], f = 3 on a window's first call
    /// (the reference frame's latent, then the 2 denoised frames), else 2. Downloads (synchronizes):
    /// call it between calls.
    Tensor video_prediction() const;
    /// Decodes video latents (host [z, K, h, w], e.g. an episode's video_prediction()s joined along
    /// time) with the VAE decoder into host uint8 RGB frames [1 + 4(K - 1), H, W, 3], converted as
    /// the official server saves them: ((x + 1) * 127.5) clipped to [0, 255], truncated. Needs the
    /// decoder weights and PolicyOptions::video_decode (the workspace is planned for it); allocates
    /// the latent and video buffers on the backend, so call it between calls.
    Tensor decode_video(const TensorView& latents);
    void set_trace(PolicyTraceFn trace);
    void set_override(PolicyOverrideFn override_fn) { override_ = std::move(override_fn); }
    std::string describe() const;

private:
    struct Buffers;
    enum class ForwardKind : uint8_t { Prefill, Commit, Denoise };

    void plan_workspace(const WeightSource& weights, const std::filesystem::path& tokenizer);
    /// branch: "pos" or "neg" (the trace names' "umt5.<branch>." prefix)
    void encode_text(const std::vector<int64_t>& ids, int64_t length, const TensorView& out, const char* branch);
    /// The encoders' trace hook under `prefix` (empty without a trace): their internals as policy stages.
    std::function<void(const char*, int, const TensorView&)> encoder_trace(std::string prefix);
    void populate_text_cross();
    void populate_image_cross();
    void forward_branch(int branch, ForwardKind kind, const TensorView& x, const TensorView& y, int start_frame,
                        int64_t timestep, const TensorView& video_out, const TensorView& action_out,
                        int64_t action_timestep);
    void trace(std::string_view stage, const TensorView& t);
    void check_finite(std::string_view stage, const TensorView& t);
    void sync_phase(double& slot, class Timer& timer);

    ModelConfig model_;
    PolicyOptions options_;
    Embodiment embodiment_;
    Backend& be_;
    bool measuring_ = false;  // this instance runs on a MeasuringBackend (workspace planning)

    std::unique_ptr<ObservationPreprocessor> preprocessor_;  // prepare()'s frames -> model inputs
    mutable std::mutex spare_mu_;                              // guards spare_
    mutable std::vector<PreparedObservation> spare_;           // recycled buffers for prepare()
    std::unique_ptr<Umt5Tokenizer> tokenizer_;
    std::unique_ptr<Umt5Encoder> text_encoder_;
    std::unique_ptr<ClipVision> image_encoder_;
    std::unique_ptr<WanVae> vae_;
    std::unique_ptr<CausalDit> dit_;
    std::unique_ptr<FlowUniPC> video_sampler_, action_sampler_;
    std::unique_ptr<StepSchedule> schedule_;
    std::shared_ptr<NoiseSource> noise_;

    // KV: paged (manager + session + one cache per branch) or dense (one cache per branch).
    std::unique_ptr<KvCacheManager> kv_manager_;
    std::unique_ptr<KvSession> kv_session_;
    std::array<std::unique_ptr<PagedSelfAttentionCache>, 2> paged_;
    std::array<std::unique_ptr<DenseSelfAttentionCache>, 2> dense_;
    std::unique_ptr<DitCrossKv> staging_kv_;      // paged: computed here, then copied into the cross caches
    std::array<std::unique_ptr<DitCrossKv>, 2> branch_kv_;  // what the DiT reads, per branch

    std::unique_ptr<Buffers> buf_;
    size_t workspace_bytes_ = 0;

    // Session state (dreamzero-reference.md §1.5).
    bool started_ = false;
    int start_frame_ = 0;
    std::vector<int64_t> prompt_ids_;
    bool text_ready_ = false;
    int call_index_ = 0;
    int last_latent_frames_ = 0;
    PolicyTraceFn trace_;
    PolicyOverrideFn override_;
};

/// DreamZeroPolicy::prepare() without a policy (`dzr bench prepare` times it): validation against the
/// embodiment, the frames -> model inputs (`preprocessor` making the model's canvas) and the prompt tokens. With
/// `bf16_inputs` the model inputs are written as bf16 only (reference_input_bf16 / clip_input_bf16),
/// as a bf16 backend uploads them; else as f32 only. `reuse` (optional): a used PreparedObservation whose
/// buffers are taken over.
PreparedObservation prepare_observation(const Observation& obs, const ModelConfig& model, const Embodiment& embodiment,
                                        const ObservationPreprocessor& preprocessor, const Umt5Tokenizer& tokenizer,
                                        bool bf16_inputs = false, PreparedObservation* reuse = nullptr);

/// A WeightSource of shapes only (no data), from the inventory of a geometry, for workspace planning.
std::unique_ptr<WeightSource> make_shape_only_weights(const ModelConfig& model);

}  // namespace dzr
