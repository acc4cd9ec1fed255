#include "kv/cross_attention_cache.h"

#include <tuple>

#include "core/error.h"

namespace dzr {

std::string_view cross_kind_name(CrossKind kind) { return kind == CrossKind::Text ? "text" : "image"; }

CrossAttentionCache::CrossAttentionCache(std::string name, int num_layers, int tokens, int heads, int head_dim,
                                         DType dtype, Backend* storage, bool fp8)
    : name_(std::move(name)), num_layers_(num_layers), tokens_(tokens), heads_(heads), head_dim_(head_dim),
      dtype_(fp8 ? DType::F8_E4M3 : dtype), fp8_(fp8) {
    if (storage) {
        k_ = storage->alloc(Shape{num_layers, tokens, heads, head_dim}, dtype_);
        v_ = storage->alloc(Shape{num_layers, tokens, heads, head_dim}, dtype_);
        if (fp8) {
            k_scale_ = storage->alloc(Shape{num_layers, tokens, heads}, DType::F32);
            v_scale_ = storage->alloc(Shape{num_layers, tokens, heads}, DType::F32);
        }
    }
}

void CrossAttentionCache::populate(Backend* be, std::span<const LayerKv> layers) {
    DZR_CHECK(int(layers.size()) == num_layers_, "kv cross cache {}: got {} layers of K/V, expected {}", name_,
              layers.size(), num_layers_);
    const Shape want{tokens_, heads_, head_dim_};
    for (size_t l = 0; l < layers.size(); ++l) {
        for (const auto& [t, which] : {std::pair{&layers[l].k, "k"}, std::pair{&layers[l].v, "v"}}) {
            DZR_CHECK(t->defined() && t->shape == want && dtype_is_float(t->dtype),
                      "kv cross cache {}: layer {} {} is {}, expected a float tensor of shape {}", name_, l, which,
                      t->defined() ? t->str() : std::string("absent"), want.str());
            if (k_.defined())
                DZR_CHECK(t->device == k_.device(), "kv cross cache {}: layer {} {} is on {}, the cache is on {}",
                          name_, l, which, t->device.str(), k_.device().str());
            DZR_CHECK(!fp8_ || t->is_contiguous(),
                      "kv cross cache {}: layer {} {}: an FP8 cache quantizes contiguous K/V, got {}", name_, l, which,
                      t->str());
        }
    }
    if (k_.defined()) {
        DZR_CHECK(be != nullptr, "kv cross cache {}: populating its storage needs a backend", name_);
        // NOTE: every input is checked above, so a failure below is a device fault; the cache is then empty
        // rather than a mix of old and new layers.
        populated_ = false;
        writing_ = false;
        for (int l = 0; l < num_layers_; ++l) store_layer(*be, l, layers[size_t(l)].k, layers[size_t(l)].v);
    }
    populated_ = true;
    ++generation_;
}

void CrossAttentionCache::store_layer(Backend& be, int layer, const TensorView& k, const TensorView& v) {
    DZR_CHECK(k_.defined(), "kv cross cache {}: storing layer {} needs storage", name_, layer);
    if (!fp8_) {
        be.copy(k, layer_view(k_, layer));
        be.copy(v, layer_view(v_, layer));
        return;
    }
    // one scale per token and head (each head's head_dim values), as the FP8 pool
    const int64_t rows = int64_t(tokens_) * heads_;
    for (const auto& [src, q, sc] : {std::tuple{&k, &k_, &k_scale_}, std::tuple{&v, &v_, &v_scale_}})
        be.quantize_fp8(src->reshape(Shape{rows, head_dim_}), layer_view(*q, layer).reshape(Shape{rows, head_dim_}),
                        scale_view(*sc, layer).reshape(Shape{rows}));
}

std::vector<LayerKv> CrossAttentionCache::begin_write() {
    DZR_CHECK(k_.defined(), "kv cross cache {}: writing in place needs storage", name_);
    populated_ = false;
    writing_ = true;
    std::vector<LayerKv> layers;
    for (int l = 0; l < num_layers_; ++l)
        layers.push_back({layer_view(k_, l), layer_view(v_, l), scale_view(k_scale_, l), scale_view(v_scale_, l)});
    return layers;
}

void CrossAttentionCache::commit_write() {
    DZR_CHECK(writing_, "kv cross cache {}: commit_write without begin_write", name_);
    writing_ = false;
    populated_ = true;
    ++generation_;
}

TensorView CrossAttentionCache::layer_view(const Tensor& t, int layer) const {
    DZR_CHECK(layer >= 0 && layer < num_layers_, "kv cross cache {}: layer {} out of range [0, {})", name_, layer,
              num_layers_);
    if (!t.defined()) return TensorView(nullptr, dtype_, Shape{tokens_, heads_, head_dim_});
    // [layers, tokens, H, D] -> [tokens, H, D] of one layer
    return t.view().slice(0, layer, 1).reshape(Shape{tokens_, heads_, head_dim_});
}

TensorView CrossAttentionCache::scale_view(const Tensor& t, int layer) const {
    if (!fp8_) return TensorView{};
    DZR_CHECK(layer >= 0 && layer < num_layers_, "kv cross cache {}: layer {} out of range [0, {})", name_, layer,
              num_layers_);
    if (!t.defined()) return TensorView(nullptr, DType::F32, Shape{tokens_, heads_});
    return t.view().slice(0, layer, 1).reshape(Shape{tokens_, heads_});
}

TensorView CrossAttentionCache::k_scale(int layer) const {
    DZR_CHECK(populated_, "kv cross cache {}: read (layer {} k scale) before it was populated", name_, layer);
    return scale_view(k_scale_, layer);
}

TensorView CrossAttentionCache::v_scale(int layer) const {
    DZR_CHECK(populated_, "kv cross cache {}: read (layer {} v scale) before it was populated", name_, layer);
    return scale_view(v_scale_, layer);
}

TensorView CrossAttentionCache::k(int layer) const {
    DZR_CHECK(populated_, "kv cross cache {}: read (layer {} k) before it was populated", name_, layer);
    return layer_view(k_, layer);
}

TensorView CrossAttentionCache::v(int layer) const {
    DZR_CHECK(populated_, "kv cross cache {}: read (layer {} v) before it was populated", name_, layer);
    return layer_view(v_, layer);
}

}  // namespace dzr
