#pragma once
/// `dzr rollout`: replay recorded episodes through the DreamZero policy. Loads the checkpoint once,
/// runs a warm-up that walks every distinct forward shape (then checks the KV pool is whole), and for
/// each episode runs the chunked rollout on the frame schedule, writing actions, timing, a manifest
/// and (with ground truth) metrics and plots into <out>/<episode>/, plus a summary across episodes and
/// the HTML report.
#include <atomic>
#include <vector>

#include "policy/engine.h"
#include "rollout/reports.h"
#include "rollout/rollout_options.h"
#include "rollout/shard_run.h"

namespace dzr::rollout {

/// The warm-up: synthetic calls that walk every forward shape of a window (prefill, the commits at start frames
/// 1, 3, 5: denoising reads 880 · {1, 3, 5, 7} tokens, and the window reset of a 4-frame call), then a reset; the
/// KV pools must come back whole. Adds the calls to `calls`; returns the wall time in ms.
double run_warmup(Engine& engine, Session& session, int& calls);

/// Set from a signal handler: the run stops after the current call and writes no partial episode.
std::atomic<bool>& interrupt_flag();

struct RolloutResult {
    std::vector<EpisodeSummary> episodes;
    int failed = 0;
    bool interrupted = false;
    ShardOutcome shard;  ///< the plan, the rank's record and the summary it wrote
};

/// Runs the whole rollout. Everything that can be checked without the weights is checked first (validate.h):
/// a problem there throws dzr::Error listing every problem found, before any weight is loaded or any output
/// written. Later, an episode's failure is recorded in its summary and the run goes on with the next.
RolloutResult run_rollout(const RolloutOptions& options);

}  // namespace dzr::rollout
