#include "backend/backend.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/profiler.h"
#include "core/error.h"

namespace dzr {

void Stream::begin_capture() { DZR_THROW("this stream cannot capture graphs"); }

std::unique_ptr<Graph> Stream::end_capture() { DZR_THROW("this stream cannot capture graphs"); }

void Stream::copy_pinned(const void*, const TensorView&) { DZR_THROW("this stream cannot copy from pinned memory"); }

std::unique_ptr<Stream> Backend::make_copy_stream() { DZR_THROW("backend {} has no copy stream", name()); }

Backend::Backend(Numerics numerics, bool measuring) : numerics_(numerics), measuring_(measuring) {}

// NOTE: the profiler outlives the derived backend's members here; it only frees its events then
Backend::~Backend() = default;

void Backend::attach_profiler(bool time_ops) {
    profiler_ = std::make_unique<Profiler>(stream(), make_kernel_tracer(*this), time_ops);
}

void Backend::unsupported(const char* op) const {
    DZR_THROW("backend {} has no {}", name(), op);
}

void Backend::touch_workspace(size_t bytes) {
    if (bytes == 0) return;
    ArenaScope scope(workspace());
    workspace().alloc(bytes);
}

namespace {

/// Rows [b·L, (b+1)·L) of a [B·L, ...] view of B branches' rows.
TensorView branch_rows(const TensorView& t, size_t branches, size_t b, const char* what) {
    DZR_CHECK(t.rank() >= 1 && t.dim(0) % int64_t(branches) == 0,
              "paged_attention_batched: {} {} does not hold {} branches' rows", what, t.str(), branches);
    const int64_t rows = t.dim(0) / int64_t(branches);
    return t.slice(0, int64_t(b) * rows, rows);
}

}  // namespace

void Backend::do_paged_attention_batched(const AttentionParams& p, const TensorView& q,
                                         std::span<const PagedKvView> histories, int layer,
                                         const TensorView& k_cur, const TensorView& v_cur,
                                         const TensorView& out) {
    const size_t B = histories.size();
    DZR_CHECK(B >= 1, "paged_attention_batched: no branches");
    for (size_t b = 0; b < B; ++b)
        paged_attention(p, branch_rows(q, B, b, "q"), histories[b], layer, branch_rows(k_cur, B, b, "k"),
                        branch_rows(v_cur, B, b, "v"), branch_rows(out, B, b, "out"));
}

size_t Backend::paged_attention_batched_workspace_bytes(std::span<const PagedKvView> histories,
                                                        const TensorView& k_cur) {
    size_t most = 0;
    const size_t B = histories.size();
    for (size_t b = 0; b < B; ++b)
        most = std::max(most, paged_attention_workspace_bytes(histories[b], branch_rows(k_cur, B, b, "k")));
    return most;
}

void Backend::do_sin_cos_table(float step, const TensorView& out) {
    DZR_CHECK(out.rank() == 2 && out.dim(1) % 2 == 0 && out.is_contiguous(),
              "sin_cos_table: output must be a contiguous [T, 2·half], got {}", out.str());
    const int64_t rows = out.dim(0), half = out.dim(1) / 2;
    std::vector<float> host(size_t(rows * 2 * half));
    for (int64_t t = 0; t < rows; ++t)
        for (int64_t j = 0; j < half; ++j) {
            const float arg = float(t) * std::exp(-float(j) * step);
            host[size_t(t * 2 * half + j)] = std::sin(arg);
            host[size_t(t * 2 * half + half + j)] = std::cos(arg);
        }
    upload(TensorView(host.data(), DType::F32, out.shape), out);
}

void Backend::do_count_nonfinite(const TensorView& x, const TensorView& out) {
    DZR_CHECK(x.is_contiguous() && out.dtype == DType::I32 && out.numel() == 1,
              "count_nonfinite: x must be contiguous and out an i32 [1], got {} and {}", x.str(), out.str());
    std::vector<float> host(size_t(x.numel()));
    download(x, TensorView(host.data(), DType::F32, x.shape));
    int32_t n = 0;
    for (float v : host) n += std::isfinite(v) ? 0 : 1;
    upload(TensorView(&n, DType::I32, Shape{1}), out);
}

std::unique_ptr<Backend> make_backend(const Device& device, const BackendOptions& options) {
    std::unique_ptr<Backend> be =
        device.is_cpu() ? make_cpu_backend(options) : make_cuda_backend(device.index, options);
    if (options.profile) be->attach_profiler(options.profile_ops);
    return be;
}

bool cuda_backend_built() {
#ifdef DZR_HAVE_CUDA
    return true;
#else
    return false;
#endif
}

#ifndef DZR_HAVE_CUDA
std::unique_ptr<Backend> make_cuda_backend(int, const BackendOptions&) {
    DZR_THROW("this dzr was built without CUDA (-DDZR_CUDA=OFF); use --device cpu");
}

bool cuda_device_available() { return false; }

int cuda_device_count() { return 0; }
#endif

// ---- fused ops of `fast` numerics, composed of the plain ops ----------------------------------------

namespace {

/// Row g of a per-group [G, C] view.
TensorView group_row(const TensorView& v, int g) { return v.slice(0, g, 1).reshape(Shape{v.dim(1)}); }

/// The row range of group g of an [L, ...] tensor split at `split`.
TensorView group_rows(const TensorView& t, int64_t split, int g) {
    const int64_t L = t.dim(0), s = std::min(split, L);
    return g == 0 ? t.slice(0, 0, s) : t.slice(0, s, L - s);
}

int group_count(int64_t split, int64_t L) { return split < L ? 2 : 1; }

/// Runs `op(q, rows)` on each block of p.period rows (q: p without the period; rows(t) slices t's rows of that
/// block) when the rows repeat their grouping; returns false (nothing run) when they do not.
template <typename Op>
bool per_period(const FusedRowParams& p, int64_t L, Op&& op) {
    if (p.period >= L) return false;
    DZR_CHECK(p.period > 0, "fused row op: period {} must be positive", p.period);
    FusedRowParams q = p;
    q.period = INT64_MAX;
    for (int64_t r0 = 0; r0 < L; r0 += p.period) {
        const int64_t n = std::min(p.period, L - r0);
        op(q, [r0, n](const TensorView& t) { return t.slice(0, r0, n); });
    }
    return true;
}

}  // namespace

void Backend::do_ada_layer_norm(const FusedRowParams& p, const TensorView& x, const TensorView& weight,
                                const TensorView& bias, const TensorView& scale, const TensorView& shift,
                                const TensorView& out) {
    if (per_period(p, x.dim(0), [&](const FusedRowParams& q, auto rows) {
            ada_layer_norm(q, rows(x), weight, bias, scale, shift, rows(out));
        }))
        return;
    layer_norm({p.eps}, x, weight, bias, out);
    const int64_t C = x.dim(x.rank() - 1);
    ArenaScope scope(workspace());
    const TensorView one_plus = scale.defined() ? scratch(Shape{C}, DType::F32) : TensorView{};
    for (int g = 0; g < group_count(p.split, x.dim(0)); ++g) {
        const TensorView og = group_rows(out, p.split, g);
        if (og.dim(0) == 0) continue;
        if (scale.defined()) {
            this->scale({1.0f, 1.0f}, group_row(scale, g), one_plus);
            mul(og, one_plus, og);
        }
        if (shift.defined()) add(og, group_row(shift, g), og);
    }
}

void Backend::do_gated_residual(const FusedRowParams& p, const TensorView& x, const TensorView& y,
                                const TensorView& gate) {
    if (!gate.defined()) {
        add(x, y, x);
        return;
    }
    if (per_period(p, x.dim(0), [&](const FusedRowParams& q, auto rows) { gated_residual(q, rows(x), rows(y), gate); }))
        return;
    for (int g = 0; g < group_count(p.split, x.dim(0)); ++g) {
        const TensorView xg = group_rows(x, p.split, g), yg = group_rows(y, p.split, g);
        if (xg.dim(0) == 0) continue;
        mul(yg, group_row(gate, g), yg);
        add(xg, yg, xg);
    }
}

void Backend::do_rms_norm_rope(const FusedRowParams& p, const TensorView& x, const TensorView& weight,
                               const TensorView& table_a, const TensorView& table_b, const TensorView& out) {
    const int64_t L = out.dim(0), H = out.dim(1), D = out.dim(2);
    if (per_period(p, L, [&](const FusedRowParams& q, auto rows) {
            rms_norm_rope(q, rows(x), weight, table_a, table_b, rows(out));
        }))
        return;
    if (!table_a.defined()) {
        rms_norm({p.eps}, x, weight, out.reshape(Shape{L, H * D}));
        return;
    }
    ArenaScope scope(workspace());
    const TensorView normed = scratch(Shape{L, H, D}, out.dtype);
    rms_norm({p.eps}, x, weight, normed.reshape(Shape{L, H * D}));
    const int64_t s = std::min(p.split, L);
    // NOTE: a ragged last block (fewer rows than its period) takes the first rows of each table
    const auto first = [](const TensorView& t, int64_t n) { return t.dim(0) > n ? t.slice(0, 0, n) : t; };
    if (s > 0) rope({}, normed.slice(0, 0, s), first(table_a, s), out.slice(0, 0, s));
    if (s < L) rope({}, normed.slice(0, s, L - s), first(table_b, L - s), out.slice(0, s, L - s));
}

void Backend::do_gated_residual_norm(const FusedRowParams& p, const TensorView& x, const TensorView& y,
                                     const TensorView& gate, const TensorView& weight, const TensorView& bias,
                                     const TensorView& scale, const TensorView& shift,
                                     const TensorView& out) {
    gated_residual(p, x, y, gate);
    ada_layer_norm(p, x, weight, bias, scale, shift, out);
}

void Backend::do_ada_layer_norm_fp8(const FusedRowParams& p, const TensorView& x, const TensorView& weight,
                                    const TensorView& bias, const TensorView& scale, const TensorView& shift,
                                    const TensorView& q, const TensorView& scales) {
    ArenaScope scope(workspace());
    const TensorView h = scratch(x.shape, compute_dtype());
    ada_layer_norm(p, x, weight, bias, scale, shift, h);
    quantize_fp8(h, q, scales);
}

void Backend::do_activation_quantize_fp8(const ActivationParams& p, const TensorView& x, const TensorView& q,
                                         const TensorView& scales) {
    ArenaScope scope(workspace());
    const TensorView a = scratch(x.shape, x.dtype);
    activation(p, x, a);
    quantize_fp8(a, q, scales);
}

void Backend::do_gemm_gelu(const GemmParams& p, const TensorView& a, const TensorView& b,
                           const TensorView& bias, const TensorView& out) {
    gemm(p, a, b, bias, out);
    activation({Activation::GeluTanh}, out, out);
}

}  // namespace dzr
