#pragma once
/// The layers the four networks share: a Linear (nn.Linear), an RmsNorm (T5/Wan RMSNorm with a weight), a
/// LayerNorm (affine or not) and the action heads' CategoryLinear. Each holds its weights as loaded (typed
/// members, no lookup by name in a forward) and runs through one Backend op with the parameters the networks
/// always passed, so a network built from them issues exactly the calls it issued with bare tensors.
///
/// Keys: `prefix` is a module path without the trailing dot ("action_head.model.blocks.3.self_attn.q"); the
/// layer appends its parameter names (".weight", ".bias"; ".W", ".b" for CategoryLinear).
#include <cstdint>
#include <initializer_list>
#include <string>

#include "backend/backend.h"
#include "core/tensor.h"
#include "weights/weight_source.h"

namespace dzr {

/// nn.Linear: out[M, out] = x[M, in] · wᵀ (+ b), one GEMM with the bias in its epilogue.
/// Activations quantized once (per token, Backend::quantize_fp8) for several FP8 Linears that read the same input
/// (q, k and v read one normed x); undefined when none of them is FP8. The views live in the workspace scope they
/// were made in.
struct Fp8Input {
    TensorView q;       // F8_E4M3 [rows, in]
    TensorView scales;  // F32 [rows]

    bool defined() const { return q.defined(); }
    /// x quantized into the workspace when `fp8` (else undefined).
    static Fp8Input quantize(Backend& be, const TensorView& x, bool fp8);
};

struct Linear;

/// What a Linear reads (Linear::forward): rows [n, in] in the compute dtype and, for FP8 Linears, their per-token
/// quantization, made once for the several Linears that read the same rows (q, k and v read one normed x). A norm in
/// front of FP8 Linears may write the codes alone (AdaLayerNorm::forward: `rows` undefined). `gelu`: the rows are the
/// input of a tanh GELU that the reader applies first (fused into its quantization when FP8).
struct LinearInput {
    TensorView rows;
    Fp8Input fp8;
    bool gelu = false;

    /// x for the Linears `readers`: quantized once when several of them share it and any is FP8 (a single reader
    /// quantizes x itself, in its own workspace scope).
    static LinearInput shared(Backend& be, const TensorView& x, std::initializer_list<const Linear*> readers);
};

struct Linear {
    Tensor w;      // [out, in]: the compute dtype, or F8_E4M3 with `scale`
    Tensor b;      // [out]; undefined without bias
    Tensor scale;  // F32 [out]: per-output-channel scales of an FP8 weight; undefined otherwise

    /// Loads `<prefix>.weight` [out, in] (WeightLoader::require_linear: FP8 with its scale, or the compute dtype)
    /// and, with `bias`, `<prefix>.bias` [out]. `init`: the weight's hint (the bias's is WeightInit::bias()).
    void load(WeightLoader& loader, const std::string& prefix, int64_t in, int64_t out, bool bias = true,
              WeightInit init = WeightInit::fan_in());
    /// out = x · wᵀ + b. With an FP8 weight: x is quantized per row (Backend::quantize_fp8, per-token scales) into
    /// the workspace, then Backend::gemm_fp8 applies both scales and the bias.
    void forward(Backend& be, const TensorView& x, const TensorView& out) const;
    /// forward() of x whose quantization `xq` was made already (Fp8Input::quantize of the same x: the same codes and
    /// scales forward() would make, so the same output); with an undefined `xq` or a compute-dtype weight, forward().
    void forward(Backend& be, const TensorView& x, const Fp8Input& xq, const TensorView& out) const;
    /// out = in · wᵀ + b, the input as a norm or an earlier Linear left it: the shared codes when this weight is FP8
    /// and they were made, else in.rows as forward() reads them. A pending GELU (in.gelu) runs first: fused with the
    /// quantization when FP8 (Backend::activation_quantize_fp8, in.rows unchanged), else in place on in.rows.
    void forward(Backend& be, const LinearInput& in, const TensorView& out) const;

    /// out = gelu_tanh(x · wᵀ + b) through Backend::gemm_gelu (the bias and the GELU in the GEMM's epilogue where the
    /// backend fuses them; fast numerics' FFN). FP8: forward(), then Backend::activation. out contiguous.
    void forward_gelu(Backend& be, const TensorView& x, const TensorView& out) const;
    /// forward_gelu() for the next Linear to read: with in.rows, the GELU applied into `out`; with the codes alone
    /// (a norm that quantized for this FP8 weight), the GEMM only, the GELU left pending (LinearInput::gelu) so that
    /// the reader's quantization applies it in the same pass.
    LinearInput forward_gelu(Backend& be, const LinearInput& in, const TensorView& out) const;
    /// out += x · wᵀ + b: the GEMM accumulates into out (beta = 1: one rounding of the sum; fast numerics' residual
    /// adds). FP8: forward() into the workspace, then Backend::add.
    void forward_accumulate(Backend& be, const TensorView& x, const TensorView& out) const;

    bool fp8() const { return scale.defined(); }
    /// Workspace forward() takes for `rows` input rows (the quantized activations and their scales; 0 unless FP8).
    size_t fp8_workspace_bytes(int64_t rows) const;

    int64_t in_features() const { return w.shape()[1]; }
    int64_t out_features() const { return w.shape()[0]; }
};

/// RMSNorm with a weight: out = x / sqrt(mean(x²) + eps) · w over the last dim (Backend::rms_norm).
struct RmsNorm {
    Tensor w;  // [channels]
    float eps = 1e-6f;

    /// Loads `<prefix>.weight` [channels] (init: WeightInit::norm_scale()).
    void load(WeightLoader& loader, const std::string& prefix, int64_t channels, float epsilon);
    void forward(Backend& be, const TensorView& x, const TensorView& out) const;
};

/// LayerNorm over the last dim (Backend::layer_norm): affine (weight and bias loaded) or not (a LayerNorm
/// constructed with its eps only: elementwise_affine=False).
struct LayerNorm {
    Tensor w;  // [channels]; undefined when not affine
    Tensor b;  // [channels]; undefined when not affine
    float eps = 1e-5f;

    LayerNorm() = default;
    explicit LayerNorm(float epsilon) : eps(epsilon) {}

    /// Loads `<prefix>.weight` and `<prefix>.bias` [channels] (a norm scale and a bias).
    void load(WeightLoader& loader, const std::string& prefix, int64_t channels, float epsilon);
    void forward(Backend& be, const TensorView& x, const TensorView& out) const;
};

/// One CategorySpecificLinear of the action heads with its single category: out[M, out] = x[M, in] · w + b.
/// Not a Linear: the weight is stored [1, in, out] and used untransposed, and the bias is a separate add.
struct CategoryLinear {
    Tensor w;  // [in, out] (the stored [1, in, out] without its category dim)
    Tensor b;  // [out]

    /// Loads `<prefix>.W` [1, in, out] (init N(0, 1/in)) and `<prefix>.b` [1, out] (a bias).
    void load(WeightLoader& loader, const std::string& prefix, int64_t in, int64_t out);
    void forward(Backend& be, const TensorView& x, const TensorView& out) const;

    int64_t in_features() const { return w.shape()[0]; }
};

/// Fast numerics' LayerNorm of rows in token groups (Backend::ada_layer_norm's operands, FusedRowParams):
/// out = LN(x) [· weight + bias] [· (1 + scale[g]) + shift[g]].
struct AdaLayerNorm {
    FusedRowParams rows;
    TensorView weight, bias;  // [C]; undefined: no affine
    TensorView scale, shift;  // [G, C] (rows may be strided); undefined: no modulation

    /// The norm of x for the Linears `readers`. Every reader FP8 and `keep_rows` false: the codes alone, quantized in
    /// the norm's own pass (Backend::ada_layer_norm_fp8; `out` is not written). Otherwise the rows into `out`, as
    /// LinearInput::shared gives them to the readers (a trace wants the rows: the two ops then).
    LinearInput forward(Backend& be, const TensorView& x, const TensorView& out,
                        std::initializer_list<const Linear*> readers, bool keep_rows) const;
};

/// An owning tensor seen with another shape (same storage, no copy).
Tensor reshaped(const Tensor& t, Shape shape);

}  // namespace dzr
