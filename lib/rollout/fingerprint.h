#pragma once
/// The run fingerprint: what an episode's outputs depend on, recorded in its done marker (done.json), so that
/// `--resume` skips only episodes produced by the same run and refuses, naming the difference, to mix outputs
/// of another checkpoint, config, seed, numerics or dzr version into one output directory.
///
///   dzr_version   DZR_VERSION and the git hash (a rebuild from other sources may compute other numbers)
///   checkpoint    per shard: name, bytes, the SHA-256 of its header (names, dtypes, shapes, offsets) and of
///   a
///                 sample of its data (16 blocks of 64 KiB spread over it); the SHA-256 of config.json and
///                 experiment_cfg/metadata.json
///   tokenizer     the SHA-256 of spiece.model
///   run           sampling (without the seed), kv, the frame schedule, the embodiment, the prompt override,
///                 --allow-truncate, the metric options, plots, --save-video, injected noise files' SHA-256
///   seed          sampling.seed
///   numerics      backend, compute dtype, KV mode and the DZR_* variables that pick kernels
///   episode       its frame count, prompt, and the SHA-256 of what was read (frames, state, actions, fps), so a
///                 changed input of the same length is another episode
///
/// Not in it: paths (a moved checkpoint or episode is the same input), the device index, the command line.
#include <filesystem>
#include <string>
#include <vector>

#include "rollout/reports.h"
#include "rollout/rollout_options.h"
#include "weights/checkpoint.h"

namespace dzr::rollout {

/// Shard names, sizes and header hashes, and the hashes of config.json and metadata.json.
Json checkpoint_identity(const Checkpoint& ckpt);

/// The fingerprint of a run, without its "episode" part.
Json run_fingerprint(const RolloutOptions& opt, const Checkpoint& ckpt,
                     const std::filesystem::path& tokenizer);

/// `run` with the episode part added.
Json episode_fingerprint(const Json& run, int64_t num_frames, const std::string& prompt,
                         const std::string& inputs_sha256);

/// The SHA-256 of an episode's inputs as read: each camera's name, shape and frames, each state key's name and
/// values, the ground-truth actions and the frame rate (the prompt is in the fingerprint as text).
std::string episode_inputs_sha256(const io::Episode& ep);

/// A field whose values differ between two JSON documents ("absent" where one lacks it), by dotted key.
struct FieldDifference {
    std::string key, base, now;
};
/// Every field where `base` and `now` differ, flattened to dotted keys ("run.sampling.seed", "shards[0].bytes").
std::vector<FieldDifference> json_differences(const Json& base, const Json& now);

/// The fields where `recorded` and `now` differ, one line each ("seed: 1140 (recorded) vs 7 (this run)"),
/// at most `limit` (then a last line says how many more).
std::vector<std::string> fingerprint_differences(const Json& recorded, const Json& now, size_t limit = 6);

}  // namespace dzr::rollout
