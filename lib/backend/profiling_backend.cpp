#include "backend/profiling_backend.h"

#include <fmt/format.h>

namespace dzr {

namespace {

/// "bf16[1785,5120]" (strided views say so: "bf16[1785,5120]s").
std::string desc(const TensorView& t) {
    if (!t.defined()) return "-";
    std::string s = fmt::format("{}[", dtype_name(t.dtype));
    for (int i = 0; i < t.rank(); ++i) {
        if (i) s += ',';
        s += std::to_string(t.dim(i));
    }
    s += "]";
    if (!t.is_contiguous()) s += "s";
    return s;
}

const char* binary_name(BinaryOp op) {
    switch (op) {
        case BinaryOp::Add: return "add";
        case BinaryOp::Sub: return "sub";
        case BinaryOp::Mul: return "mul";
        case BinaryOp::Div: return "div";
    }
    return "binary";
}

const char* activation_name(Activation a) {
    switch (a) {
        case Activation::GeluTanh: return "gelu_tanh";
        case Activation::GeluErf: return "gelu_erf";
        case Activation::Silu: return "silu";
        case Activation::Relu: return "relu";
        case Activation::Sigmoid: return "sigmoid";
        case Activation::GeluTanhStepwise: return "gelu_tanh_stepwise";
    }
    return "activation";
}

}  // namespace

ProfilingBackend::ProfilingBackend(std::unique_ptr<Backend> inner, bool time_ops)
    : Backend(inner->numerics()),
      inner_(std::move(inner)),
      profiler_(inner_->stream(), make_kernel_tracer(*inner_), time_ops) {}

template <class F>
void ProfilingBackend::run(std::string key, F&& f) {
    AutocastScope autocast(*inner_, this->autocast());
    profiler_.begin_op(std::move(key));
    try {
        f(*inner_);
    } catch (...) {
        profiler_.end_op();
        throw;
    }
    profiler_.end_op();
}

void ProfilingBackend::copy(const TensorView& src, const TensorView& dst) {
    run(fmt::format("copy {} -> {}", desc(src), desc(dst)), [&](Backend& b) { b.copy(src, dst); });
}
void ProfilingBackend::fill(const TensorView& dst, float value) {
    run(fmt::format("fill {}", desc(dst)), [&](Backend& b) { b.fill(dst, value); });
}
void ProfilingBackend::gemm(const GemmParams& p, const TensorView& a, const TensorView& w, const TensorView& bias,
                            const TensorView& out) {
    run(fmt::format("gemm{}{} {} x {}{}", p.trans_a ? " ta" : "", p.trans_b ? " tb" : "", desc(a), desc(w),
                    bias.defined() ? " +bias" : ""),
        [&](Backend& b) { b.gemm(p, a, w, bias, out); });
}
void ProfilingBackend::binary(const BinaryParams& p, const TensorView& a, const TensorView& b2, const TensorView& out) {
    run(fmt::format("{} {} {}", binary_name(p.op), desc(a), desc(b2)), [&](Backend& b) { b.binary(p, a, b2, out); });
}
void ProfilingBackend::scale(const ScaleParams& p, const TensorView& x, const TensorView& out) {
    run(fmt::format("scale {}", desc(x)), [&](Backend& b) { b.scale(p, x, out); });
}
void ProfilingBackend::activation(const ActivationParams& p, const TensorView& x, const TensorView& out) {
    run(fmt::format("{} {}", activation_name(p.kind), desc(x)), [&](Backend& b) { b.activation(p, x, out); });
}
void ProfilingBackend::layer_norm(const LayerNormParams& p, const TensorView& x, const TensorView& weight,
                                  const TensorView& bias, const TensorView& out) {
    run(fmt::format("layer_norm {}{}", desc(x), weight.defined() ? " affine" : ""),
        [&](Backend& b) { b.layer_norm(p, x, weight, bias, out); });
}
void ProfilingBackend::rms_norm(const RmsNormParams& p, const TensorView& x, const TensorView& weight,
                                const TensorView& out) {
    run(fmt::format("rms_norm {}", desc(x)), [&](Backend& b) { b.rms_norm(p, x, weight, out); });
}
void ProfilingBackend::l2_norm(const L2NormParams& p, const TensorView& x, const TensorView& weight,
                               const TensorView& out) {
    run(fmt::format("l2_norm {}{}", desc(x), p.silu ? " silu" : ""), [&](Backend& b) { b.l2_norm(p, x, weight, out); });
}
void ProfilingBackend::softmax(const SoftmaxParams& p, const TensorView& x, const TensorView& out) {
    run(fmt::format("softmax {}", desc(x)), [&](Backend& b) { b.softmax(p, x, out); });
}
void ProfilingBackend::reduce(const ReduceParams& p, const TensorView& x, const TensorView& out) {
    run(fmt::format("reduce {}", desc(x)), [&](Backend& b) { b.reduce(p, x, out); });
}
void ProfilingBackend::rope(const RopeParams& p, const TensorView& x, const TensorView& table, const TensorView& out) {
    run(fmt::format("rope {}", desc(x)), [&](Backend& b) { b.rope(p, x, table, out); });
}
void ProfilingBackend::attention(const AttentionParams& p, const TensorView& q, const TensorView& k,
                                 const TensorView& v, const TensorView& bias, const TensorView& out) {
    run(fmt::format("attention q {} k {}{}", desc(q), desc(k), bias.defined() ? " +bias" : ""),
        [&](Backend& b) { b.attention(p, q, k, v, bias, out); });
}
void ProfilingBackend::conv3d(const Conv3dParams& p, const TensorView& x, const TensorView& w, const TensorView& bias,
                              const TensorView& out) {
    run(fmt::format("conv3d {} w {}{}", desc(x), desc(w), p.frames_2d ? " 2d" : ""),
        [&](Backend& b) { b.conv3d(p, x, w, bias, out); });
}
size_t ProfilingBackend::conv3d_workspace_bytes(const Conv3dParams& p, const TensorView& x, const TensorView& w,
                                                const TensorView& out) {
    return inner_->conv3d_workspace_bytes(p, x, w, out);
}
size_t ProfilingBackend::paged_attention_workspace_bytes(const PagedKvView& history, const TensorView& k_cur) {
    return inner_->paged_attention_workspace_bytes(history, k_cur);
}
size_t ProfilingBackend::paged_attention_batched_workspace_bytes(std::span<const PagedKvView> histories,
                                                                 const TensorView& k_cur) {
    return inner_->paged_attention_batched_workspace_bytes(histories, k_cur);
}
void ProfilingBackend::resize_bicubic(const TensorView& src, const TensorView& dst) {
    run(fmt::format("resize_bicubic {} -> {}", desc(src), desc(dst)), [&](Backend& b) { b.resize_bicubic(src, dst); });
}
void ProfilingBackend::sin_cos_table(float step, const TensorView& out) {
    run(fmt::format("sin_cos_table {}", desc(out)), [&](Backend& b) { b.sin_cos_table(step, out); });
}
void ProfilingBackend::count_nonfinite(const TensorView& x, const TensorView& out) {
    run(fmt::format("count_nonfinite {}", desc(x)), [&](Backend& b) { b.count_nonfinite(x, out); });
}
void ProfilingBackend::quantize_fp8(const TensorView& x, const TensorView& q, const TensorView& scales) {
    run(fmt::format("quantize_fp8 {}", desc(x)), [&](Backend& b) { b.quantize_fp8(x, q, scales); });
}
void ProfilingBackend::ada_layer_norm_fp8(const FusedRowParams& p, const TensorView& x, const TensorView& weight,
                                          const TensorView& bias, const TensorView& scale, const TensorView& shift,
                                          const TensorView& q, const TensorView& scales) {
    run(fmt::format("ada_layer_norm_fp8 {}{}{}", desc(x), weight.defined() ? " affine" : "", scale.defined() ? " mod" : ""),
        [&](Backend& b) { b.ada_layer_norm_fp8(p, x, weight, bias, scale, shift, q, scales); });
}
void ProfilingBackend::activation_quantize_fp8(const ActivationParams& p, const TensorView& x, const TensorView& q,
                                               const TensorView& scales) {
    run(fmt::format("activation_quantize_fp8 {}", desc(x)),
        [&](Backend& b) { b.activation_quantize_fp8(p, x, q, scales); });
}
void ProfilingBackend::dequantize_fp8(const TensorView& q, const TensorView& scales, const TensorView& out) {
    run(fmt::format("dequantize_fp8 {}", desc(q)), [&](Backend& b) { b.dequantize_fp8(q, scales, out); });
}
void ProfilingBackend::gemm_fp8(const TensorView& xq, const TensorView& x_scales, const TensorView& wq,
                                const TensorView& w_scales, const TensorView& bias, const TensorView& out) {
    run(fmt::format("gemm_fp8 {} x {}{}", desc(xq), desc(wq), bias.defined() ? " +bias" : ""),
        [&](Backend& b) { b.gemm_fp8(xq, x_scales, wq, w_scales, bias, out); });
}
void ProfilingBackend::ada_layer_norm(const FusedRowParams& p, const TensorView& x, const TensorView& weight,
                                      const TensorView& bias, const TensorView& scale, const TensorView& shift,
                                      const TensorView& out) {
    run(fmt::format("ada_layer_norm {}{}{}", desc(x), weight.defined() ? " affine" : "", scale.defined() ? " mod" : ""),
        [&](Backend& b) { b.ada_layer_norm(p, x, weight, bias, scale, shift, out); });
}
void ProfilingBackend::gated_residual(const FusedRowParams& p, const TensorView& x, const TensorView& y,
                                      const TensorView& gate) {
    run(fmt::format("gated_residual {}{}", desc(x), gate.defined() ? " gate" : ""),
        [&](Backend& b) { b.gated_residual(p, x, y, gate); });
}
void ProfilingBackend::rms_norm_rope(const FusedRowParams& p, const TensorView& x, const TensorView& weight,
                                     const TensorView& table_a, const TensorView& table_b, const TensorView& out) {
    run(fmt::format("rms_norm_rope {}{}", desc(x), table_a.defined() ? " rope" : ""),
        [&](Backend& b) { b.rms_norm_rope(p, x, weight, table_a, table_b, out); });
}
void ProfilingBackend::gated_residual_norm(const FusedRowParams& p, const TensorView& x, const TensorView& y,
                                           const TensorView& gate, const TensorView& weight, const TensorView& bias,
                                           const TensorView& scale, const TensorView& shift, const TensorView& out) {
    run(fmt::format("gated_residual_norm {}{}{}{}", desc(x), gate.defined() ? " gate" : "",
                    weight.defined() ? " affine" : "", scale.defined() ? " mod" : ""),
        [&](Backend& b) { b.gated_residual_norm(p, x, y, gate, weight, bias, scale, shift, out); });
}
void ProfilingBackend::gemm_gelu(const GemmParams& p, const TensorView& a, const TensorView& w, const TensorView& bias,
                                 const TensorView& out) {
    run(fmt::format("gemm_gelu{}{} {} x {}{}", p.trans_a ? " ta" : "", p.trans_b ? " tb" : "", desc(a), desc(w),
                    bias.defined() ? " +bias" : ""),
        [&](Backend& b) { b.gemm_gelu(p, a, w, bias, out); });
}
void ProfilingBackend::paged_attention(const AttentionParams& p, const TensorView& q, const PagedKvView& history,
                                       int layer, const TensorView& k_cur, const TensorView& v_cur,
                                       const TensorView& out) {
    // NOTE: the history length is part of the key: it is what the time depends on
    run(fmt::format("paged_attention q {} hist {} cur {}", desc(q), history.seq_len, desc(k_cur)),
        [&](Backend& b) { b.paged_attention(p, q, history, layer, k_cur, v_cur, out); });
}
void ProfilingBackend::paged_attention_batched(const AttentionParams& p, const TensorView& q,
                                               std::span<const PagedKvView> histories, int layer,
                                               const TensorView& k_cur, const TensorView& v_cur, const TensorView& out) {
    run(fmt::format("paged_attention_batched {} x q {} hist {} cur {}", histories.size(), desc(q),
                    histories.empty() ? int64_t(0) : histories[0].seq_len, desc(k_cur)),
        [&](Backend& b) { b.paged_attention_batched(p, q, histories, layer, k_cur, v_cur, out); });
}
void ProfilingBackend::scatter_kv(const PagedKvView& pool, int layer, const TensorView& slots, const TensorView& k,
                                  const TensorView& v, int64_t num_slots) {
    run(fmt::format("scatter_kv {}", desc(k)), [&](Backend& b) { b.scatter_kv(pool, layer, slots, k, v, num_slots); });
}

}  // namespace dzr
