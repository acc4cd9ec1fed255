#pragma once
/// The merge of two attentions of the same queries over disjoint key sets (a split attention: the paged
/// history and the current rows, lib/backend/cuda/cuda_paged_sdpa.cpp). Each part comes with its output rows
/// and each row's log-sum-exp of the scaled logits (cuDNN SDPA's stats); the merged row is the attention over
/// the union:
///   m = max(lse_a, lse_b), wa = exp(lse_a - m), wb = exp(lse_b - m), out = (wa·O_a + wb·O_b) / (wa + wb)
/// in f32, rounded once to the output dtype.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace dzr::kernels {

struct AttentionMergeArgs {
    DType dtype = DType::BF16;  // bf16 or f16 rows
    int64_t lq = 0;
    int heads = 0, head_dim = 0;
    /// Part a's rows, read and overwritten with the merged rows: [lq, heads, head_dim], (token, head)
    /// strides.
    void* out = nullptr;
    int64_t o_tok = 0, o_head = 0;
    /// Part b's rows: [lq, heads, head_dim], (token, head) strides.
    const void* other = nullptr;
    int64_t b_tok = 0, b_head = 0;
    /// f32 [heads, lq] log-sum-exps of parts a and b (row (t, h) at h * lq + t).
    const float* lse_a = nullptr;
    const float* lse_b = nullptr;
};

/// Merges part b into part a (see above), on `stream`.
cudaError_t attention_merge(const AttentionMergeArgs& a, cudaStream_t stream);

}  // namespace dzr::kernels
