// The public ops of Backend: each runs its do_<op> in the one bracket, which names it for the profiler (its
// key: the kind and shapes the time depends on; docs/PERF.md's tables and the profile JSON group by it) and
// says what a measuring backend does instead.
#include <fmt/format.h>

#include "backend/backend.h"
#include "backend/profiler.h"
#include "core/error.h"

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

/// "ada_layer_norm bf16[1785,5120] affine mod": a fused norm's key.
std::string norm_key(const char* op, const TensorView& x, const TensorView& weight, const TensorView& scale) {
    return fmt::format("{} {}{}{}", op, desc(x), weight.defined() ? " affine" : "", scale.defined() ? " mod" : "");
}

/// What a measuring backend does for an op that neither composes others nor takes workspace of its own.
constexpr auto skipped = [] {};

}  // namespace

template <class Key, class Run, class Measure>
void Backend::bracket(const Key& key, const Run& run, const Measure& measure) {
    if (measuring_) {
        measure();
        return;
    }
    // NOTE: only the outermost op is timed: the ops a backend runs inside it (a composition, a fallback) are its
    if (in_op_ || !profiler_ || !profiler_->ops_timed()) {
        run();
        return;
    }
    profiler_->begin_op(key());
    in_op_ = true;
    try {
        run();
    } catch (...) {
        in_op_ = false;
        profiler_->end_op();
        throw;
    }
    in_op_ = false;
    profiler_->end_op();
}

// ==== generic ops ===============================================================================

void Backend::copy(const TensorView& src, const TensorView& dst) {
    bracket([&] { return fmt::format("copy {} -> {}", desc(src), desc(dst)); }, [&] { do_copy(src, dst); },
            [&] {
                DZR_CHECK(src.numel() == dst.numel() && dst.is_contiguous(), "measuring copy: {} -> {}",
                          src.str(), dst.str());
            });
}

void Backend::fill(const TensorView& dst, float value) {
    bracket([&] { return fmt::format("fill {}", desc(dst)); }, [&] { do_fill(dst, value); }, skipped);
}

void Backend::gemm(const GemmParams& p, const TensorView& a, const TensorView& b, const TensorView& bias,
                   const TensorView& out) {
    bracket(
        [&] {
            return fmt::format("gemm{}{} {} x {}{}", p.trans_a ? " ta" : "", p.trans_b ? " tb" : "", desc(a),
                               desc(b), bias.defined() ? " +bias" : "");
        },
        [&] { do_gemm(p, a, b, bias, out); }, skipped);
}

void Backend::binary(const BinaryParams& p, const TensorView& a, const TensorView& b, const TensorView& out) {
    bracket([&] { return fmt::format("{} {} {}", binary_name(p.op), desc(a), desc(b)); },
            [&] { do_binary(p, a, b, out); }, skipped);
}

void Backend::scale(const ScaleParams& p, const TensorView& x, const TensorView& out) {
    bracket([&] { return fmt::format("scale {}", desc(x)); }, [&] { do_scale(p, x, out); }, skipped);
}

void Backend::activation(const ActivationParams& p, const TensorView& x, const TensorView& out) {
    bracket([&] { return fmt::format("{} {}", activation_name(p.kind), desc(x)); },
            [&] { do_activation(p, x, out); }, skipped);
}

void Backend::layer_norm(const LayerNormParams& p, const TensorView& x, const TensorView& weight,
                         const TensorView& bias, const TensorView& out) {
    bracket([&] { return fmt::format("layer_norm {}{}", desc(x), weight.defined() ? " affine" : ""); },
            [&] { do_layer_norm(p, x, weight, bias, out); }, skipped);
}

void Backend::rms_norm(const RmsNormParams& p, const TensorView& x, const TensorView& weight,
                       const TensorView& out) {
    bracket([&] { return fmt::format("rms_norm {}", desc(x)); }, [&] { do_rms_norm(p, x, weight, out); },
            skipped);
}

void Backend::l2_norm(const L2NormParams& p, const TensorView& x, const TensorView& weight,
                      const TensorView& out) {
    bracket([&] { return fmt::format("l2_norm {}{}", desc(x), p.silu ? " silu" : ""); },
            [&] { do_l2_norm(p, x, weight, out); }, skipped);
}

void Backend::softmax(const SoftmaxParams& p, const TensorView& x, const TensorView& out) {
    bracket([&] { return fmt::format("softmax {}", desc(x)); }, [&] { do_softmax(p, x, out); }, skipped);
}

void Backend::reduce(const ReduceParams& p, const TensorView& x, const TensorView& out) {
    bracket([&] { return fmt::format("reduce {}", desc(x)); }, [&] { do_reduce(p, x, out); }, skipped);
}

void Backend::rope(const RopeParams& p, const TensorView& x, const TensorView& table, const TensorView& out) {
    bracket([&] { return fmt::format("rope {}", desc(x)); }, [&] { do_rope(p, x, table, out); }, skipped);
}

void Backend::attention(const AttentionParams& p, const TensorView& q, const TensorView& k,
                        const TensorView& v, const TensorView& bias, const TensorView& out) {
    bracket(
        [&] {
            return fmt::format("attention q {} k {}{}", desc(q), desc(k), bias.defined() ? " +bias" : "");
        },
        [&] { do_attention(p, q, k, v, bias, out); }, skipped);
}

void Backend::conv3d(const Conv3dParams& p, const TensorView& x, const TensorView& w, const TensorView& bias,
                     const TensorView& out) {
    bracket([&] { return fmt::format("conv3d {} w {}{}", desc(x), desc(w), p.frames_2d ? " 2d" : ""); },
            [&] { do_conv3d(p, x, w, bias, out); },
            [&] { touch_workspace(conv3d_workspace_bytes(p, x, w, out)); });
}

void Backend::resize_bicubic(const TensorView& src, const TensorView& dst) {
    bracket([&] { return fmt::format("resize_bicubic {} -> {}", desc(src), desc(dst)); },
            [&] { do_resize_bicubic(src, dst); }, skipped);
}

void Backend::sin_cos_table(float step, const TensorView& out) {
    bracket([&] { return fmt::format("sin_cos_table {}", desc(out)); }, [&] { do_sin_cos_table(step, out); },
            skipped);
}

void Backend::count_nonfinite(const TensorView& x, const TensorView& out) {
    bracket([&] { return fmt::format("count_nonfinite {}", desc(x)); }, [&] { do_count_nonfinite(x, out); },
            skipped);
}

void Backend::quantize_fp8(const TensorView& x, const TensorView& q, const TensorView& scales) {
    bracket([&] { return fmt::format("quantize_fp8 {}", desc(x)); }, [&] { do_quantize_fp8(x, q, scales); },
            skipped);
}

void Backend::dequantize_fp8(const TensorView& q, const TensorView& scales, const TensorView& out) {
    bracket([&] { return fmt::format("dequantize_fp8 {}", desc(q)); },
            [&] { do_dequantize_fp8(q, scales, out); }, skipped);
}

void Backend::gemm_fp8(const TensorView& xq, const TensorView& x_scales, const TensorView& wq,
                       const TensorView& w_scales, const TensorView& bias, const TensorView& out) {
    bracket(
        [&] { return fmt::format("gemm_fp8 {} x {}{}", desc(xq), desc(wq), bias.defined() ? " +bias" : ""); },
        [&] { do_gemm_fp8(xq, x_scales, wq, w_scales, bias, out); }, skipped);
}

// ==== fused DiT ops =============================================================================
// NOTE: a measuring backend runs the fused ops' base composition, so their plan holds what that composition takes
// (the CPU's implementation, and a CUDA fallback's)

void Backend::ada_layer_norm(const FusedRowParams& p, const TensorView& x, const TensorView& weight,
                             const TensorView& bias, const TensorView& scale, const TensorView& shift,
                             const TensorView& out) {
    const auto run = [&] { do_ada_layer_norm(p, x, weight, bias, scale, shift, out); };
    bracket([&] { return norm_key("ada_layer_norm", x, weight, scale); }, run, run);
}

void Backend::gated_residual(const FusedRowParams& p, const TensorView& x, const TensorView& y,
                             const TensorView& gate) {
    const auto run = [&] { do_gated_residual(p, x, y, gate); };
    bracket([&] { return fmt::format("gated_residual {}{}", desc(x), gate.defined() ? " gate" : ""); }, run,
            run);
}

void Backend::rms_norm_rope(const FusedRowParams& p, const TensorView& x, const TensorView& weight,
                            const TensorView& table_a, const TensorView& table_b, const TensorView& out) {
    const auto run = [&] { do_rms_norm_rope(p, x, weight, table_a, table_b, out); };
    bracket([&] { return fmt::format("rms_norm_rope {}{}", desc(x), table_a.defined() ? " rope" : ""); }, run,
            run);
}

void Backend::gated_residual_norm(const FusedRowParams& p, const TensorView& x, const TensorView& y,
                                  const TensorView& gate, const TensorView& weight, const TensorView& bias,
                                  const TensorView& scale, const TensorView& shift, const TensorView& out) {
    const auto run = [&] { do_gated_residual_norm(p, x, y, gate, weight, bias, scale, shift, out); };
    bracket(
        [&] {
            return fmt::format("gated_residual_norm {}{}{}{}", desc(x), gate.defined() ? " gate" : "",
                               weight.defined() ? " affine" : "", scale.defined() ? " mod" : "");
        },
        run, run);
}

void Backend::gemm_gelu(const GemmParams& p, const TensorView& a, const TensorView& b, const TensorView& bias,
                        const TensorView& out) {
    const auto run = [&] { do_gemm_gelu(p, a, b, bias, out); };
    bracket(
        [&] {
            return fmt::format("gemm_gelu{}{} {} x {}{}", p.trans_a ? " ta" : "", p.trans_b ? " tb" : "",
                               desc(a), desc(b), bias.defined() ? " +bias" : "");
        },
        run, run);
}

void Backend::ada_layer_norm_fp8(const FusedRowParams& p, const TensorView& x, const TensorView& weight,
                                 const TensorView& bias, const TensorView& scale, const TensorView& shift,
                                 const TensorView& q, const TensorView& scales) {
    const auto run = [&] { do_ada_layer_norm_fp8(p, x, weight, bias, scale, shift, q, scales); };
    bracket([&] { return norm_key("ada_layer_norm_fp8", x, weight, scale); }, run, run);
}

void Backend::activation_quantize_fp8(const ActivationParams& p, const TensorView& x, const TensorView& q,
                                      const TensorView& scales) {
    const auto run = [&] { do_activation_quantize_fp8(p, x, q, scales); };
    bracket([&] { return fmt::format("activation_quantize_fp8 {}", desc(x)); }, run, run);
}

void Backend::paged_attention(const AttentionParams& p, const TensorView& q, const PagedKvView& history,
                              int layer, const TensorView& k_cur, const TensorView& v_cur,
                              const TensorView& out) {
    // NOTE: the history length is part of the key: it is what the time depends on
    bracket(
        [&] {
            return fmt::format("paged_attention q {} hist {} cur {}", desc(q), history.seq_len, desc(k_cur));
        },
        [&] { do_paged_attention(p, q, history, layer, k_cur, v_cur, out); },
        [&] { touch_workspace(paged_attention_workspace_bytes(history, k_cur)); });
}

void Backend::paged_attention_batched(const AttentionParams& p, const TensorView& q,
                                      std::span<const PagedKvView> histories, int layer,
                                      const TensorView& k_cur, const TensorView& v_cur,
                                      const TensorView& out) {
    bracket(
        [&] {
            return fmt::format("paged_attention_batched {} x q {} hist {} cur {}", histories.size(), desc(q),
                               histories.empty() ? int64_t(0) : histories[0].seq_len, desc(k_cur));
        },
        [&] { do_paged_attention_batched(p, q, histories, layer, k_cur, v_cur, out); },
        [&] { touch_workspace(paged_attention_batched_workspace_bytes(histories, k_cur)); });
}

void Backend::scatter_kv(const PagedKvView& pool, int layer, const TensorView& slots, const TensorView& k,
                         const TensorView& v, int64_t num_slots) {
    bracket([&] { return fmt::format("scatter_kv {}", desc(k)); },
            [&] { do_scatter_kv(pool, layer, slots, k, v, num_slots); }, skipped);
}

}  // namespace dzr
