#pragma once
/// The compute interface every model forward goes through. One method per op family, each with a
/// typed params struct. CpuBackend is the fp32 reference (OpenBLAS); CudaBackend runs bf16 with fp32
/// accumulation (cuBLASLt, cuDNN, kernels/). Model code never branches on the backend.
///
/// Conventions for every op:
///  - Tensors are TensorViews on this backend's device. Inputs may be strided where an op says so;
///    outputs are contiguous unless stated. `{}` (a default TensorView) means "absent".
///  - Row ops (norms, softmax, activations, reductions) treat a tensor as [rows, cols] with cols the
///    last dimension.
///  - The CPU backend computes in f32 and accepts f32 tensors only (plus the dtype conversions of
///    copy/upload/download). The CUDA backend accepts f32 and bf16 for every float op, with fp32
///    accumulation inside; GEMM inputs must share a dtype.
///  - No op allocates or synchronizes with the host (except synchronize/download/upload), so a forward
///    can be captured into a CUDA graph.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "core/arena.h"
#include "core/tensor.h"
#include "kv/kv_view.h"

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
/// `eager` picks the rounding points on a bf16/f16 output, mirroring the reference's two regimes:
///  - false (torch.autocast): the norm runs in f32 and the whole chain rounds once, at the output;
///  - true (plain bf16 eager ops): ||x|| (f32 sum), max(., eps), the division, * scale, * weight and the
///    SiLU each round to the output dtype, as PyTorch's bf16 ops do.
/// On an f32 output both are the same f32 computation. weight [C] is required.
struct L2NormParams {
    float eps = 1e-12f;
    float scale = 1.0f;
    bool silu = false;
    bool eager = false;
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
/// bias [Co] (optional), out [Co, To, Ho, Wo]. Padding may differ before and after (causal time).
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
};

class Backend {
public:
    virtual ~Backend() = default;

    virtual Device device() const = 0;
    virtual std::string name() const = 0;
    /// The dtype activations and weights use on this backend (CPU: f32, CUDA: bf16).
    virtual DType compute_dtype() const = 0;

    // ---- memory -------------------------------------------------------------------------------
    /// Persistent allocation (weights, KV pool), zero-filled. May allocate device memory.
    virtual Tensor alloc(Shape shape, DType dtype) = 0;
    /// The workspace arena forwards take activations from (see Arena).
    virtual Arena& workspace() = 0;
    /// (Re)create the workspace with the given capacity in bytes. Not for use inside a forward.
    virtual void reserve_workspace(size_t bytes) = 0;
    /// A contiguous activation buffer from the workspace.
    TensorView scratch(Shape shape, DType dtype) { return workspace().alloc_view(shape, dtype); }
    TensorView scratch(Shape shape) { return scratch(shape, compute_dtype()); }

    /// Host -> device copy, converting dtype (src any float or integer dtype, contiguous host view).
    virtual void upload(const TensorView& host_src, const TensorView& dst) = 0;
    /// Device -> host copy, converting dtype; synchronizes.
    virtual void download(const TensorView& src, const TensorView& host_dst) = 0;
    /// Device copy, converting dtype; src may be strided (any permutation), dst contiguous.
    virtual void copy(const TensorView& src, const TensorView& dst) = 0;
    /// Set every element of a contiguous tensor to value.
    virtual void fill(const TensorView& dst, float value) = 0;
    /// Wait for all queued work.
    virtual void synchronize() = 0;
    /// Device memory in use, device-wide (total minus free as the driver reports it: includes the
    /// context and other processes), in bytes; nullopt where not measured (CPU). Call it between
    /// forwards only (it may synchronize with the device).
    virtual std::optional<int64_t> device_memory_in_use() const { return std::nullopt; }

    // ---- ops ----------------------------------------------------------------------------------
    virtual void gemm(const GemmParams& p, const TensorView& a, const TensorView& b, const TensorView& bias,
                      const TensorView& out) = 0;
    virtual void binary(const BinaryParams& p, const TensorView& a, const TensorView& b,
                        const TensorView& out) = 0;
    virtual void scale(const ScaleParams& p, const TensorView& x, const TensorView& out) = 0;
    virtual void activation(const ActivationParams& p, const TensorView& x, const TensorView& out) = 0;
    virtual void layer_norm(const LayerNormParams& p, const TensorView& x, const TensorView& weight,
                            const TensorView& bias, const TensorView& out) = 0;
    virtual void rms_norm(const RmsNormParams& p, const TensorView& x, const TensorView& weight,
                          const TensorView& out) = 0;
    virtual void l2_norm(const L2NormParams& p, const TensorView& x, const TensorView& weight,
                         const TensorView& out) = 0;
    virtual void softmax(const SoftmaxParams& p, const TensorView& x, const TensorView& out) = 0;
    virtual void reduce(const ReduceParams& p, const TensorView& x, const TensorView& out) = 0;
    virtual void rope(const RopeParams& p, const TensorView& x, const TensorView& table,
                      const TensorView& out) = 0;
    virtual void attention(const AttentionParams& p, const TensorView& q, const TensorView& k,
                           const TensorView& v, const TensorView& bias, const TensorView& out) = 0;
    virtual void conv3d(const Conv3dParams& p, const TensorView& x, const TensorView& w, const TensorView& bias,
                        const TensorView& out) = 0;
    /// Workspace bytes conv3d takes for these shapes beyond its own buffers (the library's scratch), planning the
    /// call now if needed: the CUDA backend fixes the cuDNN engine PyTorch would pick without a workspace limit,
    /// so a workspace planned with this (MeasuringBackend) always leaves room for it. Only shapes and dtypes of
    /// the views are read. 0 where there is none.
    virtual size_t conv3d_workspace_bytes(const Conv3dParams& p, const TensorView& x, const TensorView& w,
                                          const TensorView& out) {
        (void)p, (void)x, (void)w, (void)out;
        return 0;
    }
    /// Bicubic resize of an f32 image [C, H, W] -> f32 [C, h, w] (both contiguous) in the arithmetic of
    /// PyTorch's kernel for this device, where the backend has one; false where it does not (the caller then
    /// resizes with its interpolation matrices, model/image_resize.h).
    virtual bool resize_bicubic(const TensorView& src, const TensorView& dst) {
        (void)src, (void)dst;
        return false;
    }
    /// A table of sinusoids, out: [T, 2·half]: out[t, j] = sin(t · e_j), out[t, half + j] = cos(t · e_j) with
    /// e_j = exp(−j · step), each step one f32 operation (−j · step, exp, t · e_j, sin / cos), then stored in
    /// out's dtype. The reference evaluates this (the action encoder's timestep encoding) on its device, so a
    /// device backend computes it with the device's f32 exp/sin/cos; this default computes it on the host
    /// (std::exp, std::sin, std::cos in float) and uploads it. For tables built at load, not in a forward.
    virtual void sin_cos_table(float step, const TensorView& out);
    /// out (i32 [1] on this backend's device) = the number of NaN and ±Inf elements of x (a contiguous float
    /// tensor). Queued like any op: the caller downloads the count (policy/finite_check.h). This default
    /// downloads x and counts on the host.
    virtual void count_nonfinite(const TensorView& x, const TensorView& out);

    // ---- paged KV cache ops (kv_view.h); the base implementations throw "not supported" ----------
    /// Non-causal attention of q over [history rows through the block table | current rows], per head:
    /// out = softmax(scale * q [K_hist | k_cur]^T) [V_hist | v_cur]. q, out: [Lq, H, D]; k_cur, v_cur:
    /// [Lc, H, D] (strided rows allowed); history: a view of the pool whose block table and storage are on
    /// this backend's device; `layer` selects the pool layer. With no keys at all the output is zero.
    virtual void paged_attention(const AttentionParams& p, const TensorView& q, const PagedKvView& history,
                                 int layer, const TensorView& k_cur, const TensorView& v_cur, const TensorView& out);
    /// Writes row i of k and v ([n, H, D]) to pool slot slots[i] (i64 [n] on this backend's device; slot =
    /// block_id * block_size + offset) of layer `layer`; kPadSlot (-1) rows are skipped. Slots must lie in
    /// [0, num_slots); the CPU checks, the CUDA kernel skips rows outside (it cannot throw).
    virtual void scatter_kv(const PagedKvView& pool, int layer, const TensorView& slots, const TensorView& k,
                            const TensorView& v, int64_t num_slots);

    // ---- conveniences built on the ops ---------------------------------------------------------
    /// PyTorch Linear: out[M, N] = x[M, K] · w[N, K]^T + bias[N].
    void linear(const TensorView& x, const TensorView& w, const TensorView& bias, const TensorView& out) {
        gemm(GemmParams{}, x, w, bias, out);
    }
    void add(const TensorView& a, const TensorView& b, const TensorView& out) {
        binary({BinaryOp::Add}, a, b, out);
    }
    void mul(const TensorView& a, const TensorView& b, const TensorView& out) {
        binary({BinaryOp::Mul}, a, b, out);
    }
};

/// The fp32 reference backend (OpenBLAS). `threads` = 0 leaves OpenBLAS's default.
std::unique_ptr<Backend> make_cpu_backend(size_t workspace_bytes = 0);
/// The CUDA backend on device `index`. Throws dzr::Error when built without CUDA or no GPU exists.
std::unique_ptr<Backend> make_cuda_backend(int index = 0, size_t workspace_bytes = 0);
/// Backend for a device string ("cpu", "cuda", "cuda:1").
std::unique_ptr<Backend> make_backend(const Device& device, size_t workspace_bytes = 0);

/// True when dzr was built with CUDA and at least one device is visible.
bool cuda_device_available();

}  // namespace dzr
