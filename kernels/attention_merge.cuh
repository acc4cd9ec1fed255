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

/// The other keys of a split attention as n copies of one key row (a padded prompt's pad rows, which all project to
/// one K and V row): part a is the attention over the distinct rows with its log-sum-exp, and per (token, head)
///   lse_b = scale · (q · k_rep) + log n,  m = max(lse_a, lse_b),  wa = exp(lse_a - m),  wb = exp(lse_b - m),
///   out = (wa·O_a + wb·v_rep) / (wa + wb) (+ addend)
/// in f32, rounded once to the output dtype (Backend::attention_repeated_tail).
struct RepeatedKeyMergeArgs {
    DType dtype = DType::BF16;  // every row: bf16 or f16
    int64_t lq = 0;
    int heads = 0, head_dim = 0, head_dim_v = 0;
    float scale = 1.0f;
    float log_n = 0.0f;  // log of the copies' count
    const void* q = nullptr;  // [lq, heads, head_dim], (token, head) strides
    int64_t q_tok = 0, q_head = 0;
    const void* k_rep = nullptr;  // the repeated key row [heads, head_dim], head stride
    int64_t k_head = 0;
    const void* v_rep = nullptr;  // the repeated value row [heads, head_dim_v], head stride
    int64_t v_head = 0;
    const void* part = nullptr;  // part a's rows [lq, heads, head_dim_v]
    int64_t p_tok = 0, p_head = 0;
    const float* lse = nullptr;  // part a's log-sum-exps, f32 [heads, lq] (row (t, h) at h * lq + t)
    const void* addend = nullptr;  // optional [lq, heads, head_dim_v]
    int64_t a_tok = 0, a_head = 0;
    void* out = nullptr;  // [lq, heads, head_dim_v]; may be part itself
    int64_t o_tok = 0, o_head = 0;
};

/// One warp per (token, head) row, on `stream`.
cudaError_t repeated_key_merge(const RepeatedKeyMergeArgs& a, cudaStream_t stream);

}  // namespace dzr::kernels
