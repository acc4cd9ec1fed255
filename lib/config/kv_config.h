#pragma once
/// KV-cache settings (the `kv:` section of a run config) and the geometry they apply to (read from the
/// model). KvLimits derives the window policy's fixed sizes from both: how many blocks one CFG branch
/// can hold, the padded block-table width, the scratch rows. See docs/KV_CACHE.md.
#include <cstdint>
#include <string>

#include "config/precision.h"
#include "core/dtype.h"

namespace YAML {
class Node;
}

namespace dzr {

struct ModelConfig;

/// How the self-attention history is kept (`kv.mode`, `--kv`).
enum class KvMode : uint8_t { Paged, Dense };
/// "paged" or "dense".
const char* kv_mode_name(KvMode mode);
/// "paged" or "dense"; throws dzr::Error naming `what` otherwise.
KvMode parse_kv_mode(const std::string& text, const std::string& what);

/// What the model puts in the cache. Defaults are DreamZero-DROID (dreamzero-reference.md §1.5, §5.1).
struct KvGeometry {
    int num_layers = 40;
    int num_kv_heads = 40;
    int head_dim = 128;
    int tokens_per_frame = 880;  // 22 x 40 patches of one latent frame
    int chunk_frames = 2;        // latent frames of a commit or denoise forward (num_frame_per_block)
    int prefill_frames = 1;      // latent frames of a window's first (prefill) forward
    int register_tokens = 25;    // action + state tokens of a denoise forward; never cached
    int text_tokens = 512;       // cross-attention context lengths
    int image_tokens = 257;
    int num_branches = 2;        // CFG branches held on this device (positive, negative)
    /// Sessions open at once (PolicyOptions::max_sessions): each has its blocks and cross caches; the scratch and the
    /// null block serve whichever forward runs (one at a time).
    int sessions = 1;
    DType dtype = DType::BF16;   // element type of the pool, scratch and cross caches
    /// The pool (not the scratch or the cross caches) holds E4M3 values with one f32 scale per token and head
    /// (kv.dtype: fp8; core/fp8.h's row quantization over each head's head_dim values).
    bool fp8_pool = false;
    /// The cross-attention caches hold E4M3 K and V with one f32 scale per token and head too (kv.dtype: fp8; the
    /// forward dequantizes a layer's K and V before attending).
    bool fp8_cross = false;
    /// The branches' blocks lie in lanes (kv.in_place, resolved by resolve_kv_lanes), so the attention reads each
    /// branch's [history | current] rows where they lie instead of gathering them (CUDA, fast numerics, a bf16 pool).
    /// One branch: its lane holds the history from block 1 on and, after it, room for a forward's current rows. Two
    /// branches (mirrored): branch 0's history grows down from the middle, branch 1's up from it, and the middle holds
    /// a denoising forward's current rows of both, [branch 0 | branch 1], where the DiT writes them (KvLimits).
    bool lanes = false;

    /// Geometry of `model`'s DiT (layers, heads, frame tokens, register tokens, context lengths).
    static KvGeometry from_model(const ModelConfig& model, DType dtype, int num_branches = 2);

    /// Bytes of one token's K (or V) row in one layer: heads * head_dim * dtype.
    size_t row_bytes() const { return size_t(num_kv_heads) * size_t(head_dim) * dtype_size(dtype); }
    /// Bytes of one token's K and V across every layer.
    size_t token_bytes() const { return 2 * row_bytes() * size_t(num_layers); }
    /// Bytes of one token's K (or V) row in one layer of the pool: row_bytes(), or with fp8_pool heads * head_dim
    /// E4M3 bytes plus one f32 scale per head.
    size_t pool_row_bytes() const {
        return fp8_pool ? size_t(num_kv_heads) * (size_t(head_dim) + sizeof(float)) : row_bytes();
    }
    /// Bytes of one token's K and V across every layer of the pool.
    size_t pool_token_bytes() const { return 2 * pool_row_bytes() * size_t(num_layers); }
    /// Bytes of one context token's K and V across every layer of a cross cache (with fp8_cross: E4M3 rows and
    /// their scales).
    size_t cross_token_bytes() const {
        const size_t row = fp8_cross ? size_t(num_kv_heads) * (size_t(head_dim) + sizeof(float)) : row_bytes();
        return 2 * row * size_t(num_layers);
    }
    int64_t max_current_video_frames() const { return chunk_frames > prefill_frames ? chunk_frames : prefill_frames; }

    /// Throws dzr::Error naming the first non-positive field.
    void validate() const;
};

/// What one forward puts through the cache.
struct KvForwardSpec {
    bool commit = false;          // prefill or commit: the video K/V become history at commit()
    int video_frames = 0;         // current latent frames
    int register_tokens = 0;      // action + state tokens (denoise); never cached

    static KvForwardSpec prefill(const KvGeometry& g) { return {true, g.prefill_frames, 0}; }
    static KvForwardSpec commit_chunk(const KvGeometry& g) { return {true, g.chunk_frames, 0}; }
    static KvForwardSpec denoise(const KvGeometry& g) { return {false, g.chunk_frames, g.register_tokens}; }
};

/// kv.in_place: whether the branches' blocks are laid out in lanes with room for the current rows (KvGeometry::lanes).
enum class KvInPlace : uint8_t {
    Auto,  // lanes where they apply (CUDA, fast numerics, a bf16 pool, reset_at_boundary) and fit the device
    On,    // lanes; an error where they cannot apply
    Off,   // the pool hands out blocks first in, first out (vLLM's order); the attention gathers its rows
};

/// "auto", "true", "false".
const char* kv_in_place_name(KvInPlace mode);
/// Parses auto, or a switch (true / false, on / off, 1 / 0: parse_switch); throws dzr::Error naming `what` otherwise.
KvInPlace parse_kv_in_place(const std::string& text, const std::string& what);

/// How much memory the KV cache may take.
enum class KvBudgetKind : uint8_t {
    Auto,      // exactly one session (both CFG branches), see plan_kv_memory
    Bytes,     // a fixed number of bytes
    Fraction,  // a fraction of the device's free memory, measured after the model is loaded
};

struct KvBudget {
    KvBudgetKind kind = KvBudgetKind::Auto;
    uint64_t bytes = 0;
    double fraction = 0.0;

    /// "auto", "12.5 GiB (13421772800 bytes)", "40% of free memory".
    std::string str() const;
};

/// Parses "auto", a byte count ("13421772800", "12.5GiB", "800 MiB", "2GB"), or a fraction of free
/// device memory ("40%", "0.4"). Throws dzr::Error quoting the text otherwise.
KvBudget parse_kv_budget(const std::string& text);

/// The `kv:` section of a run config.
struct KvConfig {
    int window_frames = 9;        // visible video frames (history + current): local_attn_size
    int sink_frames = 0;          // leading frames sliding eviction never drops
    int frames_per_block = 1;     // latent frames per KV block
    KvBudget memory_budget;       // "auto" by default
    bool reset_at_boundary = true;  // the owner resets the window (DreamZero's csf >= 9 rule); no sliding
    /// The self-attention pool's element type: bf16 = the compute dtype; fp8 = E4M3 with an f32 scale per token
    /// and head (KvGeometry::fp8_pool). Cross caches and the scratch keep the compute dtype.
    Precision dtype = Precision::Bf16;
    /// Lanes with room for the current rows (KvGeometry::lanes): auto, true or false.
    KvInPlace in_place = KvInPlace::Auto;
    /// Paged blocks, or the dense reference path.
    KvMode mode = KvMode::Paged;

    /// Throws dzr::Error for an inconsistent setting, naming the `kv.` key, its value and the rule.
    void validate(const KvGeometry& geometry) const;
};

/// Reads a `kv:` YAML map; absent keys keep their defaults, unknown keys are an error.
/// Does not validate against a geometry (call KvConfig::validate once the model is known).
KvConfig parse_kv_config(const YAML::Node& kv);

/// Fixed sizes that follow from a geometry and a config (pure arithmetic, no state).
struct KvLimits {
    int64_t block_tokens = 0;         // tokens per block = frames_per_block * tokens_per_frame
    int sink_blocks = 0;              // leading blocks kept by sliding eviction
    int max_blocks_per_branch = 0;    // most blocks one branch holds at once (history + pending commit)
    int table_width = 0;              // padded block-table width: most visible history blocks
    int64_t max_committed_tokens = 0; // reset_at_boundary: most committed tokens (history + pending)
    int64_t scratch_tokens = 0;       // per-branch scratch rows: largest current video + register tokens
    int64_t max_history_tokens = 0;   // most visible history tokens of one forward
    /// With KvGeometry::lanes, the lanes' block ids (docs/KV_CACHE.md, "Lanes"); all 0 without lanes.
    /// One branch: its lane, ids 1 .. lane_blocks: the longest history plus one forward's current rows.
    /// Two branches (mirrored): branch 0's lane is ids 1 .. lane_blocks (its history in runs growing down from
    /// lane_blocks), the middle_blocks ids after it hold [branch 0's | branch 1's] scratch_tokens current rows, and
    /// branch 1's lane follows (its history growing up) with its rows shifted by shift_rows, so that it starts right
    /// after the middle's 2 * scratch_tokens rows; one more id (reserved, like the middle) holds the shift's tail.
    int lane_blocks = 0;
    int middle_blocks = 0;
    int64_t shift_rows = 0;
    /// Block ids the lanes take in all (the middle and the tail included).
    int lane_ids = 0;
    bool mirrored() const { return middle_blocks > 0 || shift_rows > 0; }
};

/// Window policy. With reset_at_boundary the owner resets before the window overflows, so a branch holds
/// at most (window - chunk) frames (DreamZero: 1, 3, 5, 7, then reset) and a forward sees all of them.
/// Without it, sliding eviction keeps the sink blocks plus the newest blocks such that history + current
/// <= sink + window frames, so a branch holds at most sink + window frames. Validates the config first.
KvLimits kv_limits(const KvGeometry& geometry, const KvConfig& config);

/// Whether a pool for `config` on `geometry` gets lanes (KvGeometry::lanes): kv.in_place auto gives them where they
/// pay, `fast_device` (a CUDA device in fast numerics, where the attention reads the lanes in place), with a bf16 pool,
/// reset_at_boundary and one or two branches on the device; true gives them wherever they can hold (throws naming
/// kv.in_place for an fp8 pool, sliding eviction or more than two branches: kv_lanes_refusal); false never. The
/// memory check of auto is the caller's (Engine: the device's free memory).
bool resolve_kv_lanes(const KvConfig& config, const KvGeometry& geometry, bool fast_device);
/// Why a pool for `config` on `geometry` cannot hold lanes ("a bf16 pool, not kv.dtype fp8 ..."); empty where it can.
std::string kv_lanes_refusal(const KvConfig& config, const KvGeometry& geometry);

/// "687.5 MiB", "12.12 GiB", "512 B".
std::string format_bytes(uint64_t bytes);

}  // namespace dzr
