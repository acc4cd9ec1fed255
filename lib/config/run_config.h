#pragma once
/// configs/*.yaml: the model geometry (`model:`) and the run settings (`sampling:`, `kv:`, `rollout:`,
/// `embodiment:`), with command-line overrides (`--set a.b.c=value`). Reading is strict: an unknown
/// key, a wrong type or an inconsistent geometry is a dzr::Error naming the file and the key.
#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "config/kv_config.h"
#include "config/model_config.h"
#include "backend/options.h"
#include "config/precision.h"

namespace dzr::config {

/// Bounds of the run settings (docs/RELIABILITY.md lists them): a value outside is an error naming the key.
inline constexpr int kMaxInferenceSteps = 1000;    ///< the flow schedule's 1000 training timesteps
inline constexpr int kPresetInferenceSteps = 16;   ///< the step count the NUM_DIT_STEPS presets are defined for
inline constexpr float kMaxSigmaShift = 100.0f;
inline constexpr float kMaxCfgScale = 100.0f;
inline constexpr int kMaxFrameIndex = 10'000'000;  ///< rollout.stride, offsets, max_chunks, start_frame

/// Flow-matching sampler settings (dreamzero-reference.md §3).
///
/// Which steps evaluate the DiT is checked when the config is read: with dynamic_schedule the dynamic schedule
/// decides while it runs (num_dit_steps does not apply); else dit_step_mask when given (num_dit_steps becomes
/// its count; a different explicit num_dit_steps is an error); else num_dit_steps = num_inference_steps runs
/// every step, and 5..8 pick the official presets, which exist for 16 steps only. Anything else is an error.
struct SamplingConfig {
    int num_inference_steps = 16;
    float sigma_shift = 5.0f;
    float cfg_scale = 5.0f;
    int num_dit_steps = 8;  // DiT evaluations per call (see above)
    std::vector<bool>
        dit_step_mask;  // explicit mask (length num_inference_steps); empty = from num_dit_steps
    bool dynamic_schedule = false;
    uint64_t seed = 1140;
};

/// Which frames feed each policy call (the official test client's cadence).
struct RolloutConfig {
    int stride = 24;                               // frames between calls
    std::vector<int> offsets = {-23, -16, -8, 0};  // frames of a call relative to its anchor
    int max_chunks = 0;                            // 0 = until the episode ends
    int start_frame = 0;
};

struct RunConfig {
    ModelConfig model;
    SamplingConfig sampling;
    KvConfig kv;  // dzr::KvConfig (lib/config/kv_config.h)
    RolloutConfig rollout;
    /// The checkpoint's embodiment tag to run; empty: the checkpoint's only one (config/embodiment.h).
    std::string embodiment;
    /// The DiT's Linear weights: bf16 (the compute dtype) or fp8 (E4M3 with per-output-channel scales, quantized
    /// on load or read from a `dzr ckpt quantize` checkpoint). Top-level `precision:`.
    Precision precision = Precision::Bf16;
    /// The most device memory a run may plan for, as written ("44GiB", "48GB", a byte count); empty: no limit. A
    /// rollout whose memory plan (policy/memory_plan.h) exceeds it is refused before anything is loaded.
    std::string gpu_memory_budget;
    /// CUDA graphs of the DiT forwards (one per forward shape, captured in the warm-up); false: every forward runs
    /// op by op. Top-level `cuda_graphs:`; `--no-cuda-graphs` and DZR_CUDA_GRAPHS=0 turn them off too. Applies to
    /// CUDA backends only (the CPU always runs op by op).
    bool cuda_graphs = true;
    /// `fast` numerics: the two CFG branches' DiT forwards run as one batched forward on a device that holds both
    /// (CausalDit::forward_batch). Top-level `batch_cfg:`; `--no-batch-cfg` turns it off. Reference numerics always
    /// run the branches one after the other (as the official code does).
    bool batch_cfg = true;
    /// DiT layers whose weights stay in host memory and are streamed to the GPU as they run (model/layer_stream.h;
    /// the numbers do not change, the speed may): "auto" (as many as a --gpu-memory-budget needs, else none) or a
    /// count. Top-level `offload_layers:`.
    std::string offload_layers = "auto";
    /// The backends' arithmetic (backend/options.h): fast passed its gate at the real widths (docs/PARITY.md), closer
    /// to the official fp32 run than the official bf16 run is; reference stays for parity and CI. `numerics:`.
    Numerics numerics = Numerics::Fast;
    /// The text encoder pre-pass (policy/text_prepass.h): umT5 encodes the run's prompts at load and is freed
    /// before the other networks load; off, it stays resident. The actions are the same either way.
    bool text_prepass = true;
    std::string description;
    std::filesystem::path source;  // the YAML file it came from (empty for a string)
};

/// One `--set a.b.c=value` override; the value is parsed as a YAML scalar or flow list.
struct Override {
    std::string path;   // "sampling.cfg_scale"
    std::string value;  // "3.5", "[1, 2]"
};

/// Splits "a.b.c=value". Throws dzr::Error for text without '=' or with an empty key.
Override parse_override(const std::string& text);

/// Sets `path` in the tree to the parsed `value`, creating maps on the way. Throws when a prefix of the
/// path is not a map.
void apply_override(YAML::Node& root, const Override& override);

/// Loads a YAML file, applies the overrides, and reads it strictly. The `model:` section must list every
/// geometry field; run sections may omit fields (the real DreamZero-DROID settings are the defaults).
RunConfig load_run_config(const std::filesystem::path& path, const std::vector<Override>& overrides = {});

/// Same for YAML text; `source` names it in messages.
RunConfig parse_run_config(const std::string& yaml_text, const std::string& source,
                           const std::vector<Override>& overrides = {});

/// Reads a `model:` node alone (every field required). `where` prefixes messages ("tiny.yaml: model").
ModelConfig model_config_from_yaml(const YAML::Node& model, const std::string& source);

/// Parses "1234", "64MiB", "5GB", "1.5GiB" (B, KB/MB/GB/TB = powers of 1000, KiB/MiB/GiB/TiB = powers of
/// 1024). Throws dzr::Error naming `what` on anything else.
uint64_t parse_byte_size(const std::string& text, const std::string& what);

/// A device memory budget ("44GiB", "48GB", "32000MiB", a byte count): parse_byte_size, and positive. Throws
/// dzr::Error naming `what` ("--gpu-memory-budget", "run.yaml: gpu_memory_budget") otherwise.
uint64_t parse_memory_budget(const std::string& text, const std::string& what);

/// An `offload_layers` value: nullopt for "auto", else a count >= 0. Throws dzr::Error naming `what` otherwise.
std::optional<int> parse_offload_layers(const std::string& text, const std::string& what);

/// "45.85 GB (45,848,344,232 bytes)"-style text for reports.
std::string format_bytes(uint64_t bytes);
/// "22,924,172,116".
std::string format_count(uint64_t n);

}  // namespace dzr::config
