#pragma once
/// CPU reference kernels over KV views (f32 host memory, or an f8_e4m3 pool with its per-token-and-head scales):
/// the paged attention and the scatter of current K/V rows into pool slots. Straight loops with double
/// accumulation; the point is clarity, not speed. An f8_e4m3 pool is quantized on the scatter and dequantized
/// (code * scale, f32) before the attention, as the CUDA path does.
#include <cstdint>

#include "core/tensor.h"
#include "backend/kv_view.h"

namespace dzr {

/// Non-causal attention of q over [history | current], per head:
///   out[i, h] = sum_j softmax_j(scale * q[i, h] . K[j, h]) V[j, h],  K = [history rows | current rows]
/// q, out: f32 host [Lq, H, D] with unit head-dim stride; history and current: f32 views of layer `layer`.
/// With no keys at all the output is zero.
void paged_attention_cpu(const TensorView& q, const PagedKvView& history, const ContiguousKvView& current, int layer,
                         float scale, const TensorView& out);

/// The same attention with a contiguous history (the dense reference's layout): one template serves both.
void contiguous_attention_cpu(const TensorView& q, const ContiguousKvView& history, const ContiguousKvView& current,
                              int layer, float scale, const TensorView& out);

/// Writes row i of k and v ([n, H, D] f32 host) to pool slot slots[i] of layer `layer` (kPadSlot rows
/// are skipped). Slots must lie inside the pool: [0, num_block_ids * block_size).
void scatter_kv_cpu(const PagedKvView& pool, int layer, const int64_t* slots, int64_t n, int64_t num_slots,
                    const TensorView& k, const TensorView& v);

}  // namespace dzr
