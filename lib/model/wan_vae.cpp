#include "model/wan_vae.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/error.h"
#include "core/half.h"
#include "weights/keys.h"

namespace dzr {

using vae::AttentionBlock;
using vae::Resample;
using vae::ResampleMode;
using vae::ResidualBlock;

const std::array<float, 16> WanVae::kLatentMean = {-0.7571f, -0.7089f, -0.9113f, 0.1075f,  -0.1745f, 0.9653f,
                                                   -0.1517f, 1.5508f,  0.4134f,  -0.0715f, 0.5517f,  -0.3632f,
                                                   -0.1922f, -0.9497f, 0.2503f,  -0.2921f};
const std::array<float, 16> WanVae::kLatentStd = {2.8184f, 1.4541f, 2.3275f, 2.6558f, 1.2196f, 1.7708f,
                                                  2.6052f, 2.0743f, 3.2687f, 2.1526f, 2.8652f, 1.5579f,
                                                  1.6382f, 1.1253f, 2.8251f, 1.9160f};

namespace {

/// Activation bytes one chunk of a Net needs for its block outputs (ping-pong) and the shapes of
/// its temporal caches, from a walk over shapes only.
struct NetPlan {
    int64_t max_numel = 0;
    std::vector<Shape> cache_shapes;
    Shape out;
};

Shape block_output(const WanVae::Net::Block& block, const Shape& in, bool first) {
    return std::visit(
        [&](const auto& b) -> Shape {
            using B = std::decay_t<decltype(b)>;
            if constexpr (std::is_same_v<B, ResidualBlock>)
                return Shape{b.out_channels(), in[1], in[2], in[3]};
            else if constexpr (std::is_same_v<B, AttentionBlock>)
                return in;
            else
                return b.output_shape(in, first);
        },
        block);
}

NetPlan plan_net(const WanVae::Net& net, const Shape& in, bool first) {
    NetPlan plan;
    plan.cache_shapes.resize(size_t(net.num_caches));
    auto history = [](const Shape& s, int64_t channels) {
        return Shape{vae::kCacheFrames, s[2] * s[3], channels};
    };
    plan.cache_shapes[0] = history(in, net.conv_in.in_channels());
    Shape s{net.conv_in.out_channels(), in[1], in[2], in[3]};
    plan.max_numel = s.numel();
    for (size_t i = 0; i < net.blocks.size(); ++i) {
        const int slot = net.cache_slot[i];
        if (const auto* r = std::get_if<ResidualBlock>(&net.blocks[i])) {
            plan.cache_shapes[size_t(slot)] = history(s, r->in_channels());
            plan.cache_shapes[size_t(slot) + 1] = history(s, r->out_channels());
        } else if (const auto* rs = std::get_if<Resample>(&net.blocks[i]); rs && rs->has_time_conv()) {
            plan.cache_shapes[size_t(slot)] = rs->cache_shape(s);
        }
        s = block_output(net.blocks[i], s, first);
        plan.max_numel = std::max(plan.max_numel, s.numel());
    }
    plan.cache_shapes.back() = history(s, net.head_conv.in_channels());
    plan.out = Shape{net.head_conv.out_channels(), s[1], s[2], s[3]};
    plan.max_numel = std::max(plan.max_numel, plan.out.numel());
    return plan;
}

/// Gives every temporal cache of `net` a fresh (empty) buffer from the workspace.
void start_caches(Backend& be, WanVae::Net& net, const NetPlan& plan) {
    for (size_t i = 0; i < net.caches.size(); ++i) {
        net.caches[i] = vae::TemporalCache{};
        net.caches[i].buf = be.scratch(plan.cache_shapes[i]);
    }
}

/// One chunk through `net`: block outputs alternate between `ping` and `pong`; the returned view
/// (the head output) lives in one of them.
TensorView run_net(Backend& be, WanVae::Net& net, const TensorView& x, bool cached, const TensorView& ping,
                   const TensorView& pong, const WanVae::TraceFn& trace = {}, bool channels_last = false) {
    vae::TemporalCache* caches = cached ? net.caches.data() : nullptr;
    auto cache = [&](int slot) { return caches && slot >= 0 ? caches + slot : nullptr; };
    const TensorView* bufs[2] = {&ping, &pong};
    int which = 0;
    // channels-last: every block output is a channels-last view (the blocks follow their input's layout)
    auto next = [&](const Shape& shape) {
        TensorView v = channels_last ? vae::carve_channels_last(*bufs[which], shape) : vae::carve(*bufs[which], shape);
        which ^= 1;
        return v;
    };
    TensorView cur = next(Shape{net.conv_in.out_channels(), x.dim(1), x.dim(2), x.dim(3)});
    net.conv_in.forward(be, x, cache(0), cur);
    if (trace) trace("vae.conv_in", -1, cur);
    for (size_t i = 0; i < net.blocks.size(); ++i) {
        vae::TemporalCache* c = cache(net.cache_slot[i]);
        const bool first = c == nullptr || !c->started;
        TensorView out = next(block_output(net.blocks[i], cur.shape, first));
        std::visit(
            [&](const auto& b) {
                using B = std::decay_t<decltype(b)>;
                if constexpr (std::is_same_v<B, AttentionBlock>)
                    b.forward(be, cur, out);
                else if constexpr (std::is_same_v<B, ResidualBlock>)
                    b.forward(be, cur, c, out);
                else
                    b.forward(be, cur, c, out);
            },
            net.blocks[i]);
        cur = out;
        if (trace) trace("vae.block", int(i), cur);
    }
    TensorView out = next(Shape{net.head_conv.out_channels(), cur.dim(1), cur.dim(2), cur.dim(3)});
    net.head_conv.forward_normed(be, net.head_norm, cur, cache(net.num_caches - 1), out);
    if (trace) trace("vae.head", -1, out);
    return out;
}

/// Numbers the temporal caches: conv_in, two per residual block, one per resample time conv, head.
void assign_cache_slots(WanVae::Net& net) {
    int slot = 1;
    net.cache_slot.clear();
    for (const auto& block : net.blocks) {
        if (std::holds_alternative<ResidualBlock>(block)) {
            net.cache_slot.push_back(slot);
            slot += ResidualBlock::kNumCaches;
        } else if (const auto* rs = std::get_if<Resample>(&block); rs && rs->has_time_conv()) {
            net.cache_slot.push_back(slot++);
        } else {
            net.cache_slot.push_back(-1);
        }
    }
    net.num_caches = slot + 1;
    net.caches.assign(size_t(net.num_caches), vae::TemporalCache{});
}

template <typename B, typename... Args>
void add_block(WanVae::Net& net, WeightLoader& loader, const std::string& path, Args... args) {
    net.blocks.emplace_back(std::in_place_type<B>);
    std::get<B>(net.blocks.back()).load(loader, path, args...);
}

/// `v` rounded to the backend's compute dtype (the reference casts the latent statistics to the
/// activation dtype before applying them).
float in_compute_dtype(const Backend& be, float v) {
    switch (be.compute_dtype()) {
        case DType::BF16:
            return bf16_to_f32(f32_to_bf16(v));
        case DType::F16:
            return f16_to_f32(f32_to_f16(v));
        default:
            return v;
    }
}

void check_io(const Backend& be, const TensorView& t, const Shape& shape, const char* op, const char* what) {
    DZR_CHECK(t.shape == shape, "vae {}: {} must be {}, got {}", op, what, shape.str(), t.shape.str());
    DZR_CHECK(t.dtype == be.compute_dtype() && t.device == be.device(), "vae {}: {} must be {} on {}, got {}",
              op, what, dtype_name(be.compute_dtype()), be.device().str(), t.str());
    DZR_CHECK(t.is_contiguous(), "vae {}: {} must be contiguous ({})", op, what, t.str());
}

}  // namespace

WanVae::WanVae(WeightLoader& loader, const VaeConfig& config) : be_(loader.backend()), config_(config) {
    const size_t stages = config_.dim_mult.size();
    DZR_CHECK(config_.base_dim > 0 && config_.num_res_blocks >= 0 && stages >= 2,
              "vae config: base_dim {} / num_res_blocks {} / {} dim_mult stages are not a valid Wan VAE",
              config_.base_dim, config_.num_res_blocks, stages);
    // NOTE: the reference decoder halves the input channels of stages 1..3 only (after each upsample),
    // which fits at most 4 stages.
    DZR_CHECK(stages <= 4, "vae config: dim_mult has {} stages, the Wan VAE layout supports at most 4",
              stages);
    DZR_CHECK(config_.temporal_downsample.size() == stages - 1,
              "vae config: temporal_downsample needs {} entries (one per downsample), got {}", stages - 1,
              config_.temporal_downsample.size());
    const auto temporal =
        std::count(config_.temporal_downsample.begin(), config_.temporal_downsample.end(), true);
    // NOTE: the reference chunking (frame 0, then 4 frames) assumes a temporal factor of exactly 4.
    DZR_CHECK(temporal == 2,
              "vae config: temporal_downsample must downsample time exactly twice (factor 4), "
              "got {} temporal downsamples",
              temporal);
    DZR_CHECK(config_.z_dim == int(kLatentMean.size()),
              "vae config: z_dim {} unsupported: the Wan2.1 latent statistics are defined for z_dim {}",
              config_.z_dim, kLatentMean.size());
    spatial_factor_ = 1 << int(stages - 1);

    load_encoder(loader);
    const int z = config_.z_dim;
    conv1_.load(loader, keys::vae("conv1."), 2 * z, 2 * z, {1, 1, 1}, {0, 0, 0});
    // NOTE: conv2 belongs to VideoVAE_ itself, so the checkpoint holds it even without a decoder.
    conv2_.load(loader, keys::vae("conv2."), z, z, {1, 1, 1}, {0, 0, 0});
    if (config_.has_decoder) load_decoder(loader);
}

WanVae::~WanVae() = default;

void WanVae::load_encoder(WeightLoader& loader) {
    Net& net = encoder_;
    const int b = config_.base_dim, stages = int(config_.dim_mult.size());
    std::vector<int> dims{b};  // [b] + [b * m for m in dim_mult]
    for (int m : config_.dim_mult) dims.push_back(b * m);
    net.conv_in.load(loader, keys::vae_encoder("conv1."), 3, dims[0], {3, 3, 3}, {1, 1, 1});
    int idx = 0;
    for (int i = 0; i < stages; ++i) {
        int in = dims[size_t(i)];
        const int out = dims[size_t(i) + 1];
        for (int r = 0; r < config_.num_res_blocks; ++r, in = out)
            add_block<ResidualBlock>(net, loader, keys::vae_encoder_down(idx++), in, out);
        if (i != stages - 1) {
            const bool temporal = config_.temporal_downsample[size_t(i)];
            add_block<Resample>(net, loader, keys::vae_encoder_down(idx++), out,
                                temporal ? ResampleMode::Down3d : ResampleMode::Down2d);
        }
    }
    const int top = dims.back();
    add_block<ResidualBlock>(net, loader, keys::vae_encoder_middle(0), top, top);
    add_block<AttentionBlock>(net, loader, keys::vae_encoder_middle(1), top);
    add_block<ResidualBlock>(net, loader, keys::vae_encoder_middle(2), top, top);
    // head = [RMS_norm, SiLU, CausalConv3d] -> mean and log-variance
    net.head_norm.load(loader, keys::vae_encoder("head.0.gamma"), top, false);
    net.head_conv.load(loader, keys::vae_encoder("head.2."), top, 2 * config_.z_dim, {3, 3, 3}, {1, 1, 1});
    assign_cache_slots(net);
    // NOTE: fast numerics' convolutions read their weights channels-last; the encoder keeps a channels-last copy of
    // each (about its conv weights' size again, allocated here so that a measured load counts it) rather than
    // transposing every weight on every chunk. The decoder (a --save-video extra) transposes on the fly.
    Backend& be = loader.backend();
    net.conv_in.keep_channels_last(be, encoder_cl_weights_);
    for (auto& block : net.blocks)
        std::visit(
            [&](auto& b) {
                using B = std::decay_t<decltype(b)>;
                if constexpr (!std::is_same_v<B, AttentionBlock>) b.keep_channels_last(be, encoder_cl_weights_);
            },
            block);
    net.head_conv.keep_channels_last(be, encoder_cl_weights_);
}

void WanVae::load_decoder(WeightLoader& loader) {
    Net& net = decoder_;
    const int b = config_.base_dim, stages = int(config_.dim_mult.size());
    std::vector<int> dims{b * config_.dim_mult.back()};  // [b * mult[-1]] + [b * m for m in reversed(mult)]
    for (auto it = config_.dim_mult.rbegin(); it != config_.dim_mult.rend(); ++it) dims.push_back(b * *it);
    const int top = dims[0];
    net.conv_in.load(loader, keys::vae_decoder("conv1."), config_.z_dim, top, {3, 3, 3}, {1, 1, 1});
    add_block<ResidualBlock>(net, loader, keys::vae_decoder_middle(0), top, top);
    add_block<AttentionBlock>(net, loader, keys::vae_decoder_middle(1), top);
    add_block<ResidualBlock>(net, loader, keys::vae_decoder_middle(2), top, top);
    int idx = 0;
    for (int i = 0; i < stages; ++i) {
        // every stage after the first starts from the previous upsample's halved channels
        int in = i == 0 ? dims[0] : dims[size_t(i)] / 2;
        const int out = dims[size_t(i) + 1];
        for (int r = 0; r < config_.num_res_blocks + 1; ++r, in = out)
            add_block<ResidualBlock>(net, loader, keys::vae_decoder_up(idx++), in, out);
        if (i != stages - 1) {
            // temporal_upsample = reversed(temporal_downsample)
            const bool temporal = config_.temporal_downsample[size_t(stages - 2 - i)];
            add_block<Resample>(net, loader, keys::vae_decoder_up(idx++), out,
                                temporal ? ResampleMode::Up3d : ResampleMode::Up2d);
        }
    }
    const int last = dims.back();
    net.head_norm.load(loader, keys::vae_decoder("head.0.gamma"), last, false);
    net.head_conv.load(loader, keys::vae_decoder("head.2."), last, 3, {3, 3, 3}, {1, 1, 1});
    assign_cache_slots(net);
}

Shape WanVae::latent_shape(const Shape& video) const {
    DZR_CHECK(video.rank() == 4 && video[0] == 3, "vae encode: video must be [3, T, H, W], got {}",
              video.str());
    const int64_t T = video[1], H = video[2], W = video[3], f = spatial_factor_;
    DZR_CHECK(T >= 1 && (T - 1) % kChunkFrames == 0,
              "vae encode: video has {} frames, the causal VAE needs 1 + 4k frames", T);
    DZR_CHECK(H > 0 && W > 0 && H % f == 0 && W % f == 0,
              "vae encode: video size {}x{} must be a positive multiple of {} in both H and W", H, W, f);
    return Shape{config_.z_dim, 1 + (T - 1) / kChunkFrames, H / f, W / f};
}

Shape WanVae::video_shape(const Shape& latent) const {
    DZR_CHECK(
        latent.rank() == 4 && latent[0] == config_.z_dim && latent[1] >= 1 && latent[2] > 0 && latent[3] > 0,
        "vae decode: latent must be [{}, K, h, w] with K >= 1, got {}", config_.z_dim, latent.str());
    return Shape{3, 1 + kChunkFrames * (latent[1] - 1), latent[2] * spatial_factor_,
                 latent[3] * spatial_factor_};
}

Shape WanVae::conditioning_shape(int num_frames, int64_t height, int64_t width) const {
    Shape s = latent_shape(Shape{3, num_frames, height, width});
    s[0] = kMaskChannels + config_.z_dim;
    return s;
}

void WanVae::encode(const TensorView& video, const TensorView& latent, VaePrecision precision,
                    VaeSchedule schedule) {
    // NOTE: the reference's two regimes of the encoder (docs/VAE.md "Precision") are the backend's autocast
    // state, as they are torch.autocast's in the reference
    AutocastScope autocast(be_, precision == VaePrecision::Autocast);
    const Shape lat = latent_shape(video.shape);
    check_io(be_, video, video.shape, "encode", "video");
    check_io(be_, latent, lat, "encode", "latent");
    const int64_t T = video.dim(1), H = video.dim(2), W = video.dim(3);
    const bool chunked = schedule == VaeSchedule::Chunked;

    // NOTE: the trace's consumers read channels-first tensors: a traced encode stays channels-first
    const bool channels_last =
        !trace_ && channels_last_encoder_.value_or(be_.numerics() == Numerics::Fast &&
                                                   be_.capabilities().conv_channels_last);
    for (vae::ChannelsLastWeight* w : encoder_cl_weights_) w->fill(be_);  // once, on the first encode
    ArenaScope scope(be_.workspace());
    const NetPlan plan = plan_net(encoder_, Shape{3, chunked ? 1 : T, H, W}, true);
    int64_t max_numel = plan.max_numel;
    if (chunked && T > 1)
        max_numel = std::max(max_numel, plan_net(encoder_, Shape{3, kChunkFrames, H, W}, false).max_numel);
    if (chunked) start_caches(be_, encoder_, plan);
    const TensorView ping = be_.scratch(Shape{max_numel});
    const TensorView pong = be_.scratch(Shape{max_numel});

    for (int64_t t0 = 0, l0 = 0; t0 < T;) {
        const int64_t frames = !chunked ? T : (t0 == 0 ? 1 : kChunkFrames);
        ArenaScope chunk(be_.workspace());
        TensorView x = be_.scratch(Shape{3, frames, H, W});
        be_.copy(video.slice(1, t0, frames), x);
        // [2z, frames', h, w]; the first chunk traced, and the second as "vae.chunk1.<name>" (parity diagnostics)
        TraceFn chunk_trace;
        if (trace_ && t0 == 0) {
            chunk_trace = trace_;
        } else if (trace_ && t0 == 1) {
            chunk_trace = [this](const char* name, int layer, const TensorView& t) {
                const char* dot = std::strchr(name, '.');
                trace_(("vae.chunk1." + std::string(dot ? dot + 1 : name)).c_str(), layer, t);
            };
        }
        const TensorView h = run_net(be_, encoder_, x, chunked, ping, pong, chunk_trace, channels_last);
        TensorView moments = be_.scratch(h.shape);
        conv1_.forward(be_, h, nullptr, moments);
        // mu = moments[:z] (the log-variance half is unused); latent = (mu - mean) * (1 / std), with 1/std
        // formed in f32 and both constants cast to the activation dtype, one rounding per op as in VAE.py
        const int64_t lf = h.dim(1);
        for (int c = 0; c < config_.z_dim; ++c) {
            const float mean = in_compute_dtype(be_, kLatentMean[size_t(c)]);
            const float inv_std = in_compute_dtype(be_, 1.0f / kLatentStd[size_t(c)]);
            const TensorView dst = latent.slice(0, c, 1).slice(1, l0, lf);
            be_.scale(ScaleParams{1.0f, -mean}, moments.slice(0, c, 1), dst);
            be_.scale(ScaleParams{inv_std, 0.0f}, dst, dst);
        }
        t0 += frames;
        l0 += lf;
        DZR_ASSERT(l0 <= lat[1]);
    }
}

void WanVae::encode_conditioning(const TensorView& frame, int num_frames, const TensorView& ys,
                                 VaePrecision precision) {
    DZR_CHECK(frame.rank() == 3 && frame.dim(0) == 3, "vae conditioning: frame must be [3, H, W], got {}",
              frame.str());
    const int64_t H = frame.dim(1), W = frame.dim(2);
    const Shape ys_shape = conditioning_shape(num_frames, H, W);
    check_io(be_, frame, frame.shape, "conditioning", "frame");
    check_io(be_, ys, ys_shape, "conditioning", "ys");

    ArenaScope scope(be_.workspace());
    // clip = [frame, zeros x (num_frames - 1)]  (zeros are mid-grey in [-1, 1])
    TensorView clip = be_.scratch(Shape{3, num_frames, H, W});
    be_.fill(clip, 0.0f);
    for (int c = 0; c < 3; ++c) be_.copy(frame.slice(0, c, 1), clip.slice(0, c, 1).slice(1, 0, 1));
    // mask channels: 1 at latent frame 0, 0 elsewhere
    for (int c = 0; c < kMaskChannels; ++c) {
        be_.fill(ys.slice(0, c, 1), 0.0f);
        be_.fill(ys.slice(0, c, 1).slice(1, 0, 1), 1.0f);
    }
    encode(clip, ys.slice(0, kMaskChannels, config_.z_dim), precision);
}

void WanVae::decode(const TensorView& latent, const TensorView& video, VaeSchedule schedule) {
    AutocastScope eager(be_, false);  // the reference decodes with plain bf16 eager ops
    DZR_CHECK(config_.has_decoder,
              "vae decode: the VAE was loaded without its decoder (has_decoder = false)");
    const Shape vs = video_shape(latent.shape);
    check_io(be_, latent, latent.shape, "decode", "latent");
    check_io(be_, video, vs, "decode", "video");
    const int z = config_.z_dim;
    const int64_t K = latent.dim(1), h = latent.dim(2), w = latent.dim(3);
    const bool chunked = schedule == VaeSchedule::Chunked;

    ArenaScope scope(be_.workspace());
    const NetPlan plan = plan_net(decoder_, Shape{z, chunked ? 1 : K, h, w}, true);
    int64_t max_numel = plan.max_numel;
    if (chunked && K > 1)
        max_numel = std::max(max_numel, plan_net(decoder_, Shape{z, 1, h, w}, false).max_numel);
    if (chunked) start_caches(be_, decoder_, plan);
    const TensorView ping = be_.scratch(Shape{max_numel});
    const TensorView pong = be_.scratch(Shape{max_numel});

    for (int64_t k0 = 0, v0 = 0; k0 < K;) {
        const int64_t frames = chunked ? 1 : K;
        ArenaScope chunk(be_.workspace());
        // z * std + mean
        // NOTE: the reference divides by (1 / std); multiplying by std differs by at most an ulp.
        TensorView zc = be_.scratch(Shape{z, frames, h, w});
        for (int c = 0; c < z; ++c)
            be_.scale(ScaleParams{kLatentStd[size_t(c)], kLatentMean[size_t(c)]},
                      latent.slice(0, c, 1).slice(1, k0, frames), zc.slice(0, c, 1));
        TensorView x = be_.scratch(zc.shape);
        conv2_.forward(be_, zc, nullptr, x);
        const TensorView out = run_net(be_, decoder_, x, chunked, ping, pong);  // [3, frames', H, W], eager
        vae::clamp_unit(be_, out, out);
        const int64_t vf = out.dim(1);
        DZR_ASSERT(v0 + vf <= vs[1]);
        for (int c = 0; c < 3; ++c) be_.copy(out.slice(0, c, 1), video.slice(0, c, 1).slice(1, v0, vf));
        k0 += frames;
        v0 += vf;
    }
}

}  // namespace dzr
