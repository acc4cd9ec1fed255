// Fast numerics' convolutions on the GPU (backend/cuda/cuda_conv_fast.cpp): the channels-last path (forced with
// ConvTune::ChannelsLast, so it runs whatever the timing says) against an exact double-precision convolution at
// the VAE's paddings and strides, with a bound derived from bf16 rounding; the VAE encode in fast numerics against
// the f32 CPU encode, as close as reference numerics' encode is; a tuned plan replayed bit for bit; and a forward
// that fits the workspace its measurement declared.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/measuring_backend.h"
#include "core/half.h"
#include "support/test_support.h"
#include "unit/test_vae_support.h"

DZR_TEST_REQUIRES_GPU()

using namespace dzr;
using namespace dzr::test;

namespace {

float bf16r(float v) { return bf16_to_f32(f32_to_bf16(v)); }

std::vector<float> bf16_rounded(std::vector<float> v) {
    for (float& x : v) x = bf16r(x);
    return v;
}

std::unique_ptr<Backend> gpu(Numerics numerics, ConvTune tune, size_t workspace = size_t(256) << 20) {
    BackendOptions o;
    o.numerics = numerics;
    o.cuda.conv_tune = tune;
    o.workspace_bytes = workspace;
    return make_cuda_backend(0, o);
}

Tensor upload(Backend& be, const Shape& shape, const std::vector<float>& values) {
    Tensor d = be.alloc(shape, be.compute_dtype());
    be.upload(Tensor::host_f32(shape, values), d);
    return d;
}

std::vector<float> download(Backend& be, const TensorView& t) {
    Tensor host = Tensor::host(t.shape, DType::F32);
    be.download(t, host);
    return to_f32_vector(host);
}

struct ConvCase {
    const char* what;
    int64_t Ci, Co, T, H, W;
    std::array<int, 3> k, stride, pad_before, pad_after;
    bool frames_2d;
};

// The VAE's convolutions, at small sizes with channel counts cuDNN's channels-last kernels take (multiples of 8).
const ConvCase kConvCases[] = {
    {"causal 3x3x3, two zero frames", 16, 24, 3, 10, 12, {3, 3, 3}, {1, 1, 1}, {2, 1, 1}, {0, 1, 1}, false},
    {"causal 3x3x3, one zero frame", 16, 16, 5, 10, 12, {3, 3, 3}, {1, 1, 1}, {1, 1, 1}, {0, 1, 1}, false},
    {"3x3x3 after the cache (symmetric)", 24, 16, 6, 9, 7, {3, 3, 3}, {1, 1, 1}, {0, 1, 1}, {0, 1, 1}, false},
    {"downsample: pad right/bottom, stride 2 (per frame)", 16, 16, 4, 10, 14, {1, 3, 3}, {1, 2, 2}, {0, 0, 0}, {0, 1, 1}, true},
    {"upsample conv: pad 1 (per frame)", 16, 8, 2, 8, 8, {1, 3, 3}, {1, 1, 1}, {0, 1, 1}, {0, 1, 1}, true},
    {"time conv: kernel 3, stride 2", 16, 16, 5, 6, 8, {3, 1, 1}, {2, 1, 1}, {0, 0, 0}, {0, 0, 0}, false},
    {"shortcut 1x1x1", 16, 32, 4, 6, 8, {1, 1, 1}, {1, 1, 1}, {0, 0, 0}, {0, 0, 0}, false},
};

/// x [C, T, H, W] (row-major values) as a channels-last view on the device: [C, T, H, W] over a [T, H, W, C] buffer.
TensorView channels_last_view(Backend& be, const Shape& xs, const std::vector<float>& x, Tensor& storage) {
    const int64_t C = xs[0], T = xs[1], H = xs[2], W = xs[3];
    std::vector<float> cl(x.size());
    for (int64_t c = 0; c < C; ++c)
        for (int64_t i = 0; i < T * H * W; ++i) cl[size_t(i * C + c)] = x[size_t(c * T * H * W + i)];
    storage = upload(be, Shape{T, H, W, C}, cl);
    return storage.view().permute({3, 0, 1, 2});
}

}  // namespace

TEST_CASE("fast numerics' channels-last convolutions are within bf16 rounding of the exact convolution") {
    auto be = gpu(Numerics::Fast, ConvTune::ChannelsLast);
    uint64_t seed = 100;
    for (const ConvCase& c : kConvCases) {
        for (const int layout : {0, 1, 2, 3}) {
            const bool cl_input = layout & 1, cl_output = layout & 2;
            const std::string what = c.what;
            CAPTURE(what);
            CAPTURE(cl_input);
            CAPTURE(cl_output);
            const Shape xs{c.Ci, c.T, c.H, c.W}, ws{c.Co, c.Ci, c.k[0], c.k[1], c.k[2]};
            const std::vector<float> x = bf16_rounded(random_floats(size_t(xs.numel()), ++seed));
            const std::vector<float> w = bf16_rounded(random_floats(size_t(ws.numel()), ++seed, -0.2f, 0.2f));
            const std::vector<float> b = bf16_rounded(random_floats(size_t(c.Co), ++seed, -0.5f, 0.5f));
            Conv3dParams p;
            p.frames_2d = c.frames_2d;
            for (int i = 0; i < 3; ++i) {
                p.stride[i] = c.stride[i];
                p.pad_before[i] = c.pad_before[i];
                p.pad_after[i] = c.pad_after[i];
            }
            Vol xv(c.Ci, c.T, c.H, c.W);
            for (size_t i = 0; i < x.size(); ++i) xv.v[i] = x[i];
            const Vol exact = conv3d_ref(xv, w, {}, c.Co, c.k, c.stride, c.pad_before, c.pad_after);
            // sum |x| |w| per output: the scale of the accumulation's rounding
            std::vector<float> wabs(w.size());
            for (size_t i = 0; i < w.size(); ++i) wabs[i] = std::fabs(w[i]);
            Vol xabs = xv;
            for (double& v : xabs.v) v = std::fabs(v);
            const Vol scale = conv3d_ref(xabs, wabs, {}, c.Co, c.k, c.stride, c.pad_before, c.pad_after);

            Tensor xd = upload(*be, xs, x), x_storage;
            const Tensor wd = upload(*be, ws, w), bd = upload(*be, Shape{c.Co}, b);
            const TensorView xv_in = cl_input ? channels_last_view(*be, xs, x, x_storage) : xd.view();
            const Shape os{c.Co, exact.T, exact.H, exact.W};
            const Tensor out = cl_output ? be->alloc(Shape{os[1], os[2], os[3], os[0]}, be->compute_dtype())
                                         : be->alloc(os, be->compute_dtype());
            be->conv3d(p, xv_in, wd, bd, cl_output ? out.view().permute({3, 0, 1, 2}) : out.view());
            std::vector<float> got = download(*be, out);
            if (cl_output) {  // [To, Ho, Wo, Co] -> [Co, To, Ho, Wo]
                const std::vector<float> cl = got;
                const int64_t S = os[1] * os[2] * os[3];
                for (int64_t co = 0; co < c.Co; ++co)
                    for (int64_t i = 0; i < S; ++i) got[size_t(co * S + i)] = cl[size_t(i * c.Co + co)];
            }
            REQUIRE(got.size() == exact.v.size());
            // NOTE: bf16 keeps 8 significant bits, so rounding to it errs by up to 2^-8 of the value. cuDNN rounds the
            // f32 sum c to bf16 (2^-8 |c| <= 2^-8 sum |x w|), the bias is added and the sum rounded again (2^-8 |c + b|
            // <= 2^-8 (sum |x w| + |b|)), as on the reference path (PyTorch's convolution, then its bias add); an f32
            // sum of K products in any order errs by at most about K 2^-24 sum |x w| (K <= 24·27 here: under 2^-13)
            int bad = 0;
            for (int64_t co = 0; co < c.Co; ++co)
                for (int64_t i = 0; i < exact.T * exact.H * exact.W; ++i) {
                    const size_t j = size_t(co * exact.T * exact.H * exact.W + i);
                    const double y = exact.v[j] + b[size_t(co)];
                    const double tol = (std::ldexp(1.0, -7) + std::ldexp(1.0, -13)) * scale.v[j] +
                                       std::ldexp(1.0, -8) * std::fabs(double(b[size_t(co)]));
                    if (std::fabs(double(got[j]) - y) > tol) ++bad;
                }
            CHECK(bad == 0);
        }
    }
    // every case ran channels-last (the reference path would pass the bound too, untested here otherwise)
    const std::string report = be->conv_plan_report();
    CAPTURE(report);
    size_t lines = 0, channels_last = 0;
    for (size_t pos = 0; (pos = report.find('\n', pos)) != std::string::npos; ++pos) ++lines;
    for (size_t pos = 0; (pos = report.find("channels-last", pos)) != std::string::npos; ++pos) ++channels_last;
    CHECK(lines == 4 * std::size(kConvCases));
    CHECK(channels_last == 4 * std::size(kConvCases));
}

TEST_CASE("channels-last operands run the reference path as their channels-first copies do, bit for bit") {
    for (const Numerics numerics : {Numerics::Reference, Numerics::Fast}) {
        CAPTURE(int(numerics));
        // fast numerics with the tuning off run the reference path too
        auto be = gpu(numerics, ConvTune::Off);
        const ConvCase& c = kConvCases[0];
        const Shape xs{c.Ci, c.T, c.H, c.W}, ws{c.Co, c.Ci, c.k[0], c.k[1], c.k[2]};
        const std::vector<float> x = random_floats(size_t(xs.numel()), 7);
        const Tensor xd = upload(*be, xs, x), wd = upload(*be, ws, random_floats(size_t(ws.numel()), 8, -0.2f, 0.2f));
        Tensor storage;
        const TensorView xcl = channels_last_view(*be, xs, x, storage);
        Conv3dParams p;
        for (int i = 0; i < 3; ++i) p.pad_before[i] = c.pad_before[i], p.pad_after[i] = c.pad_after[i];
        const Shape os{c.Co, c.T, c.H, c.W};
        const Tensor a = be->alloc(os, be->compute_dtype()), b = be->alloc(os, be->compute_dtype());
        be->conv3d(p, xd, wd, {}, a);
        be->conv3d(p, xcl, wd, {}, b);
        CHECK(download(*be, a) == download(*be, b));
        // and a channels-last out holds the same numbers, transposed
        const Tensor c_out = be->alloc(Shape{os[1], os[2], os[3], os[0]}, be->compute_dtype());
        be->conv3d(p, xcl, wd, {}, c_out.view().permute({3, 0, 1, 2}));
        const Tensor back = be->alloc(os, be->compute_dtype());
        be->copy(c_out.view().permute({3, 0, 1, 2}), back);
        CHECK(download(*be, a) == download(*be, back));
        CHECK(be->capabilities().conv_channels_last);
    }
}

TEST_CASE("a weight given channels-last too gives the same convolution bit for bit, and a misshapen one is refused") {
    auto be = gpu(Numerics::Fast, ConvTune::ChannelsLast);
    for (const size_t i : {size_t(0), size_t(3), size_t(5)}) {  // causal 3x3x3, downsample (per frame), time conv
        const ConvCase& c = kConvCases[i];
        const std::string what = c.what;
        CAPTURE(what);
        const Shape xs{c.Ci, c.T, c.H, c.W}, ws{c.Co, c.Ci, c.k[0], c.k[1], c.k[2]};
        const std::vector<float> x = random_floats(size_t(xs.numel()), 21);
        const std::vector<float> w = random_floats(size_t(ws.numel()), 22, -0.2f, 0.2f);
        // [Co, Ci, kt, kh, kw] -> [Co, kt, kh, kw, Ci] on the host
        const int64_t K = c.k[0] * c.k[1] * c.k[2];
        std::vector<float> wcl(w.size());
        for (int64_t co = 0; co < c.Co; ++co)
            for (int64_t ci = 0; ci < c.Ci; ++ci)
                for (int64_t k = 0; k < K; ++k)
                    wcl[size_t((co * K + k) * c.Ci + ci)] = w[size_t((co * c.Ci + ci) * K + k)];
        const Tensor xd = upload(*be, xs, x), wd = upload(*be, ws, w);
        const Tensor bd = upload(*be, Shape{c.Co}, random_floats(size_t(c.Co), 23));
        const Tensor wcld = upload(*be, Shape{c.Co, c.k[0], c.k[1], c.k[2], c.Ci}, wcl);
        Conv3dParams p;
        p.frames_2d = c.frames_2d;
        for (int d = 0; d < 3; ++d) {
            p.stride[d] = c.stride[d];
            p.pad_before[d] = c.pad_before[d];
            p.pad_after[d] = c.pad_after[d];
        }
        int64_t o[3];
        for (int d = 0; d < 3; ++d)
            o[d] = (xs[size_t(d) + 1] + c.pad_before[d] + c.pad_after[d] - c.k[d]) / c.stride[d] + 1;
        const Shape os{c.Co, o[0], o[1], o[2]};
        const Tensor a = be->alloc(os, be->compute_dtype()), b = be->alloc(os, be->compute_dtype());
        be->conv3d(p, xd, wd, bd, a);
        Conv3dParams q = p;
        q.w_channels_last = wcld.view();
        be->fill(b, 7.f);
        be->conv3d(q, xd, wd, bd, b);
        CHECK(download(*be, a) == download(*be, b));
        // the copy must be the weight's channels-last shape
        q.w_channels_last = wcld.view().reshape(Shape{c.Co, c.Ci, c.k[0], c.k[1], c.k[2]});
        CHECK_THROWS_WITH_AS(be->conv3d(q, xd, wd, bd, b), doctest::Contains("w_channels_last"), Error);
    }
}

namespace {

constexpr int64_t kT = 9, kHeight = 32, kWidth = 48;

VaeConfig small_config() {
    VaeConfig c;
    c.base_dim = 8;  // channels 8 / 16 / 32
    return c;
}

/// The VAE on a GPU backend with a workspace of exactly what a measuring pass over it declared for the encode.
struct GpuVae {
    std::unique_ptr<Backend> be;
    std::unique_ptr<WeightLoader> loader;
    std::unique_ptr<WanVae> vae;
    Tensor video, latent;
    size_t workspace = 0;

    GpuVae(Numerics numerics, ConvTune tune, const VaeWeightSource& weights, const VaeConfig& config,
           const Tensor& host_video)
        : be(gpu(numerics, tune, size_t(16) << 20)) {
        loader = std::make_unique<WeightLoader>(weights, *be);
        vae = std::make_unique<WanVae>(*loader, config);
        const DType dt = be->compute_dtype();
        workspace = measure_workspace(*be, [&](Backend& mb) {
            WeightLoader l(weights, mb);
            WanVae v(l, config);
            const Tensor x = mb.alloc(host_video.shape(), dt), y = mb.alloc(v.latent_shape(x.shape()), dt);
            v.encode(x, y);
        });
        // NOTE: no margin: the forward, tuning included, must fit what it declared
        be->reserve_workspace(workspace);
        video = be->alloc(host_video.shape(), dt);
        latent = be->alloc(vae->latent_shape(video.shape()), dt);
        be->upload(host_video, video);
    }
    std::vector<float> encode() {
        vae->encode(video, latent);
        return download(*be, latent);
    }
};

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
    double d = 0, r = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        d += (double(a[i]) - double(b[i])) * (double(a[i]) - double(b[i]));
        r += double(b[i]) * double(b[i]);
    }
    return std::sqrt(d / r);
}

}  // namespace

TEST_CASE("the fast-numerics VAE encode is as close to the f32 CPU encode as reference numerics, and replays bit for bit") {
    const VaeConfig config = small_config();
    // weights and pixels rounded to bf16 on the host, so the CPU encode starts from the values the GPU holds
    VaeWeightSource weights = random_vae_weights(config, 11);
    for (auto& [key, t] : weights.tensors) {
        std::vector<float> v = bf16_rounded(to_f32_vector(t.view()));
        t = Tensor::host_f32(t.shape(), v);
    }
    const Tensor host_video =
        Tensor::host_f32(Shape{3, kT, kHeight, kWidth}, bf16_rounded(random_floats(size_t(3 * kT * kHeight * kWidth), 12)));

    std::unique_ptr<Backend> cpu = make_cpu_backend(size_t(256) << 20);
    WeightLoader cpu_loader(weights, *cpu);
    WanVae cpu_vae(cpu_loader, config);
    Tensor cpu_latent = cpu->alloc(cpu_vae.latent_shape(host_video.shape()), DType::F32);
    cpu_vae.encode(host_video, cpu_latent);
    const std::vector<float> exact = to_f32_vector(cpu_latent.view());

    GpuVae ref(Numerics::Reference, ConvTune::Auto, weights, config, host_video);
    const double ref_err = rel_l2(ref.encode(), exact);
    for (const ConvTune tune : {ConvTune::ChannelsLast, ConvTune::Auto}) {
        CAPTURE(int(tune));
        GpuVae fast(Numerics::Fast, tune, weights, config, host_video);
        const std::vector<float> first = fast.encode();  // plans and tunes every convolution
        const std::vector<float> second = fast.encode(), third = fast.encode();
        const double fast_err = rel_l2(first, exact);
        CAPTURE(ref_err);
        CAPTURE(fast_err);
        CAPTURE(fast.be->conv_plan_report());
        // NOTE: both round every activation to bf16 at the same points (fast numerics' norm rounds fewer times) and
        // differ otherwise only in the order of the convolutions' f32 sums, so their distance to the f32 result is
        // the same bf16 rounding noise; a layout, padding or bias mistake in one convolution is an error of order 1
        CHECK(fast_err <= 2.0 * ref_err);
        CHECK(first == second);
        CHECK(second == third);
    }
}
