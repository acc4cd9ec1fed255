#pragma once
/// Cross-attention K/V of one context (text 512 or image 257 tokens) for one CFG branch: per layer a K
/// and a V of [tokens, heads, head_dim]. They depend only on the branch's context, so they are computed
/// once per prompt (text) or per window (image) and read by every denoising step.
///
/// Population is transactional: every layer's K and V are checked (layer count, shapes, dtypes, device)
/// before anything is written, so a bad input leaves the previous cache intact; if a copy fails midway the
/// cache becomes empty (all layers or nothing). Reading an empty cache is an error.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.h"

namespace dzr {

enum class CrossKind : uint8_t { Text, Image };
std::string_view cross_kind_name(CrossKind kind);

/// One layer's projected context: k and v [tokens, heads, head_dim].
struct LayerKv {
    TensorView k;
    TensorView v;
    TensorView k_scale{}, v_scale{};  // an FP8 cache's views (begin_write, k_scale()): f32 [tokens, heads]
};

class CrossAttentionCache {
public:
    /// Storage [layers, tokens, heads, head_dim] for K and V is allocated on `storage` when given;
    /// without it the cache only checks and records population (bookkeeping mode).
    /// `fp8`: the storage holds E4M3 values with an f32 scale per token and head (populate quantizes its input,
    /// Backend::quantize_fp8 over each head's head_dim values); `dtype` is then the inputs' dtype.
    CrossAttentionCache(std::string name, int num_layers, int tokens, int heads, int head_dim, DType dtype,
                        Backend* storage, bool fp8 = false);

    const std::string& name() const { return name_; }
    int tokens() const { return tokens_; }

    /// Copies `layers` (exactly num_layers entries) into the cache through `be` (needed when the cache has
    /// storage); all or nothing.
    void populate(Backend* be, std::span<const LayerKv> layers);
    /// Writable K and V views of every layer's storage, so that a context's projections are computed straight into
    /// the cache (no staging copy). The cache reads as empty from here until commit_write(); a failure in between
    /// leaves it empty (all layers or nothing, as populate). Needs storage.
    std::vector<LayerKv> begin_write();
    /// Marks the layers written since begin_write() as the cache's content.
    void commit_write();
    /// Writes one layer's K and V ([tokens, heads, head_dim], contiguous) into the storage: a copy, or in an FP8 cache
    /// their E4M3 codes and scales (what populate does per layer; between begin_write and commit_write, one layer at a
    /// time from a caller's own buffers).
    void store_layer(Backend& be, int layer, const TensorView& k, const TensorView& v);
    bool populated() const { return populated_; }
    /// Incremented by every successful populate (lets a reader notice a refresh).
    uint64_t generation() const { return generation_; }
    void drop() { populated_ = writing_ = false; }

    /// K and V of `layer`: [tokens, heads, head_dim] (E4M3 in an FP8 cache). Throws before populate.
    TensorView k(int layer) const;
    TensorView v(int layer) const;
    /// An FP8 cache's scales of `layer`: f32 [tokens, heads]; undefined in a cache of another dtype.
    TensorView k_scale(int layer) const;
    TensorView v_scale(int layer) const;
    bool fp8() const { return fp8_; }

private:
    TensorView layer_view(const Tensor& t, int layer) const;
    TensorView scale_view(const Tensor& t, int layer) const;

    std::string name_;
    int num_layers_ = 0, tokens_ = 0, heads_ = 0, head_dim_ = 0;
    DType dtype_ = DType::F32;
    bool fp8_ = false;
    Tensor k_, v_;
    Tensor k_scale_, v_scale_;  // fp8: f32 [layers, tokens, heads]
    bool populated_ = false;
    bool writing_ = false;  // between begin_write and commit_write
    uint64_t generation_ = 0;
};

}  // namespace dzr
