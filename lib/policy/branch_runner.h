#pragma once
/// The two CFG branches of a policy call as runners, and what moves between them.
///
/// A BranchRunner evaluates the DiT for one CFG branch (conditional: the prompt; unconditional: the negative
/// prompt). It holds the backend it runs on, the DiT weights on that backend, its branch's self-attention KV
/// cache (paged or dense) and cross-attention K/V, and, when it runs on another device than the session's
/// buffers, its own copies of the forward's inputs and outputs. A placement decides where each branch runs:
/// both on one backend (one device) today; the unconditional branch on a second backend with `--device
/// cpu,cpu` (two CPU backends: the split tested without a second GPU) or two GPUs later.
///
/// A Communicator moves the small tensors between a remote runner and the session's device: the forward's
/// inputs (the samples, the conditioning slice, the state) out, the video velocity back. On one device nothing
/// moves.
#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "kv/dense_self_attention_cache.h"
#include "kv/paged_self_attention_cache.h"
#include "model/causal_dit.h"
#include "policy/forward_graphs.h"

namespace dzr {

enum class ForwardKind : uint8_t { Prefill, Commit, Denoise };
const char* forward_kind_name(ForwardKind kind);

/// CFG branch indices and names (the trace names' "pos"/"neg").
inline constexpr int kCondBranch = 0;
inline constexpr int kUncondBranch = 1;
inline constexpr const char* kBranchNames[2] = {"pos", "neg"};
/// The graph key's branch of a batched forward of both (BranchRunner::forward_pair); its name is "both".
inline constexpr int kBothBranches = 2;

/// Moves a tensor between two backends of one engine.
class Communicator {
public:
    virtual ~Communicator() = default;
    /// dst (on `to`) = src (on `from`); same shape, dtype and element count, both contiguous. Ordered after the
    /// work queued on `from` and before the work queued on `to` after the call.
    virtual void transfer(Backend& from, const TensorView& src, Backend& to, const TensorView& dst) = 0;
    virtual std::string describe() const = 0;
};

/// Through host memory, for any two backends: the source is downloaded (which waits for `from`) into a host
/// buffer and uploaded to `to`. Between two CPU backends this is a plain copy; between two GPUs a peer copy
/// (no host round trip, no host wait) replaces it.
std::unique_ptr<Communicator> make_host_communicator();

/// The forward's inputs and outputs, on the session's (primary) backend.
struct BranchIo {
    TensorView x;             ///< latent [z, f, h, w]
    TensorView y;             ///< conditioning slice [4 + z, f, h, w]
    TensorView action;        ///< denoise: the action sample [horizon, action_dim]
    TensorView state;         ///< denoise: the normalized state [1, max_state_dim]
    TensorView video_out;     ///< the video velocity [z, f, h, w]
    TensorView action_out;    ///< denoise: the action velocity (the conditional branch's is used)
};

class BranchRunner {
public:
    /// `dit` lives on `be`. `primary`: the backend of the session's buffers (== be for a local runner);
    /// `comm` moves tensors when they differ (may be null for a local runner).
    BranchRunner(int branch, Backend& be, const CausalDit& dit, Backend& primary, Communicator* comm);
    ~BranchRunner();
    BranchRunner(const BranchRunner&) = delete;
    BranchRunner& operator=(const BranchRunner&) = delete;

    /// The paged cache: the runner attends through `session`'s branch `kv_branch`.
    void use_paged(KvSession& session, int kv_branch, PagedAttentionPath path);
    /// The dense reference cache, allocated on the runner's backend.
    void use_dense(const KvGeometry& geometry, const KvConfig& config);
    /// Cross K/V: views into cross caches (paged) or the runner's own storage (dense); the caller fills them.
    DitCrossKv& cross() { return cross_; }
    /// Drops the dense history (the paged session is reset by its owner).
    void reset_history();

    /// Allocates the runner's copies of the forward's inputs and outputs (remote runners only), with the shapes
    /// of the largest forward (denoise): the conditioning and the state in `dtype`, the samples and the velocities
    /// in `sample_dtype`.
    void allocate_io(const Shape& video, const Shape& conditioning, const Shape& action, const Shape& state,
                     DType dtype, DType sample_dtype);

    /// One DiT forward. The history is committed after a prefill or commit forward; on failure the cache is
    /// aborted (the paged session releases everything) and the error propagates.
    void forward(ForwardKind kind, const BranchIo& io, int start_frame, int64_t timestep, int64_t action_timestep,
                 const DitForwardOptions& options);

    /// Whether a and b can run their forwards as one (forward_pair): both local, on one backend with `fast`
    /// numerics, over the same DiT and the same kind of KV cache.
    static bool can_pair(const BranchRunner& a, const BranchRunner& b);
    /// The forwards of a and b (the two CFG branches) as one batched DiT forward (CausalDit::forward_batch): both
    /// read io_a's inputs (x, y, action and state: the branches share them) and each writes its own outputs (io_b's
    /// action_out may be undefined: b's action decoder is skipped). A's graphs capture and replay it, keyed by both
    /// branches. As forward() otherwise: both histories committed after a prefill or commit, both aborted on
    /// failure. Needs can_pair(a, b) and no trace.
    /// `traces`: each branch's own outputs traced (DitBranch::trace), or none.
    static void forward_pair(BranchRunner& a, BranchRunner& b, ForwardKind kind, const BranchIo& io_a,
                             const BranchIo& io_b, int start_frame, int64_t timestep, int64_t action_timestep,
                             const DitForwardOptions& options, const std::array<DitTraceFn, 2>& traces = {});

    /// CUDA graphs per forward shape (forward_graphs.h) on this runner's backend, where graphs_supported(); off:
    /// every forward runs op by op. Forwards with a trace or check_finite, and forwards through the dense cache,
    /// always run op by op.
    void enable_graphs(bool on);
    /// What the graphs did so far (enabled = false when off).
    ForwardGraphStats graph_stats() const;

    int branch() const { return branch_; }
    Backend& backend() { return be_; }
    const CausalDit& dit() const { return dit_; }
    bool remote() const { return &be_ != &primary_; }

private:
    /// The view of `t` (on the primary backend) as this runner reads it: `t` itself, or its copy in `local`
    /// (transferred now when `send`).
    TensorView inbound(const TensorView& t, const Tensor& local, bool send);
    /// The graph key of a forward of `kind` with these inputs and outputs (the cache's forward is open).
    ForwardGraphKey graph_key(ForwardKind kind, const KvForwardSpec& spec, const DitInputs& in, const DitOutputs& out,
                              const SelfAttentionCache& cache) const;
    /// The forward's spec of `kind` with these inputs.
    KvForwardSpec forward_spec(ForwardKind kind, const BranchIo& io) const;
    /// Opens the cache's forward (the paged cache uploads its table) and returns it.
    SelfAttentionCache& begin_cache(const KvForwardSpec& spec);
    /// Closes it: commit (ok) or abort.
    void end_cache(bool ok);

    int branch_;
    Backend& be_;
    const CausalDit& dit_;
    Backend& primary_;
    Communicator* comm_;
    DitCrossKv cross_;
    std::unique_ptr<PagedSelfAttentionCache> paged_;
    std::unique_ptr<DenseSelfAttentionCache> dense_;
    Tensor x_, y_, action_, state_, video_out_, action_out_;  // remote runners: inputs and outputs on be_
    TimestepRows time_rows_;                 // the forwards' timestep rows, staged before each forward
    std::unique_ptr<ForwardGraphs> graphs_;  // null: graphs off
};

}  // namespace dzr
