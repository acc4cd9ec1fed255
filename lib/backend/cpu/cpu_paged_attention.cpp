#include "backend/cpu/cpu_paged_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/fp8.h"
#include "core/half.h"
#include "backend/kv_view.h"

namespace dzr {

namespace {

void check_qo(const TensorView& q, const TensorView& out, int heads, int head_dim, const char* op) {
    for (const TensorView* t : {&q, &out}) {
        DZR_CHECK(t->device.is_cpu() && t->dtype == DType::F32 && t->rank() == 3,
                  "{}: q and out must be f32 host [L, H, D], got {}", op, t->str());
        DZR_CHECK(t->dim(1) == heads && t->dim(2) == head_dim && t->strides[2] == 1,
                  "{}: {} does not match the cache's {} heads x {} (unit head-dim stride)", op, t->str(), heads,
                  head_dim);
    }
    DZR_CHECK(q.dim(0) == out.dim(0), "{}: q {} and out {} differ in length", op, q.str(), out.str());
}

/// One attention over two key segments, written once for every view type (each has num_tokens, k, v).
template <typename History, typename Current>
void attend_two_segments(const TensorView& q, const History& hist, const Current& cur, int layer, float scale,
                         const TensorView& out) {
    const int64_t lq = q.dim(0), heads = q.dim(1), d = q.dim(2);
    const int64_t nh = hist.num_tokens(), nc = cur.num_tokens(), nk = nh + nc;
    std::vector<double> logits(static_cast<size_t>(nk));
    std::vector<double> acc(static_cast<size_t>(d));
    for (int64_t h = 0; h < heads; ++h) {
        for (int64_t i = 0; i < lq; ++i) {
            const float* qi = q.ptr<float>() + i * q.strides[0] + h * q.strides[1];
            float* oi = out.ptr<float>() + i * out.strides[0] + h * out.strides[1];
            if (nk == 0) {
                std::fill(oi, oi + d, 0.0f);
                continue;
            }
            const auto key = [&](int64_t j) {
                return j < nh ? hist.template k<const float>(layer, j, int(h))
                              : cur.template k<const float>(layer, j - nh, int(h));
            };
            const auto value = [&](int64_t j) {
                return j < nh ? hist.template v<const float>(layer, j, int(h))
                              : cur.template v<const float>(layer, j - nh, int(h));
            };
            double mx = -INFINITY;
            for (int64_t j = 0; j < nk; ++j) {
                const float* kj = key(j);
                double dot = 0.0;
                for (int64_t c = 0; c < d; ++c) dot += double(qi[c]) * double(kj[c]);
                logits[size_t(j)] = double(scale) * dot;
                mx = std::max(mx, logits[size_t(j)]);
            }
            double sum = 0.0;
            for (int64_t j = 0; j < nk; ++j) {
                logits[size_t(j)] = std::exp(logits[size_t(j)] - mx);
                sum += logits[size_t(j)];
            }
            std::fill(acc.begin(), acc.end(), 0.0);
            for (int64_t j = 0; j < nk; ++j) {
                const float* vj = value(j);
                const double p = logits[size_t(j)] / sum;
                for (int64_t c = 0; c < d; ++c) acc[size_t(c)] += p * double(vj[c]);
            }
            for (int64_t c = 0; c < d; ++c) oi[c] = float(acc[size_t(c)]);
        }
    }
}

template <typename View>
void check_view(const View& view, int heads, int head_dim, const char* what, const char* op, bool fp8_ok = false) {
    DZR_CHECK(view.dtype == DType::F32 || (fp8_ok && view.dtype == DType::F8_E4M3),
              "{}: the {} is {}; the CPU reference reads f32 only{}", op, what, dtype_name(view.dtype),
              fp8_ok ? " (and f8_e4m3 pools)" : "");
    DZR_CHECK(view.num_heads == heads && view.head_dim == head_dim,
              "{}: the {} has {} heads x {}, q has {} x {}", op, what, view.num_heads, view.head_dim, heads, head_dim);
    DZR_CHECK(view.num_tokens() == 0 || (view.k_base != nullptr && view.v_base != nullptr),
              "{}: the {} has {} tokens but no storage", op, what, view.num_tokens());
}

/// An FP8 pool's visible history dequantized (core/fp8.h: code * the row's scale) into f32 [seq_len, H, D].
std::vector<float> dequantize_history(const PagedKvView& h, int layer, bool values) {
    const int64_t d = h.head_dim;
    std::vector<float> out(size_t(h.seq_len * h.num_heads * d));
    for (int64_t t = 0; t < h.seq_len; ++t)
        for (int head = 0; head < h.num_heads; ++head) {
            const uint8_t* q = values ? h.v<const uint8_t>(layer, t, head) : h.k<const uint8_t>(layer, t, head);
            const float s = *(values ? h.v_scale_at(layer, t, head) : h.k_scale_at(layer, t, head));
            float* o = out.data() + (t * h.num_heads + head) * d;
            for (int64_t c = 0; c < d; ++c) o[c] = f8e4m3_to_f32(q[c]) * s;
        }
    return out;
}

}  // namespace

void paged_attention_cpu(const TensorView& q, const PagedKvView& history, const ContiguousKvView& current, int layer,
                         float scale, const TensorView& out) {
    const char* op = "paged_attention_cpu";
    check_qo(q, out, history.num_heads, history.head_dim, op);
    check_view(history, int(q.dim(1)), int(q.dim(2)), "history pool", op, true);
    check_view(current, int(q.dim(1)), int(q.dim(2)), "current view", op);
    DZR_CHECK(history.seq_len <= int64_t(history.num_table_blocks) * history.block_size &&
                  history.num_table_blocks <= history.table_width,
              "{}: seq_len {} needs {} table entries, the table has {} of width {}", op, history.seq_len,
              (history.seq_len + history.block_size - 1) / history.block_size, history.num_table_blocks,
              history.table_width);
    if (history.fp8()) {
        // NOTE: dequantize in the gather, as the CUDA path does: the history as f32 rows, then the same attention
        DZR_CHECK(history.seq_len == 0 || (history.k_scale && history.v_scale && history.head_stride == history.head_dim),
                  "{}: an f8_e4m3 pool needs its K and V scales", op);
        std::vector<float> k = dequantize_history(history, layer, false), v = dequantize_history(history, layer, true);
        const int64_t row = int64_t(history.num_heads) * history.head_dim;
        const ContiguousKvView gathered{k.data(), v.data(), DType::F32, history.num_heads, history.head_dim, 0, row,
                                        history.head_dim, history.seq_len};
        attend_two_segments(q, gathered, current, layer, scale, out);
        return;
    }
    attend_two_segments(q, history, current, layer, scale, out);
}

void contiguous_attention_cpu(const TensorView& q, const ContiguousKvView& history, const ContiguousKvView& current,
                              int layer, float scale, const TensorView& out) {
    const char* op = "contiguous_attention_cpu";
    check_qo(q, out, history.num_heads, history.head_dim, op);
    check_view(history, int(q.dim(1)), int(q.dim(2)), "history view", op);
    check_view(current, int(q.dim(1)), int(q.dim(2)), "current view", op);
    attend_two_segments(q, history, current, layer, scale, out);
}

void scatter_kv_cpu(const PagedKvView& pool, int layer, const int64_t* slots, int64_t n, int64_t num_slots,
                    const TensorView& k, const TensorView& v) {
    const char* op = "scatter_kv_cpu";
    check_view(pool, pool.num_heads, pool.head_dim, "pool", op, true);
    DZR_CHECK(!pool.fp8() || (pool.k_scale && pool.v_scale && pool.head_stride == pool.head_dim),
              "{}: an f8_e4m3 pool needs its K and V scales", op);
    DZR_CHECK(pool.k_base != nullptr && pool.v_base != nullptr, "{}: the pool has no storage", op);
    for (const TensorView* t : {&k, &v}) {
        DZR_CHECK(t->device.is_cpu() && t->dtype == DType::F32 && t->rank() == 3 && t->dim(0) >= n &&
                      t->dim(1) == pool.num_heads && t->dim(2) == pool.head_dim && t->strides[2] == 1,
                  "{}: k and v must be f32 host [>= {}, {}, {}], got {}", op, n, pool.num_heads, pool.head_dim,
                  t->str());
    }
    for (int64_t i = 0; i < n; ++i) {
        const int64_t slot = slots[i];
        if (slot == kPadSlot) continue;
        DZR_CHECK(slot >= 0 && slot < num_slots, "{}: token {} maps to slot {}, outside the pool's {} slots", op, i,
                  slot, num_slots);
        for (int h = 0; h < pool.num_heads; ++h) {
            const float* ks = k.ptr<float>() + i * k.strides[0] + h * k.strides[1];
            const float* vs = v.ptr<float>() + i * v.strides[0] + h * v.strides[1];
            if (pool.fp8()) {
                // one scale per token and head (core/fp8.h)
                const int64_t o = pool.slot_offset(layer, slot, h), so = pool.slot_scale_offset(layer, slot, h);
                static_cast<float*>(pool.k_scale)[so] =
                    quantize_row_fp8(ks, pool.head_dim, static_cast<uint8_t*>(pool.k_base) + o);
                static_cast<float*>(pool.v_scale)[so] =
                    quantize_row_fp8(vs, pool.head_dim, static_cast<uint8_t*>(pool.v_base) + o);
                continue;
            }
            std::copy(ks, ks + pool.head_dim, static_cast<float*>(pool.k_base) + pool.slot_offset(layer, slot, h));
            std::copy(vs, vs + pool.head_dim, static_cast<float*>(pool.v_base) + pool.slot_offset(layer, slot, h));
        }
    }
}

}  // namespace dzr
