#pragma once
/// The compute interface every model forward goes through, in three parts:
///  - DeviceContext: allocation (persistent tensors, the workspace arena), memory information, capabilities;
///  - Stream: the ordered queue of work on that device: host transfers, events, synchronization, graph capture;
///  - Backend: the ops, one method per op family with a typed params struct, queued on the backend's stream.
/// CpuBackend is the fp32 reference (OpenBLAS); CudaBackend runs bf16 with fp32 accumulation (cuBLASLt, cuDNN,
/// kernels/). A backend's Numerics mode (options.h) is fixed when it is made. Model code never branches on the
/// backend.
///
/// Conventions for every op:
///  - Tensors are TensorViews on this backend's device. Inputs may be strided where an op says so;
///    outputs are contiguous unless stated. `{}` (a default TensorView) means "absent".
///  - Row ops (norms, softmax, activations, reductions) treat a tensor as [rows, cols] with cols the
///    last dimension.
///  - The CPU backend computes in f32 and accepts f32 tensors only (plus the dtype conversions of
///    copy/upload/download). The CUDA backend accepts f32 and bf16 for every float op, with fp32
///    accumulation inside; GEMM inputs must share a dtype.
///  - No op allocates or synchronizes with the host (except Stream::synchronize/download and upload of a
///    strided host source), so a forward can be captured into a CUDA graph.
#include <climits>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "backend/kv_view.h"
#include "backend/options.h"
#include "core/arena.h"
#include "core/tensor.h"

namespace dzr {

/// out[b] = alpha * op(a[b]) · op(b[b]) + beta * out[b] (+ bias broadcast over rows).
/// a: [M, K] (or [K, M] with trans_a), b: [K, N] (or [N, K] with trans_b; PyTorch Linear weights are
/// [out, in] so a Linear is trans_b = true), out: [M, N]. Rank-3 operands are batched over dim 0
/// (a batch stride of 0 broadcasts). The last dim of each operand must be contiguous; rows may be
/// strided (leading dimension = strides[-2]).
struct GemmParams {
    bool trans_a = false;
    bool trans_b = true;
    float alpha = 1.0f;
    float beta = 0.0f;
};

/// Elementwise binary op with broadcasting of b over a's leading dims: b has a's shape, or b's shape
/// equals a trailing part of a's shape (e.g. a [R, C] and b [C]), or b is a single element.
enum class BinaryOp : uint8_t { Add, Sub, Mul, Div };
struct BinaryParams {
    BinaryOp op = BinaryOp::Add;
};

/// out = alpha * x + beta (elementwise).
struct ScaleParams {
    float alpha = 1.0f;
    float beta = 0.0f;
};

/// GeluTanhStepwise is the tanh GELU written out op by op, 0.5·x · (1 + tanh(√(2/π)·(x + 0.044715·x³))),
/// as umT5's own GELU module does: on a bf16 backend every one of its eight steps rounds to bf16, as
/// PyTorch's eager ops do (on f32 it equals GeluTanh up to f32 rounding). Sigmoid is 1 / (1 + e^-x).
enum class Activation : uint8_t { GeluTanh, GeluErf, Silu, Relu, Sigmoid, GeluTanhStepwise };
struct ActivationParams {
    Activation kind = Activation::GeluTanh;
};

/// LayerNorm over the last dim: (x - mean) / sqrt(var + eps) [* weight] [+ bias].
struct LayerNormParams {
    float eps = 1e-5f;
};

/// RMSNorm over the last dim: x / sqrt(mean(x^2) + eps) [* weight]. On a bf16 output the normalized
/// value is rounded to bf16 before the weight multiply (Wan/umT5 RMSNorm: `norm(x.float()).type_as(x) * w`).
struct RmsNormParams {
    float eps = 1e-6f;
};

/// The Wan VAE's RMS_norm over the last dim (channels-last rows), optionally followed by SiLU:
/// y = x / max(||x||_2, eps) * scale * weight[c], out = silu ? y / (1 + e^-y) : y.
/// On a bf16/f16 output the backend's autocast state (Backend::autocast) picks the rounding points, mirroring the
/// reference's two regimes:
///  - autocast (torch.autocast): the norm runs in f32 and the whole chain rounds once, at the output;
///  - no autocast (plain bf16 eager ops): ||x|| (f32 sum), max(., eps), the division, * scale, * weight and the
///    SiLU each round to the output dtype, as PyTorch's bf16 ops do.
/// On an f32 output both are the same f32 computation. weight [C] is required.
struct L2NormParams {
    float eps = 1e-12f;
    float scale = 1.0f;
    bool silu = false;
};

/// Softmax over the last dim of (scale * x).
struct SoftmaxParams {
    float scale = 1.0f;
};

enum class ReduceOp : uint8_t { Sum, Mean, Max };
struct ReduceParams {
    ReduceOp op = ReduceOp::Sum;
};

/// Rotary embedding on interleaved channel pairs: for token t and pair j,
/// (x[2j], x[2j+1]) <- (x[2j] c - x[2j+1] s, x[2j] s + x[2j+1] c) with (c, s) = table[t, j].
/// x: [L, H, D] (D even), table: f32 [L, D/2, 2] holding (cos, sin) in f32, or f32 [L, D/2, 4] holding
/// (cos_hi, cos_lo, sin_hi, sin_lo) double-float pairs, with which the rotation is computed in double
/// and rounded to f32 before the output dtype (the reference's complex128 RoPE and its cast). The same
/// rotation applies to every head. Pairs beyond table's second dim are left unchanged (partial RoPE).
struct RopeParams {};

/// Dense non-causal attention: out = softmax(scale * q k^T + bias) v per head.
/// q: [Lq, H, D], k and v: [Lk, H, D] (strided rows allowed), out: [Lq, H, D].
/// bias (optional): f32 [H, Lq, Lk] added to the logits (T5 relative positions, masks).
struct AttentionParams {
    float scale = 1.0f;
};

/// 3-D convolution with zero padding, one sample: x [Ci, T, H, W], w [Co, Ci, kt, kh, kw],
/// bias [Co] (optional), out [Co, To, Ho, Wo]. Padding may differ before and after (causal time). x, w and out are
/// contiguous; where Capabilities::conv_channels_last, x and out may also be channels-last views.
struct Conv3dParams {
    int stride[3] = {1, 1, 1};
    int pad_before[3] = {0, 0, 0};
    int pad_after[3] = {0, 0, 0};
    /// A PyTorch Conv2d applied to every frame (kernel, stride and padding 1/0 in time): the same sum, but
    /// the CUDA backend runs cuDNN's 2-D convolution over the frames as a batch, as PyTorch does, whose
    /// kernels round differently from a (1, kh, kw) 3-D convolution in bf16. The CPU backend ignores it.
    bool frames_2d = false;
    /// With frames_2d: the 2-D convolution runs on channels-last (NHWC) frames and a channels-last weight, as
    /// PyTorch's cuDNN convolution does for a channels-last input (its kernels sum in another order). The CPU
    /// backend ignores it.
    bool channels_last = false;
    /// Optional: w laid out channels-last, [Co, kt, kh, kw, Ci] contiguous (the same values). Fast numerics' channels-
    /// last convolutions on CUDA read it instead of transposing w on every call; every other path reads w. A caller
    /// keeps it next to its weight (model/wan_vae_blocks.h ChannelsLastWeight); the CPU backend ignores it.
    TensorView w_channels_last;
};

/// The fused chains of a DiT block that `fast` numerics use (model/causal_dit.cpp). Each computes in f32 and rounds
/// once to the output dtype on a bf16 backend; the base implementations compose the plain ops (the CPU's f32 is the
/// same computation). Rows are split in at most two groups: rows [0, split) read row 0 of the per-group vectors
/// ([G, C] views, rows may be strided), rows [split, L) row 1; split >= L: one group. With period < L the rows are
/// blocks of `period` rows (the CFG branches' rows stacked in one batch), each grouped as above: row r is grouped,
/// and takes its rope table row, as row r % period.
struct FusedRowParams {
    float eps = 1e-6f;
    int64_t split = INT64_MAX;
    int64_t period = INT64_MAX;
};

/// What a backend can do beyond the ops every backend has.
struct Capabilities {
    /// resize_bicubic runs in the arithmetic of PyTorch's kernel for this device (else the caller resizes
    /// with its interpolation matrices, model/image_resize.h).
    bool resize_bicubic = false;
    /// paged_attention and scatter_kv (the paged KV cache's device path).
    bool paged_kv = false;
    /// Stream::record/elapsed_ms measure device time; false: host time of synchronous work (CPU).
    bool device_events = false;
    /// Stream::begin_capture / end_capture (CUDA graphs).
    bool graphs = false;
    /// The FP8 (E4M3) ops and an FP8 KV pool: on CUDA sm_89 and later; the CPU emulates them on decoded values.
    bool fp8 = false;
    /// Compute capability x 10 (90 = Hopper); 0 on the CPU.
    int compute_capability = 0;
    /// Allocations are fake and ops compute nothing (MeasuringBackend: workspace planning).
    bool measuring = false;
    /// conv3d also takes x and out channels-last: a [C, T, H, W] view of a contiguous [T, H, W, C] buffer (strides
    /// [1, H·W·C, W·C, C]), which spares a fast-numerics caller that holds channels-last rows the transposes.
    bool conv_channels_last = false;
};

/// Allocation and memory information of one device.
class DeviceContext {
public:
    virtual ~DeviceContext() = default;
    virtual Device device() const = 0;
    /// Persistent allocation (weights, KV pool), zero-filled. May allocate device memory.
    virtual Tensor alloc(Shape shape, DType dtype) = 0;
    /// Host memory the device copies from while it computes (Stream::copy_pinned): page-locked on a GPU, the heap
    /// on the CPU. Zero-filled; contiguous.
    virtual Tensor alloc_pinned(Shape shape, DType dtype) { return Tensor::host(shape, dtype); }
    /// The workspace arena forwards take activations from (see Arena).
    virtual Arena& workspace() = 0;
    /// (Re)create the workspace with the given capacity in bytes. Not for use inside a forward.
    virtual void reserve_workspace(size_t bytes) = 0;
    /// Device memory in use, device-wide (total minus free as the driver reports it: includes the context and
    /// other processes), in bytes; nullopt where not measured (CPU). Call it between forwards only.
    virtual std::optional<int64_t> memory_in_use() const { return std::nullopt; }
    /// Device memory free now (as the driver reports it); nullopt where not measured (CPU).
    virtual std::optional<int64_t> memory_free() const { return std::nullopt; }
    /// The GPU's PCI bus id ("00000000:3B:00.0", as NVML names it); "" for a device without one (CPU).
    virtual std::string pci_bus_id() const { return {}; }
    virtual Capabilities capabilities() const = 0;
};

/// A point in a stream's work. Made by Stream::make_event (outside a forward: it may allocate), recorded by
/// Stream::record (inside one: it does not).
class Event {
public:
    virtual ~Event() = default;
};

/// A captured sequence of a stream's work, replayed as one launch.
class Graph {
public:
    virtual ~Graph() = default;
    virtual void launch() = 0;
};

/// The ordered queue of work on one device. Ops of a Backend run on its stream, in call order.
class Stream {
public:
    virtual ~Stream() = default;
    /// Host -> device copy, converting dtype (src any float or integer dtype; a strided host source is packed
    /// first, on the host).
    virtual void upload(const TensorView& host_src, const TensorView& dst) = 0;
    /// Device -> host copy, converting dtype; synchronizes.
    virtual void download(const TensorView& src, const TensorView& host_dst) = 0;
    /// Wait for all queued work.
    virtual void synchronize() = 0;
    /// A new event (for record); may allocate, so make events before the calls that record them.
    virtual std::unique_ptr<Event> make_event() = 0;
    /// Marks the current point of the stream's work.
    virtual void record(Event& e) = 0;
    /// Later work of this stream waits for `e` (recorded on any stream of the same or a peer device).
    virtual void wait(const Event& e) = 0;
    /// Milliseconds between two recorded events; waits for `to` to complete.
    virtual double elapsed_ms(const Event& from, const Event& to) = 0;
    /// Graph capture (Capabilities::graphs): the stream's work between begin_capture and end_capture is recorded,
    /// not run, and end_capture returns it as a Graph. Throws where unsupported.
    virtual void begin_capture();
    virtual std::unique_ptr<Graph> end_capture();
    /// Ends a capture that failed (an op threw while capturing, or the capture was invalidated) and drops what was
    /// recorded, leaving the stream ready for eager work. No-op when nothing is being captured.
    virtual void abort_capture() {}
    /// True between begin_capture and end_capture/abort_capture.
    virtual bool capturing() const { return false; }
    /// dst = the dst.nbytes() bytes at `pinned_src` (DeviceContext::alloc_pinned memory), no conversion; queued, so
    /// the source must stay unchanged until the copy is done. Capture-safe. Throws where unsupported.
    virtual void copy_pinned(const void* pinned_src, const TensorView& dst);
};

class Profiler;

/// The ops. Each op is a public function that runs the backend's protected `do_<op>` inside one bracket
/// (backend_ops.cpp), which is all that profiling and workspace planning need of an op:
///  - with a profiler attached (attach_profiler) that times ops, the outermost op is recorded under its key (its kind
///    and shapes, "gemm tb bf16[1785,5120] x bf16[5120,5120]") between two stream events; the ops an op runs itself
///    (a composition, a fallback) are part of it;
///  - on a measuring backend (MeasuringBackend) nothing is computed: plain ops are skipped, the fused DiT ops run
///    their base composition (its scratch counts), and an op with workspace of its own takes what its
///    `*_workspace_bytes` query says.
/// A new op is its public function, its bracket and key (backend_ops.cpp) and its `do_<op>`, then an implementation
/// in each backend.
class Backend {
public:
    virtual ~Backend();

    virtual std::string name() const = 0;
    /// The dtype activations and weights use on this backend (CPU: f32, CUDA: bf16).
    virtual DType compute_dtype() const = 0;
    virtual DeviceContext& context() = 0;
    virtual const DeviceContext& context() const = 0;
    virtual Stream& stream() = 0;
    /// A second stream of the device for host -> device copies (Stream::copy_pinned) that overlap the work of
    /// stream(), ordered against it with events; in a graph capture of stream() it joins the capture through them
    /// (model/layer_stream.h). Throws where unsupported.
    virtual std::unique_ptr<Stream> make_copy_stream();
    Numerics numerics() const { return numerics_; }

    // ---- profiling (profiler.h) --------------------------------------------------------------------
    /// From now on the ops run between a Profiler's events (time_ops false: the ops run untimed, regions and the
    /// kernel tracer only: Profiler::ops_timed). BackendOptions::profile attaches one in make_backend.
    void attach_profiler(bool time_ops = true);
    /// The attached profiler, else null.
    Profiler* profiler() { return profiler_.get(); }

    // ---- the device and the stream, for the common calls ---------------------------------------
    Device device() const { return context().device(); }
    Capabilities capabilities() const { return context().capabilities(); }
    Tensor alloc(Shape shape, DType dtype) { return context().alloc(shape, dtype); }
    Arena& workspace() { return context().workspace(); }
    void reserve_workspace(size_t bytes) { context().reserve_workspace(bytes); }
    std::optional<int64_t> device_memory_in_use() const { return context().memory_in_use(); }
    /// A contiguous activation buffer from the workspace.
    TensorView scratch(Shape shape, DType dtype) { return workspace().alloc_view(shape, dtype); }
    TensorView scratch(Shape shape) { return scratch(shape, compute_dtype()); }
    void upload(const TensorView& host_src, const TensorView& dst) { stream().upload(host_src, dst); }
    void download(const TensorView& src, const TensorView& host_dst) { stream().download(src, host_dst); }
    void synchronize() { stream().synchronize(); }

    // ---- autocast --------------------------------------------------------------------------------
    /// While an AutocastScope is open, a bf16/f16 backend computes the norm chains that torch.autocast promotes
    /// (l2_norm with its SiLU) in f32 and rounds once, at the output; outside, they round after each step as
    /// plain eager bf16 ops do. An f32 backend computes both in f32. Reference numerics honour it; fast
    /// numerics may round once either way.
    bool autocast() const { return autocast_; }

    // ---- implementation choices (CUDA; other backends have one implementation per op) ----------------
    /// Replaces the CUDA implementation choices made at creation (benches and parity probes compare them).
    virtual void set_cuda_options(const CudaBackendOptions& options) { (void)options; }
    virtual CudaBackendOptions cuda_options() const { return {}; }
    /// The implementation that ran the last attention call (attention_impl_name), "" where there is one.
    virtual std::string last_attention_impl() const { return ""; }
    /// The convolution plans made so far, one line per call shape (CUDA in fast numerics: the autotuner's choice
    /// and times against the reference path's); "" where there is nothing to report.
    virtual std::string conv_plan_report() const { return ""; }

    // ==== generic ops ===========================================================================
    /// Device copy, converting dtype; src may be strided (any permutation), dst contiguous.
    void copy(const TensorView& src, const TensorView& dst);
    /// Set every element of a contiguous tensor to value.
    void fill(const TensorView& dst, float value);
    void gemm(const GemmParams& p, const TensorView& a, const TensorView& b, const TensorView& bias,
              const TensorView& out);
    void binary(const BinaryParams& p, const TensorView& a, const TensorView& b, const TensorView& out);
    void scale(const ScaleParams& p, const TensorView& x, const TensorView& out);
    void activation(const ActivationParams& p, const TensorView& x, const TensorView& out);
    void layer_norm(const LayerNormParams& p, const TensorView& x, const TensorView& weight, const TensorView& bias,
                    const TensorView& out);
    void rms_norm(const RmsNormParams& p, const TensorView& x, const TensorView& weight, const TensorView& out);
    void l2_norm(const L2NormParams& p, const TensorView& x, const TensorView& weight, const TensorView& out);
    void softmax(const SoftmaxParams& p, const TensorView& x, const TensorView& out);
    void reduce(const ReduceParams& p, const TensorView& x, const TensorView& out);
    void rope(const RopeParams& p, const TensorView& x, const TensorView& table, const TensorView& out);
    void attention(const AttentionParams& p, const TensorView& q, const TensorView& k, const TensorView& v,
                   const TensorView& bias, const TensorView& out);
    void conv3d(const Conv3dParams& p, const TensorView& x, const TensorView& w, const TensorView& bias,
                const TensorView& out);
    /// Workspace bytes conv3d takes from the arena for these shapes (its padded or re-laid-out operands and the
    /// library's scratch), planning the call now if needed: the CUDA backend fixes the cuDNN engine PyTorch would
    /// pick without a workspace limit, so a workspace planned with this (MeasuringBackend) always leaves room for
    /// it. Only shapes and dtypes of the views are read. 0 where there is none.
    virtual size_t conv3d_workspace_bytes(const Conv3dParams& p, const TensorView& x, const TensorView& w,
                                          const TensorView& out) {
        (void)p, (void)x, (void)w, (void)out;
        return 0;
    }
    /// Bicubic resize of an f32 image [C, H, W] -> f32 [C, h, w] (both contiguous) in the arithmetic of PyTorch's
    /// kernel for this device. Only where capabilities().resize_bicubic; the base implementation throws (callers
    /// resize with their interpolation matrices elsewhere, model/image_resize.h).
    void resize_bicubic(const TensorView& src, const TensorView& dst);
    /// A table of sinusoids, out: [T, 2·half]: out[t, j] = sin(t · e_j), out[t, half + j] = cos(t · e_j) with
    /// e_j = exp(−j · step), each step one f32 operation (−j · step, exp, t · e_j, sin / cos), then stored in
    /// out's dtype. The reference evaluates this (the action encoder's timestep encoding) on its device, so a
    /// device backend computes it with the device's f32 exp/sin/cos; the base implementation computes it on the host
    /// (std::exp, std::sin, std::cos in float) and uploads it. For tables built at load, not in a forward.
    void sin_cos_table(float step, const TensorView& out);
    /// out (i32 [1] on this backend's device) = the number of NaN and ±Inf elements of x (a contiguous float
    /// tensor). Queued like any op: the caller downloads the count (policy/finite_check.h). The base implementation
    /// downloads x and counts on the host.
    void count_nonfinite(const TensorView& x, const TensorView& out);

    // ---- FP8 (E4M3) ops (core/fp8.h defines the quantization); the base implementations throw ----------
    /// Per-row quantization: x [rows, cols] (f32 or the compute dtype; rows may be strided, unit last stride) ->
    /// q F8_E4M3 [rows, cols] (contiguous) and scales F32 [rows]: scale = max(amax, 1e-12) / 448, q = e4m3(x · 448 /
    /// max(amax, 1e-12)), rounded to nearest even and saturating. The CPU and the CUDA backend write the same bits
    /// for the same input (activations per token; the FP8 KV pool per token and head).
    void quantize_fp8(const TensorView& x, const TensorView& q, const TensorView& scales);
    /// out[r, c] = e4m3 q[r, c] · scales[r] (f32 product) in out's dtype: q F8_E4M3 [rows, cols] and out
    /// [rows, cols] contiguous, scales F32 [rows].
    void dequantize_fp8(const TensorView& q, const TensorView& scales, const TensorView& out);
    /// The FP8 Linear: out[m, n] = x_scales[m] · w_scales[n] · Σ_k xq[m, k] · wq[n, k] (+ bias[n]), the E4M3 products
    /// summed in f32. xq: F8_E4M3 [M, K] and wq: F8_E4M3 [N, K] (a Linear weight), both contiguous; x_scales F32 [M],
    /// w_scales F32 [N]; bias [N] (optional) and out [M, N] (unit last stride) in f32 or the compute dtype. Needs
    /// capabilities().fp8 on a device; the CPU runs it on dequantized values.
    void gemm_fp8(const TensorView& xq, const TensorView& x_scales, const TensorView& wq, const TensorView& w_scales,
                  const TensorView& bias, const TensorView& out);

    // ==== fused DiT ops =========================================================================
    // ---- the fused chains of `fast` numerics (FusedRowParams); the base implementations compose the ops above ----
    /// out = (LN(x) [* weight + bias]) [* (1 + scale[g])] [+ shift[g]]; x, out: contiguous [L, C].
    void ada_layer_norm(const FusedRowParams& p, const TensorView& x, const TensorView& weight, const TensorView& bias,
                        const TensorView& scale, const TensorView& shift, const TensorView& out);
    /// x += y [* gate[g]]; x, y: contiguous [L, C] of one dtype. y may be overwritten (it is scratch to the caller).
    void gated_residual(const FusedRowParams& p, const TensorView& x, const TensorView& y, const TensorView& gate);
    /// out [L, H, D] = rope(rms_norm(x) * weight): the RMS over each whole row of x (contiguous [L, H·D]), then
    /// RopeParams' rotation with table_a's rows for rows [0, split) and table_b's rows for rows [split, L) (tables
    /// absent: no rotation).
    void rms_norm_rope(const FusedRowParams& p, const TensorView& x, const TensorView& weight,
                       const TensorView& table_a, const TensorView& table_b, const TensorView& out);
    /// x += y [* gate[g]] (rounded to x's dtype), then out = ada_layer_norm(x, weight, bias, scale, shift): a residual
    /// add and the next norm in one pass over x. Operands as gated_residual and ada_layer_norm; y may be overwritten.
    void gated_residual_norm(const FusedRowParams& p, const TensorView& x, const TensorView& y, const TensorView& gate,
                             const TensorView& weight, const TensorView& bias, const TensorView& scale,
                             const TensorView& shift, const TensorView& out);
    /// out = gelu_tanh(op(a) · op(b) + bias): gemm's operands (rank 2 or 3) and params, then the tanh GELU
    /// (Activation::GeluTanh), computed in f32 and rounded once where the backend fuses it (CUDA: cuBLASLt's GELU_BIAS
    /// epilogue, whose GELU is the tanh form). The base implementation runs gemm, then activation in place.
    void gemm_gelu(const GemmParams& p, const TensorView& a, const TensorView& b, const TensorView& bias,
                   const TensorView& out);
    /// ada_layer_norm whose output, rounded to the compute dtype, is quantized as quantize_fp8 quantizes it: q F8_E4M3
    /// [L, C] (contiguous) and scales F32 [L]; the bf16 rows themselves are not written (the norm in front of FP8
    /// Linears, in one pass). The base implementation runs ada_layer_norm into the workspace, then quantize_fp8: the
    /// same codes and scales.
    void ada_layer_norm_fp8(const FusedRowParams& p, const TensorView& x, const TensorView& weight,
                            const TensorView& bias, const TensorView& scale, const TensorView& shift,
                            const TensorView& q, const TensorView& scales);
    /// quantize_fp8 of activation(x) rounded to x's dtype (x contiguous [rows, cols], left unchanged): the FFN's GELU
    /// and the next FP8 Linear's quantization in one pass. The base implementation runs the activation into the
    /// workspace, then quantize_fp8: the same codes and scales.
    void activation_quantize_fp8(const ActivationParams& p, const TensorView& x, const TensorView& q,
                                 const TensorView& scales);

    // ---- paged KV cache ops (kv_view.h); the base implementations throw "not supported" ----------
    /// Non-causal attention of q over [history rows through the block table | current rows], per head:
    /// out = softmax(scale * q [K_hist | k_cur]^T) [V_hist | v_cur]. q, out: [Lq, H, D]; k_cur, v_cur:
    /// [Lc, H, D] (strided rows allowed); history: a view of the pool whose block table and storage are on
    /// this backend's device; `layer` selects the pool layer. With no keys at all the output is zero.
    void paged_attention(const AttentionParams& p, const TensorView& q, const PagedKvView& history, int layer,
                         const TensorView& k_cur, const TensorView& v_cur, const TensorView& out);
    /// Workspace bytes paged_attention takes from the arena for this history and these current rows (shapes
    /// only). 0 where there is none.
    virtual size_t paged_attention_workspace_bytes(const PagedKvView& history, const TensorView& k_cur) {
        (void)history, (void)k_cur;
        return 0;
    }
    /// paged_attention of B branches at once (the CFG branches of one batched forward): branch b's query, current
    /// and output rows are rows [b·L, (b+1)·L) of q, k_cur, v_cur and out ([B·L, H, D], L = q.dim(0) / B), its
    /// history histories[b]. Each branch's result is what paged_attention gives it; a backend that runs the branches
    /// as one call (CUDA, fast numerics: one cuDNN SDPA of batch B when every history has the same length) may round
    /// like that call. The base implementation runs paged_attention per branch.
    void paged_attention_batched(const AttentionParams& p, const TensorView& q, std::span<const PagedKvView> histories,
                                 int layer, const TensorView& k_cur, const TensorView& v_cur, const TensorView& out);
    /// Workspace bytes paged_attention_batched takes (shapes only): by default the most one branch's call takes.
    virtual size_t paged_attention_batched_workspace_bytes(std::span<const PagedKvView> histories,
                                                           const TensorView& k_cur);
    /// Writes row i of k and v ([n, H, D]) to pool slot slots[i] (i64 [n] on this backend's device; slot =
    /// block_id * block_size + offset) of layer `layer`; kPadSlot (-1) rows are skipped. Slots must lie in
    /// [0, num_slots); the CPU checks, the CUDA kernel skips rows outside (it cannot throw).
    void scatter_kv(const PagedKvView& pool, int layer, const TensorView& slots, const TensorView& k,
                    const TensorView& v, int64_t num_slots);

    // ---- conveniences built on the ops ---------------------------------------------------------
    /// PyTorch Linear: out[M, N] = x[M, K] · w[N, K]^T + bias[N].
    void linear(const TensorView& x, const TensorView& w, const TensorView& bias, const TensorView& out) {
        gemm(GemmParams{}, x, w, bias, out);
    }
    void add(const TensorView& a, const TensorView& b, const TensorView& out) { binary({BinaryOp::Add}, a, b, out); }
    void mul(const TensorView& a, const TensorView& b, const TensorView& out) { binary({BinaryOp::Mul}, a, b, out); }

protected:
    /// measuring: the ops compute nothing (MeasuringBackend; see the ops' bracket above).
    explicit Backend(Numerics numerics = Numerics::Reference, bool measuring = false);

    // ---- the ops' implementations, one per public op above (which documents it) ----------------------
    // Generic ops: each backend implements them; these defaults throw "backend ... has no <op>".
    virtual void do_copy(const TensorView&, const TensorView&) { unsupported("copy"); }
    virtual void do_fill(const TensorView&, float) { unsupported("fill"); }
    virtual void do_gemm(const GemmParams&, const TensorView&, const TensorView&, const TensorView&,
                         const TensorView&) {
        unsupported("gemm");
    }
    virtual void do_binary(const BinaryParams&, const TensorView&, const TensorView&, const TensorView&) {
        unsupported("binary");
    }
    virtual void do_scale(const ScaleParams&, const TensorView&, const TensorView&) { unsupported("scale"); }
    virtual void do_activation(const ActivationParams&, const TensorView&, const TensorView&) {
        unsupported("activation");
    }
    virtual void do_layer_norm(const LayerNormParams&, const TensorView&, const TensorView&, const TensorView&,
                               const TensorView&) {
        unsupported("layer_norm");
    }
    virtual void do_rms_norm(const RmsNormParams&, const TensorView&, const TensorView&, const TensorView&) {
        unsupported("rms_norm");
    }
    virtual void do_l2_norm(const L2NormParams&, const TensorView&, const TensorView&, const TensorView&) {
        unsupported("l2_norm");
    }
    virtual void do_softmax(const SoftmaxParams&, const TensorView&, const TensorView&) { unsupported("softmax"); }
    virtual void do_reduce(const ReduceParams&, const TensorView&, const TensorView&) { unsupported("reduce"); }
    virtual void do_rope(const RopeParams&, const TensorView&, const TensorView&, const TensorView&) {
        unsupported("rope");
    }
    virtual void do_attention(const AttentionParams&, const TensorView&, const TensorView&, const TensorView&,
                              const TensorView&, const TensorView&) {
        unsupported("attention");
    }
    virtual void do_conv3d(const Conv3dParams&, const TensorView&, const TensorView&, const TensorView&,
                           const TensorView&) {
        unsupported("conv3d");
    }
    virtual void do_resize_bicubic(const TensorView&, const TensorView&) {
        unsupported("device bicubic resize (capabilities().resize_bicubic)");
    }
    virtual void do_sin_cos_table(float step, const TensorView& out);
    virtual void do_count_nonfinite(const TensorView& x, const TensorView& out);
    virtual void do_quantize_fp8(const TensorView&, const TensorView&, const TensorView&) {
        unsupported("FP8 quantization");
    }
    virtual void do_dequantize_fp8(const TensorView&, const TensorView&, const TensorView&) {
        unsupported("FP8 dequantization");
    }
    virtual void do_gemm_fp8(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                             const TensorView&, const TensorView&) {
        unsupported("FP8 GEMM");
    }
    // Fused DiT ops: the defaults compose the generic ops (backend.cpp), the CPU's implementation.
    virtual void do_ada_layer_norm(const FusedRowParams& p, const TensorView& x, const TensorView& weight,
                                   const TensorView& bias, const TensorView& scale, const TensorView& shift,
                                   const TensorView& out);
    virtual void do_gated_residual(const FusedRowParams& p, const TensorView& x, const TensorView& y,
                                   const TensorView& gate);
    virtual void do_rms_norm_rope(const FusedRowParams& p, const TensorView& x, const TensorView& weight,
                                  const TensorView& table_a, const TensorView& table_b, const TensorView& out);
    virtual void do_gated_residual_norm(const FusedRowParams& p, const TensorView& x, const TensorView& y,
                                        const TensorView& gate, const TensorView& weight, const TensorView& bias,
                                        const TensorView& scale, const TensorView& shift, const TensorView& out);
    virtual void do_gemm_gelu(const GemmParams& p, const TensorView& a, const TensorView& b, const TensorView& bias,
                              const TensorView& out);
    virtual void do_ada_layer_norm_fp8(const FusedRowParams& p, const TensorView& x, const TensorView& weight,
                                       const TensorView& bias, const TensorView& scale, const TensorView& shift,
                                       const TensorView& q, const TensorView& scales);
    virtual void do_activation_quantize_fp8(const ActivationParams& p, const TensorView& x, const TensorView& q,
                                            const TensorView& scales);
    // Paged KV ops: the defaults throw, but for the batched attention's (paged_attention per branch).
    virtual void do_paged_attention(const AttentionParams&, const TensorView&, const PagedKvView&, int,
                                    const TensorView&, const TensorView&, const TensorView&) {
        unsupported("paged attention");
    }
    virtual void do_paged_attention_batched(const AttentionParams& p, const TensorView& q,
                                            std::span<const PagedKvView> histories, int layer, const TensorView& k_cur,
                                            const TensorView& v_cur, const TensorView& out);
    virtual void do_scatter_kv(const PagedKvView&, int, const TensorView&, const TensorView&, const TensorView&,
                               int64_t) {
        unsupported("KV scatter");
    }

private:
    friend class AutocastScope;
    [[noreturn]] void unsupported(const char* op) const;
    /// The bracket of every op (backend_ops.cpp): `run` on a computing backend, the outermost op of a profiled one
    /// between the profiler's events under `key()`; `measure` instead on a measuring backend.
    template <class Key, class Run, class Measure>
    void bracket(const Key& key, const Run& run, const Measure& measure);
    /// Takes `bytes` of the workspace and gives them back (a measured op's own workspace).
    void touch_workspace(size_t bytes);

    Numerics numerics_;
    bool measuring_ = false;
    bool autocast_ = false;
    bool in_op_ = false;  // a profiled op is running: the ops it runs are part of it
    std::unique_ptr<Profiler> profiler_;
};

/// Sets a backend's autocast state for its lifetime, then restores the previous one (torch.autocast's scope).
class AutocastScope {
public:
    AutocastScope(Backend& be, bool enabled) : be_(be), prev_(be.autocast_) { be.autocast_ = enabled; }
    ~AutocastScope() { be_.autocast_ = prev_; }
    AutocastScope(const AutocastScope&) = delete;
    AutocastScope& operator=(const AutocastScope&) = delete;

private:
    Backend& be_;
    bool prev_;
};

/// The fp32 reference backend (OpenBLAS).
std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options = {});
/// The CUDA backend on device `index`. Throws dzr::Error when built without CUDA or no GPU exists.
std::unique_ptr<Backend> make_cuda_backend(int index = 0, const BackendOptions& options = {});
/// The same with default options but for the workspace (tests, benches).
inline std::unique_ptr<Backend> make_cpu_backend(size_t workspace_bytes) {
    BackendOptions o;
    o.workspace_bytes = workspace_bytes;
    return make_cpu_backend(o);
}
inline std::unique_ptr<Backend> make_cuda_backend(int index, size_t workspace_bytes) {
    BackendOptions o;
    o.workspace_bytes = workspace_bytes;
    return make_cuda_backend(index, o);
}
/// Backend for a device ("cpu", "cuda:1"), with `options` as given (apply_env_overrides is the caller's choice).
std::unique_ptr<Backend> make_backend(const Device& device, const BackendOptions& options = {});

/// True when dzr was built with the CUDA backend (-DDZR_CUDA=ON).
bool cuda_backend_built();
/// True when dzr was built with CUDA and at least one device is visible.
bool cuda_device_available();
/// The number of visible CUDA devices (0 when built without CUDA or when none is visible).
int cuda_device_count();

}  // namespace dzr
