// Fast numerics' convolutions: every conv3d call shape gets a FastConvPlan (cuda_internal.h). The convolution runs
// channels-last, where cuDNN's tensor-core implicit-GEMM kernels read their operands directly: the input is
// transposed and zero-padded into the workspace in one kernel (the causal and the resample paddings included, so
// cuDNN pads nothing), the weight is transposed to [Co, kt, kh, kw, Ci] (unless the caller keeps it so,
// Conv3dParams::w_channels_last, or it is 1x1x1: the same memory), and the output comes back channels-first
// with the bias added in the same kernel. A caller holding channels-last rows passes them as x (a channels-last
// view, Capabilities::conv_channels_last): read in place when its padding is symmetric in space and none in time
// (cuDNN pads it), else zero-padded into the workspace; a channels-last out is written by cuDNN, the bias added in
// place. Kernel-1 temporal convolutions with temporal stride 1 (the resample's per-frame Conv2d, the 1x1
// convolutions) run as 2-D convolutions over the frames as a batch.
//
// The engine config is chosen by measurement on the first call of the shape: every config that cuDNN's heuristics
// modes INSTANT, B and the fallback list offer (deterministic, not down-converting, not compiled at run time, within
// kWorkspaceCap), each timed with events on the call's own buffers, against the reference path (conv3d_planned:
// PyTorch's engine and layout). The reference path stays where nothing beats it by kMinGain: its numbers are the
// reference numbers. The timing happens once per shape and synchronizes, so the first call of a shape must not be
// inside a CUDA graph capture (a shape first seen while capturing keeps the reference path). The workspace each
// call takes is declared up front by conv3d_workspace_bytes: the largest channels-last candidate, or the reference
// path's need, whichever is larger.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_conv_graph.h"
#include "backend/cuda/cuda_internal.h"
#include "core/log.h"
#include "core/timer.h"
#include "kernels/conv3d.cuh"

namespace dzr {

using cuda_detail::DeviceGuard;
using cuda_detail::FastConvCandidate;
using cuda_detail::FastConvPlan;
using cuda_detail::GraphBuilder;
using cuda_detail::GraphFailure;

namespace {

/// Engine configs timed per shape at most (heuristics order), and the cuDNN workspace one may take.
constexpr size_t kMaxCandidates = 12;
constexpr size_t kWorkspaceCap = size_t(256) << 20;
/// A channels-last candidate replaces the reference path only when at least this much faster.
constexpr float kMinGain = 0.97f;
/// Timed runs per candidate after one untimed run (the minimum is kept); a candidate whose untimed run is
/// kSlowFactor times the best so far is not timed further.
constexpr int kTimedRuns = 3;
constexpr float kSlowFactor = 4.f;

size_t aligned(size_t b) { return (b + Arena::kAlign - 1) / Arena::kAlign * Arena::kAlign; }

const char* heur_name(cudnnBackendHeurMode_t m) {
    switch (m) {
        case CUDNN_HEUR_MODE_INSTANT:
            return "instant";
        case CUDNN_HEUR_MODE_B:
            return "B";
        case CUDNN_HEUR_MODE_FALLBACK:
            return "fallback";
        default:
            return "?";
    }
}

/// A config's knob choices as "type=value ..." (dedupes configs that two heuristics modes both offer).
std::string engine_knobs(cudnnBackendDescriptor_t cfg) {
    std::string knobs;
    int64_t count = 0;
    if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                                 nullptr) != CUDNN_STATUS_SUCCESS ||
        count <= 0)
        return knobs;
    std::vector<cudnnBackendDescriptor_t> choices;
    for (int64_t i = 0; i < count; ++i) {
        cudnnBackendDescriptor_t d = nullptr;
        if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR, &d) != CUDNN_STATUS_SUCCESS) break;
        choices.push_back(d);
    }
    int64_t got = 0;
    if (int64_t(choices.size()) == count &&
        cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got,
                                 choices.data()) == CUDNN_STATUS_SUCCESS) {
        for (int64_t i = 0; i < got; ++i) {
            cudnnBackendKnobType_t type{};
            int64_t value = 0, m = 0;
            if (cudnnBackendGetAttribute(choices[size_t(i)], CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1,
                                         &m, &type) == CUDNN_STATUS_SUCCESS &&
                cudnnBackendGetAttribute(choices[size_t(i)], CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &m,
                                         &value) == CUDNN_STATUS_SUCCESS)
                knobs += fmt::format("{}{}={}", knobs.empty() ? "" : " ", int(type), value);
        }
    }
    for (cudnnBackendDescriptor_t d : choices) cudnnBackendDestroyDescriptor(d);
    return knobs;
}

/// A finalized execution plan of `cfg` and its workspace; null when it does not finalize.
cudnnBackendDescriptor_t finalize_plan(cudnnHandle_t handle, cudnnBackendDescriptor_t cfg, size_t* workspace) {
    cudnnBackendDescriptor_t p = nullptr;
    if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &p) != CUDNN_STATUS_SUCCESS) return nullptr;
    cudnnStatus_t st = cudnnBackendSetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfg);
    if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(p);
    int64_t ws = 0, n = 0;
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendGetAttribute(p, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &ws);
    if (st != CUDNN_STATUS_SUCCESS || ws < 0) {
        cudnnBackendDestroyDescriptor(p);
        return nullptr;
    }
    *workspace = size_t(ws);
    return p;
}

/// Every candidate config of `graph` in heuristics order (INSTANT, B, fallback), deduplicated, at most
/// kMaxCandidates.
void enumerate_candidates(FastConvPlan& plan, GraphBuilder& b, cudnnHandle_t handle, cudnnBackendDescriptor_t graph,
                          DType dtype) {
    std::set<std::string> seen;
    for (const cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_INSTANT, CUDNN_HEUR_MODE_B, CUDNN_HEUR_MODE_FALLBACK}) {
        cudnnBackendDescriptor_t heur = b.make(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
        GraphBuilder::set_desc(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
        GraphBuilder::set(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
        if (cudnnBackendFinalize(heur) != CUDNN_STATUS_SUCCESS) continue;
        int64_t count = 0;
        if (cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                                     nullptr) != CUDNN_STATUS_SUCCESS ||
            count <= 0)
            continue;
        std::vector<cudnnBackendDescriptor_t> cfgs;
        for (int64_t i = 0; i < count; ++i) cfgs.push_back(b.make(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
        int64_t got = 0;
        if (cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got,
                                     cfgs.data()) != CUDNN_STATUS_SUCCESS)
            continue;
        for (int64_t i = 0; i < got && plan.candidates.size() < kMaxCandidates; ++i) {
            int64_t index = -1;
            uint32_t behavior = ~0u;
            const uint32_t notes = cuda_detail::engine_notes(cfgs[size_t(i)], &index, &behavior);
            // NOTE: deterministic engines only, so that a tuned plan gives the same numbers on every call; and none
            // that sums or transforms below f32 (reduced-precision reductions, Winograd and FFT transforms): fast
            // numerics keep each output within bf16 rounding of the exact convolution (tests/cuda/test_vae_fast_conv)
            constexpr uint32_t kExcluded =
                (1u << CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS) | (1u << CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) |
                (1u << CUDNN_NUMERICAL_NOTE_REDUCED_PRECISION_REDUCTION) | (1u << CUDNN_NUMERICAL_NOTE_FFT) |
                (1u << CUDNN_NUMERICAL_NOTE_WINOGRAD) | (1u << CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_4x4) |
                (1u << CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_6x6) | (1u << CUDNN_NUMERICAL_NOTE_WINOGRAD_TILE_13x13);
            if (notes & kExcluded) continue;
            if (dtype == DType::F32 && (notes & (1u << CUDNN_NUMERICAL_NOTE_TENSOR_CORE))) continue;
            // NOTE: runtime-compiled engines take seconds each to build at load; left out
            if (behavior & (1u << CUDNN_BEHAVIOR_NOTE_RUNTIME_COMPILATION)) continue;
            const std::string knobs = engine_knobs(cfgs[size_t(i)]);
            if (!seen.insert(fmt::format("{}:{}", index, knobs)).second) continue;
            size_t ws = 0;
            cudnnBackendDescriptor_t p = finalize_plan(handle, cfgs[size_t(i)], &ws);
            if (!p) continue;
            if (ws > kWorkspaceCap) {
                cudnnBackendDestroyDescriptor(p);
                continue;
            }
            FastConvCandidate c;
            c.plan = p;
            c.workspace_bytes = ws;
            c.engine = fmt::format("engine {} ({} #{}{})", index, heur_name(mode), i, knobs.empty() ? "" : ", " + knobs);
            plan.candidates.push_back(std::move(c));
        }
    }
}

/// Frees two CUDA events.
struct EventPair {
    cudaEvent_t a = nullptr, b = nullptr;
    EventPair() {
        DZR_CUDA_CHECK(cudaEventCreate(&a));
        DZR_CUDA_CHECK(cudaEventCreate(&b));
    }
    ~EventPair() {
        cudaEventDestroy(a);
        cudaEventDestroy(b);
    }
    EventPair(const EventPair&) = delete;
    EventPair& operator=(const EventPair&) = delete;
};

}  // namespace

FastConvPlan* CudaBackend::fast_conv_plan(const Conv3dParams& p, const TensorView& x, const TensorView& w,
                                          const TensorView& out) {
    const int64_t Ci = x.dim(0), Co = w.dim(0);
    // conv3d admits channels-last views besides contiguous ones
    const bool x_cl = !x.is_contiguous(), out_cl = !out.is_contiguous();
    const std::string key = fmt::format(
        "{} x[{},{},{},{}]{} w[{},{},{},{}] pad[{},{},{}|{},{},{}] stride[{},{},{}]{}{}", dtype_name(x.dtype), Ci,
        x.dim(1), x.dim(2), x.dim(3), x_cl ? "cl" : "", Co, w.dim(2), w.dim(3), w.dim(4), p.pad_before[0],
        p.pad_before[1], p.pad_before[2], p.pad_after[0], p.pad_after[1], p.pad_after[2], p.stride[0], p.stride[1],
        p.stride[2], p.frames_2d ? (p.channels_last ? " 2d nhwc" : " 2d") : "", out_cl ? " out cl" : "");
    auto it = fast_conv_plans_.find(key);
    if (it == fast_conv_plans_.end()) {
        auto plan = std::make_unique<FastConvPlan>();
        plan->key = key;
        plan->x_channels_last = x_cl;
        plan->out_channels_last = out_cl;
        // a channels-last x with no temporal and symmetric spatial padding is read in place, cuDNN padding it;
        // otherwise a kernel pads it into the workspace (transposing a channels-first x on the way)
        const bool in_place = x_cl && p.pad_before[0] == 0 && p.pad_after[0] == 0 &&
                              p.pad_before[1] == p.pad_after[1] && p.pad_before[2] == p.pad_after[2];
        int64_t padded[3], o[3], k[3];
        for (int i = 0; i < 3; ++i) {
            plan->pad[i] = in_place ? p.pad_before[i] : 0;
            padded[i] = x.dim(i + 1) + (in_place ? 0 : p.pad_before[i] + p.pad_after[i]);
            o[i] = out.dim(i + 1);
            k[i] = w.dim(i + 2);
        }
        int cudnn_pad[3] = {};
        if (k[0] == 1 && p.stride[0] == 1) {
            // the frames as a batch of 2-D images (NHWC): the same memory as the 5-D NDHWC layout
            plan->nd = 4;
            const int64_t xd[4] = {padded[0], Ci, padded[1], padded[2]}, wd[4] = {Co, Ci, k[1], k[2]},
                          yd[4] = {o[0], Co, o[1], o[2]};
            std::copy(xd, xd + 4, plan->x_dims);
            std::copy(wd, wd + 4, plan->w_dims);
            std::copy(yd, yd + 4, plan->y_dims);
            plan->stride[0] = p.stride[1], plan->stride[1] = p.stride[2];
            cudnn_pad[0] = plan->pad[1], cudnn_pad[1] = plan->pad[2];
        } else {
            plan->nd = 5;
            const int64_t xd[5] = {1, Ci, padded[0], padded[1], padded[2]}, wd[5] = {Co, Ci, k[0], k[1], k[2]},
                          yd[5] = {1, Co, o[0], o[1], o[2]};
            std::copy(xd, xd + 5, plan->x_dims);
            std::copy(wd, wd + 5, plan->w_dims);
            std::copy(yd, yd + 5, plan->y_dims);
            std::copy(p.stride, p.stride + 3, plan->stride);
            std::copy(plan->pad, plan->pad + 3, cudnn_pad);
        }
        const size_t es = dtype_size(x.dtype);
        plan->x_bytes = in_place ? 0 : size_t(Ci * padded[0] * padded[1] * padded[2]) * es;
        plan->w_bytes = size_t(w.numel()) * es;
        plan->y_bytes = out_cl ? 0 : size_t(out.numel()) * es;
        try {
            GraphBuilder b(plan->keep);
            const cudnnBackendDescriptor_t graph = cuda_detail::make_conv_graph(
                b, cudnn(), x.dtype, plan->nd, plan->x_dims, plan->w_dims, plan->y_dims, cudnn_pad, plan->stride, true);
            enumerate_candidates(*plan, b, cudnn(), graph, x.dtype);
        } catch (const GraphFailure& f) {
            plan->note = "no NHWC graph: " + f.what;
        }
        if (plan->candidates.empty() && plan->note.empty()) plan->note = "no NHWC engine config";
        for (const FastConvCandidate& c : plan->candidates)
            plan->declared_bytes =
                std::max(plan->declared_bytes, aligned(plan->x_bytes) + aligned(plan->w_bytes) +
                                                   aligned(plan->y_bytes) + aligned(c.workspace_bytes));
        log()->debug("fast conv {}: {} channels-last candidates{}", key, plan->candidates.size(),
                     plan->note.empty() ? "" : " (" + plan->note + ")");
        it = fast_conv_plans_.emplace(key, std::move(plan)).first;
    }
    return it->second->candidates.empty() ? nullptr : it->second.get();
}

size_t CudaBackend::fast_conv_workspace_bytes(const Conv3dParams& p, const TensorView& x, const TensorView& w,
                                              const TensorView& out) {
    if (options_.conv_tune == ConvTune::Off) return 0;
    DeviceGuard guard(index_);
    const FastConvPlan* plan = fast_conv_plan(p, x, w, out);
    return plan ? plan->declared_bytes : 0;
}

cudnnStatus_t CudaBackend::run_fast_candidate(const FastConvPlan& plan, const FastConvCandidate& c,
                                              const Conv3dParams& p, const TensorView& x, const TensorView& w,
                                              const TensorView& bias, const TensorView& out, void* xcl, void* wcl,
                                              void* ycl, void* ws) {
    const int64_t Ci = x.dim(0), Co = w.dim(0), K = w.dim(2) * w.dim(3) * w.dim(4);
    const int64_t in[3] = {x.dim(1), x.dim(2), x.dim(3)};
    const void* src = xcl;
    if (plan.x_bytes == 0)
        src = x.data;
    else if (plan.x_channels_last)
        DZR_CUDA_CHECK(kernels::pad_channels_last(x.data, xcl, x.dtype, Ci, in, p.pad_before, p.pad_after, stream_));
    else
        DZR_CUDA_CHECK(
            kernels::to_channels_last_padded(x.data, xcl, x.dtype, Ci, in, p.pad_before, p.pad_after, stream_));
    // the weight channels-last: [Co, Ci, K] -> [Co, K, Ci], the same memory for K = 1, or the caller's copy
    const void* wsrc = wcl;
    if (K == 1 && cuda_detail::pointer_alignment(w.data) >= 16)
        wsrc = w.data;
    else if (p.w_channels_last.defined() && cuda_detail::pointer_alignment(p.w_channels_last.data) >= 16)
        wsrc = p.w_channels_last.data;
    else
        copy(w.reshape(Shape{Co, Ci, K}).permute({0, 2, 1}), TensorView(wcl, w.dtype, Shape{Co, K, Ci}, w.device));
    const cudnnStatus_t st =
        cuda_detail::execute_conv_plan(cudnn(), c.plan, src, wsrc, plan.out_channels_last ? out.data : ycl, ws);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    const void* b = bias.defined() ? bias.data : nullptr;
    if (plan.out_channels_last)
        DZR_CUDA_CHECK(kernels::add_bias_rows(out.data, out.dtype, Co, out.numel() / Co, b, bias.dtype, stream_));
    else
        DZR_CUDA_CHECK(kernels::channels_first_with_bias(ycl, out.data, out.dtype, Co, out.numel() / Co, b, bias.dtype,
                                                         stream_));
    return st;
}

void CudaBackend::tune_fast_conv(FastConvPlan& plan, const Conv3dParams& p, const TensorView& x, const TensorView& w,
                                 const TensorView& bias, const TensorView& out) {
    Timer host;
    EventPair ev;
    // The minimum of kTimedRuns event-timed runs after an untimed one (whose time alone is returned when it is
    // kSlowFactor times `bound`); < 0 when `run` fails.
    const auto time = [&](const auto& run, float bound) -> float {
        float best = std::numeric_limits<float>::infinity();
        for (int r = 0; r <= kTimedRuns; ++r) {
            DZR_CUDA_CHECK(cudaEventRecord(ev.a, stream_));
            if (!run()) {
                DZR_CUDA_CHECK(cudaStreamSynchronize(stream_));
                return -1.f;
            }
            DZR_CUDA_CHECK(cudaEventRecord(ev.b, stream_));
            DZR_CUDA_CHECK(cudaEventSynchronize(ev.b));
            float ms = 0.f;
            DZR_CUDA_CHECK(cudaEventElapsedTime(&ms, ev.a, ev.b));
            if (r > 0) best = std::min(best, ms);
            if (r == 0 && bound > 0.f && ms > kSlowFactor * bound) return ms;
        }
        return best;
    };
    // The reference path first, before this plan's buffers take arena space its plan may want.
    plan.reference_ms = time(
        [&] {
            conv3d_reference(p, x, w, bias, out);
            return true;
        },
        -1.f);
    const size_t layout = aligned(plan.x_bytes) + aligned(plan.w_bytes) + aligned(plan.y_bytes);
    const size_t free = arena_.capacity() - arena_.used();
    size_t max_ws = 0;
    int fitting = 0;
    for (const FastConvCandidate& c : plan.candidates)
        if (layout + aligned(c.workspace_bytes) <= free) max_ws = std::max(max_ws, c.workspace_bytes), ++fitting;
    float best = plan.reference_ms;
    plan.chosen = -1;
    if (fitting > 0) {
        ArenaScope scope(arena_);
        void* xcl = plan.x_bytes > 0 ? arena_.alloc(plan.x_bytes) : nullptr;
        void* wcl = arena_.alloc(plan.w_bytes);
        void* ycl = plan.y_bytes > 0 ? arena_.alloc(plan.y_bytes) : nullptr;
        void* ws = max_ws > 0 ? arena_.alloc(max_ws) : nullptr;
        float best_cl = std::numeric_limits<float>::infinity();
        for (size_t i = 0; i < plan.candidates.size(); ++i) {
            FastConvCandidate& c = plan.candidates[i];
            if (layout + aligned(c.workspace_bytes) > free) continue;
            c.ms = time(
                [&] {
                    return run_fast_candidate(plan, c, p, x, w, bias, out, xcl, wcl, ycl, ws) == CUDNN_STATUS_SUCCESS;
                },
                std::isfinite(best_cl) ? best_cl : plan.reference_ms);
            if (c.ms >= 0.f && c.ms < best_cl) {
                best_cl = c.ms;
                if (plan.reference_ms < 0.f || c.ms < kMinGain * plan.reference_ms ||
                    options_.conv_tune == ConvTune::ChannelsLast) {
                    best = c.ms;
                    plan.chosen = int(i);
                }
            }
        }
    } else {
        plan.note = fmt::format("no NHWC candidate fits the {} B of workspace free", free);
    }
    plan.tuned = true;
    plan.tune_ms = host.ms();
    log()->debug("fast conv {}: {} {:.3f} ms; the reference path (PyTorch's engine) {:.3f} ms; {} candidates, tuned "
                 "in {:.0f} ms{}",
                 plan.key, plan.chosen >= 0 ? plan.candidates[size_t(plan.chosen)].engine : "the reference path", best,
                 plan.reference_ms, plan.candidates.size(), plan.tune_ms,
                 plan.note.empty() ? "" : " (" + plan.note + ")");
}

bool CudaBackend::run_fast_conv(const Conv3dParams& p, const TensorView& x, const TensorView& w,
                                const TensorView& bias, const TensorView& out) {
    if (options_.conv_tune == ConvTune::Off) return false;
    FastConvPlan* plan = fast_conv_plan(p, x, w, out);
    if (!plan) return false;
    // NOTE: the plan's tensors declare 16-byte alignment; an x read or an out written in place at another offset (no
    // caller makes one) takes the reference path
    if ((plan->x_bytes == 0 && cuda_detail::pointer_alignment(x.data) < 16) ||
        (plan->out_channels_last && cuda_detail::pointer_alignment(out.data) < 16))
        return false;
    if (!plan->tuned) {
        cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
        DZR_CUDA_CHECK(cudaStreamIsCapturing(stream_, &capture));
        if (capture != cudaStreamCaptureStatusNone) {
            // NOTE: timing synchronizes, which a capture forbids; the shape keeps the reference path for good, so
            // that the captured graph and later eager calls compute the same numbers
            plan->tuned = true;
            plan->note = "first seen while capturing a CUDA graph: not tuned";
            return false;
        }
        tune_fast_conv(*plan, p, x, w, bias, out);
    }
    if (plan->chosen < 0) return false;
    const FastConvCandidate& c = plan->candidates[size_t(plan->chosen)];
    const size_t need = aligned(plan->x_bytes) + aligned(plan->w_bytes) + aligned(plan->y_bytes) +
                        aligned(c.workspace_bytes);
    if (need > arena_.capacity() - arena_.used()) {
        // NOTE: a workspace planned without this path (other numerics or tuning settings then); the shape keeps the
        // reference path from now on, so that its later calls compute the same numbers
        log()->warn("fast conv {}: {} B of workspace needed, {} B free; using the reference path", plan->key, need,
                    arena_.capacity() - arena_.used());
        plan->chosen = -1;
        return false;
    }
    ArenaScope scope(arena_);
    void* xcl = plan->x_bytes > 0 ? arena_.alloc(plan->x_bytes) : nullptr;
    void* wcl = arena_.alloc(plan->w_bytes);
    void* ycl = plan->y_bytes > 0 ? arena_.alloc(plan->y_bytes) : nullptr;
    void* ws = c.workspace_bytes > 0 ? arena_.alloc(c.workspace_bytes) : nullptr;
    const cudnnStatus_t st = run_fast_candidate(*plan, c, p, x, w, bias, out, xcl, wcl, ycl, ws);
    if (st == CUDNN_STATUS_SUCCESS) return true;
    // NOTE: as the reference path does with a refused launch: this shape runs the reference path from now on
    log()->warn("fast conv {}: {} failed ({}); using the reference path", plan->key, c.engine, cudnnGetErrorString(st));
    plan->chosen = -1;
    return false;
}

std::string CudaBackend::conv_plan_report() const {
    std::string out;
    if (numerics() != Numerics::Fast || options_.conv_tune == ConvTune::Off) {
        for (const auto& [key, plan] : conv_plans_)
            out += fmt::format("{:<64} {}, workspace {} B\n", key, plan->has_algo ? plan->engine : "direct kernel",
                               plan->workspace_bytes);
        return out;
    }
    for (const auto& [key, plan] : fast_conv_plans_) {
        if (!plan->tuned) continue;
        const bool cl = plan->chosen >= 0;
        out += fmt::format("{:<64} {:>9} {:>9.3f} ms  ref {:>9.3f} ms  {:>2} cand  tune {:>6.0f} ms  {}\n", key,
                           cl ? "channels-last" : "reference",
                           cl ? plan->candidates[size_t(plan->chosen)].ms : plan->reference_ms, plan->reference_ms,
                           plan->candidates.size(), plan->tune_ms,
                           cl ? plan->candidates[size_t(plan->chosen)].engine : plan->note);
    }
    return out;
}

}  // namespace dzr
