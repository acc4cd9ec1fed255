#pragma once
/// The DreamZero policy as one object: an Engine and its one Session (engine.h), for callers that run one
/// rollout on one backend (tests, `dzr parity run`). Per call: preprocess the frames into canvases; apply the
/// reset rules (first call, prompt change, a 1-frame call, start frame >= the attention window); on a reset encode
/// the reference frame with CLIP and the VAE (`ys`) and run the prefill forward of both CFG branches; otherwise
/// VAE-encode the clip and commit its two newest latent frames to both branches' KV caches; then denoise 2 latent
/// frames jointly with the 24-step action chunk (FlowUniPC x2, CFG on video only, the step mask); post-process the
/// actions to 24x8 robot targets (dreamzero-reference.md §1.4-§1.6, §3.6).
#include <filesystem>
#include <memory>
#include <string>

#include "policy/engine.h"

namespace dzr {

class DreamZeroPolicy {
public:
    /// Loads every network from `weights` (geometry `model`) onto `be`, plans the workspace, allocates
    /// the KV pool and opens the session. `embodiment` (with its metadata.json statistics) says what the
    /// observations and actions are; it is checked against the model (check_embodiment).
    DreamZeroPolicy(const ModelConfig& model, const WeightSource& weights, const Embodiment& embodiment,
                    const std::filesystem::path& tokenizer, const PolicyOptions& options, Backend& be);
    /// The same on a placement of one or two backends (the second runs the unconditional branch).
    DreamZeroPolicy(const ModelConfig& model, const WeightSource& weights, const Embodiment& embodiment,
                    const std::filesystem::path& tokenizer, const PolicyOptions& options, const Placement& placement);
    ~DreamZeroPolicy();
    DreamZeroPolicy(const DreamZeroPolicy&) = delete;
    DreamZeroPolicy& operator=(const DreamZeroPolicy&) = delete;

    PreparedObservation prepare(const Observation& obs) const { return engine_->prepare(obs); }
    void recycle(PreparedObservation&& used) const { engine_->recycle(std::move(used)); }
    /// One policy call. On failure the session fails closed: the next call starts a new window.
    PolicyCallResult step(const PreparedObservation& obs) { return session_->step(obs); }
    PolicyCallResult step(const Observation& obs);
    /// Forget the session (the next call is a first call). The KV pool is returned whole.
    void reset() { session_->reset(); }

    const ModelConfig& model() const { return engine_->model(); }
    const Embodiment& embodiment() const { return engine_->embodiment(); }
    Backend& backend() { return engine_->backend(); }
    /// Workspace bytes reserved on the primary backend (planned at construction).
    size_t workspace_bytes() const { return engine_->workspace_bytes().empty() ? 0 : engine_->workspace_bytes()[0]; }
    size_t kv_bytes() const { return engine_->kv_bytes(); }
    const KvCacheManager* kv_manager() const { return engine_->kv_manager(); }
    TensorView last_video_latent() const { return session_->last_video_latent(); }
    Tensor video_prediction() const { return session_->video_prediction(); }
    Tensor decode_video(const TensorView& latents) { return engine_->decode_video(latents); }
    void set_trace(PolicyTraceFn trace) { session_->set_trace(std::move(trace)); }
    void set_override(PolicyOverrideFn override_fn) { session_->set_override(std::move(override_fn)); }
    std::string describe() const { return engine_->describe(); }
    Engine& engine() { return *engine_; }
    Session& session() { return *session_; }

private:
    std::unique_ptr<Engine> engine_;
    std::unique_ptr<Session> session_;
};

}  // namespace dzr
