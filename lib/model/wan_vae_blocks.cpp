#include "model/wan_vae_blocks.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace dzr::vae {
namespace {

void check_activation(const TensorView& x, const char* what) {
    DZR_CHECK(x.rank() == 4, "vae: {} must be [C, T, H, W], got {}", what, x.str());
}

/// [L, C] columns of a wider row-major matrix -> [L, 1, C] single-head view (rows keep their stride).
TensorView one_head(const TensorView& cols) {
    return TensorView(cols.data, cols.dtype, Shape{cols.dim(0), 1, cols.dim(1)},
                      Shape{cols.strides[0], cols.dim(1), 1}, cols.device);
}

/// Whether a causal conv assembles its input channels-last and hands it to the convolution as such: always for a
/// channels-last x (the channels-last encoder, WanVae::set_channels_last_encoder), and in fast numerics on a backend
/// whose conv3d takes channels-last operands (Capabilities::conv_channels_last), instead of transposing the
/// sequence back to channels-first for a convolution that transposes it again.
/// NOTE: for a multiple of 8 channels only: cuDNN's channels-last tensor-core kernels read channels in 16-byte
/// vectors (the 3 pixel channels of the first conv stay channels-first).
bool channels_last_conv(const Backend& be, const TensorView& x) {
    return is_channels_last(x) ||
           (be.numerics() == Numerics::Fast && x.dim(0) % 8 == 0 && be.capabilities().conv_channels_last);
}

/// assemble's channels-last form: the sequence [hist - n zero frames (the causal padding) | cache frames | f(x)]
/// in a buffer taken from the caller's arena scope, returned as the conv input [C, hist + T, H, W] (a channels-last
/// view); the cache is updated as assemble updates it.
TensorView assemble_channels_last(Backend& be, const TensorView& x, const ChannelRmsNorm* norm, TemporalCache* cache,
                                  int hist) {
    const int64_t C = x.dim(0), T = x.dim(1), H = x.dim(2), W = x.dim(3), HW = H * W;
    const int64_t n = cache ? cache->frames : 0, z = std::max<int64_t>(hist - n, 0);
    TensorView seq = be.scratch(Shape{z + n + T, HW, C});
    if (z > 0) be.fill(seq.slice(0, 0, z), 0.0f);
    TensorView tail = seq.slice(0, z + n, T);
    if (norm && is_channels_last(x)) {
        norm->forward_rows(be, cl_rows(x).reshape(Shape{T * HW, C}), tail.reshape(Shape{T * HW, C}), true);
    } else if (norm) {
        ArenaScope tmp(be.workspace());
        TensorView xcl = be.scratch(Shape{T, HW, C});
        to_channels_last(be, x, xcl);
        norm->forward_rows(be, xcl.reshape(Shape{T * HW, C}), tail.reshape(Shape{T * HW, C}), true);
    } else {
        to_channels_last(be, x, tail);
    }
    if (cache) {
        if (n > 0) be.copy(cache->buf.slice(0, 0, n), seq.slice(0, z, n));
        const int64_t keep = std::min<int64_t>(kCacheFrames, n + T);
        DZR_ASSERT(cache->buf.dim(0) >= keep && cache->buf.dim(1) == HW && cache->buf.dim(2) == C);
        be.copy(seq.slice(0, z + n + T - keep, keep), cache->buf.slice(0, 0, keep));
        cache->frames = int(keep);
    }
    return cl_view(seq.reshape(Shape{z + n + T, H, W, C}));
}

/// Assembles the conv input [C, n + T, H, W] = [cache frames | f(x)] channels-first, with f =
/// SiLU(norm(.)) when norm is given, else identity, and moves the newest kCacheFrames frames of that
/// sequence into the cache. n = cache->frames (0 without cache).
/// NOTE: under autocast the reference caches the f32 SiLU output and rounds it at the conv's input
/// cast; the cache here holds the already rounded conv input, which is the same numbers (a cached
/// frame is only ever used as conv input).
void assemble(Backend& be, const TensorView& x, const ChannelRmsNorm* norm, TemporalCache* cache,
              const TensorView& input) {
    ArenaScope scope(be.workspace());
    // NOTE: the channels-last sequence without zero frames, then transposed: the same ops as assembling it directly
    be.copy(assemble_channels_last(be, x, norm, cache, 0), input);
}

/// out (channels-last) += y (channels-last), as rows.
void add_channels_last(Backend& be, const TensorView& out, const TensorView& y) {
    be.add(cl_rows(out), cl_rows(y), cl_rows(out));
}

}  // namespace

// ---- helpers -----------------------------------------------------------------------------------

TensorView carve(const TensorView& buf, const Shape& shape) {
    DZR_ASSERT(shape.numel() <= buf.numel());
    return TensorView(buf.data, buf.dtype, shape, buf.device);
}

void to_channels_last(Backend& be, const TensorView& x, const TensorView& out) {
    const int64_t C = x.dim(0), T = x.dim(1), H = x.dim(2), W = x.dim(3);
    DZR_ASSERT(out.numel() == x.numel());
    // [C, T, H, W] -> [T, H, W, C]
    be.copy(x.permute({1, 2, 3, 0}), out.reshape(Shape{T, H, W, C}));
}

void to_channels_first(Backend& be, const TensorView& x, const TensorView& out) {
    const int64_t C = out.dim(0), T = out.dim(1), H = out.dim(2), W = out.dim(3);
    DZR_ASSERT(x.numel() == out.numel() && x.dim(0) == T && x.dim(-1) == C);
    // [T, H*W, C] -> [T, H, W, C] -> [C, T, H, W]
    be.copy(x.reshape(Shape{T, H, W, C}).permute({3, 0, 1, 2}), out);
}

bool is_channels_last(const TensorView& x) {
    return x.rank() == 4 && !x.is_contiguous() && x.permute({1, 2, 3, 0}).is_contiguous();
}

TensorView cl_view(const TensorView& buf) {
    DZR_ASSERT(buf.rank() == 4 && buf.is_contiguous());
    return buf.permute({3, 0, 1, 2});
}

TensorView cl_rows(const TensorView& x) {
    const TensorView rows = x.permute({1, 2, 3, 0});
    DZR_ASSERT(rows.is_contiguous());
    return rows;
}

TensorView carve_channels_last(const TensorView& buf, const Shape& shape) {
    return cl_view(carve(buf, Shape{shape[1], shape[2], shape[3], shape[0]}));
}

TensorView scratch_channels_last(Backend& be, const Shape& shape) {
    return cl_view(be.scratch(Shape{shape[1], shape[2], shape[3], shape[0]}));
}

void conv3d_any_layout(Backend& be, const Conv3dParams& p, const TensorView& x, const TensorView& w,
                       const TensorView& bias, const TensorView& out) {
    if ((x.is_contiguous() && out.is_contiguous()) || be.capabilities().conv_channels_last) {
        be.conv3d(p, x, w, bias, out);
        return;
    }
    ArenaScope scope(be.workspace());
    TensorView xc = x;
    if (!x.is_contiguous()) {
        xc = be.scratch(x.shape, x.dtype);
        be.copy(x, xc);
    }
    if (out.is_contiguous()) {
        be.conv3d(p, xc, w, bias, out);
        return;
    }
    const TensorView oc = be.scratch(out.shape, out.dtype);
    be.conv3d(p, xc, w, bias, oc);
    be.copy(oc.permute({1, 2, 3, 0}), cl_rows(out));
}

void upsample_nearest2x(Backend& be, const TensorView& x, const TensorView& out) {
    const int64_t C = x.dim(0), T = x.dim(1), H = x.dim(2), W = x.dim(3);
    DZR_ASSERT(out.shape == (Shape{C, T, 2 * H, 2 * W}));
    // NOTE: nearest and nearest-exact agree for an integer factor of 2: source = floor(dst / 2).
    // Broadcast view [C, T, H, 2, W, 2] with stride 0 on the repeat dims -> contiguous [C, T, 2H, 2W].
    const TensorView src(x.data, x.dtype, Shape{C, T, H, 2, W, 2},
                         Shape{x.strides[0], x.strides[1], x.strides[2], 0, x.strides[3], 0}, x.device);
    be.copy(src, out.reshape(Shape{C, T, H, 2, W, 2}));
}

void clamp_unit(Backend& be, const TensorView& x, const TensorView& out) {
    // NOTE: the Backend has no clamp op. clamp(x, -1, 1) = x - relu(x - 1) + relu(-x - 1): inside
    // [-1, 1] both relu terms are exactly 0, so in-range values pass bit-unchanged; above 1,
    // x - (x - 1) is exactly 1 whenever x - 1 is exact (|x| < 2^24 in f32, < 2^8 in bf16), and
    // symmetrically below -1.
    ArenaScope scope(be.workspace());
    TensorView over = be.scratch(x.shape, x.dtype);
    TensorView under = be.scratch(x.shape, x.dtype);
    be.scale(ScaleParams{1.0f, -1.0f}, x, over);
    be.activation(ActivationParams{Activation::Relu}, over, over);
    be.scale(ScaleParams{-1.0f, -1.0f}, x, under);
    be.activation(ActivationParams{Activation::Relu}, under, under);
    be.binary(BinaryParams{BinaryOp::Sub}, x, over, out);
    be.add(out, under, out);
}

// ---- ChannelsLastWeight ------------------------------------------------------------------------

void ChannelsLastWeight::allocate(Backend& be, const TensorView& w) {
    if (!w.defined() || be.numerics() != Numerics::Fast || !be.capabilities().conv_channels_last) return;
    DZR_ASSERT(w.rank() == 5);
    if (w.dim(2) * w.dim(3) * w.dim(4) == 1) return;  // [Co, Ci, 1, 1, 1] is channels-last already
    w_ = w;
    cl_ = be.alloc(Shape{w.dim(0), w.dim(2), w.dim(3), w.dim(4), w.dim(1)}, w.dtype);
}

void ChannelsLastWeight::fill(Backend& be) {
    if (filled_ || !cl_.defined()) return;
    const int64_t Co = w_.dim(0), Ci = w_.dim(1), K = w_.dim(2) * w_.dim(3) * w_.dim(4);
    // [Co, Ci, kt, kh, kw] -> [Co, kt, kh, kw, Ci]
    be.copy(w_.reshape(Shape{Co, Ci, K}).permute({0, 2, 1}), cl_.view().reshape(Shape{Co, K, Ci}));
    filled_ = true;
}

// ---- ChannelRmsNorm ----------------------------------------------------------------------------

void ChannelRmsNorm::load(WeightLoader& loader, const std::string& key, int channels, bool images) {
    channels_ = channels;
    const Shape shape = images ? Shape{channels, 1, 1} : Shape{channels, 1, 1, 1};
    gamma_ = loader.require(key, shape, WeightInit::norm_scale());
    gamma_vec_ = gamma_.view().reshape(Shape{channels});  // [C, 1, 1(, 1)] -> [C]
}

void ChannelRmsNorm::forward_rows(Backend& be, const TensorView& x, const TensorView& out, bool silu) const {
    DZR_ASSERT(x.cols() == channels_);
    L2NormParams p;
    p.eps = kNormEps;
    // NOTE: the reference's scale is the Python float C ** 0.5, which a tensor op uses as float.
    p.scale = float(std::sqrt(double(channels_)));
    p.silu = silu;
    be.l2_norm(p, x, gamma_vec_, out);
}

// ---- CausalConv3d ------------------------------------------------------------------------------

void CausalConv3d::load(WeightLoader& loader, const std::string& path, int in_ch, int out_ch,
                        std::array<int, 3> kernel, std::array<int, 3> padding) {
    in_ = in_ch;
    out_ = out_ch;
    kernel_ = kernel;
    pad_ = padding;
    DZR_ASSERT(pad_[0] == 0 || 2 * pad_[0] == kernel_[0] - 1);
    weight_ = loader.require(path + "weight", Shape{out_ch, in_ch, kernel[0], kernel[1], kernel[2]});
    bias_ = loader.require(path + "bias", Shape{out_ch}, WeightInit::bias());
}

void CausalConv3d::keep_channels_last(Backend& be, std::vector<ChannelsLastWeight*>& fill) {
    weight_cl_.allocate(be, weight_.view());
    fill.push_back(&weight_cl_);
}

void CausalConv3d::convolve(Backend& be, const TensorView& input, int time_pad, int time_stride,
                            const TensorView& out) const {
    Conv3dParams p;
    p.stride[0] = time_stride;
    p.pad_before[0] = time_pad;
    for (int d = 1; d < 3; ++d) {
        p.pad_before[d] = pad_[d];
        p.pad_after[d] = pad_[d];
    }
    p.w_channels_last = weight_cl_.view();
    conv3d_any_layout(be, p, input, weight_, bias_, out);
}

void CausalConv3d::forward(Backend& be, const TensorView& x, TemporalCache* cache,
                           const TensorView& out) const {
    check_activation(x, "causal conv input");
    DZR_ASSERT(x.dim(0) == in_ && out.dim(0) == out_ && out.dim(1) == x.dim(1));
    const int hist = history();
    DZR_ASSERT(hist > 0 || cache == nullptr);
    const int n = cache ? cache->frames : 0;
    if (hist == 0 && is_channels_last(x)) {
        convolve(be, x, 0, 1, out);  // nothing to assemble
        return;
    }
    if (n == 0 && x.is_contiguous()) {
        if (cache) {
            const int64_t T = x.dim(1), keep = std::min<int64_t>(kCacheFrames, T);
            to_channels_last(be, x.slice(1, T - keep, keep), cache->buf.slice(0, 0, keep));
            cache->frames = int(keep);
        }
        convolve(be, x, hist, 1, out);
        return;
    }
    ArenaScope scope(be.workspace());
    if (channels_last_conv(be, x)) {
        convolve(be, assemble_channels_last(be, x, nullptr, cache, hist), 0, 1, out);
        return;
    }
    TensorView input = be.scratch(Shape{in_, n + x.dim(1), x.dim(2), x.dim(3)});
    assemble(be, x, nullptr, cache, input);
    convolve(be, input, hist - n, 1, out);
}

void CausalConv3d::forward_normed(Backend& be, const ChannelRmsNorm& norm, const TensorView& x,
                                  TemporalCache* cache, const TensorView& out) const {
    check_activation(x, "causal conv input");
    DZR_ASSERT(x.dim(0) == in_ && norm.channels() == in_ && out.dim(0) == out_ && out.dim(1) == x.dim(1));
    DZR_ASSERT(history() > 0 || cache == nullptr);
    const int n = cache ? cache->frames : 0;
    ArenaScope scope(be.workspace());
    if (channels_last_conv(be, x)) {
        convolve(be, assemble_channels_last(be, x, &norm, cache, history()), 0, 1, out);
        return;
    }
    TensorView input = be.scratch(Shape{in_, n + x.dim(1), x.dim(2), x.dim(3)});
    assemble(be, x, &norm, cache, input);
    convolve(be, input, history() - n, 1, out);
}

// ---- ResidualBlock -----------------------------------------------------------------------------

void ResidualBlock::load(WeightLoader& loader, const std::string& path, int in_ch, int out_ch) {
    // residual = [RMS_norm, SiLU, CausalConv3d, RMS_norm, SiLU, Dropout, CausalConv3d]
    norm1_.load(loader, path + "residual.0.gamma", in_ch, false);
    conv1_.load(loader, path + "residual.2.", in_ch, out_ch, {3, 3, 3}, {1, 1, 1});
    norm2_.load(loader, path + "residual.3.gamma", out_ch, false);
    conv2_.load(loader, path + "residual.6.", out_ch, out_ch, {3, 3, 3}, {1, 1, 1});
    if (in_ch != out_ch) {
        shortcut_.emplace();
        shortcut_->load(loader, path + "shortcut.", in_ch, out_ch, {1, 1, 1}, {0, 0, 0});
    }
}

void ResidualBlock::forward(Backend& be, const TensorView& x, TemporalCache* caches, const TensorView& out) const {
    check_activation(x, "residual block input");
    if (is_channels_last(x)) {
        // the channels-last encoder: x, out and the intermediate channels-last
        DZR_ASSERT(is_channels_last(out) && out.shape == (Shape{out_channels(), x.dim(1), x.dim(2), x.dim(3)}));
        ArenaScope scope(be.workspace());
        const TensorView mid = scratch_channels_last(be, out.shape);
        conv1_.forward_normed(be, norm1_, x, caches ? &caches[0] : nullptr, mid);
        conv2_.forward_normed(be, norm2_, mid, caches ? &caches[1] : nullptr, out);
        if (shortcut_) {
            shortcut_->forward(be, x, nullptr, mid);
            add_channels_last(be, out, mid);
        } else {
            add_channels_last(be, out, x);
        }
        return;
    }
    DZR_ASSERT(x.is_contiguous() && out.shape == (Shape{out_channels(), x.dim(1), x.dim(2), x.dim(3)}));
    ArenaScope scope(be.workspace());
    TensorView mid = be.scratch(out.shape);
    conv1_.forward_normed(be, norm1_, x, caches ? &caches[0] : nullptr, mid);
    conv2_.forward_normed(be, norm2_, mid, caches ? &caches[1] : nullptr, out);
    if (shortcut_) {
        shortcut_->forward(be, x, nullptr, mid);  // mid is free again: reuse it for the shortcut
        be.add(out, mid, out);
    } else {
        be.add(out, x, out);
    }
}

void ResidualBlock::keep_channels_last(Backend& be, std::vector<ChannelsLastWeight*>& fill) {
    conv1_.keep_channels_last(be, fill);
    conv2_.keep_channels_last(be, fill);
    if (shortcut_) shortcut_->keep_channels_last(be, fill);
}

// ---- AttentionBlock ----------------------------------------------------------------------------

void AttentionBlock::load(WeightLoader& loader, const std::string& path, int channels) {
    channels_ = channels;
    const int64_t C = channels;
    norm_.load(loader, path + "norm.gamma", channels, true);
    qkv_w_ = loader.require(path + "to_qkv.weight", Shape{3 * C, C, 1, 1});
    qkv_b_ = loader.require(path + "to_qkv.bias", Shape{3 * C}, WeightInit::bias());
    proj_w_ = loader.require(path + "proj.weight", Shape{C, C, 1, 1});
    proj_b_ = loader.require(path + "proj.bias", Shape{C}, WeightInit::bias());
    qkv_w5_ = qkv_w_.view().reshape(Shape{3 * C, C, 1, 1, 1});  // Conv2d 1x1 as a conv3d with kt = 1
    proj_w5_ = proj_w_.view().reshape(Shape{C, C, 1, 1, 1});
}

void AttentionBlock::forward(Backend& be, const TensorView& x, const TensorView& out) const {
    check_activation(x, "attention block input");
    if (is_channels_last(x)) {
        forward_channels_last(be, x, out);
        return;
    }
    const int64_t C = channels_, T = x.dim(1), H = x.dim(2), W = x.dim(3), L = H * W;
    DZR_ASSERT(x.dim(0) == C && x.is_contiguous() && out.shape == x.shape);
    ArenaScope scope(be.workspace());
    // The reference folds time into the batch: norm over channels, to_qkv and proj as Conv2d 1x1 over the
    // (b t) frames (run here as such: cuDNN rounds them unlike a GEMM, and adds the bias to the rounded
    // product), SDPA per frame on [hw, 3c] rows.
    const TensorView cf = be.scratch(Shape{C, T, H, W});  // channels-first conv input
    {
        ArenaScope tmp(be.workspace());
        const TensorView xcl = be.scratch(Shape{T, L, C});
        const TensorView xn = be.scratch(Shape{T, L, C});
        to_channels_last(be, x, xcl);  // [C, T, H, W] -> [T, L, C]
        norm_.forward_rows(be, xcl.reshape(Shape{T * L, C}), xn.reshape(Shape{T * L, C}), false);
        be.copy(xn.reshape(Shape{T, H, W, C}).permute({3, 0, 1, 2}), cf);
    }
    Conv3dParams conv;
    conv.frames_2d = true;
    const TensorView qkv = be.scratch(Shape{3 * C, T, H, W});
    be.conv3d(conv, cf, qkv_w5_, qkv_b_, qkv);
    const TensorView y = be.scratch(Shape{T, L, C});
    {
        ArenaScope tmp(be.workspace());
        const TensorView rows = be.scratch(Shape{L, 3 * C});
        const TensorView q = be.scratch(Shape{L, 1, C});
        const TensorView o = be.scratch(Shape{L, 1, C});
        const AttentionParams attn{float(1.0 / std::sqrt(double(C)))};
        const TensorView frames = qkv.reshape(Shape{3 * C, T, L}).permute({1, 2, 0});  // [T, L, 3C]
        for (int64_t t = 0; t < T; ++t) {
            be.copy(frames.slice(0, t, 1), rows.reshape(Shape{1, L, 3 * C}));  // columns [q | k | v]
            be.copy(one_head(rows.slice(1, 0, C)), q);  // [L, C] (row stride 3C) -> [L, 1, C]
            be.attention(attn, q, one_head(rows.slice(1, C, C)), one_head(rows.slice(1, 2 * C, C)), TensorView{},
                         o);
            be.copy(o.reshape(Shape{L, C}), y.slice(0, t, 1).reshape(Shape{L, C}));
        }
    }
    be.copy(y.reshape(Shape{T, H, W, C}).permute({3, 0, 1, 2}), cf);  // [T, L, C] -> [C, T, H, W]
    be.conv3d(conv, cf, proj_w5_, proj_b_, out);
    be.add(out, x, out);
}

void AttentionBlock::forward_channels_last(Backend& be, const TensorView& x, const TensorView& out) const {
    const int64_t C = channels_, T = x.dim(1), H = x.dim(2), W = x.dim(3), L = H * W;
    DZR_ASSERT(x.dim(0) == C && is_channels_last(out) && out.shape == x.shape);
    ArenaScope scope(be.workspace());
    // the rows are the norm's, the 1x1 convolutions' and the attention's layout: no transposes
    const TensorView xn = be.scratch(Shape{T, H, W, C});
    norm_.forward_rows(be, cl_rows(x).reshape(Shape{T * L, C}), xn.reshape(Shape{T * L, C}), false);
    Conv3dParams conv;
    conv.frames_2d = true;
    const TensorView qkv = be.scratch(Shape{T, H, W, 3 * C});  // rows [q | k | v]
    conv3d_any_layout(be, conv, cl_view(xn), qkv_w5_, qkv_b_, cl_view(qkv));
    const TensorView y = be.scratch(Shape{T, H, W, C});
    if (be.numerics() == Numerics::Fast) {
        attend_gemm(be, qkv.reshape(Shape{T, L, 3 * C}), y.reshape(Shape{T, L, C}));
    } else {
        ArenaScope tmp(be.workspace());
        const TensorView q = be.scratch(Shape{L, 1, C});
        const TensorView o = be.scratch(Shape{L, 1, C});
        const AttentionParams attn{float(1.0 / std::sqrt(double(C)))};
        for (int64_t t = 0; t < T; ++t) {
            const TensorView rows = qkv.slice(0, t, 1).reshape(Shape{L, 3 * C});
            be.copy(one_head(rows.slice(1, 0, C)), q);  // [L, C] (row stride 3C) -> [L, 1, C]
            be.attention(attn, q, one_head(rows.slice(1, C, C)), one_head(rows.slice(1, 2 * C, C)), TensorView{},
                         o);
            be.copy(o.reshape(Shape{L, C}), y.slice(0, t, 1).reshape(Shape{L, C}));
        }
    }
    conv3d_any_layout(be, conv, cl_view(y), proj_w5_, proj_b_, out);
    add_channels_last(be, out, x);
}

void AttentionBlock::attend_gemm(Backend& be, const TensorView& qkv, const TensorView& y) const {
    // NOTE: the reference's SDPA with head_dim = C = 384 runs PyTorch's memory-efficient kernel, which dzr mirrors in
    // reference numerics (kernels/attention_memeff.cu, one CTA per 32 queries: 110 CTAs for one frame's 3520 tokens,
    // under one wave of the H200). Fast numerics run the attention as cuBLASLt GEMMs around a softmax of f32 logits
    // instead, reading q, k and v where to_qkv wrote them (rows [q | k | v], no copies). The probabilities are
    // rounded once after normalization (the CUDA backend's GEMM attention does the same).
    const int64_t T = qkv.dim(0), L = qkv.dim(1), C = channels_;
    DZR_ASSERT(qkv.dim(2) == 3 * C && y.shape == (Shape{T, L, C}));
    ArenaScope scope(be.workspace());
    const TensorView logits = be.scratch(Shape{L, L}, DType::F32);
    const TensorView probs = be.scratch(Shape{L, L});
    GemmParams scores;  // [L, C] x [L, C]^T -> [L, L], times 1/sqrt(C)
    scores.trans_b = true;
    scores.alpha = float(1.0 / std::sqrt(double(C)));
    GemmParams mix;  // [L, L] x [L, C] -> [L, C]
    mix.trans_b = false;
    for (int64_t t = 0; t < T; ++t) {
        const TensorView rows = qkv.slice(0, t, 1).reshape(Shape{L, 3 * C});  // row stride 3C
        be.gemm(scores, rows.slice(1, 0, C), rows.slice(1, C, C), TensorView{}, logits);
        be.softmax(SoftmaxParams{}, logits, probs);
        be.gemm(mix, probs, rows.slice(1, 2 * C, C), TensorView{}, y.slice(0, t, 1).reshape(Shape{L, C}));
    }
}

// ---- Resample ----------------------------------------------------------------------------------

void Resample::load(WeightLoader& loader, const std::string& path, int channels, ResampleMode mode) {
    mode_ = mode;
    channels_ = channels;
    const int64_t C = channels, Co = out_channels();
    // resample = [ZeroPad2d | Upsample, Conv2d]
    conv_w_ = loader.require(path + "resample.1.weight", Shape{Co, C, 3, 3});
    conv_b_ = loader.require(path + "resample.1.bias", Shape{Co}, WeightInit::bias());
    conv_w5_ = conv_w_.view().reshape(Shape{Co, C, 1, 3, 3});  // Conv2d as a conv3d with kt = 1
    if (mode == ResampleMode::Down3d)
        time_conv_.load(loader, path + "time_conv.", channels, channels, {3, 1, 1}, {0, 0, 0});
    else if (mode == ResampleMode::Up3d)
        time_conv_.load(loader, path + "time_conv.", channels, 2 * channels, {3, 1, 1}, {1, 0, 0});
}

void Resample::keep_channels_last(Backend& be, std::vector<ChannelsLastWeight*>& fill) {
    conv_cl_.allocate(be, conv_w5_);
    fill.push_back(&conv_cl_);
    if (has_time_conv()) time_conv_.keep_channels_last(be, fill);
}

int Resample::out_channels() const {
    const bool up = mode_ == ResampleMode::Up2d || mode_ == ResampleMode::Up3d;
    return up ? channels_ / 2 : channels_;
}

Shape Resample::cache_shape(const Shape& in) const {
    switch (mode_) {
        case ResampleMode::Down3d:
            return Shape{1, (in[2] / 2) * (in[3] / 2), channels_};
        case ResampleMode::Up3d:
            return Shape{kCacheFrames, in[2] * in[3], channels_};
        default:
            return Shape{};
    }
}

Shape Resample::output_shape(const Shape& in, bool first) const {
    const int64_t T = in[1], H = in[2], W = in[3];
    switch (mode_) {
        case ResampleMode::Down2d:
            return Shape{channels_, T, H / 2, W / 2};
        case ResampleMode::Down3d:
            return Shape{channels_, first ? 1 + (T - 1) / 2 : T / 2, H / 2, W / 2};
        case ResampleMode::Up2d:
            return Shape{channels_ / 2, T, 2 * H, 2 * W};
        case ResampleMode::Up3d:
            return Shape{channels_ / 2, first ? 1 + 2 * (T - 1) : 2 * T, 2 * H, 2 * W};
    }
    return Shape{};
}

void Resample::spatial(Backend& be, const TensorView& x, const TensorView& out) const {
    Conv3dParams p;
    p.frames_2d = true;  // the reference's Conv2d over (b t) frames
    p.w_channels_last = conv_cl_.view();
    if (mode_ == ResampleMode::Down2d || mode_ == ResampleMode::Down3d) {
        // ZeroPad2d((0, 1, 0, 1)) then Conv2d(3, stride 2)
        p.stride[1] = p.stride[2] = 2;
        p.pad_after[1] = p.pad_after[2] = 1;
        conv3d_any_layout(be, p, x, conv_w5_, conv_b_, out);
        return;
    }
    ArenaScope scope(be.workspace());
    TensorView up = be.scratch(Shape{x.dim(0), x.dim(1), 2 * x.dim(2), 2 * x.dim(3)});
    upsample_nearest2x(be, x, up);
    p.pad_before[1] = p.pad_before[2] = p.pad_after[1] = p.pad_after[2] = 1;
    be.conv3d(p, up, conv_w5_, conv_b_, out);
}

void Resample::forward(Backend& be, const TensorView& x, TemporalCache* cache, const TensorView& out) const {
    check_activation(x, "resample input");
    const bool first = cache == nullptr || !cache->started;
    DZR_ASSERT(out.shape == output_shape(x.shape, first));
    if (is_channels_last(x)) {
        // the channels-last encoder: the downsamples only
        DZR_CHECK(mode_ == ResampleMode::Down2d || mode_ == ResampleMode::Down3d,
                  "vae: a channels-last resample input needs a downsample");
        DZR_ASSERT(x.dim(0) == channels_ && is_channels_last(out));
        if (mode_ == ResampleMode::Down2d)
            spatial(be, x, out);
        else
            forward_down3d_channels_last(be, x, cache, out);
        return;
    }
    DZR_ASSERT(x.dim(0) == channels_ && x.is_contiguous());
    switch (mode_) {
        case ResampleMode::Down2d:
        case ResampleMode::Up2d:
            spatial(be, x, out);
            return;
        case ResampleMode::Down3d:
            forward_down3d(be, x, cache, out);
            return;
        case ResampleMode::Up3d:
            forward_up3d(be, x, cache, out);
            return;
    }
}

void Resample::forward_down3d(Backend& be, const TensorView& x, TemporalCache* cache,
                              const TensorView& out) const {
    const bool first = cache == nullptr || !cache->started;
    const int64_t C = channels_, T = x.dim(1), h = x.dim(2) / 2, w = x.dim(3) / 2;
    ArenaScope scope(be.workspace());
    TensorView y = be.scratch(Shape{C, T, h, w});
    spatial(be, x, y);
    if (first) {
        // The first chunk's frames skip the time conv except through its stride-2 windows: frame 0
        // passes through, then windows (0,1,2), (2,3,4), ... (the whole-clip form of the rule).
        DZR_CHECK(T % 2 == 1,
                  "vae: a clip's first temporal chunk needs an odd frame count at a temporal "
                  "downsample, got {} frames",
                  T);
        const int64_t nconv = (T - 1) / 2;
        if (nconv == 0) {
            be.copy(y, out);
        } else {
            TensorView conv = be.scratch(Shape{C, nconv, h, w});
            time_conv_.convolve(be, y, 0, 2, conv);
            TensorView seq = be.scratch(Shape{1 + nconv, h * w, C});  // [frame 0 | windows] channels-last
            to_channels_last(be, y.slice(1, 0, 1), seq.slice(0, 0, 1));
            to_channels_last(be, conv, seq.slice(0, 1, nconv));
            to_channels_first(be, seq, out);
        }
    } else {
        // Later chunks: windows over [last frame of the previous chunk | this chunk].
        DZR_CHECK(T % 2 == 0,
                  "vae: a later temporal chunk needs an even frame count at a temporal downsample, "
                  "got {} frames",
                  T);
        TensorView seq = be.scratch(Shape{1 + T, h * w, C});
        be.copy(cache->buf.slice(0, 0, 1), seq.slice(0, 0, 1));
        to_channels_last(be, y, seq.slice(0, 1, T));
        TensorView input = be.scratch(Shape{C, 1 + T, h, w});
        to_channels_first(be, seq, input);
        time_conv_.convolve(be, input, 0, 2, out);
    }
    if (cache) {
        to_channels_last(be, y.slice(1, T - 1, 1), cache->buf.slice(0, 0, 1));
        cache->frames = 1;
        cache->started = true;
    }
}

void Resample::forward_down3d_channels_last(Backend& be, const TensorView& x, TemporalCache* cache,
                                            const TensorView& out) const {
    const bool first = cache == nullptr || !cache->started;
    const int64_t C = channels_, T = x.dim(1), h = x.dim(2) / 2, w = x.dim(3) / 2;
    ArenaScope scope(be.workspace());
    const TensorView y = scratch_channels_last(be, Shape{C, T, h, w});
    spatial(be, x, y);
    const TensorView y_rows = cl_rows(y), out_rows = cl_rows(out);  // [frames, h, w, C]: frames are blocks
    if (first) {
        // frame 0 passes through, then the windows (0,1,2), (2,3,4), ... (forward_down3d)
        DZR_CHECK(T % 2 == 1,
                  "vae: a clip's first temporal chunk needs an odd frame count at a temporal downsample, got {} frames",
                  T);
        const int64_t nconv = (T - 1) / 2;
        be.copy(y_rows.slice(0, 0, 1), out_rows.slice(0, 0, 1));
        if (nconv > 0) time_conv_.convolve(be, y, 0, 2, cl_view(out_rows.slice(0, 1, nconv)));
    } else {
        // windows over [last frame of the previous chunk | this chunk]
        DZR_CHECK(T % 2 == 0,
                  "vae: a later temporal chunk needs an even frame count at a temporal downsample, got {} frames", T);
        const TensorView seq = be.scratch(Shape{1 + T, h, w, C});
        be.copy(cache->buf.slice(0, 0, 1).reshape(Shape{1, h, w, C}), seq.slice(0, 0, 1));
        be.copy(y_rows, seq.slice(0, 1, T));
        time_conv_.convolve(be, cl_view(seq), 0, 2, out);
    }
    if (cache) {
        be.copy(y_rows.slice(0, T - 1, 1).reshape(Shape{1, h * w, C}), cache->buf.slice(0, 0, 1));
        cache->frames = 1;
        cache->started = true;
    }
}

void Resample::forward_up3d(Backend& be, const TensorView& x, TemporalCache* cache,
                            const TensorView& out) const {
    const bool first = cache == nullptr || !cache->started;
    const int64_t C = channels_, T = x.dim(1), H = x.dim(2), W = x.dim(3), HW = H * W;
    // The clip's first frame is not doubled; every later frame t gives frames 2t and 2t+1 through the
    // time conv, whose causal history starts (zero-padded) at the clip's second frame.
    const int64_t skip = first ? 1 : 0, n = T - skip, frames = skip + 2 * n;
    ArenaScope scope(be.workspace());
    TensorView doubled = be.scratch(Shape{C, frames, H, W});
    if (n == 0) {
        be.copy(x, doubled);
    } else {
        TensorView tc = be.scratch(Shape{2 * C, n, H, W});
        time_conv_.forward(be, x.slice(1, skip, n), cache, tc);
        // tc channels [s*C + c] hold frame 2t+s of channel c: view [C, n, 2, HW] (s stride C*n*HW)
        const int64_t plane = n * HW;
        if (first) {
            TensorView seq = be.scratch(Shape{frames, HW, C});  // [frame 0 | doubled frames] channels-last
            to_channels_last(be, x.slice(1, 0, 1), seq.slice(0, 0, 1));
            const TensorView pairs(tc.data, tc.dtype, Shape{n, 2, HW, C}, Shape{HW, C * plane, 1, plane},
                                   tc.device);
            be.copy(pairs, seq.slice(0, 1, 2 * n).reshape(Shape{n, 2, HW, C}));
            to_channels_first(be, seq, doubled);
        } else {
            const TensorView pairs(tc.data, tc.dtype, Shape{C, n, 2, HW}, Shape{plane, HW, C * plane, 1},
                                   tc.device);
            be.copy(pairs, doubled.reshape(Shape{C, n, 2, HW}));
        }
    }
    if (cache) cache->started = true;
    spatial(be, doubled, out);
}

}  // namespace dzr::vae
