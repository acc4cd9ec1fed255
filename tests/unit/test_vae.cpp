// WanVae end to end at a tiny geometry (base_dim 4, 24x40 frames -> 3x5 latents) against the literal
// reference chunk loop in double precision (tests/unit/test_vae_support.h), plus schedule
// equivalence, causality, shapes, the conditioning tensor, decode and the loader at the real layout.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>

#include "core/error.h"
#include "model/wan_vae.h"
#include "test_vae_support.h"
#include "weights/keys.h"

using namespace dzr;
using namespace dzr::test;

namespace {

constexpr int64_t kH = 24, kW = 40;  // latent 3 x 5: odd sizes exercise the right/bottom padding

Tensor encode(TinyVae& t, const Tensor& video, VaeSchedule schedule = VaeSchedule::Chunked) {
    Tensor latent = Tensor::host(t.vae->latent_shape(video.shape()), DType::F32);
    t.vae->encode(video.view(), latent.view(), VaePrecision::Eager, schedule);
    return latent;
}

Tensor decode(TinyVae& t, const Tensor& latent, VaeSchedule schedule = VaeSchedule::Chunked) {
    Tensor video = Tensor::host(t.vae->video_shape(latent.shape()), DType::F32);
    t.vae->decode(latent.view(), video.view(), schedule);
    return video;
}

bool all_finite(const Tensor& t) {
    for (float v : to_f32_vector(t.view()))
        if (!std::isfinite(v)) return false;
    return true;
}

}  // namespace

TEST_CASE("vae loads exactly the VAE tensors of the real DROID layout") {
    MeasuringBackend be(DType::BF16);
    const VaeConfig real;  // base_dim 96, z 16, dim_mult [1, 2, 4, 4], 2 res blocks
    const VaeWeightSource src = shape_only_vae_weights(real);
    WeightLoader loader(src, be);
    WanVae vae(loader, real);
    CHECK(loader.unused(std::string(keys::kVae)).empty());
    // dreamzero-reference.md §2.3: 194 tensors, 126,892,531 parameters (encoder + conv1 + conv2 + decoder)
    CHECK(loader.used().size() == 194);
    uint64_t params = 0;
    for (const auto& key : loader.used()) params += uint64_t(src.tensors.at(key).numel());
    CHECK(params == 126'892'531ull);
    CHECK(vae.latent_shape(Shape{3, 33, 352, 640}) == (Shape{16, 9, 44, 80}));
    CHECK(vae.conditioning_shape(33, 352, 640) == (Shape{20, 9, 44, 80}));
}

TEST_CASE("vae load names a missing or misshapen tensor") {
    const VaeConfig cfg = tiny_vae_config();
    auto be = make_cpu_backend(size_t(16) << 20);
    {
        VaeWeightSource src = random_vae_weights(cfg, 1);
        const std::string key = keys::vae_encoder_middle(1) + "to_qkv.bias";
        REQUIRE(src.tensors.erase(key) == 1);
        WeightLoader loader(src, *be);
        const std::string msg = error_of([&] { WanVae vae(loader, cfg); });
        CHECK(msg.find(key) != std::string::npos);
    }
    {
        VaeWeightSource src = random_vae_weights(cfg, 1);
        const std::string key = keys::vae_decoder_up(3) + "time_conv.weight";
        REQUIRE(src.tensors.count(key) == 1);
        src.tensors[key] = Tensor::host(Shape{32, 16, 3, 1, 2}, DType::F32);
        WeightLoader loader(src, *be);
        const std::string msg = error_of([&] { WanVae vae(loader, cfg); });
        CHECK(msg.find(key) != std::string::npos);
        CHECK(msg.find("[32, 16, 3, 1, 1]") != std::string::npos);
        CHECK(msg.find("[32, 16, 3, 1, 2]") != std::string::npos);
    }
    {
        VaeConfig bad = cfg;
        bad.temporal_downsample = {false, false, true};
        VaeWeightSource src = random_vae_weights(cfg, 1);
        WeightLoader loader(src, *be);
        CHECK(error_of([&] { WanVae vae(loader, bad); }).find("temporal_downsample") != std::string::npos);
    }
}

TEST_CASE("vae encode maps 1, 5, 9 and 33 frames to 1, 2, 3 and 9 latent frames") {
    TinyVae t;
    for (auto [frames, latents] : {std::pair<int64_t, int64_t>{1, 1}, {5, 2}, {9, 3}, {33, 9}}) {
        CAPTURE(frames);
        const Tensor latent = encode(t, random_video(frames, 16, 32, uint64_t(frames)));
        CHECK(latent.shape() == (Shape{16, latents, 2, 4}));
        CHECK(all_finite(latent));
    }
    CHECK(error_of([&] {
              (void)t.vae->latent_shape(Shape{3, 4, 16, 32});
          }).find("1 + 4k") != std::string::npos);
    CHECK(error_of([&] {
              (void)t.vae->latent_shape(Shape{3, 5, 20, 32});
          }).find("multiple of 8") != std::string::npos);
    CHECK(error_of([&] {
              (void)t.vae->latent_shape(Shape{4, 5, 16, 32});
          }).find("[3, T, H, W]") != std::string::npos);
    Tensor wrong = Tensor::host(Shape{16, 3, 2, 5}, DType::F32);
    const Tensor video = random_video(9, 16, 32, 3);
    CHECK(error_of([&] { t.vae->encode(video.view(), wrong.view()); }).find("latent must be [16, 3, 2, 4]") !=
          std::string::npos);
}

TEST_CASE("chunked encode equals one whole-clip causal pass bit for bit") {
    TinyVae t;
    for (int64_t frames : {5, 13}) {
        CAPTURE(frames);
        const Tensor video = random_video(frames, kH, kW, 40 + uint64_t(frames));
        const Tensor chunked = encode(t, video, VaeSchedule::Chunked);
        const Tensor whole = encode(t, video, VaeSchedule::WholeClip);
        CHECK(bit_equal(chunked.view(), whole.view()));
    }
}

TEST_CASE("vae encode matches the literal reference chunk loop in double precision") {
    VaeConfig wide = tiny_vae_config(8);  // twice the tiny.yaml width, with one residual block per stage
    wide.num_res_blocks = 1;
    for (const VaeConfig& cfg : {tiny_vae_config(4), wide}) {
        CAPTURE(cfg.base_dim);
        TinyVae t(cfg);
        const Tensor video = random_video(9, kH, kW, 5);
        const Tensor latent = encode(t, video);
        RefVae ref(t.source, t.config);
        const Vol expect = ref.encode(vol_from(video.view()));
        REQUIRE(latent.shape() == (Shape{expect.C, expect.T, expect.H, expect.W}));
        const double err = max_abs_diff(to_f32_vector(latent.view()), expect);
        MESSAGE("encode: max |ours - reference| = " << err << ", max |reference| = " << max_abs(expect));
        CHECK(max_abs(expect) > 0.1);
        CHECK(err <= 1e-4 * std::max(1.0, max_abs(expect)));
    }
}

TEST_CASE("latent frame j depends only on video frames up to 4j") {
    TinyVae t;
    const Tensor video = random_video(9, kH, kW, 6);
    for (VaeSchedule schedule : {VaeSchedule::Chunked, VaeSchedule::WholeClip}) {
        CAPTURE(int(schedule));
        const Tensor base = encode(t, video, schedule);
        for (int64_t from : {1, 5}) {
            CAPTURE(from);
            // perturb frames [from, 9): latent frames below (from + 3) / 4 must not move at all
            Tensor changed = Tensor::host_f32(video.shape(), to_f32_vector(video.view()));
            for (int64_t c = 0; c < 3; ++c)
                for (int64_t f = from; f < 9; ++f)
                    for (int64_t i = 0; i < kH * kW; ++i)
                        changed.ptr<float>()[(c * 9 + f) * kH * kW + i] *= -0.5f;
            const Tensor moved = encode(t, changed, schedule);
            const int64_t fixed = (from + 3) / 4;
            CHECK(bit_equal(moved.view().slice(1, 0, fixed), base.view().slice(1, 0, fixed)));
            CHECK_FALSE(bit_equal(moved.view().slice(1, fixed, 1), base.view().slice(1, fixed, 1)));
        }
    }
}

TEST_CASE("conditioning is a first-frame mask prepended to the encode of the frame and zero frames") {
    TinyVae t;
    for (int frames : {9, 33}) {
        CAPTURE(frames);
        const int64_t H = 16, W = 24;
        const Tensor frame = Tensor::host_f32(Shape{3, H, W}, random_floats(size_t(3 * H * W), 8));
        Tensor ys = Tensor::host(t.vae->conditioning_shape(frames, H, W), DType::F32);
        const int64_t K = 1 + (frames - 1) / 4;
        REQUIRE(ys.shape() == (Shape{20, K, 2, 3}));
        std::fill(ys.ptr<float>(), ys.ptr<float>() + ys.numel(), 7.0f);  // poison
        t.vae->encode_conditioning(frame.view(), frames, ys.view());

        for (int64_t c = 0; c < 4; ++c)
            for (int64_t k = 0; k < K; ++k)
                for (int64_t i = 0; i < 6; ++i)
                    CHECK(ys.ptr<float>()[(c * K + k) * 6 + i] == (k == 0 ? 1.0f : 0.0f));

        std::vector<float> clip(size_t(3 * frames * H * W), 0.0f);
        for (int64_t c = 0; c < 3; ++c)
            std::copy_n(frame.ptr<float>() + c * H * W, H * W, clip.begin() + c * frames * H * W);
        const Tensor latent = encode(t, Tensor::host_f32(Shape{3, frames, H, W}, clip));
        CHECK(bit_equal(ys.view().slice(0, 4, 16), latent.view()));
    }
}

TEST_CASE("vae decode matches the literal reference and clamps to [-1, 1]") {
    VaeConfig wide = tiny_vae_config(8);
    wide.num_res_blocks = 1;
    for (const VaeConfig& cfg : {tiny_vae_config(4), wide}) {
        CAPTURE(cfg.base_dim);
        TinyVae t(cfg);
        // NOTE: push the output head's bias so channel 0 saturates above 1 and channel 1 below -1, which
        // makes the clamp visible whatever the random weights do.
        Tensor& head_bias = t.source.tensors.at(keys::vae_decoder("head.2.bias"));
        head_bias.ptr<float>()[0] = 4.0f;
        head_bias.ptr<float>()[1] = -4.0f;
        t.vae = std::make_unique<WanVae>(*t.loader, t.config);

        const Tensor latent = Tensor::host_f32(Shape{16, 3, 3, 5}, random_floats(16 * 3 * 15, 9, -2.f, 2.f));
        const Tensor video = decode(t, latent);
        CHECK(video.shape() == (Shape{3, 9, 24, 40}));
        RefVae ref(t.source, t.config);
        const Vol expect = ref.decode(vol_from(latent.view()));
        REQUIRE(video.shape() == (Shape{expect.C, expect.T, expect.H, expect.W}));
        const double err = max_abs_diff(to_f32_vector(video.view()), expect);
        MESSAGE("decode: max |ours - reference| = " << err);
        CHECK(err <= 1e-4);

        int64_t at_top = 0, at_bottom = 0, inside = 0;
        for (float v : to_f32_vector(video.view())) {
            CHECK(v >= -1.0f);
            CHECK(v <= 1.0f);
            at_top += v == 1.0f;
            at_bottom += v == -1.0f;
            inside += std::abs(v) < 1.0f;
        }
        CHECK(at_top > 0);
        CHECK(at_bottom > 0);
        CHECK(inside > 0);
    }
}

TEST_CASE("vae decode maps 1, 2 and 3 latent frames to 1, 5 and 9 frames, chunked equal to whole-clip") {
    TinyVae t;
    for (int64_t K : {1, 2, 3}) {
        CAPTURE(K);
        const Tensor latent =
            Tensor::host_f32(Shape{16, K, 2, 3}, random_floats(size_t(16 * K * 6), 10 + uint64_t(K)));
        const Tensor chunked = decode(t, latent, VaeSchedule::Chunked);
        CHECK(chunked.shape() == (Shape{3, 1 + 4 * (K - 1), 16, 24}));
        const Tensor whole = decode(t, latent, VaeSchedule::WholeClip);
        CHECK(bit_equal(chunked.view(), whole.view()));
        CHECK(all_finite(chunked));
    }
    CHECK(error_of([&] {
              (void)t.vae->video_shape(Shape{8, 2, 2, 3});
          }).find("latent must be [16, K, h, w]") != std::string::npos);
}

TEST_CASE("vae encode and decode are deterministic and leave the workspace as they found it") {
    TinyVae t;
    const Tensor video = random_video(5, 16, 24, 12);
    const size_t used = t.be->workspace().used();
    const Tensor a = encode(t, video);
    const Tensor b = encode(t, video);
    CHECK(bit_equal(a.view(), b.view()));
    CHECK(all_finite(a));
    const Tensor va = decode(t, a);
    const Tensor vb = decode(t, b);
    CHECK(bit_equal(va.view(), vb.view()));
    CHECK(all_finite(va));
    CHECK(t.be->workspace().used() == used);
}

TEST_CASE("vae without its decoder loads the encoder only and refuses to decode") {
    VaeConfig cfg = tiny_vae_config();
    cfg.has_decoder = false;
    auto be = make_cpu_backend(size_t(64) << 20);
    VaeWeightSource src = random_vae_weights(cfg, 2);
    WeightLoader loader(src, *be);
    WanVae vae(loader, cfg);
    CHECK(loader.unused(std::string(keys::kVae)).empty());
    Tensor latent = Tensor::host(Shape{16, 1, 2, 3}, DType::F32);
    Tensor video = Tensor::host(Shape{3, 1, 16, 24}, DType::F32);
    CHECK(error_of([&] { vae.decode(latent.view(), video.view()); }).find("without its decoder") !=
          std::string::npos);
}

TEST_CASE("chunked encode at the real geometry needs a workspace that does not grow with the clip") {
    // bf16 activations, as on the CUDA backend; 352 x 640 canvas, base_dim 96
    const VaeConfig real;
    auto peak = [&](int64_t frames, VaeSchedule schedule, bool conditioning, bool decoding = false) {
        MeasuringBackend be(DType::BF16);
        const VaeWeightSource src = shape_only_vae_weights(real);
        WeightLoader loader(src, be);
        WanVae vae(loader, real);
        if (conditioning) {
            const TensorView frame(fake_address(), DType::BF16, Shape{3, 352, 640}, Device::cpu());
            const TensorView ys(fake_address(), DType::BF16, vae.conditioning_shape(int(frames), 352, 640),
                                Device::cpu());
            vae.encode_conditioning(frame, int(frames), ys);
        } else if (decoding) {
            const TensorView latent(fake_address(), DType::BF16, Shape{16, frames, 44, 80}, Device::cpu());
            const TensorView video(fake_address(), DType::BF16, vae.video_shape(latent.shape), Device::cpu());
            vae.decode(latent, video, schedule);
        } else {
            const TensorView video(fake_address(), DType::BF16, Shape{3, frames, 352, 640}, Device::cpu());
            const TensorView latent(fake_address(), DType::BF16, vae.latent_shape(video.shape),
                                    Device::cpu());
            vae.encode(video, latent, VaePrecision::Eager, schedule);
        }
        CHECK(be.workspace().used() == 0);
        return be.workspace().high_water();
    };
    const size_t p9 = peak(9, VaeSchedule::Chunked, false);
    const size_t p33 = peak(33, VaeSchedule::Chunked, false);
    const size_t cond = peak(33, VaeSchedule::Chunked, true);
    const size_t whole33 = peak(33, VaeSchedule::WholeClip, false);
    const size_t dec3 = peak(3, VaeSchedule::Chunked, false, true);
    const size_t dec9 = peak(9, VaeSchedule::Chunked, false, true);
    MESSAGE("bf16 workspace peak, 352x640: chunked encode 9 frames "
            << p9 << " B, 33 frames " << p33 << " B, 33-frame conditioning " << cond
            << " B, whole-clip 33 frames " << whole33 << " B; chunked decode 3 latent frames " << dec3
            << " B, 9 latent frames " << dec9 << " B");
    CHECK(p9 == p33);
    CHECK(dec3 == dec9);
    // the conditioning adds only its 33-frame input clip (3 x 33 x 352 x 640 bf16, arena-aligned)
    CHECK(cond == p33 + (size_t(3 * 33 * 352 * 640 * 2 + 255) / 256 * 256));
    CHECK(whole33 > 4 * p33);
    // docs/VAE.md: the chunked encode fits in 2 GiB of bf16 workspace at the DROID geometry
    CHECK(p33 < (size_t(2) << 30));
}

TEST_CASE("the channels-last encoder computes what the channels-first encoder does, in every schedule") {
    // NOTE: on the CPU the channels-last convolutions run transposed around the channels-first one, and the norms
    // read the same rows, so the two layouts must agree exactly: any bookkeeping slip (a frame, a cache, a padding,
    // a transposed view) shows. Compared as floats, so a zero's sign (an explicit zero frame against skipped taps)
    // does not count.
    TinyVae t(tiny_vae_config(8));
    const size_t used = t.be->workspace().used();
    for (auto [frames, schedule] : {std::pair{int64_t(9), VaeSchedule::Chunked}, {int64_t(1), VaeSchedule::Chunked},
                                    {int64_t(13), VaeSchedule::Chunked}, {int64_t(9), VaeSchedule::WholeClip},
                                    {int64_t(5), VaeSchedule::WholeClip}}) {
        CAPTURE(frames);
        CAPTURE(int(schedule));
        const Tensor video = random_video(frames, kH, kW, 70 + uint64_t(frames));
        t.vae->set_channels_last_encoder(false);
        const Tensor cf = encode(t, video, schedule);
        t.vae->set_channels_last_encoder(true);
        const Tensor cl = encode(t, video, schedule);
        t.vae->set_channels_last_encoder(std::nullopt);
        CHECK(to_f32_vector(cf.view()) == to_f32_vector(cl.view()));
        CHECK(all_finite(cl));
    }
    // the conditioning encode (33 frames, autocast) too
    const Tensor frame = Tensor::host_f32(Shape{3, kH, kW}, random_floats(size_t(3 * kH * kW), 5));
    Tensor ys_cf = Tensor::host(t.vae->conditioning_shape(33, kH, kW), DType::F32);
    Tensor ys_cl = Tensor::host(ys_cf.shape(), DType::F32);
    t.vae->set_channels_last_encoder(false);
    t.vae->encode_conditioning(frame.view(), 33, ys_cf.view());
    t.vae->set_channels_last_encoder(true);
    t.vae->encode_conditioning(frame.view(), 33, ys_cl.view());
    CHECK(to_f32_vector(ys_cf.view()) == to_f32_vector(ys_cl.view()));
    CHECK(t.be->workspace().used() == used);
}
