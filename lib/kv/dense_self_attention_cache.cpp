#include "kv/dense_self_attention_cache.h"

#include "backend/measuring_backend.h"
#include "core/error.h"

namespace dzr {

DenseSelfAttentionCache::DenseSelfAttentionCache(Backend& be, const KvGeometry& geometry, const KvConfig& config)
    : be_(be), geometry_(geometry), config_(config) {
    config_.validate(geometry_);
    const int64_t tpf = geometry_.tokens_per_frame;
    // history kept after a commit (sink + window frames) plus the rows one committing forward stages
    capacity_ = (int64_t(config_.sink_frames + config_.window_frames) + geometry_.max_current_video_frames()) * tpf;
    const Shape shape{geometry_.num_layers, capacity_, geometry_.num_kv_heads, geometry_.head_dim};
    k_ = be_.alloc(shape, geometry_.dtype);
    v_ = be_.alloc(shape, geometry_.dtype);
}

size_t DenseSelfAttentionCache::workspace_bytes(const KvGeometry& geometry, const KvConfig& config, Backend& be) {
    return measure_workspace(be, [&](Backend& mb) {
        DenseSelfAttentionCache cache(mb, geometry, config);
        run_kv_fill_walk(mb, geometry, config, cache);
    });
}

TensorView DenseSelfAttentionCache::rows(const Tensor& t, int layer, int64_t start, int64_t n) const {
    // [layers, capacity, H, D] -> [n, H, D]: rows [start, start + n) of one layer
    return t.view()
        .slice(0, layer, 1)
        .reshape(Shape{capacity_, geometry_.num_kv_heads, geometry_.head_dim})
        .slice(0, start, n);
}

void DenseSelfAttentionCache::begin(const KvForwardSpec& spec) {
    DZR_CHECK(!in_forward_, "dense kv cache: a new forward began while the previous one was neither committed nor "
                            "aborted");
    const int64_t tpf = geometry_.tokens_per_frame;
    const int64_t video = int64_t(spec.video_frames) * tpf;
    DZR_CHECK(spec.video_frames >= 0 && spec.video_frames <= geometry_.max_current_video_frames() &&
                  spec.register_tokens >= 0,
              "dense kv cache: a forward of {} video frames and {} register tokens is outside the geometry",
              spec.video_frames, spec.register_tokens);
    // visible history: everything when history + current fit in sink + window frames, else the sink rows
    // and the newest rows that fit
    const int64_t sink = int64_t(config_.sink_frames) * tpf;
    const int64_t limit = int64_t(config_.sink_frames + config_.window_frames) * tpf - video;
    if (len_ <= limit) {
        sink_rows_ = 0;
        window_start_ = 0;
    } else {
        sink_rows_ = sink;
        window_start_ = len_ - (limit - sink);
    }
    DZR_ASSERT(!spec.commit || len_ + video <= capacity_);
    in_forward_ = true;
    spec_ = spec;
    video_tokens_ = video;
}

int64_t DenseSelfAttentionCache::history_tokens() const {
    DZR_CHECK(in_forward_, "dense kv cache: history_tokens() outside a forward (call begin first)");
    return sink_rows_ + (len_ - window_start_);
}

void DenseSelfAttentionCache::check_rows(const char* what, int layer, const TensorView& k, const TensorView& v,
                                         int64_t video_tokens) const {
    DZR_CHECK(in_forward_, "dense kv cache: {} (layer {}) outside a forward (call begin first)", what, layer);
    DZR_CHECK(layer >= 0 && layer < geometry_.num_layers, "dense kv cache: layer {} out of range [0, {})", layer,
              geometry_.num_layers);
    const Shape want{video_tokens_ + spec_.register_tokens, geometry_.num_kv_heads, geometry_.head_dim};
    DZR_CHECK(video_tokens == video_tokens_ && k.shape == want && v.shape == want,
              "dense kv cache: layer {}: k {} and v {} with {} video tokens do not match the forward's {} video + {} "
              "register tokens",
              layer, k.str(), v.str(), video_tokens, video_tokens_, spec_.register_tokens);
}

void DenseSelfAttentionCache::stage(Backend& be, int layer, const TensorView& k, const TensorView& v,
                                    int64_t video_tokens) {
    be.copy(k.slice(0, 0, video_tokens), rows(k_, layer, len_, video_tokens));
    be.copy(v.slice(0, 0, video_tokens), rows(v_, layer, len_, video_tokens));
}

void DenseSelfAttentionCache::attend(Backend& be, int layer, const TensorView& q, const TensorView& k,
                                     const TensorView& v, int64_t video_tokens, float scale, const TensorView& out) {
    check_rows("attend", layer, k, v, video_tokens);
    const int64_t cur = video_tokens_ + spec_.register_tokens;
    if (spec_.commit) stage(be, layer, k, v, video_tokens);
    ArenaScope scope(be.workspace());
    const int64_t hist = history_tokens(), window = len_ - window_start_;
    // concat(sink rows, newest rows, current): [hist + cur, H, D]
    const TensorView kall = be.scratch(Shape{hist + cur, geometry_.num_kv_heads, geometry_.head_dim});
    const TensorView vall = be.scratch(Shape{hist + cur, geometry_.num_kv_heads, geometry_.head_dim});
    if (sink_rows_ > 0) {
        be.copy(rows(k_, layer, 0, sink_rows_), kall.slice(0, 0, sink_rows_));
        be.copy(rows(v_, layer, 0, sink_rows_), vall.slice(0, 0, sink_rows_));
    }
    if (window > 0) {
        be.copy(rows(k_, layer, window_start_, window), kall.slice(0, sink_rows_, window));
        be.copy(rows(v_, layer, window_start_, window), vall.slice(0, sink_rows_, window));
    }
    be.copy(k, kall.slice(0, hist, cur));
    be.copy(v, vall.slice(0, hist, cur));
    be.attention(AttentionParams{scale}, q, kall, vall, TensorView{}, out);
}

void DenseSelfAttentionCache::store(Backend& be, int layer, const TensorView& k, const TensorView& v,
                                    int64_t video_tokens) {
    DZR_CHECK(in_forward_ && spec_.commit, "dense kv cache: store (layer {}) outside a committing forward", layer);
    check_rows("store", layer, k, v, video_tokens);
    stage(be, layer, k, v, video_tokens);
}

void DenseSelfAttentionCache::commit() {
    DZR_CHECK(in_forward_, "dense kv cache: commit without an open forward");
    in_forward_ = false;
    if (!spec_.commit) return;
    len_ += video_tokens_;
    const int64_t tpf = geometry_.tokens_per_frame;
    const int64_t keep = int64_t(config_.sink_frames + config_.window_frames) * tpf;
    if (len_ <= keep) return;
    // NOTE: rows older than sink + window frames are never visible again: move the newest rows down behind
    // the sink (through a workspace buffer, since the ranges may overlap).
    const int64_t sink = int64_t(config_.sink_frames) * tpf, newest = keep - sink;
    for (int layer = 0; layer < geometry_.num_layers; ++layer) {
        for (const Tensor* t : {&k_, &v_}) {
            ArenaScope scope(be_.workspace());
            const TensorView tmp = be_.scratch(Shape{newest, geometry_.num_kv_heads, geometry_.head_dim},
                                               geometry_.dtype);
            be_.copy(rows(*t, layer, len_ - newest, newest), tmp);
            be_.copy(tmp, rows(*t, layer, sink, newest));
        }
    }
    len_ = keep;
}

void DenseSelfAttentionCache::abort() noexcept { in_forward_ = false; }

void DenseSelfAttentionCache::reset() {
    in_forward_ = false;
    len_ = 0;
}

}  // namespace dzr
