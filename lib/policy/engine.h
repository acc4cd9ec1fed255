#pragma once
/// The DreamZero engine and its sessions.
///
/// An Engine loads everything once: the backends (one per device of the placement), the networks (umT5, CLIP and
/// the VAE on the primary backend; the DiT on every backend that runs a CFG branch), the sampler schedule, the
/// tokenizer and preprocessing, the KV pool (one per device) and the workspace, planned by running the calls on
/// measuring backends. A Session is one rollout: its state machine (start frame, prompt, window), its KV session,
/// its buffers and the branch runners. `dzr rollout` is an Engine plus an episode loop; the parity commands and
/// the benches build the same Engine; a request loop (serving) would be one more thin caller.
///
/// Up to PolicyOptions::max_sessions sessions are open at once (one by default; the KV pool and the cross caches are
/// sized for them). Each keeps its buffers, branch runners (CUDA graphs), samplers and KV session; they share the
/// networks, the workspace arena and the KV scratch, so Session::step calls on one engine must not overlap (a call
/// that would is refused).
#include <atomic>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "config/embodiment.h"
#include "config/run_config.h"
#include "kv/kv_cache_manager.h"
#include "policy/branch_runner.h"
#include "policy/observation.h"
#include "policy/tokenizer.h"
#include "sampling/noise.h"
#include "weights/bulk_load.h"
#include "weights/checkpoint.h"
#include "weights/weight_source.h"

namespace dzr {

class Umt5Encoder;
class ClipVision;
class WanVae;
class CausalDit;
class StepSchedule;
class Communicator;
class Session;
class MeasuringBackend;
class TextEmbeddings;

struct PolicyOptions {
    config::SamplingConfig sampling;
    KvConfig kv;
    std::shared_ptr<NoiseSource> noise;  ///< null: SeededNoise(sampling.seed)
    UnitRangeMode unit_range = UnitRangeMode::F32;
    bool check_finite = false;           ///< debug: check every stage (synchronizes) and name the culprit
    size_t free_device_bytes = 0;        ///< for a fractional kv.memory_budget (0 = unknown)
    bool video_decode = false;           ///< also plan the workspace for decode_video() (needs the decoder)
    /// The DiT's Linear weights: bf16 = the compute dtype; fp8 = E4M3 with per-output-channel scales (stored so in
    /// the checkpoint, or quantized at load: weights/fp8_weights.h). The KV pool's is kv.dtype.
    Precision precision = Precision::Bf16;
    /// How the weights are read (weights/bulk_load.h); nullopt: each weight is uploaded as its network requires it.
    std::optional<BulkLoadOptions> bulk_load = BulkLoadOptions{};
    /// The text encoder pre-pass (an offline run knows its prompts): umT5 is loaded alone, encodes the negative
    /// prompt and every prompt of `prepass_prompts` (instructions, as an Observation carries them), and is freed
    /// before the other networks load; sessions take the embeddings from that cache and never run umT5, so a
    /// prompt outside the list is an error. Off: umT5 stays resident and encodes each new prompt in its call.
    bool text_prepass = false;
    std::vector<std::string> prepass_prompts;
    /// CUDA graphs of the DiT forwards (policy/forward_graphs.h) where the backend has them; the environment's
    /// DZR_CUDA_GRAPHS=0 turns them off too. Profiled, measuring and CPU backends run op by op either way.
    bool cuda_graphs = true;
    /// `fast` numerics: both CFG branches' forwards as one batched forward where they share a backend
    /// (BranchRunner::forward_pair). A traced call batches too when `trace_dit_layers` is off; with it on it runs the
    /// branches one after the other (the DiT's layer intermediates are named per branch).
    bool batch_cfg = true;
    /// With batch_cfg: layer 0's self-attention runs once for both branches (DitForwardOptions::
    /// share_first_self_attention). The environment's DZR_SHARE_LAYER0=off turns it off.
    bool share_first_self_attention = true;
    /// A trace (set_trace) records the DiT's intermediates ("dit.<kind>.<branch>.<name>[.<layer>]": the embeddings,
    /// every layer's, the head's). Off: only the head's input and output and the action velocity of each branch,
    /// which a batched forward gives per branch (a parity run that compares those, docs/PARITY.md).
    bool trace_dit_layers = true;
    /// DiT layers kept in host memory and streamed in as they run (RunConfig::offload_layers, resolved: a count).
    int offload_layers = 0;
    /// Sessions open at once (`dzr serve --max-sessions`): the KV pool and the cross caches hold this many, each
    /// session allocates its own buffers; their calls run one at a time.
    int max_sessions = 1;
};

/// The PolicyOptions a run config sets (sampling, kv and its mode, precision, cuda_graphs, batch_cfg,
/// offload_layers: auto as none); the rest keep their defaults.
PolicyOptions run_policy_options(const config::RunConfig& run);

/// What an engine takes on each device of its placement besides what it was given, found by running its calls on
/// measuring backends (Engine::measure): nothing is loaded or computed.
struct EngineFootprint {
    std::vector<size_t> workspace_bytes;  ///< the workspace to reserve: the arena's high water + kWorkspaceMargin
    std::vector<size_t> engine_bytes;     ///< the engine's allocations: the networks (weights, tables), KV pools
    std::vector<size_t> session_bytes;    ///< a session's: buffers, samplers, velocities
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

/// Where the networks run: backends[0] (the primary) runs the encoders, the VAE, the samplers and the
/// conditional branch; the unconditional branch runs on backends[1] when there is one, else on backends[0].
struct Placement {
    std::vector<Backend*> backends;

    Backend& primary() const { return *backends.at(0); }
    /// The backend index a CFG branch runs on.
    int device_of(int branch) const { return branch == 1 && backends.size() > 1 ? 1 : 0; }
    Backend& backend_of(int branch) const { return *backends.at(size_t(device_of(branch))); }
};

/// What Engine::load needs: the checkpoint, the run settings, the devices.
struct EngineOptions {
    std::filesystem::path checkpoint;
    config::RunConfig run;
    /// run.model came from a config file: the checkpoint's geometry must equal it.
    bool check_config_model = false;
    /// One device, or two ("cpu,cpu", "cuda:0,cuda:1"): the second runs the unconditional branch.
    std::vector<Device> devices{Device::cpu()};
    BackendOptions backend;
    std::string tokenizer;  ///< empty: the checkpoint's spiece.model
    bool check_finite = false;
    bool video_decode = false;
    std::shared_ptr<NoiseSource> noise;  ///< null: SeededNoise(run.sampling.seed)
    std::optional<BulkLoadOptions> bulk_load = BulkLoadOptions{};  ///< PolicyOptions::bulk_load
    /// The text encoder pre-pass over these prompts (PolicyOptions::text_prepass).
    bool text_prepass = false;
    std::vector<std::string> prepass_prompts;
    int max_sessions = 1;  ///< PolicyOptions::max_sessions

    /// The policy options Engine::load builds from these (the memory plan of a run uses the same).
    PolicyOptions policy_options() const;
};

/// Everything a session needs, loaded once.
class Engine {
public:
    /// Opens and checks the checkpoint (geometry against the run config, every weight, the statistics of the
    /// run's embodiment, the tokenizer), makes the backends and loads the engine on them.
    static std::unique_ptr<Engine> load(const EngineOptions& options);
    /// The engine on new backends for `devices` (one, or two: the second runs the unconditional branch), which it
    /// owns.
    static std::unique_ptr<Engine> create(const ModelConfig& model, const WeightSource& weights,
                                          const Embodiment& embodiment, const std::filesystem::path& tokenizer,
                                          const PolicyOptions& options, const std::vector<Device>& devices,
                                          const BackendOptions& backend);

    /// Loads every network from `weights` (geometry `model`) onto the placement's backends, plans the workspace
    /// and allocates the KV pools. `embodiment` (with its metadata.json statistics) says what the observations and
    /// actions are; it is checked against the model (check_embodiment).
    Engine(const ModelConfig& model, const WeightSource& weights, const Embodiment& embodiment,
           const std::filesystem::path& tokenizer, const PolicyOptions& options, const Placement& placement);
    ~Engine();

    /// Added to the measured workspace high water when it is reserved.
    static constexpr size_t kWorkspaceMargin = size_t(1) << 20;
    /// Builds the engine on `backends` (measuring backends, one per device of the placement) with shape-only
    /// weights, opens a session and runs a window's first call and a commit call (every shape), and the video
    /// decode with options.video_decode: the workspace each device needs and what the engine and a session
    /// allocate there. Every engine plans its workspace with this; the memory plan (memory_plan.h) too.
    /// `tokenizer` may be empty (the calls carry placeholder prompts either way). `shapes`: the shape-only weights
    /// to load (null: make_shape_only_weights(model)).
    static EngineFootprint measure(const ModelConfig& model, const Embodiment& embodiment,
                                   const std::filesystem::path& tokenizer, const PolicyOptions& options,
                                   const std::vector<MeasuringBackend*>& backends,
                                   const WeightSource* shapes = nullptr);
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    /// A new session. At most options().max_sessions may be open at once (an error naming it); it must not outlive
    /// the engine.
    std::unique_ptr<Session> open_session();

    /// Host-side preprocessing of an observation (validation, views -> canvases -> model input,
    /// tokenization). Thread-safe with respect to a concurrent Session::step().
    /// The buffers of a recycled PreparedObservation are reused (see recycle()).
    PreparedObservation prepare(const Observation& obs) const;
    /// Hands a prepared observation's buffers back after its step(), so the next prepare() writes into
    /// memory that is already mapped instead of allocating some 3 MB per call. Thread-safe.
    void recycle(PreparedObservation&& used) const;

    /// Decodes video latents (host [z, K, h, w], e.g. an episode's Session::video_prediction()s joined along
    /// time) with the VAE decoder into host uint8 RGB frames [1 + 4(K - 1), H, W, 3], converted as the
    /// official server saves them: ((x + 1) * 127.5) clipped to [0, 255], truncated. Needs the decoder weights
    /// and PolicyOptions::video_decode (the workspace is planned for it); allocates the latent and video
    /// buffers on the backend, so call it between calls.
    Tensor decode_video(const TensorView& latents);

    const ModelConfig& model() const { return model_; }
    const PolicyOptions& options() const { return options_; }
    const Embodiment& embodiment() const { return embodiment_; }
    const Placement& placement() const { return placement_; }
    Backend& backend() const { return placement_.primary(); }
    /// Workspace bytes reserved per backend (planned at construction).
    const std::vector<size_t>& workspace_bytes() const { return workspace_bytes_; }
    /// The KV memory plans (paged mode, one per device) or the dense caches' bytes.
    size_t kv_bytes() const;
    const KvCacheManager* kv_manager(int device = 0) const {
        return size_t(device) < kv_managers_.size() ? kv_managers_[size_t(device)].get() : nullptr;
    }
    /// The DiT on the placement's `device`-th backend.
    const CausalDit& dit(int device = 0) const { return *dits_.at(size_t(device)); }
    /// The text pre-pass's embeddings (null when umT5 is resident).
    const TextEmbeddings* text_embeddings() const { return text_embeddings_.get(); }
    /// The checkpoint Engine::load opened (null for an engine built on a given WeightSource).
    const Checkpoint* checkpoint() const { return checkpoint_.get(); }
    const std::filesystem::path& tokenizer_path() const { return tokenizer_path_; }
    /// Device memory in use, the largest over the placement's devices; nullopt where not measured (CPU).
    std::optional<int64_t> device_memory_in_use() const;
    /// "cpu", "cuda:0", "cpu,cpu": the placement's devices.
    std::string devices() const;
    /// The PCI bus ids of the placement's GPUs, each once (empty on CPU).
    std::vector<std::string> pci_bus_ids() const;
    /// True when every KV pool is whole (no session holds blocks).
    bool kv_pools_whole() const;
    std::string describe() const;

    /// Profiled backends (BackendOptions::profile): forget the calls so far (e.g. the warm-up's).
    void reset_profiles();
    /// Profiled backends: each one's profile (Profiler::to_json) keyed by its device ("cuda:0", a second backend on
    /// the same device "cpu#1"), and their tables appended to `table` when given; {} when none is profiled.
    nlohmann::ordered_json profile_json(std::string* table = nullptr) const;

private:
    friend class Session;

    void plan_workspace(const std::filesystem::path& tokenizer, const WeightSource& weights);

    ModelConfig model_;
    PolicyOptions options_;
    Embodiment embodiment_;
    Placement placement_;
    bool measuring_ = false;  // the placement's backends only measure (workspace planning)
    std::vector<std::unique_ptr<Backend>> owned_backends_;  // Engine::load's
    std::unique_ptr<Checkpoint> checkpoint_;                  // Engine::load's
    std::filesystem::path tokenizer_path_;

    std::unique_ptr<ObservationPreprocessor> preprocessor_;  // prepare()'s frames -> model inputs
    mutable std::mutex spare_mu_;                              // guards spare_
    mutable std::vector<PreparedObservation> spare_;           // recycled buffers for prepare()
    std::unique_ptr<Umt5Tokenizer> tokenizer_;         // null only on a measuring engine built without one
    std::unique_ptr<Umt5Encoder> text_encoder_;        // null with the text pre-pass
    std::unique_ptr<TextEmbeddings> text_embeddings_;  // the text pre-pass's embeddings (null without it)
    std::unique_ptr<ClipVision> image_encoder_;
    std::unique_ptr<WanVae> vae_;
    std::vector<std::unique_ptr<CausalDit>> dits_;  // one per backend of the placement that runs a branch
    std::unique_ptr<StepSchedule> schedule_;
    std::shared_ptr<NoiseSource> noise_;
    std::unique_ptr<Communicator> communicator_;   // two backends: moves the unconditional branch's tensors
    std::vector<std::unique_ptr<KvCacheManager>> kv_managers_;  // paged: one per backend
    std::vector<size_t> workspace_bytes_;
    int open_sessions_ = 0;
    std::atomic<bool> stepping_{false};  // a Session::step runs (they share the workspace: one at a time)
};

/// Wall time of one call's phases in milliseconds. The phases are measured with events on the primary backend's
/// stream (device time on a GPU, host time on the CPU), read once the actions are on the host, so a call
/// synchronizes only there. `preprocess` is the in-call part of preprocessing (state normalization, the
/// model-input upload); `host_prepare` is prepare()'s host time (frames -> model inputs, tokens), which a
/// prefetching caller overlaps with the previous call, so it is not inside `total` (host wall time of step()).
struct PhaseTimes {
    double preprocess = 0, text_encoder = 0, image_encoder = 0, vae_encode = 0, kv_commit = 0, dit = 0,
           scheduler = 0, postprocess = 0, total = 0;
    double host_prepare = 0;
};

struct PolicyCallResult {
    std::vector<float> actions;             ///< [horizon, D] robot actions, D = the embodiment's action width
                                            ///< (DROID: 7 absolute joints, 1 gripper)
    std::vector<float> actions_normalized;  ///< [horizon, action_dim] the model's normalized output
    PhaseTimes times;
    int call_index = 0;                     ///< 0-based calls since the session opened
    int start_frame = 0;                    ///< the denoised block's start frame (latent frames)
    bool reset = false;                     ///< this call started a new attention window
    std::string reset_reason;               ///< "first call", "prompt changed", "1-frame call", "window full"
    int64_t kv_tokens = 0;                  ///< committed tokens the denoising forwards attended to
    int dit_evaluations = 0;                ///< network evaluations of the denoising loop (per branch)
};

/// One rollout on an engine: per call, the reset rules, the inputs, the context (text and image cross K/V),
/// the prefill or commit, the denoising loop and the post-processing.
class Session {
public:
    explicit Session(Engine& engine);
    ~Session();
    Session(const Session&) = delete;
    Session& operator=(const Session&) = delete;

    /// One policy call. On failure the session fails closed on every device: the next call starts a new window.
    /// The calls of the sessions of one engine run one at a time (a call while another runs throws).
    PolicyCallResult step(const PreparedObservation& obs);
    /// Forget the session's state (the next call is a first call). The KV pools are returned whole.
    void reset();

    /// The 2 denoised latent frames of the last call, [z, 2, h, w] on the primary backend.
    TensorView last_video_latent() const;
    /// The last call's video prediction as the reference returns it (`video_pred`,
    /// wan_flow_matching_action_tf.py:1311): host f32 [z, f, h, w], f = 3 on a window's first call
    /// (the reference frame's latent, then the 2 denoised frames), else 2. Downloads (synchronizes):
    /// call it between calls.
    Tensor video_prediction() const;
    void set_trace(PolicyTraceFn trace);
    void set_override(PolicyOverrideFn override_fn) { override_ = std::move(override_fn); }
    Engine& engine() { return engine_; }
    /// The CUDA graphs of both branches so far (enabled = false when the session runs op by op).
    ForwardGraphStats graph_stats() const;

private:
    struct Buffers;
    struct Runners;
    struct Events;

    // The stages of step().
    std::string reset_reason(const PreparedObservation& obs) const;
    void apply_reset(const PreparedObservation& obs);
    void upload_inputs(const PreparedObservation& obs, bool reset);
    void encode_context(const PreparedObservation& obs);
    void start_window(int frames);
    void commit_clip();
    int denoise(PolicyCallResult& result);
    void postprocess(const PreparedObservation& obs, PolicyCallResult& result);
    void fail_closed() noexcept;

    /// branch: "pos" or "neg" (the trace names' "umt5.<branch>." prefix)
    void encode_text(const std::vector<int64_t>& ids, int64_t length, const TensorView& out, const char* branch);
    /// The encoders' trace hook under `prefix` (empty without a trace): their internals as policy stages.
    std::function<void(const char*, int, const TensorView&)> encoder_trace(std::string prefix);
    void populate_text_cross();
    void populate_image_cross();
    /// Both CFG branches' forwards of `kind`: as one batched forward where the options and placement allow
    /// (BranchRunner::forward_pair), else the conditional branch's, then the unconditional's.
    void forward_both(ForwardKind kind, const BranchIo& cond, const BranchIo& uncond, int start_frame,
                      int64_t timestep, int64_t action_timestep);
    void forward(int branch, ForwardKind kind, const BranchIo& io, int start_frame, int64_t timestep,
                 int64_t action_timestep);
    /// The trace of a DiT forward of `kind` on `branch` ("dit.<kind>.<branch>.<name>[.<layer>]"); empty without one.
    DitTraceFn dit_trace(ForwardKind kind, int branch);
    void trace(std::string_view stage, const TensorView& t);
    void check_finite(std::string_view stage, const TensorView& t);

    Engine& engine_;
    std::unique_ptr<Buffers> buf_;
    std::unique_ptr<Runners> runners_;
    std::unique_ptr<Events> events_;

    // Session state (dreamzero-reference.md §1.5).
    bool started_ = false;
    int start_frame_ = 0;
    std::vector<int64_t> prompt_ids_;
    bool text_ready_ = false;
    int call_index_ = 0;
    PolicyTraceFn trace_;
    PolicyOverrideFn override_;
};

/// kv.in_place auto: whether the lanes' room pays on `be` (resolve_kv_lanes' fast_device): a GPU, or a measuring backend
/// planning one (its capabilities are the GPU's), in fast numerics, where the attention reads the lanes in place.
bool kv_lanes_pay(const Backend& be);

/// A WeightSource of shapes only (no data), from the inventory of a geometry, for workspace planning. With `like`,
/// a Linear weight stored there as F8_E4M3 is F8_E4M3 here too (with its scale), so the plan loads what the real
/// load will.
std::unique_ptr<WeightSource> make_shape_only_weights(const ModelConfig& model, const WeightSource* like = nullptr);

/// Throws, before anything is loaded, when the run asks for FP8 (weights or KV pool) on a backend without FP8
/// (a GPU before sm_89), naming the device, its compute capability and the setting.
void check_fp8_support(const Placement& placement, Precision weights, Precision kv);

}  // namespace dzr
