#pragma once
/// The device-memory plan of a run: the bytes of every part an engine puts on its device (each network's weights,
/// the networks' tables, the KV pool and the cross-attention caches, the buffers of each session open at once
/// (PolicyOptions::max_sessions), the workspace, a CUDA context allowance) and the peak of each phase (the text
/// pre-pass, the load, the rollout, the video decode). It is made without loading anything and without a GPU: the
/// weights from the geometry's inventory (expected_weights), the KV cache from kv_sizing, and the workspace, the tables
/// and the buffers by running the engine's calls on measuring backends (Engine::measure, with which every engine plans
/// its own workspace). `dzr plan` prints it; `dzr rollout` and `dzr serve` with `--gpu-memory-budget` refuse a run
/// whose plan does not fit before anything is loaded; a rollout writes the planned peak next to the measured one
/// (timing.json). docs/MEMORY.md.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "config/embodiment.h"
#include "config/kv_config.h"
#include "config/model_config.h"
#include "policy/engine.h"
#include "weights/inventory.h"

namespace dzr {

/// How the DiT's linear weights are stored on the device: bf16, or E4M3 with a float32 scale per output channel.
enum class WeightPrecision : uint8_t { Bf16, Fp8 };

std::string_view precision_name(WeightPrecision p);
/// "bf16" or "fp8"; throws dzr::Error naming `what` otherwise.
WeightPrecision parse_weight_precision(std::string_view text, std::string_view what);
/// The KV cache element type of "bf16" or "fp8" (E4M3); throws dzr::Error naming `what` otherwise.
DType parse_kv_dtype(std::string_view text, std::string_view what);

// ---- the per-part formulas: the one place precision and the KV dtype enter the plan ---------------------------

/// A per-channel or per-head FP8 scale (float32).
inline constexpr uint64_t kFp8ScaleBytes = 4;

/// True for a weight that --precision fp8 stores as E4M3: the linear weights of the DiT's transformer layers
/// (self- and cross-attention projections, the FFN), 97.6% of the DiT's parameters at the DROID geometry. The
/// embeddings, the head, the modulation, the norms, the image projection and the action/state encoders stay
/// bf16, as do umT5, CLIP and the VAE.
/// NOTE: the FP8 work decides the final list by measurement; it replaces this rule with the networks' own
/// declaration (the Linear that loads a weight knows its storage), and the plan follows.
bool fp8_weight(const ExpectedWeight& w);

/// Device bytes of one weight: E4M3 (1 byte per parameter) plus a float32 scale per output channel (shape[0])
/// when `precision` is fp8 and fp8_weight(w); else its parameters in the backend's compute dtype (the loader
/// converts every stored dtype to it).
uint64_t weight_bytes(const ExpectedWeight& w, WeightPrecision precision, DType compute_dtype);

/// The FP8 KV pool's scales (0 without geometry.fp8_pool): a float32 per token and head for K and for V of every
/// layer, in every pool block (the null block included), as KvCacheManager allocates them. The cross caches and the
/// scratch keep the compute dtype and have no scales.
uint64_t kv_scale_bytes(const KvGeometry& geometry, int total_block_ids, int block_tokens);

/// What a CUDA device holds besides dzr's own allocations: the context (driver state, the kernels of dzr, cuBLAS
/// and cuDNN as they load), cuBLASLt's 32 MiB workspace, the handles, and cudaMalloc's rounding of every tensor.
/// NOTE: 1.5 GiB, from two measurements on the H200 (docs/PERF.md, docs/MEMORY.md): a tiny-model rollout, whose own
/// allocations are a few MB, peaked at 797,769,728 bytes (0.74 GiB), nearly all of it context; the DROID bench
/// peaked at 57.59 GiB, 1.00 GiB above this plan's parts (with the 1.97 GiB workspace the GPU planned). The other
/// 0.5 GiB is margin. The GPU check (docs/MEMORY.md) compares every plan with the measured peak.
inline constexpr uint64_t kCudaContextBytes = uint64_t(3) << 29;

// ---- the plan ---------------------------------------------------------------------------------------------

struct MemoryPlanOptions {
    WeightPrecision precision = WeightPrecision::Bf16;
    DType kv_dtype = DType::BF16;       ///< the KV cache's element type (BF16 or F8_E4M3; the CPU's F32)
    DType compute_dtype = DType::BF16;  ///< the device's: bf16 on CUDA, f32 on the CPU
    bool cuda = true;                   ///< a CUDA device: the context allowance counts
    /// --save-video: the most latent frames an episode's predicted video joins (0: no video decode phase).
    int64_t video_latent_frames = 0;
    /// The numerics the run's calls are measured in when the plan has no planner (a planner plans its own): fast
    /// numerics batch the CFG branches' rows and keep the VAE encoder's weights channels-last as well.
    Numerics numerics = Numerics::Fast;
};

/// One part of the plan.
struct MemoryPart {
    std::string key;     ///< "weights.dit", "kv.pool", ... (the JSON key)
    std::string name;    ///< "DiT weights"
    uint64_t bytes = 0;
    std::string detail;  ///< how it is made up ("16,497,843,232 parameters: 15,728,640,000 fp8 + ...")
};

/// The parts resident on the device during one phase of a run.
struct MemoryPhase {
    std::string key;                 ///< "text_prepass", "load", "rollout", "video_decode"
    std::string name;                ///< "text pre-pass (umT5 alone)"
    std::vector<std::string> parts;  ///< the parts' keys
    uint64_t bytes = 0;
};

struct MemoryPlan {
    std::string planner;  ///< what sized the op workspaces: "cuda:0", "cpu", or "offline (a CUDA GPU assumed)"
    MemoryPlanOptions options;
    bool text_prepass = false;
    int sessions = 1;  ///< sessions open at once (PolicyOptions::max_sessions): their KV blocks, cross caches, buffers
    Numerics numerics = Numerics::Fast;  ///< the numerics the calls were measured in (the planner's, else the options')
    int offload_layers = 0;              ///< DiT layers kept in host memory (PolicyOptions::offload_layers)
    uint64_t host_pinned_bytes = 0;      ///< their page-locked host memory (not in any phase: it is not the device's)
    /// The planner's device memory free when the plan was made (a GPU planner); nullopt otherwise.
    std::optional<uint64_t> device_free_bytes;
    std::vector<MemoryPart> parts;
    std::vector<MemoryPhase> phases;

    /// The part `key`'s bytes (0 when absent).
    uint64_t part_bytes(std::string_view key) const;
    /// The phase with the most bytes (the first of equals).
    const MemoryPhase& peak() const;
    uint64_t peak_bytes() const { return peak().bytes; }
    /// The parts and the phases as text tables (bytes and GiB); with a budget (> 0), whether the plan fits.
    std::string table(uint64_t budget_bytes = 0) const;
    /// {"planner", "precision", "kv_dtype", "text_prepass", "numerics", "sessions" (only above 1), "parts": [...],
    /// "phases": [...], "peak": {...}}.
    nlohmann::ordered_json to_json() const;
};

/// Plans the memory of an engine of `model` and `embodiment` with `options` (the KV settings, paged or dense,
/// the text pre-pass, video decoding) on one device. `planner`: the backend that will run the calls, asked for its
/// ops' own workspace (cuDNN's convolutions) as Engine::plan_workspace asks it; null plans for a CUDA GPU this
/// machine lacks (its capabilities assumed; a convolution library's own scratch, which only the GPU can tell, is
/// then not in the workspace: docs/MEMORY.md).
MemoryPlan plan_memory(const ModelConfig& model, const Embodiment& embodiment, const PolicyOptions& options,
                       const MemoryPlanOptions& plan_options, Backend* planner);

/// What fitting a plan to a budget chose among the settings that leave reference numerics' bits alone.
struct MemoryChoices {
    bool kv_lanes_off = false;  ///< kv.in_place auto gave up the in-place lanes
    int offload_layers = 0;     ///< offload_layers auto streams this many DiT layers (0: the run's own setting)

    /// Writes the choices into an engine's options, or into the run config an engine is loaded from.
    void apply(PolicyOptions& options) const;
    void apply(config::RunConfig& run) const;
};

/// A plan fitted to a budget (fit_memory_budget).
struct BudgetFit {
    MemoryPlan plan;
    MemoryChoices choices;
    std::vector<std::string> notes;  ///< one line per choice made, with the peaks before and after
};

/// `plan_with(choices)` plans the run with `choices` applied. Returns the run's own plan (no choices) when it fits
/// `budget` (0: no budget); else, in this order, what fits with: the in-place KV lanes given up (`lanes_auto`:
/// kv.in_place auto), then the fewest DiT layers streamed from host memory that fit (`offload_auto`: offload_layers
/// auto, at most `num_layers`). When nothing fits, the smallest plan without streamed layers (the caller refuses it).
BudgetFit fit_memory_budget(uint64_t budget, bool lanes_auto, bool offload_auto, int num_layers,
                            const std::function<MemoryPlan(const MemoryChoices&)>& plan_with);

/// Throws dzr::Error when the plan's peak exceeds `budget_bytes`, naming the budget (`what`: "--gpu-memory-budget
/// 44GiB"), the peak phase, its parts from the largest and the shortfall.
void check_memory_budget(const MemoryPlan& plan, uint64_t budget_bytes, std::string_view what);

/// For a run over `budget`: the FP8 settings whose plans fit it, each with its peak ("--kv-dtype fp8 (40.71 GiB),
/// --precision fp8 (31.08 GiB)"): fp8 KV or fp8 weights alone, both only when neither alone fits; empty when none
/// does. `peak(fp8_kv, fp8_weights)` plans that variant (nullopt: it is the current setting, or cannot be planned).
std::string fp8_settings_that_fit(const std::function<std::optional<uint64_t>(bool fp8_kv, bool fp8_weights)>& peak,
                                  uint64_t budget);

/// "1.25 GiB" (two decimals; bytes below 1 MiB as "0.00 GiB").
std::string gib(uint64_t bytes);

}  // namespace dzr
