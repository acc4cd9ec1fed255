#include "sampling/cfg.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/arena.h"
#include "core/error.h"

namespace dzr {

void apply_cfg(Backend& be, const TensorView& v_cond, const TensorView& v_uncond, float scale,
               const TensorView& out) {
    DZR_CHECK(v_cond.numel() == v_uncond.numel() && out.numel() == v_cond.numel(),
              "cfg: v_cond {}, v_uncond {} and out {} must have the same number of elements", v_cond.str(),
              v_uncond.str(), out.str());
    DZR_CHECK(v_cond.dtype == v_uncond.dtype && out.dtype == v_cond.dtype,
              "cfg: v_cond {}, v_uncond {} and out {} must share a dtype", v_cond.str(), v_uncond.str(),
              out.str());
    DZR_CHECK(out.data != v_uncond.data || out.numel() == 0, "cfg: out must not alias v_uncond");
    const Shape flat{out.numel()};
    const TensorView c = v_cond.reshape(flat), u = v_uncond.reshape(flat), o = out.reshape(flat);
    // Three eager ops, each rounding on bf16, as the reference's trace shows: sub.Tensor(bf16, bf16),
    // mul.Tensor(bf16, 5) (a Python scalar, exact), add.Tensor(bf16, bf16).
    be.binary({BinaryOp::Sub}, c, u, o);  // [N] cond - uncond
    be.scale({scale, -0.f}, o, o);        // [N] * scale (beta -0: an exact multiply, sign of zero kept)
    be.add(o, u, o);                      // [N] + uncond
}

double cosine_similarity(Backend& be, const TensorView& a, const TensorView& b, int64_t batch) {
    DZR_CHECK(
        batch >= 1 && a.numel() == b.numel() && a.numel() % batch == 0 && a.numel() > 0,
        "cosine similarity: a {} and b {} must have equal, non-zero element counts divisible by batch {}",
        a.str(), b.str(), batch);
    ArenaScope scope(be.workspace());
    const int64_t per = a.numel() / batch;
    const Shape rows{batch, per};
    auto as_f32 = [&](const TensorView& t) {
        if (t.dtype == DType::F32) return t.reshape(rows);
        TensorView f = be.scratch(rows, DType::F32);
        be.copy(t.reshape(rows), f);
        return f;
    };
    const TensorView fa = as_f32(a), fb = as_f32(b);
    const TensorView prod = be.scratch(rows, DType::F32);
    const TensorView sums = be.scratch(Shape{3, batch}, DType::F32);
    be.mul(fa, fb, prod);  // [B, N] a * b
    be.reduce({ReduceOp::Sum}, prod, sums.slice(0, 0, 1).reshape(Shape{batch}));
    be.mul(fa, fa, prod);  // [B, N] a * a
    be.reduce({ReduceOp::Sum}, prod, sums.slice(0, 1, 1).reshape(Shape{batch}));
    be.mul(fb, fb, prod);  // [B, N] b * b
    be.reduce({ReduceOp::Sum}, prod, sums.slice(0, 2, 1).reshape(Shape{batch}));
    std::vector<float> host(size_t(3 * batch));
    be.download(sums, TensorView(host.data(), DType::F32, Shape{3, batch}));
    constexpr double kEps = 1e-8;
    double total = 0.0;
    for (int64_t i = 0; i < batch; ++i) {
        const double dot = host[size_t(i)];
        const double na = std::max(std::sqrt(double(host[size_t(batch + i)])), kEps);
        const double nb = std::max(std::sqrt(double(host[size_t(2 * batch + i)])), kEps);
        total += dot / (na * nb);
    }
    return total / double(batch);
}

}  // namespace dzr
