#include "model/clip_vision.h"

#include <cmath>

#include "backend/measuring_backend.h"
#include "core/error.h"
#include "weights/keys.h"

namespace dzr {

ClipVision::ClipVision(WeightLoader& loader, const ClipConfig& cfg, int input_height, int input_width)
    : cfg_(cfg) {
    DZR_CHECK(cfg.width > 0 && cfg.num_heads > 0 && cfg.width % cfg.num_heads == 0,
              "CLIP config: width {} is not a positive multiple of num_heads {}", cfg.width, cfg.num_heads);
    DZR_CHECK(cfg.patch_size > 0 && cfg.image_size > 0 && cfg.image_size % cfg.patch_size == 0,
              "CLIP config: image_size {} is not a multiple of patch_size {}", cfg.image_size,
              cfg.patch_size);
    DZR_CHECK(cfg.use_layers >= 1 && cfg.use_layers <= cfg.num_layers,
              "CLIP config: use_layers {} must be in [1, num_layers = {}]", cfg.use_layers, cfg.num_layers);
    DZR_CHECK(cfg.mlp_dim > 0, "CLIP config: mlp_dim must be positive, got {}", cfg.mlp_dim);
    DZR_CHECK(input_height > 0 && input_width > 0, "CLIP: input frame size must be positive, got {}x{}",
              input_height, input_width);
    const int64_t w = cfg.width, p = cfg.patch_size;
    // NOTE: declared in the checkpoint inventory's order (model/inventory.h); the weights DreamZero never runs
    // (log_scale, head, the blocks from use_layers on, post_norm) are declared, not loaded.
    const WeightInit embed_init = WeightInit::normal(1.0f / std::sqrt(float(w)));
    loader.declare(keys::clip("log_scale"), Shape{}, WeightInit::constant(std::log(1.0f / 0.07f)));  // CLIP's init
    cls_ = loader.require(keys::clip("visual.cls_embedding"), Shape{1, 1, w}, embed_init);
    pos_ = loader.require(keys::clip("visual.pos_embedding"), Shape{1, cfg.num_tokens(), w}, embed_init);
    loader.declare(keys::clip("visual.head"), Shape{w, cfg.embed_dim}, embed_init);  // used as x @ head
    patch_w_ = loader.require(keys::clip("visual.patch_embedding.weight"), Shape{w, 3, p, p});
    pre_norm_.load(loader, keys::clip("visual.pre_norm"), w, cfg.eps);
    layers_.resize(size_t(cfg.use_layers));
    for (int i = 0; i < cfg.num_layers; ++i) {
        if (i < cfg.use_layers) {
            layers_[size_t(i)].load(loader, keys::clip_block(i), cfg);
        } else {
            WeightLoader::DeclareOnly skip(loader);
            Layer().load(loader, keys::clip_block(i), cfg);
        }
    }
    {
        WeightLoader::DeclareOnly skip(loader);
        LayerNorm().load(loader, keys::clip("visual.post_norm"), w, cfg.eps);
    }
    resize_ = BicubicResize(loader.backend(), input_height, input_width, cfg.image_size, cfg.image_size);
    Backend& be = loader.backend();
    std_ = be.alloc(Shape{3}, DType::F32);
    be.upload(Tensor::host_f32(Shape{3}, {kClipStd[0], kClipStd[1], kClipStd[2]}), std_);
}

void ClipVision::Layer::load(WeightLoader& loader, const std::string& block, const ClipConfig& cfg) {
    const int64_t w = cfg.width, m = cfg.mlp_dim;
    norm1.load(loader, block + "norm1", w, cfg.eps);
    qkv.load(loader, block + "attn.to_qkv", w, 3 * w);
    proj.load(loader, block + "attn.proj", w, w);
    norm2.load(loader, block + "norm2", w, cfg.eps);
    fc1.load(loader, block + "mlp.0", w, m);
    fc2.load(loader, block + "mlp.2", m, w);
}

std::vector<std::string> ClipVision::skipped_keys(const ClipConfig& cfg) {
    MeasuringBackend be(DType::BF16);
    WeightLoader recorder(be);
    const ClipVision clip(recorder, cfg, cfg.image_size, cfg.image_size);
    std::vector<std::string> out;
    for (const WeightDeclaration& d : recorder.declarations())
        if (!d.loaded) out.push_back(d.key);
    return out;
}

size_t ClipVision::workspace_bytes(Backend& be, bool channels_last) const {
    return measure_workspace(be, [&](Backend& mb) {
        const Tensor frame = mb.alloc(Shape{3, resize_.in_height(), resize_.in_width()}, mb.compute_dtype());
        encode(mb, frame, mb.alloc(Shape{cfg_.num_tokens(), cfg_.width}, mb.compute_dtype()), {}, channels_last);
    });
}

void ClipVision::preprocess(Backend& be, const TensorView& frame, const TensorView& pixels) const {
    DZR_CHECK(!layers_.empty(), "CLIP: preprocess() on an encoder that was never loaded");
    DZR_CHECK(frame.rank() == 3 && frame.dim(0) == 3, "CLIP: input frame must be [3, {}, {}], got {}",
              resize_.in_height(), resize_.in_width(), frame.str());
    DZR_CHECK(pixels.rank() == 3 && pixels.dim(0) == 3 && pixels.dim(1) == cfg_.image_size &&
                  pixels.dim(2) == cfg_.image_size && pixels.dtype == be.compute_dtype() && pixels.is_contiguous(),
              "CLIP: pixels must be a contiguous {}[3, {}, {}], got {}", dtype_name(be.compute_dtype()),
              cfg_.image_size, cfg_.image_size, pixels.str());
    // NOTE: the reference resizes and normalizes in f32 (the bf16 frame converted to f32) and rounds to
    // the tower's dtype once at the end; each step below is one of its f32 ops, in its order.
    ArenaScope scope(be.workspace());
    const TensorView x = pixels.dtype == DType::F32 ? pixels : be.scratch(pixels.shape, DType::F32);
    resize_.apply(be, frame, x);                      // [3, H, W] -> f32 [3, S, S]
    be.scale(ScaleParams{0.5f, 0.5f}, x, x);          // x·0.5 + 0.5 (x·0.5 is exact)
    for (int c = 0; c < 3; ++c) {
        const TensorView ch = x.slice(0, c, 1);
        be.scale(ScaleParams{1.0f, -kClipMean[size_t(c)]}, ch, ch);  // − mean
        // NOTE: a division, as the reference's (a product with 1 / std would differ by an f32 ulp, and
        // sometimes flip the final bf16 rounding)
        be.binary(BinaryParams{BinaryOp::Div}, ch, std_.view().slice(0, c, 1), pixels.slice(0, c, 1));
    }
}

void ClipVision::forward(Backend& be, const TensorView& pixels, const TensorView& out, const TraceFn& trace,
                         bool channels_last) const {
    DZR_CHECK(!layers_.empty(), "CLIP: forward() on an encoder that was never loaded");
    const DType dt = be.compute_dtype();
    const int64_t s = cfg_.image_size, p = cfg_.patch_size, g = s / p, w = cfg_.width, t = cfg_.num_tokens();
    const int64_t nh = cfg_.num_heads, hd = w / nh;
    DZR_CHECK(pixels.rank() == 3 && pixels.dim(0) == 3 && pixels.dim(1) == s && pixels.dim(2) == s &&
                  pixels.dtype == dt && pixels.is_contiguous(),
              "CLIP: pixels must be a contiguous {}[3, {}, {}], got {}", dtype_name(dt), s, s, pixels.str());
    DZR_CHECK(out.rank() == 2 && out.dim(0) == t && out.dim(1) == w && out.dtype == dt && out.is_contiguous(),
              "CLIP: output must be a contiguous {}[{}, {}], got {}", dtype_name(dt), t, w, out.str());

    ArenaScope scope(be.workspace());
    // Patch embedding: the reference's Conv2d(3, w, p, stride p, no bias), run as one (cuDNN's convolution
    // sums in another order than patchify + GEMM, which shows in bf16), [w, g·g] -> token rows 1.. (row 0
    // is the class token).
    const TensorView grid = be.scratch(Shape{w, 1, g, g});
    Conv3dParams conv;
    conv.frames_2d = true;
    conv.channels_last = channels_last;
    conv.stride[1] = conv.stride[2] = int(p);
    be.conv3d(conv, pixels.reshape(Shape{3, 1, s, s}), patch_w_.view().reshape(Shape{w, 3, 1, p, p}), {}, grid);
    const TensorView emb = be.scratch(Shape{t, w});
    be.copy(grid.reshape(Shape{w, g * g}).permute({1, 0}), emb.slice(0, 1, g * g));
    be.copy(cls_.view().reshape(Shape{1, w}), emb.slice(0, 0, 1));
    if (trace) trace("clip.patch_embed", -1, emb.slice(0, 1, g * g));
    be.add(emb, pos_.view().reshape(Shape{t, w}), emb);
    pre_norm_.forward(be, emb, out);  // `out` carries the residual stream from here
    if (trace) trace("clip.pre_norm", -1, out);

    const TensorView h = be.scratch(Shape{t, w});
    const TensorView qkv = be.scratch(Shape{t, 3 * w});
    // [t, 3w] columns [q | k | v] -> [t, H, hd] views with row stride 3w (as the reference's view + unbind)
    const auto heads = [&](int64_t j) {
        const TensorView cols = qkv.slice(1, j * w, w);
        return TensorView(cols.data, cols.dtype, Shape{t, nh, hd}, Shape{3 * w, hd, 1}, cols.device);
    };
    const TensorView att = be.scratch(Shape{t, w});
    const TensorView mlp = be.scratch(Shape{t, cfg_.mlp_dim});
    const AttentionParams attn{float(1.0 / std::sqrt(double(hd)))};
    for (size_t i = 0; i < layers_.size(); ++i) {
        const Layer& l = layers_[i];
        l.norm1.forward(be, out, h);
        // to_qkv as the reference runs it: one GEMM [t, w] -> [t, 3w] (one N = 3w product, not three)
        l.qkv.forward(be, h, qkv);
        be.attention(attn, heads(0), heads(1), heads(2), {}, att.reshape(Shape{t, nh, hd}));
        l.proj.forward(be, att, h);  // [t, w] -> [t, w]
        be.add(out, h, out);
        l.norm2.forward(be, out, h);
        l.fc1.forward(be, h, mlp);  // [t, w] -> [t, mlp]
        be.activation(ActivationParams{Activation::GeluErf}, mlp, mlp);
        l.fc2.forward(be, mlp, h);  // [t, mlp] -> [t, w]
        be.add(out, h, out);
        if (trace) trace("clip.layer_out", int(i), out);
    }
}

void ClipVision::encode(Backend& be, const TensorView& frame, const TensorView& out, const TraceFn& trace,
                        bool channels_last) const {
    ArenaScope scope(be.workspace());
    const TensorView pixels = be.scratch(Shape{3, cfg_.image_size, cfg_.image_size});
    preprocess(be, frame, pixels);
    if (trace) trace("clip.pixels", -1, pixels);
    forward(be, pixels, out, trace, channels_last);
}

}  // namespace dzr
