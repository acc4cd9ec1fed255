// `dzr bench gemm|ops|fused|attention|kv|vae`: times a GPU backend with its stream's events (warm-up, then the
// median of N timed runs; GEMM inputs rotate over several buffer sets so the 60 MB L2 does not hold them), and measures
// the KV cache's device memory. Everything goes through the Backend interface (no CUDA headers here).
// `dzr bench prepare` times the policy's host-side prepare() (any build).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "apps/dzr/bench_dataset.h"
#include "apps/dzr/bench_load.h"
#include "apps/dzr/bench_vae.h"
#include "apps/dzr/command.h"
#include "apps/dzr/run_flags.h"
#include "backend/backend.h"
#include "config/run_config.h"
#include "core/error.h"
#include "core/timer.h"
#include "kv/kv_cache_manager.h"
#include "policy/dreamzero_policy.h"
#include "policy/preprocess.h"
#include "policy/tokenizer.h"
#include "rollout/bench_rollout.h"
#include "weights/checkpoint.h"

namespace dzr::app {
namespace {

struct BenchOptions {
    std::string device = "cuda:0";
    int warmup = 10;
    int iters = 50;
    // gemm
    int64_t m = 1785, n = 5120, k = 5120;
    std::string dtype = "bf16";
    std::string out_dtype = "";
    int sets = 4;
    bool dit = false;
    // attention
    int64_t lq = 1785, heads = 40, head_dim = 128, block = 880;
    std::vector<int64_t> lk = {2665, 4425, 6185, 7945};
    // kv
    std::string config = "configs/dreamzero_droid.yaml";
    // prepare
    std::string tokenizer = "tests/data/tokenizer/spiece.model";
    int threads = 0;
    int frames = 4;
    bool reference = false;
    // rollout
    int calls = 21;
    RunFlags run_flags;  // --numerics, --kv, --precision, ... (config/settings.h), as `dzr rollout`
    std::string json;
    std::string profile;
    bool profile_graphs = false;
    std::vector<std::string> sets_overrides;
    uint64_t seed = 0;
    bool text_prepass = false;
};

/// median, min, mean of host wall times.
struct HostStats {
    double median = 0, min = 0, mean = 0;
};

HostStats host_stats(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    HostStats s;
    s.median = v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
    s.min = v.front();
    for (double x : v) s.mean += x / double(v.size());
    return s;
}

/// The pre-ObservationPreprocessor pipeline of prepare(): per-view reference resize (per-channel float
/// planes), compose_canvas, canvases_to_model_input, one thread.
void reference_prepare(const Observation& obs, const ModelConfig& model, const Umt5Tokenizer& tok, int T) {
    const ViewSize view{model.canvas_height / 2, model.canvas_width / 2};
    auto one = [&](const TensorView& cam, int t) {
        return resize_bilinear_aa_u8(frame_view(cam, t), center_crop_offset(kFrameHeight, kCropHeight),
                                     center_crop_offset(kFrameWidth, kCropWidth), kCropHeight, kCropWidth,
                                     view.height, view.width);
    };
    std::vector<RgbImage> canvases;
    for (int t = 0; t < T; ++t)
        canvases.push_back(compose_canvas(one(obs.views[2], t), one(obs.views[0], t), one(obs.views[1], t)));
    const size_t frame_values = size_t(3) * model.canvas_height * model.canvas_width;
    std::vector<float> ref(frame_values);
    canvases_to_model_input(std::span<const RgbImage>(&canvases[size_t(T - 1)], 1), ref);
    if (T > 1) {
        std::vector<RgbImage> clip;
        for (int i : {0, 0, 0, 1, 1, 2, 2, 3, 3}) clip.push_back(canvases[size_t(std::min(i, T - 1))]);
        std::vector<float> out(frame_values * clip.size());
        canvases_to_model_input(clip, out);
    }
    (void)tokenize_droid_prompts(tok, obs.prompt, model.t5.text_len);
}

int run_prepare_bench(const BenchOptions& o) {
    const config::RunConfig cfg = config::load_run_config(o.config);
    const ModelConfig& model = cfg.model;
    DZR_CHECK(o.frames == 1 || o.frames == 4, "bench prepare: --frames must be 1 or 4, got {}", o.frames);
    const Umt5Tokenizer tok(resolve_tokenizer_path(o.tokenizer));
    const ObservationPreprocessor pre(ViewSize{model.canvas_height / 2, model.canvas_width / 2}, UnitRangeMode::F32,
                                      o.threads);
    // Synthetic camera frames (a hash, so no two views or frames are alike).
    const int T = o.frames;
    // DROID's cameras in the model's order: exterior 1, exterior 2, wrist.
    std::array<std::vector<uint8_t>, 3> data;
    const Embodiment droid = builtin_embodiment("oxe_droid");
    Observation obs;
    for (size_t v = 0; v < 3; ++v) {
        const size_t salt = (v + 1) % 3;  // the hash of each camera as before the cameras were reordered
        data[v].resize(size_t(T) * kFrameHeight * kFrameWidth * 3);
        for (size_t i = 0; i < data[v].size(); ++i) data[v][i] = uint8_t(((i + salt * 7919) * 2654435761u) >> 24);
        obs.views.emplace_back(data[v].data(), DType::U8, Shape{T, kFrameHeight, kFrameWidth, 3});
    }
    obs.state.assign(size_t(droid.state_dim()), 0.0);
    obs.prompt = "pick up the marker and put it in the cup";
    std::printf("dzr bench prepare: %s, canvas %dx%d, %d frame%s per call x 3 views of %dx%d, %s\n", o.config.c_str(),
                model.canvas_height, model.canvas_width, T, T == 1 ? "" : "s", kFrameHeight, kFrameWidth,
                o.reference ? "reference pipeline (1 thread)" : fmt::format("{} threads", pre.threads()).c_str());
    auto time_it = [&](const std::function<void()>& fn) {
        for (int i = 0; i < o.warmup; ++i) fn();
        std::vector<double> ms;
        for (int i = 0; i < o.iters; ++i) {
            Timer t;
            fn();
            ms.push_back(t.ms());
        }
        return host_stats(ms);
    };
    const auto print = [&](const char* what, const HostStats& s) {
        std::printf("%-28s median %8.3f ms   min %8.3f ms   mean %8.3f ms   (%d runs)\n", what, s.median, s.min, s.mean,
                    o.iters);
    };
    if (o.reference) {
        print("prepare (reference)", time_it([&] { reference_prepare(obs, model, tok, T); }));
        return 0;
    }
    // NOTE: each run hands its buffers to the next, as the rollout does (DreamZeroPolicy::recycle).
    PreparedObservation kept;
    print("prepare", time_it([&] { kept = prepare_observation(obs, model, droid, pre, tok, false, &kept); }));
    print("prepare (bf16 inputs)", time_it([&] { kept = prepare_observation(obs, model, droid, pre, tok, true, &kept); }));
    const size_t plane = size_t(model.canvas_height) * size_t(model.canvas_width);
    std::vector<int> clip;
    if (T == 4) clip = {0, 0, 0, 1, 1, 2, 2, 3, 3};
    std::vector<float> ref(3 * plane), out(3 * clip.size() * plane);
    print("  frames -> model inputs", time_it([&] { pre.run(obs.views, T - 1, clip, ref, out); }));
    print("  prompt tokens", time_it([&] { (void)tokenize_droid_prompts(tok, obs.prompt, model.t5.text_len); }));
    return 0;
}

struct Timing {
    double median_ms = 0, min_ms = 0, mean_ms = 0;
};

/// Times f(i) for i in [0, iters) with one event pair per run on the backend's stream, after `warmup` untimed runs.
template <typename F>
Timing time_on_stream(Backend& be, int warmup, int iters, F&& f) {
    for (int i = 0; i < warmup; ++i) f(i);
    Stream& stream = be.stream();
    std::vector<std::unique_ptr<Event>> ev;
    for (int i = 0; i < 2 * iters; ++i) ev.push_back(stream.make_event());
    for (int i = 0; i < iters; ++i) {
        stream.record(*ev[size_t(2 * i)]);
        f(warmup + i);
        stream.record(*ev[size_t(2 * i + 1)]);
    }
    stream.synchronize();
    std::vector<double> ms(static_cast<size_t>(iters));
    for (int i = 0; i < iters; ++i) ms[size_t(i)] = stream.elapsed_ms(*ev[size_t(2 * i)], *ev[size_t(2 * i + 1)]);
    Timing out;
    out.mean_ms = 0;
    for (double v : ms) out.mean_ms += v / double(iters);
    std::sort(ms.begin(), ms.end());
    out.min_ms = ms.front();
    out.median_ms = iters % 2 ? ms[size_t(iters / 2)] : 0.5 * (ms[size_t(iters / 2 - 1)] + ms[size_t(iters / 2)]);
    return out;
}

/// A GPU backend for a bench: the device must be one whose stream times device work.
std::unique_ptr<Backend> make_gpu_backend(const std::string& device, size_t workspace_bytes, const char* what) {
    const Device d = parse_device(device);
    DZR_CHECK(d.is_cuda(), "bench {} needs a GPU (--device cuda:N), got {}", what, device);
    BackendOptions bo = apply_env_overrides({});
    bo.workspace_bytes = workspace_bytes;
    return make_backend(d, bo);
}

void set_attention(Backend& be, AttentionImpl impl) {
    CudaBackendOptions o = be.cuda_options();
    o.attention = impl;
    be.set_cuda_options(o);
}

void set_paged_attention(Backend& be, PagedAttentionImpl impl) {
    CudaBackendOptions o = be.cuda_options();
    o.paged_attention = impl;
    be.set_cuda_options(o);
}

/// Uniform values in [-1, 1) from a small LCG (benchmarks need non-zero data, not good randomness).
Tensor random_device_tensor(Backend& be, Shape shape, DType dtype, uint32_t seed, float amplitude = 1.f) {
    Tensor host = Tensor::host(shape, DType::F32);
    uint32_t s = seed * 2654435761u + 12345u;
    float* p = host.ptr<float>();
    for (int64_t i = 0; i < host.numel(); ++i) {
        s = s * 1664525u + 1013904223u;
        p[i] = amplitude * (float(s >> 8) * (2.f / 16777216.f) - 1.f);
    }
    Tensor d = be.alloc(shape, dtype);
    be.upload(host, d);
    return d;
}

DType parse_dtype(const std::string& s) {
    const auto t = dtype_from_name(s);
    DZR_CHECK(t && (*t == DType::BF16 || *t == DType::F32), "bench: dtype must be bf16 or f32, got '{}'", s);
    return *t;
}

struct GemmShape {
    const char* label;
    int64_t m, n, k;
};

void bench_one_gemm(Backend& be, const BenchOptions& o, const GemmShape& s, DType dt, DType out_dt) {
    const int sets = std::max(1, o.sets);
    std::vector<Tensor> a, w, out;
    for (int i = 0; i < sets; ++i) {
        a.push_back(random_device_tensor(be, {s.m, s.k}, dt, uint32_t(3 * i + 1)));
        w.push_back(random_device_tensor(be, {s.n, s.k}, dt, uint32_t(3 * i + 2), 0.05f));
        out.push_back(be.alloc({s.m, s.n}, out_dt));
    }
    be.synchronize();
    const Timing t = time_on_stream(be, o.warmup, o.iters, [&](int i) {
        const size_t j = size_t(i % sets);
        be.linear(a[j], w[j], {}, out[j]);  // out[M, N] = a[M, K] · w[N, K]^T
    });
    const double flop = 2.0 * double(s.m) * double(s.n) * double(s.k);
    std::printf("%-28s %6lld %6lld %6lld  %-4s->%-4s %9.4f %9.4f %9.4f %9.1f\n", s.label, (long long)s.m,
                (long long)s.n, (long long)s.k, std::string(dtype_name(dt)).c_str(),
                std::string(dtype_name(out_dt)).c_str(), t.median_ms, t.min_ms, t.mean_ms,
                flop / (t.median_ms * 1e-3) / 1e12);
}

int run_gemm_bench(const BenchOptions& o) {
    auto owned = make_gpu_backend(o.device, 0, "gemm");
    Backend* be = owned.get();
    const DType dt = parse_dtype(o.dtype);
    const DType out_dt = o.out_dtype.empty() ? dt : parse_dtype(o.out_dtype);
    std::printf("dzr bench gemm on %s: cuBLASLt, fp32 accumulation, CUDA events, %d warm-up + median of %d, "
                "%d rotating input sets\n",
                be->name().c_str(), o.warmup, o.iters, std::max(1, o.sets));
    std::printf("%-28s %6s %6s %6s  %-10s %9s %9s %9s %9s\n", "shape", "M", "N", "K", "dtype", "med ms", "min ms",
                "mean ms", "TFLOP/s");
    std::vector<GemmShape> shapes = {{"requested", o.m, o.n, o.k}};
    if (o.dit) {
        // DreamZero DiT per-layer GEMMs at 1785 tokens (one CFG branch) and 3570 (both as a batch).
        shapes = {{"qkv fused 5120->15360", 1785, 15360, 5120}, {"o / cross q / cross o", 1785, 5120, 5120},
                  {"ffn up 5120->13824", 1785, 13824, 5120},    {"ffn down 13824->5120", 1785, 5120, 13824},
                  {"o, CFG batch M=3570", 3570, 5120, 5120},    {"ffn up, CFG batch", 3570, 13824, 5120},
                  {"square 8192", 8192, 8192, 8192}};
    }
    for (const GemmShape& s : shapes) bench_one_gemm(*be, o, s, dt, out_dt);
    return 0;
}

int run_ops_bench(const BenchOptions& o) {
    auto owned = make_gpu_backend(o.device, size_t(5) << 30, "ops");
    Backend* be = owned.get();
    const DType bf = DType::BF16;
    std::printf("dzr bench ops on %s: CUDA events, %d warm-up + median of %d; GB/s counts bytes read + written once\n",
                be->name().c_str(), o.warmup, o.iters);
    std::printf("%-52s %9s %9s %10s\n", "op", "med ms", "min ms", "GB/s");
    const auto report = [&](const std::string& label, double bytes, const Timing& t, const std::string& extra = "") {
        std::printf("%-52s %9.4f %9.4f %10.1f %s\n", label.c_str(), t.median_ms, t.min_ms,
                    bytes / (t.median_ms * 1e-3) / 1e9, extra.c_str());
    };
    const int64_t L = 1785, C = 5120, F = 13824, H = 40, D = 128;
    {
        const size_t bytes = size_t(1) << 30;
        Tensor src = be->alloc({int64_t(bytes / 2)}, bf), dst = be->alloc({int64_t(bytes / 2)}, bf);
        const Timing t = time_on_stream(*be, o.warmup, o.iters, [&](int) { be->copy(src, dst); });
        report("copy bf16 1 GiB, same dtype (ceiling)", 2.0 * double(bytes), t);
    }
    {
        Tensor x = random_device_tensor(*be, {L, C}, bf, 1), w = random_device_tensor(*be, {C}, bf, 2);
        Tensor out = be->alloc({L, C}, bf);
        const Timing t = time_on_stream(*be, o.warmup, o.iters, [&](int) { be->rms_norm({1e-6f}, x, w, out); });
        report("rms_norm bf16 [1785, 5120] * w", 2.0 * 2 * L * C + 2 * C, t);
        const Timing t2 =
            time_on_stream(*be, o.warmup, o.iters, [&](int) { be->layer_norm({1e-6f}, x, {}, {}, out); });
        report("layer_norm bf16 [1785, 5120] no affine", 2.0 * 2 * L * C, t2);
        Tensor b = random_device_tensor(*be, {C}, bf, 3);
        const Timing t3 =
            time_on_stream(*be, o.warmup, o.iters, [&](int) { be->add(x, b, out); });
        report("binary add bf16 [1785, 5120] + [5120]", 2.0 * 2 * L * C + 2 * C, t3);
        Tensor xf = be->alloc({L, C}, DType::F32);
        const Timing t4 = time_on_stream(*be, o.warmup, o.iters, [&](int) { be->copy(xf, out); });
        report("copy f32 -> bf16 [1785, 5120]", 6.0 * L * C, t4);
        // x [L, C] viewed as [C, L] (strides [1, C]) -> out as a contiguous [C, L]
        const Timing t5 = time_on_stream(*be, o.warmup, o.iters,
                                         [&](int) { be->copy(x.view().transpose(0, 1), out.view().reshape({C, L})); });
        report("copy bf16 transpose [5120, 1785] (strided)", 4.0 * L * C, t5);
    }
    {
        Tensor x = random_device_tensor(*be, {L, H, D}, bf, 4), out = be->alloc({L, H, D}, bf);
        Tensor table = random_device_tensor(*be, {L, D / 2, 2}, DType::F32, 5);
        const Timing t = time_on_stream(*be, o.warmup, o.iters, [&](int) { be->rope({}, x, table, out); });
        report("rope bf16 [1785, 40, 128], 64 pairs", 2.0 * 2 * L * H * D + 4.0 * L * D, t);
    }
    {
        const int64_t rows = 8 * L, cols = 7945;
        Tensor x = random_device_tensor(*be, {rows, cols}, DType::F32, 6, 8.f), out = be->alloc({rows, cols}, bf);
        const Timing t = time_on_stream(*be, o.warmup, o.iters, [&](int) { be->softmax({1.f}, x, out); });
        report("softmax f32 -> bf16 [14280, 7945]", 6.0 * double(rows) * double(cols), t);
    }
    {
        Tensor x = random_device_tensor(*be, {L, F}, bf, 7, 4.f), out = be->alloc({L, F}, bf);
        const Timing t = time_on_stream(*be, o.warmup, o.iters,
                                        [&](int) { be->activation({Activation::GeluTanh}, x, out); });
        report("gelu_tanh bf16 [1785, 13824]", 2.0 * 2 * L * F, t);
    }
    {
        // The backend's first attention: two cuBLASLt GEMMs around an f32 softmax, logits in the workspace.
        const int64_t Lk = 7945;
        Tensor q = random_device_tensor(*be, {L, H, D}, bf, 8), k = random_device_tensor(*be, {Lk, H, D}, bf, 9);
        Tensor v = random_device_tensor(*be, {Lk, H, D}, bf, 10), out = be->alloc({L, H, D}, bf);
        set_attention(*be, AttentionImpl::Gemm);  // this row times the GEMM path; see `dzr bench attention`
        const Timing t = time_on_stream(*be, 2, std::max(3, o.iters / 5), [&](int) {
            be->attention({1.f / std::sqrt(float(D))}, q, k, v, {}, out);
        });
        set_attention(*be, AttentionImpl::Auto);
        const double flop = 4.0 * double(L) * double(Lk) * double(D) * double(H);
        report("attention bf16 Lq1785 Lk7945 H40 D128 (GEMM-softmax-GEMM)", 2.0 * 2 * (2 * L + 2 * Lk) * H * D, t,
               fmt::format("({:.1f} TFLOP/s)", flop / (t.median_ms * 1e-3) / 1e12));
    }
    return 0;
}

/// `dzr bench fused`: fast numerics' fused row ops and GEMM epilogues at the DiT's shapes. Each timed run issues the
/// op kFusedReps times back to back (between one event pair, so the launch gaps of a forward are included and the
/// events' own cost is not), rotating over `sets` buffer sets so the 50 MB L2 does not hold the inputs. The row ops run
/// on the streamed kernels, on their earlier shape (stream8) and on the warp kernels they replaced
/// (CudaBackendOptions::row_kernels), one line each.
int run_fused_bench(const BenchOptions& o) {
    auto owned = make_gpu_backend(o.device, size_t(1) << 30, "fused");
    Backend* be = owned.get();
    const DType bf = DType::BF16;
    constexpr int kFusedReps = 20;
    const int sets = std::max(1, o.sets);
    std::printf("dzr bench fused on %s: bf16, CUDA events, %d warm-up + median of %d runs of %d back-to-back calls, "
                "%d rotating buffer sets; GB/s counts each tensor read or written once\n",
                be->name().c_str(), o.warmup, o.iters, kFusedReps, sets);
    std::printf("%-64s %9s %9s %9s\n", "op", "med us", "min us", "GB/s");
    const int64_t C = 5120, F = 13824, H = 40, D = 128, P = 64, R = 25;  // R: register tokens (24 actions + 1 state)
    constexpr int64_t kBranchRows = 1785;  // one CFG branch's rows: 1760 video tokens + R
    const auto set_rows = [&](RowKernels k) {
        CudaBackendOptions co = be->cuda_options();
        co.row_kernels = k;
        be->set_cuda_options(co);
    };
    for (const int64_t L : {kBranchRows, 2 * kBranchRows}) {
        // the rollout's grouping: per branch (period 1785), video rows [0, 1760) group 0, register rows group 1
        const int64_t split = kBranchRows - R;
        std::vector<Tensor> x, y, out, q, ffn;
        for (int i = 0; i < sets; ++i) {
            x.push_back(random_device_tensor(*be, {L, C}, bf, uint32_t(10 * i + 1)));
            y.push_back(random_device_tensor(*be, {L, C}, bf, uint32_t(10 * i + 2), 0.1f));
            out.push_back(be->alloc({L, C}, bf));
            q.push_back(be->alloc({L, F}, DType::F8_E4M3));  // codes of a [L, C] or [L, F] row set
            ffn.push_back(random_device_tensor(*be, {L, F}, bf, uint32_t(10 * i + 3), 3.f));  // GELU inputs
        }
        Tensor q_scales = be->alloc({L}, DType::F32);
        Tensor mod = random_device_tensor(*be, {2, 6, C}, bf, 3, 0.5f);
        Tensor w = random_device_tensor(*be, {C}, bf, 4), b = random_device_tensor(*be, {C}, bf, 5);
        Tensor table_a = random_device_tensor(*be, {split, P, 4}, DType::F32, 6);
        Tensor table_b = random_device_tensor(*be, {R, P, 4}, DType::F32, 7);
        // vector i of each group of the [2, 6, C] modulation tensor: a [2, C] view with a row stride of 6·C
        const auto mvec = [&](int i) {
            return TensorView(static_cast<char*>(mod.data()) + size_t(i) * size_t(C) * 2, bf, Shape{2, C},
                              Shape{6 * C, 1}, mod.device());
        };
        // the first L·cols codes of set j as [L, cols]
        const auto codes = [&](size_t j, int64_t cols) {
            return q[j].view().reshape({L * F}).slice(0, 0, L * cols).reshape({L, cols});
        };
        const FusedRowParams rows{1e-6f, split, kBranchRows};
        const double tensor_bytes = 2.0 * double(L) * double(C);
        const auto bench_bytes = [&](const std::string& label, int64_t cols, double bytes,
                                     const std::function<void(size_t)>& op) {
            const Timing t = time_on_stream(*be, o.warmup, o.iters, [&](int i) {
                for (int r = 0; r < kFusedReps; ++r) op(size_t(i * kFusedReps + r) % size_t(sets));
            });
            const double us = t.median_ms * 1e3 / kFusedReps;
            std::printf("%-64s %9.2f %9.2f %9.0f\n", fmt::format("{} [{}, {}]", label, L, cols).c_str(), us,
                        t.min_ms * 1e3 / kFusedReps, bytes / (us * 1e-6) / 1e9);
        };
        const auto bench = [&](const std::string& label, double tensors, const std::function<void(size_t)>& op) {
            bench_bytes(label, C, tensors * tensor_bytes, op);
        };
        // each row op on the streamed kernels, on their earlier shape (8 warps, f32 staging) and on the warp kernels
        // they replace (CudaBackendOptions::row_kernels)
        const auto each_impl = [&](const std::string& label, int64_t cols, double bytes,
                              const std::function<void(size_t)>& op) {
            set_rows(RowKernels::Stream);
            bench_bytes(label + " (stream)", cols, bytes, op);
            set_rows(RowKernels::Stream8);
            bench_bytes(label + " (stream8)", cols, bytes, op);
            set_rows(RowKernels::Warp);
            bench_bytes(label + " (warp)", cols, bytes, op);
            set_rows(RowKernels::Stream);
        };
        // NOTE: E4M3 bytes: the bf16 row read, a byte per code and a scale per row written
        const double fp8_norm_bytes = tensor_bytes * 1.5 + 4.0 * double(L);
        each_impl("ada_layer_norm modulated, 2 groups", C, 2 * tensor_bytes,
             [&](size_t j) { be->ada_layer_norm(rows, x[j], {}, {}, mvec(1), mvec(0), out[j]); });
        each_impl("ada_layer_norm affine (norm3)", C, 2 * tensor_bytes,
             [&](size_t j) { be->ada_layer_norm(rows, x[j], w, b, {}, {}, out[j]); });
        each_impl("ada_layer_norm_fp8 modulated, 2 groups", C, fp8_norm_bytes, [&](size_t j) {
            be->ada_layer_norm_fp8(rows, x[j], {}, {}, mvec(1), mvec(0), codes(j, C), q_scales);
        });
        each_impl("ada_layer_norm_fp8 affine (norm3)", C, fp8_norm_bytes,
             [&](size_t j) { be->ada_layer_norm_fp8(rows, x[j], w, b, {}, {}, codes(j, C), q_scales); });
        each_impl("rms_norm_rope 40x128, 64 pairs (double-float), 2 tables", C, 2 * tensor_bytes, [&](size_t j) {
            be->rms_norm_rope(rows, x[j], w, table_a, table_b, out[j].view().reshape({L, H, D}));
        });
        each_impl("rms_norm_rope 40x128, no table (cross q)", C, 2 * tensor_bytes, [&](size_t j) {
            be->rms_norm_rope({1e-6f}, x[j], w, {}, {}, out[j].view().reshape({L, H, D}));
        });
        each_impl("activation_quantize_fp8 gelu_tanh", F, 3.0 * double(L) * double(F) + 4.0 * double(L), [&](size_t j) {
            be->activation_quantize_fp8({Activation::GeluTanh}, ffn[j], codes(j, F), q_scales);
        });
        bench("gated_residual gate, 2 groups", 3, [&](size_t j) { be->gated_residual(rows, x[j], y[j], mvec(2)); });
        bench("gated_residual_norm gate + norm3", 4,
              [&](size_t j) { be->gated_residual_norm(rows, x[j], y[j], mvec(2), w, b, {}, {}, out[j]); });
        bench("  unfused: gated_residual, then ada_layer_norm", 5, [&](size_t j) {
            be->gated_residual(rows, x[j], y[j], mvec(2));
            be->ada_layer_norm(rows, x[j], w, b, {}, {}, out[j]);
        });
        bench("binary add x += y", 3, [&](size_t j) { be->add(x[j], y[j], x[j]); });
        {
            // FFN up: the GEMM with the bias and GELU in its epilogue against the GEMM then the GELU kernel
            Tensor fw = random_device_tensor(*be, {F, C}, bf, 8, 0.02f), fb = random_device_tensor(*be, {F}, bf, 9);
            Tensor hidden = be->alloc({L, F}, bf);
            const double flop = 2.0 * double(L) * double(F) * double(C);
            const auto gemm_row = [&](const std::string& label, const std::function<void(size_t)>& op) {
                const Timing t = time_on_stream(*be, 2, std::max(3, o.iters / 5), [&](int i) { op(size_t(i) % size_t(sets)); });
                std::printf("%-64s %9.2f %9.2f %9s (%.0f TFLOP/s)\n", fmt::format("{} [{}, {}]", label, L, F).c_str(),
                            t.median_ms * 1e3, t.min_ms * 1e3, "-", flop / (t.median_ms * 1e-3) / 1e12);
            };
            gemm_row("ffn up: gemm_gelu (GELU_BIAS epilogue)", [&](size_t j) { be->gemm_gelu({}, x[j], fw, fb, hidden); });
            gemm_row("  unfused: gemm + bias, then gelu_tanh", [&](size_t j) {
                be->linear(x[j], fw, fb, hidden);
                be->activation({Activation::GeluTanh}, hidden, hidden);
            });
        }
        {
            // cross-attention's o projection and residual: the GEMM accumulating into x against GEMM then add
            Tensor ow = random_device_tensor(*be, {C, C}, bf, 10, 0.02f), ob = random_device_tensor(*be, {C}, bf, 11);
            const auto gemm_row = [&](const std::string& label, const std::function<void(size_t)>& op) {
                const Timing t = time_on_stream(*be, 2, std::max(3, o.iters / 5), [&](int i) { op(size_t(i) % size_t(sets)); });
                std::printf("%-64s %9.2f %9.2f\n", fmt::format("{} [{}, {}]", label, L, C).c_str(), t.median_ms * 1e3,
                            t.min_ms * 1e3);
            };
            GemmParams acc;
            acc.beta = 1.f;
            gemm_row("cross o: gemm beta=1 into x", [&](size_t j) { be->gemm(acc, y[j], ow, ob, x[j]); });
            gemm_row("  unfused: gemm + bias, then x += y", [&](size_t j) {
                be->linear(y[j], ow, ob, out[j]);
                be->add(x[j], out[j], x[j]);
            });
        }
    }
    return 0;
}

/// One timed attention variant: median ms and TFLOP/s (4 * Lq * Lk * D * H), or why it could not run.
void report_attention(const char* label, int64_t lk, const BenchOptions& o, const std::function<void()>& f,
                      Backend& be, const std::function<std::string()>& note) {
    const double flop = 4.0 * double(o.lq) * double(lk) * double(o.head_dim) * double(o.heads);
    std::string ran;
    try {
        f();  // first call: builds plans, fails early when the variant cannot run
        ran = note();
        const Timing t = time_on_stream(be, o.warmup, o.iters, [&](int) { f(); });
        std::printf("%-34s %6lld %9.4f %9.4f %9.1f  %s\n", label, (long long)lk, t.median_ms, t.min_ms,
                    flop / (t.median_ms * 1e-3) / 1e12, ran.c_str());
    } catch (const Error& e) {
        std::printf("%-34s %6lld %9s %9s %9s  refused: %s\n", label, (long long)lk, "-", "-", "-", e.what());
    }
    std::fflush(stdout);
}

int run_attention_bench(const BenchOptions& o) {
    auto owned = make_gpu_backend(o.device, size_t(6) << 30, "attention");
    Backend* be = owned.get();
    const DType bf = DType::BF16;
    const int64_t L = o.lq, H = o.heads, D = o.head_dim, bs = o.block;
    std::printf("dzr bench attention on %s: bf16, Lq %lld, %lld heads x %lld, CUDA events, %d warm-up + median of "
                "%d; TFLOP/s = 4 Lq Lk D H / median\n",
                be->name().c_str(), (long long)L, (long long)H, (long long)D, o.warmup, o.iters);
    std::printf("%-34s %6s %9s %9s %9s  %s\n", "variant", "Lk", "med ms", "min ms", "TFLOP/s", "ran");
    const float scale = 1.f / std::sqrt(float(D));
    const int64_t max_lk = *std::max_element(o.lk.begin(), o.lk.end());
    Tensor q = random_device_tensor(*be, {L, H, D}, bf, 1, 2.f), out = be->alloc({L, H, D}, bf);
    Tensor k = random_device_tensor(*be, {max_lk, H, D}, bf, 2, 2.f);
    Tensor v = random_device_tensor(*be, {max_lk, H, D}, bf, 3);
    // paged: history in blocks of `bs` tokens through a reversed table, the current rows separate
    const int64_t max_blocks = (max_lk + bs - 1) / bs + 1;
    Tensor pool_k = random_device_tensor(*be, {max_blocks * bs, H, D}, bf, 4, 2.f);
    Tensor pool_v = random_device_tensor(*be, {max_blocks * bs, H, D}, bf, 5);
    Tensor table_host = Tensor::host({max_blocks}, DType::I32);
    for (int64_t i = 0; i < max_blocks; ++i) table_host.ptr<int32_t>()[i] = int32_t(max_blocks - 1 - i);
    Tensor table = be->alloc({max_blocks}, DType::I32);
    be->upload(table_host, table);
    Tensor kcur = random_device_tensor(*be, {L, H, D}, bf, 6, 2.f);
    Tensor vcur = random_device_tensor(*be, {L, H, D}, bf, 7);
    be->synchronize();
    const auto impl_note = [be] { return be->last_attention_impl(); };
    for (const int64_t lk : o.lk) {
        const TensorView kv = k.view().slice(0, 0, lk), vv = v.view().slice(0, 0, lk);
        for (AttentionImpl impl : {AttentionImpl::CudnnUnified, AttentionImpl::CudnnComposite, AttentionImpl::Flash,
                                   AttentionImpl::Gemm}) {
            set_attention(*be, impl);
            const std::string label = fmt::format("dense {}", attention_impl_name(impl));
            report_attention(label.c_str(), lk, o, [&] { be->attention({scale}, q, kv, vv, {}, out); }, *be,
                             impl_note);
        }
        set_attention(*be, AttentionImpl::Auto);
        const int64_t hist = lk - L;
        if (hist < 0) continue;
        PagedKvView view{};
        view.k_base = pool_k.data(), view.v_base = pool_v.data(), view.dtype = bf;
        view.num_heads = int32_t(H), view.head_dim = int32_t(D), view.block_size = int32_t(bs);
        // NOTE: one layer, but its stride gives cuDNN's paged graph the pool's block count
        view.layer_stride = max_blocks * bs * H * D, view.token_stride = H * D, view.head_stride = D;
        view.block_stride = bs * H * D;
        view.block_table = table.ptr<const BlockId>();
        view.table_width = int32_t(max_blocks);
        view.num_table_blocks = int32_t((hist + bs - 1) / bs);
        view.seq_len = hist;
        for (PagedAttentionImpl impl :
             {PagedAttentionImpl::Direct, PagedAttentionImpl::Gather, PagedAttentionImpl::CudnnPaged}) {
            set_paged_attention(*be, impl);
            const char* label = impl == PagedAttentionImpl::Direct   ? "paged direct (flash, block table)"
                                : impl == PagedAttentionImpl::Gather ? "paged gather + dense auto"
                                                                     : "paged cudnn (table) + dense, merged";
            report_attention(label, lk, o, [&] { be->paged_attention({scale}, q, view, 0, kcur, vcur, out); },
                             *be, impl_note);
        }
        set_paged_attention(*be, PagedAttentionImpl::Auto);
    }
    return 0;
}

int run_kv_bench(const BenchOptions& o) {
    const config::RunConfig cfg = config::load_run_config(o.config);
    const KvGeometry g = KvGeometry::from_model(cfg.model, DType::BF16, 2);
    const KvMemoryPlan plan = plan_kv_memory(g, cfg.kv, kv_session_bytes(g, cfg.kv));
    auto owned = make_gpu_backend(o.device, size_t(64) << 20, "kv");
    Backend* be = owned.get();
    std::printf("dzr bench kv on %s: %s, bf16, %d CFG branches, one session (memory_budget auto)\n",
                be->name().c_str(), o.config.c_str(), g.num_branches);
    std::printf("geometry: %d layers, %d heads x %d, %d tokens/frame, window %d frames, chunk %d\n", g.num_layers,
                g.num_kv_heads, g.head_dim, g.tokens_per_frame, cfg.kv.window_frames, g.chunk_frames);
    std::printf("%s\n", plan.summary().c_str());
    be->synchronize();
    const size_t used0 = size_t(be->device_memory_in_use().value_or(0));
    {
        KvCacheManager manager(g, cfg.kv, plan, be);
        be->synchronize();
        const size_t used1 = size_t(be->device_memory_in_use().value_or(0));
        const double gib = double(size_t(1) << 30);
        const size_t drop = used1 - used0, target = size_t(13421772800ull);
        std::printf("%-44s %16s %10s\n", "", "bytes", "GiB");
        std::printf("%-44s %16zu %10.3f\n", "plan: blocks + null block", plan.pool_bytes,
                    double(plan.pool_bytes) / gib);
        std::printf("%-44s %16zu %10.3f\n", "plan: scratch", plan.scratch_bytes, double(plan.scratch_bytes) / gib);
        std::printf("%-44s %16zu %10.3f\n", "plan: cross caches", plan.cross_bytes, double(plan.cross_bytes) / gib);
        std::printf("%-44s %16zu %10.3f\n", "plan: total", plan.total_bytes, double(plan.total_bytes) / gib);
        std::printf("%-44s %16zu %10.3f\n", "measured: device memory in use, growth", drop, double(drop) / gib);
        std::printf("%-44s %16zu %10.3f\n", "target (issue)", target, double(target) / gib);
        std::printf("measured - plan: %+lld bytes; %s the 12.5 GiB target\n",
                    (long long)drop - (long long)plan.total_bytes, drop <= target ? "within" : "OVER");
    }
    return 0;
}

int run_rollout_bench(const BenchOptions& o) {
    rollout::BenchRolloutOptions b;
    std::vector<config::Override> overrides;
    for (const auto& s : o.sets_overrides) overrides.push_back(config::parse_override(s));
    b.run = config::load_run_config(o.config, overrides);
    o.run_flags.apply(b.run);
    // NOTE: the bench measures without the text encoder pre-pass unless asked (--text-prepass)
    b.run.text_prepass = o.text_prepass;
    b.devices = parse_device_list(o.device);
    b.backend = apply_env_overrides({});
    b.backend.numerics = b.run.numerics;
    b.tokenizer = resolve_tokenizer_path(o.tokenizer);
    b.calls = o.calls;
    b.seed = o.seed;
    b.threads = o.threads;
    b.backend.profile = !o.profile.empty();
    DZR_CHECK(!o.profile_graphs || b.backend.profile, "bench rollout: --profile-graphs needs --profile FILE");
    b.backend.profile_ops = !o.profile_graphs;
    const rollout::BenchRolloutResult r = rollout::bench_rollout(b);
    std::printf("%s", r.table().c_str());
    if (!o.profile.empty()) {
        std::fprintf(stderr, "%s", r.profile_table.c_str());
        std::ofstream f(o.profile);
        DZR_CHECK(f.good(), "bench rollout: cannot write {}", o.profile);
        f << r.profile.dump(1) << "\n";
        std::printf("profile: %s\n", o.profile.c_str());
    }
    if (!o.json.empty()) {
        std::ofstream f(o.json);
        DZR_CHECK(f.good(), "bench rollout: cannot write {}", o.json);
        f << r.to_json().dump(2) << "\n";
        std::printf("json: %s\n", o.json.c_str());
    }
    return 0;
}

CommandRegistrar reg([](CLI::App& app, std::function<int()>& run) {
    auto* cmd = app.add_subcommand(
        "bench", "Time the CUDA backend's GEMM, kernels and attention at DreamZero shapes, the host-side prepare() and "
                 "checkpoint loading");
    cmd->require_subcommand(1);
    auto opts = std::make_shared<BenchOptions>();
    const auto common = [opts](CLI::App* sub) {
        sub->add_option("--device", opts->device, "CUDA device (cuda or cuda:N)")->capture_default_str();
        sub->add_option("--warmup", opts->warmup, "untimed runs first")->capture_default_str()->check(CLI::NonNegativeNumber);
        sub->add_option("--iters", opts->iters, "timed runs (the median is reported)")
            ->capture_default_str()
            ->check(CLI::PositiveNumber);
    };
    auto* gemm = cmd->add_subcommand("gemm", "cuBLASLt GEMM out[M, N] = a[M, K] · w[N, K]^T (a PyTorch Linear)");
    common(gemm);
    gemm->add_option("-m,--m", opts->m, "rows of a (tokens)")->capture_default_str()->check(CLI::PositiveNumber);
    gemm->add_option("-n,--n", opts->n, "rows of w (output features)")->capture_default_str()->check(CLI::PositiveNumber);
    gemm->add_option("-k,--k", opts->k, "inner dimension")->capture_default_str()->check(CLI::PositiveNumber);
    gemm->add_option("--dtype", opts->dtype, "input dtype: bf16 or f32")->capture_default_str();
    gemm->add_option("--out-dtype", opts->out_dtype, "output dtype (default: the input dtype)");
    gemm->add_option("--sets", opts->sets, "input buffer sets to rotate over")->capture_default_str();
    gemm->add_flag("--dit", opts->dit, "run DreamZero's per-layer DiT GEMM shapes instead of -m/-n/-k");
    auto* ops = cmd->add_subcommand("ops", "Kernels at DreamZero shapes (norms, rope, softmax, gelu, attention)");
    common(ops);
    auto* fused = cmd->add_subcommand(
        "fused", "Fast numerics' fused row ops and GEMM epilogues at the DiT's shapes ([1785 | 3570, 5120]): us, GB/s");
    common(fused);
    fused->add_option("--sets", opts->sets, "buffer sets to rotate over")->capture_default_str();
    auto* attention = cmd->add_subcommand(
        "attention",
        "Dense attention per implementation (cuDNN SDPA, flash, GEMM) and paged attention (direct, gather, cuDNN "
        "paged)");
    common(attention);
    attention->add_option("--lq", opts->lq, "query rows")->capture_default_str()->check(CLI::PositiveNumber);
    attention->add_option("--lk", opts->lk, "key lengths")->capture_default_str();
    attention->add_option("--heads", opts->heads, "heads")->capture_default_str()->check(CLI::PositiveNumber);
    attention->add_option("--head-dim", opts->head_dim, "head dim")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    attention->add_option("--block", opts->block, "paged block tokens")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    auto* kv = cmd->add_subcommand("kv", "Allocate one session's KV cache on the GPU; plan bytes vs cudaMemGetInfo");
    kv->add_option("--device", opts->device, "CUDA device (cuda or cuda:N)")->capture_default_str();
    kv->add_option("--config", opts->config, "run config with the model geometry and kv section")
        ->capture_default_str();
    auto* prepare = cmd->add_subcommand(
        "prepare", "Host-side prepare() of one call on synthetic frames at a config's geometry (CPU; any build); with "
                   "--dataset, how fast a dataset's episodes are read and decoded");
    auto dataset = std::make_shared<DatasetBenchOptions>();
    prepare->add_option("--dataset", dataset->path, "time reading this LeRobot dataset's (or these episode "
                                                     "directories') episodes instead: frames decoded per second");
    prepare->add_option("--episodes", dataset->selection.episodes, "with --dataset: only these episode indices");
    prepare->add_option("--split", dataset->selection.split, "with --dataset: only this split");
    prepare->add_option("--embodiment", dataset->embodiment, "with --dataset: the built-in embodiment to read as")
        ->capture_default_str();
    prepare->add_option("--repeats", dataset->repeats, "with --dataset: reads of each episode (median)")
        ->capture_default_str()
        ->check(CLI::Range(1, 100));
    prepare->add_option("--config", opts->config, "run config with the model geometry")->capture_default_str();
    prepare->add_option("--tokenizer", opts->tokenizer, "umT5 spiece.model (or a directory holding it)")
        ->capture_default_str();
    prepare->add_option("--threads", opts->threads, "preprocessing threads (0: min(8, hardware threads))")
        ->capture_default_str();
    prepare->add_option("--frames", opts->frames, "frames per camera (1: a first call, 4: a commit call)")
        ->capture_default_str();
    prepare->add_option("--warmup", opts->warmup, "untimed runs first")->capture_default_str()->check(CLI::NonNegativeNumber);
    prepare->add_option("--iters", opts->iters, "timed runs (the median is reported)")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    prepare->add_flag("--reference", opts->reference,
                      "time the reference pipeline instead (per-channel float resize, one thread: the code before the "
                      "fast path)");
    prepare->callback([&run, opts, dataset] {
        run = [opts, dataset] { return dataset->path.empty() ? run_prepare_bench(*opts) : run_dataset_bench(*dataset); };
    });

    auto* roll = cmd->add_subcommand(
        "rollout", "A full-size rollout with random weights made on the host (no checkpoint file): load, warm-up, then "
                   "timed calls; per-phase median/p90 and peak device memory");
    roll->add_option("--config", opts->config, "run config: the geometry and the run settings")->capture_default_str();
    roll->add_option("--set", opts->sets_overrides, "override a config key (as dzr rollout --set)");
    roll->add_option("--device", opts->device, "device, or two (cuda:0,cuda:1; cpu for a tiny config)")
        ->capture_default_str();
    opts->run_flags.add(roll, {"numerics", "kv.mode", "precision", "kv.dtype"});
    roll->add_option("--calls", opts->calls, "timed calls after the warm-up")->capture_default_str()
        ->check(CLI::Range(1, 10000));
    roll->add_option("--seed", opts->seed, "random weights' seed")->capture_default_str();
    roll->add_option("--threads", opts->threads, "random-weight threads (0: all)")->capture_default_str();
    roll->add_option("--tokenizer", opts->tokenizer, "umT5 spiece.model (any: a fixed prompt is tokenized)")
        ->capture_default_str();
    roll->add_option("--json", opts->json, "also write the numbers (every call's phases) as JSON");
    roll->add_option("--profile", opts->profile,
                     "profile the timed calls (every backend op timed with events, CUPTI kernel counts where built "
                     "in): JSON to this file, a table on stderr; slows the calls down");
    roll->add_flag("--profile-graphs", opts->profile_graphs,
                   "with --profile: leave the ops untimed so the forwards replay their CUDA graphs; the profile then "
                   "counts each region's kernels, host launches and idle gaps (CUPTI)");
    roll->add_flag("--text-prepass", opts->text_prepass,
                   "encode the prompts with umT5 alone before the other networks load, then free it (as dzr rollout)");
    opts->run_flags.add(roll, {"gpu_memory_budget", "cuda_graphs", "batch_cfg"});
    roll->callback([&run, opts] { run = [opts] { return run_rollout_bench(*opts); }; });

    auto vae_opts = std::make_shared<VaeBenchOptions>();
    auto* vae = cmd->add_subcommand(
        "vae", "The VAE encoder at a config's canvas with random weights: the 9-frame clip and the ys encode (median "
               "ms); in fast numerics also the difference to reference numerics and the convolution plans");
    vae->add_option("--config", vae_opts->config, "run config with the model geometry")->capture_default_str();
    vae->add_option("--device", vae_opts->device, "CUDA device (cuda or cuda:N; cpu for a tiny config)")
        ->capture_default_str();
    vae->add_option("--numerics", vae_opts->numerics, "fast or reference")->capture_default_str();
    vae->add_option("--warmup", vae_opts->warmup, "untimed runs first (they plan and tune the convolutions)")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    vae->add_option("--repeats", vae_opts->repeats, "timed runs (the median is reported; the ys encode runs half)")
        ->capture_default_str()
        ->check(CLI::Range(1, 1000));
    vae->add_option("--seed", vae_opts->seed, "random weights' seed")->capture_default_str();
    vae->add_flag("!--no-compare", vae_opts->compare, "fast numerics: skip the comparison with reference numerics");
    vae->add_flag("--profile", vae_opts->profile,
                  "also time every op of --repeats more encodes of each kind on a profiled backend (a per-op table)");
    vae->callback([&run, vae_opts] { run = [vae_opts] { return run_vae_bench(*vae_opts); }; });

    auto load_opts = std::make_shared<LoadBenchOptions>();
    auto load_mb = std::make_shared<size_t>(load_opts->bulk.chunk_bytes >> 20);
    auto* load = cmd->add_subcommand(
        "load", "Load a checkpoint's weights onto a device as the engine does (the bulk path or the old one); GB/s");
    load->add_option("--checkpoint", load_opts->checkpoint, "checkpoint directory")->required();
    load->add_option("--device", load_opts->device, "device (cuda:N, or cpu)")->capture_default_str();
    load->add_option("--path", load_opts->path, "new (parallel reads, pinned staging) or old (upload per weight)")
        ->capture_default_str();
    load->add_option("--threads", load_opts->bulk.threads, "reader threads (0: min(8, hardware threads))")
        ->capture_default_str()
        ->check(CLI::Range(0, 256));
    load->add_option("--staging-mb", *load_mb, "the largest read and each staging slot, MiB")
        ->capture_default_str()
        ->check(CLI::Range(1, 1024));
    load->add_option("--slots", load_opts->bulk.slots, "pinned staging slots (0: threads + 2)")
        ->capture_default_str()
        ->check(CLI::Range(0, 1024));
    load->add_flag("--direct", load_opts->bulk.direct, "O_DIRECT reads (past the page cache)");
    load->add_option("--repeat", load_opts->repeat, "loads in this process")->capture_default_str()
        ->check(CLI::Range(1, 100));
    load->add_option("--json", load_opts->json, "also write the numbers as JSON");
    load->callback([&run, load_opts, load_mb] {
        load_opts->bulk.chunk_bytes = *load_mb << 20;
        run = [load_opts] { return run_load_bench(*load_opts); };
    });
    gemm->callback([&run, opts] { run = [opts] { return run_gemm_bench(*opts); }; });
    ops->callback([&run, opts] { run = [opts] { return run_ops_bench(*opts); }; });
    fused->callback([&run, opts] { run = [opts] { return run_fused_bench(*opts); }; });
    attention->callback([&run, opts] { run = [opts] { return run_attention_bench(*opts); }; });
    kv->callback([&run, opts] { run = [opts] { return run_kv_bench(*opts); }; });
});

}  // namespace
}  // namespace dzr::app
