#pragma once
/// CUDA graphs of the DiT forwards, one per forward shape (issue #13).
///
/// A policy call queues 16-18 DiT forwards of ~1000-1900 kernels each; launching them one by one costs the host
/// more time than some of them take on the device. A ForwardGraphs (one per BranchRunner) captures each distinct
/// forward once and replays it as one launch afterwards:
///   - the first forward of a key runs eagerly (it builds every cuBLASLt/cuDNN plan of its shapes, and gives the
///     call its result), then is captured right away (capture records, it does not run) — the warm-up runs every
///     shape a rollout uses, so the rollout's own calls only replay;
///   - a later forward with the same key replays the graph;
///   - a capture that fails (an op that uploads, allocates or synchronizes) is dropped, logged once, and that key
///     runs eagerly from then on; the call is not affected (its eager run already produced the result).
///
/// The key holds everything a captured forward bakes into its kernels' arguments (ForwardGraphKey). Everything that
/// changes between replays of one key lives at fixed device addresses and is rewritten on the stream before the
/// launch: the timestep rows (TimestepRows), the block table and slot mapping (PagedSelfAttentionCache's device
/// mirrors), the input latents and samples (the session's buffers).
#include <compare>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace dzr {

/// What a captured DiT forward depends on besides the contents of its inputs.
struct ForwardGraphKey {
    int kind = 0;                  ///< ForwardKind
    int branch = 0;                ///< CFG branch
    int frames = 0;                ///< latent frames of the forward (1: prefill, 2: commit and denoise)
    int start_frame = 0;           ///< RoPE rows (the tables' offset)
    int64_t history_tokens = 0;    ///< the window fill: KV tokens (and table blocks) the forward attends to
    int64_t register_tokens = 0;   ///< action + state tokens (denoise)
    bool committing = false;       ///< writes its K/V to the pool
    int numerics = 0;              ///< Numerics
    std::vector<int64_t> settings;      ///< the backend's implementation choices (CudaBackendOptions)
    std::vector<uintptr_t> addresses;   ///< every device address the forward's ops take (inputs, outputs, cross K/V,
                                        ///< block table, pool, staged rows, the arena's base and next offset)

    auto operator<=>(const ForwardGraphKey&) const = default;
    /// "denoise.pos 2 frames at 3, history 2640 tokens" (addresses left out).
    std::string describe() const;
};

/// What the graphs of one runner (or of a session: the sum) did.
struct ForwardGraphStats {
    bool enabled = false;
    int captured = 0;           ///< graphs captured (distinct forward shapes)
    int failed = 0;             ///< keys whose capture failed (they run eagerly)
    double capture_ms = 0;      ///< host time spent capturing and instantiating
    int64_t replays = 0;        ///< forwards run as a graph launch
    int64_t eager = 0;          ///< forwards run op by op (first runs of a key, failed keys)
    std::string first_failure;  ///< the first capture failure's message

    ForwardGraphStats& operator+=(const ForwardGraphStats& o);
};

/// The graphs of one stream. Capture goes through Stream::begin_capture / end_capture / abort_capture.
class ForwardGraphs {
public:
    /// `owner` names the runner in the log ("pos", "neg").
    ForwardGraphs(Stream& stream, std::string owner);
    ~ForwardGraphs();
    ForwardGraphs(const ForwardGraphs&) = delete;
    ForwardGraphs& operator=(const ForwardGraphs&) = delete;

    /// Runs `forward` (which queues the forward's ops on the stream) for `key` as described above. An exception of
    /// the eager run propagates; one of the capture is caught (fallback).
    void run(const ForwardGraphKey& key, const std::function<void()>& forward);

    const ForwardGraphStats& stats() const { return stats_; }
    bool has_graph(const ForwardGraphKey& key) const;
    /// Drops every graph (e.g. after the device memory they refer to was freed).
    void clear();

private:
    struct Entry {
        std::unique_ptr<Graph> graph;  // null: the capture failed, run eagerly
    };
    Stream& stream_;
    std::string owner_;
    std::map<ForwardGraphKey, Entry> entries_;
    ForwardGraphStats stats_;
};

/// Whether graphs can be used on `be`: a device with Capabilities::graphs, not a measuring backend, and not a profiled
/// one whose profiler times every op (those runs stay eager; a profiler that only traces kernels lets graphs run).
bool graphs_supported(Backend& be);

/// The DZR_CUDA_GRAPHS environment override: unset -> `configured`; "0", "false", "off" -> false; "1", "true",
/// "on" -> `configured` (it can only turn graphs off: a run setting or flag that disables them wins). Throws
/// dzr::Error naming the variable for any other value.
bool graphs_env_override(bool configured);
/// The same on a given value (null: unset); for tests.
bool graphs_env_override(bool configured, const char* value);

}  // namespace dzr
