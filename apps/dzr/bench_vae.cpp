#include "apps/dzr/bench_vae.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/measuring_backend.h"
#include "backend/profiler.h"
#include "config/run_config.h"
#include "core/error.h"
#include "model/inventory.h"
#include "model/wan_vae.h"
#include "weights/inventory.h"
#include "weights/random_weights.h"

namespace dzr::app {
namespace {

/// Workspace beyond the measured high-water mark (alignment slack).
constexpr size_t kWorkspaceMargin = size_t(64) << 20;

struct Stats {
    double median = 0, min = 0, mean = 0;
};

Stats stats(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    Stats s;
    s.median = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
    s.min = v.front();
    for (double x : v) s.mean += x / double(v.size());
    return s;
}

/// Uniform values in [-1, 1) from a small LCG (pixels in the model's input range).
std::vector<float> pixels(size_t n, uint32_t seed) {
    std::vector<float> v(n);
    uint32_t s = seed * 2654435761u + 12345u;
    for (float& x : v) {
        s = s * 1664525u + 1013904223u;
        x = float(s >> 8) * (2.f / 16777216.f) - 1.f;
    }
    return v;
}

/// One backend with the VAE encoder loaded, its workspace measured for both encodes, and the inputs on it.
struct VaeRig {
    std::unique_ptr<Backend> be;
    std::unique_ptr<WeightLoader> loader;
    std::unique_ptr<WanVae> vae;
    Tensor clip, latent, frame, ys;
    size_t workspace_bytes = 0;

    VaeRig(const Device& device, Numerics numerics, const WeightSource& weights, const VaeConfig& config,
           const Tensor& host_clip, const Tensor& host_frame, int ys_frames, bool profile = false) {
        BackendOptions bo = apply_env_overrides({});
        bo.numerics = numerics;
        bo.profile = profile;
        bo.workspace_bytes = size_t(64) << 20;
        be = make_backend(device, bo);
        loader = std::make_unique<WeightLoader>(weights, *be);
        vae = std::make_unique<WanVae>(*loader, config);
        const DType dt = be->compute_dtype();
        const int64_t H = host_frame.shape()[1], W = host_frame.shape()[2];
        // NOTE: the measuring pass asks this backend for each convolution's workspace (in fast numerics, the
        // channels-last candidates' too), as the engine's own plan does
        workspace_bytes = measure_workspace(*be, [&](Backend& mb) {
            WeightLoader shadow_loader(weights, mb);
            WanVae shadow(shadow_loader, config);
            const Tensor c = mb.alloc(host_clip.shape(), dt), l = mb.alloc(shadow.latent_shape(c.shape()), dt);
            shadow.encode(c, l, VaePrecision::Eager);
            const Tensor f = mb.alloc(host_frame.shape(), dt);
            const Tensor y = mb.alloc(shadow.conditioning_shape(ys_frames, H, W), dt);
            shadow.encode_conditioning(f, ys_frames, y, VaePrecision::Autocast);
        });
        be->reserve_workspace(workspace_bytes + kWorkspaceMargin);
        clip = be->alloc(host_clip.shape(), dt);
        latent = be->alloc(vae->latent_shape(clip.shape()), dt);
        frame = be->alloc(host_frame.shape(), dt);
        ys = be->alloc(vae->conditioning_shape(ys_frames, H, W), dt);
        be->upload(host_clip, clip);
        be->upload(host_frame, frame);
        be->synchronize();
    }
};

/// Milliseconds of each of `repeats` runs of f (one event pair per run) after `warmup` untimed runs.
template <typename F>
Stats time_runs(Backend& be, int warmup, int repeats, F&& f) {
    for (int i = 0; i < warmup; ++i) f();
    Stream& stream = be.stream();
    std::vector<std::unique_ptr<Event>> ev;
    for (int i = 0; i < 2 * repeats; ++i) ev.push_back(stream.make_event());
    for (int i = 0; i < repeats; ++i) {
        stream.record(*ev[size_t(2 * i)]);
        f();
        stream.record(*ev[size_t(2 * i + 1)]);
    }
    stream.synchronize();
    std::vector<double> ms;
    for (int i = 0; i < repeats; ++i) ms.push_back(stream.elapsed_ms(*ev[size_t(2 * i)], *ev[size_t(2 * i + 1)]));
    return stats(ms);
}

std::vector<float> download_f32(Backend& be, const Tensor& t) {
    Tensor host = Tensor::host(t.shape(), DType::F32);
    be.download(t, host);
    return to_f32_vector(host);
}

/// max |a - b|, max |a - b| / |b| over |b| >= 1e-2 · max |b|, max |b|, and ||a - b|| / ||b||.
std::string difference(const std::vector<float>& a, const std::vector<float>& b) {
    double max_abs = 0, max_ref = 0, max_rel = 0, d2 = 0, r2 = 0;
    for (float v : b) max_ref = std::max(max_ref, double(std::fabs(v)));
    for (size_t i = 0; i < a.size(); ++i) {
        const double d = std::fabs(double(a[i]) - double(b[i])), r = std::fabs(double(b[i]));
        max_abs = std::max(max_abs, d);
        if (r >= 1e-2 * max_ref) max_rel = std::max(max_rel, d / r);
        d2 += d * d;
        r2 += r * r;
    }
    return fmt::format("max abs {:.4g} (max |ref| {:.4g}), max rel {:.4g} (where |ref| >= 1% of max), rel L2 {:.4g}",
                       max_abs, max_ref, max_rel, r2 > 0 ? std::sqrt(d2 / r2) : 0.0);
}

}  // namespace

int run_vae_bench(const VaeBenchOptions& o) {
    DZR_CHECK(o.repeats >= 1 && o.repeats <= 1000, "bench vae: --repeats must be in 1..1000, got {}", o.repeats);
    const config::RunConfig cfg = config::load_run_config(o.config);
    ModelConfig model = cfg.model;
    model.vae.has_decoder = false;  // the encoder only
    // NOTE: a CPU device runs too (host-timed; for a tiny config, as a smoke test of the bench itself)
    const Device device = parse_device(o.device);
    const Numerics numerics = parse_numerics(o.numerics);
    std::vector<ExpectedWeight> inventory;
    for (auto& w : expected_weights(model))
        if (w.component == Component::Vae) inventory.push_back(std::move(w));
    const RandomWeightSource weights(inventory, o.seed);

    const int64_t H = model.canvas_height, W = model.canvas_width;
    const int ys_frames = model.num_frames;
    // the commit clip of a rollout call: four frames, the first three times and the others twice
    const std::vector<float> frames = pixels(size_t(4 * 3 * H * W), 1);
    std::vector<float> clip_values(size_t(3 * 9 * H * W));
    const int order[9] = {0, 0, 0, 1, 1, 2, 2, 3, 3};
    for (int c = 0; c < 3; ++c)
        for (int t = 0; t < 9; ++t)
            std::copy_n(frames.begin() + (order[t] * 3 + c) * H * W, H * W,
                        clip_values.begin() + (c * 9 + t) * H * W);
    const Tensor host_clip = Tensor::host_f32(Shape{3, 9, H, W}, clip_values);
    const Tensor host_frame = Tensor::host_f32(Shape{3, H, W}, pixels(size_t(3 * H * W), 2));

    VaeRig rig(device, numerics, weights, model.vae, host_clip, host_frame, ys_frames);
    Backend& be = *rig.be;
    std::printf("dzr bench vae on %s (%s numerics): %s, canvas %lldx%lld, base_dim %d, random weights (seed %llu); "
                "workspace %.0f MiB measured; the stream's events, %d warm-up + median of %d\n",
                be.name().c_str(), numerics_name(numerics), o.config.c_str(), (long long)H, (long long)W,
                model.vae.base_dim, (unsigned long long)o.seed, double(rig.workspace_bytes) / double(1 << 20), o.warmup,
                o.repeats);
    const Stats clip = time_runs(be, o.warmup, o.repeats, [&] { rig.vae->encode(rig.clip, rig.latent); });
    std::printf("%-44s median %8.2f ms   min %8.2f ms   mean %8.2f ms\n", "clip encode (9 frames -> 3 latent, eager)",
                clip.median, clip.min, clip.mean);
    const Stats ys = time_runs(be, o.warmup, std::max(1, o.repeats / 2), [&] {
        rig.vae->encode_conditioning(rig.frame, ys_frames, rig.ys);
    });
    std::printf("%-44s median %8.2f ms   min %8.2f ms   mean %8.2f ms\n",
                fmt::format("ys encode ({} frames, autocast)", ys_frames).c_str(), ys.median, ys.min, ys.mean);
    std::fflush(stdout);

    if (numerics == Numerics::Fast && o.compare) {
        const std::vector<float> fast_latent = download_f32(be, rig.latent), fast_ys = download_f32(be, rig.ys);
        VaeRig ref(device, Numerics::Reference, weights, model.vae, host_clip, host_frame, ys_frames);
        ref.vae->encode(ref.clip, ref.latent);
        ref.vae->encode_conditioning(ref.frame, ys_frames, ref.ys);
        std::printf("fast vs reference numerics, clip latent: %s\n",
                    difference(fast_latent, download_f32(*ref.be, ref.latent)).c_str());
        std::printf("fast vs reference numerics, ys:          %s\n",
                    difference(fast_ys, download_f32(*ref.be, ref.ys)).c_str());
        const Stats ref_clip = time_runs(*ref.be, o.warmup, o.repeats, [&] { ref.vae->encode(ref.clip, ref.latent); });
        std::printf("%-44s median %8.2f ms (fast numerics: %.2fx as fast)\n", "reference numerics: clip encode",
                    ref_clip.median, ref_clip.median / clip.median);
    }
    if (o.profile) {
        // NOTE: a backend of its own, so that the events around every op do not slow the timed runs above
        VaeRig prof(device, numerics, weights, model.vae, host_clip, host_frame, ys_frames, true);
        Profiler* profiler = prof.be->profiler();
        DZR_CHECK(profiler != nullptr, "bench vae: the {} backend cannot be profiled", prof.be->name());
        for (int i = 0; i < std::max(1, o.warmup); ++i) {
            prof.vae->encode(prof.clip, prof.latent);
            prof.vae->encode_conditioning(prof.frame, ys_frames, prof.ys);
        }
        prof.be->synchronize();
        profiler->reset();
        for (int i = 0; i < o.repeats; ++i) {
            {
                ProfileScope region(*prof.be, "clip_encode");
                prof.vae->encode(prof.clip, prof.latent);
            }
            profiler->end_call();
            {
                ProfileScope region(*prof.be, "ys_encode");
                prof.vae->encode_conditioning(prof.frame, ys_frames, prof.ys);
            }
            profiler->end_call();
        }
        std::printf("per-op profile (%d clip and %d ys encodes on a profiled backend; op times with events around each "
                    "op):\n%s",
                    o.repeats, o.repeats, profiler->table(24).c_str());
    }
    const std::string report = be.conv_plan_report();
    if (!report.empty())
        std::printf("convolution plans (%s numerics; per call shape: the path taken, its time, the reference path's):\n%s",
                    numerics_name(numerics), report.c_str());
    return 0;
}

}  // namespace dzr::app
