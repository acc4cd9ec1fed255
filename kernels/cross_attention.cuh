#pragma once
/// The DiT's cross-attention of fast numerics in one kernel (Backend::cross_attention): per CFG branch, query row and
/// head, out = softmax(scale q k_txt^T) v_txt + softmax(scale q k_img^T) v_img, two softmaxes summed in f32 and
/// rounded once. Each context may end in rows that are all equal (the text's zeroed pad rows after the projections):
/// `distinct` (device memory, so a CUDA graph replays with the count of a later prompt) names how many leading rows
/// differ; the kernel attends to those and counts the last of them once for every equal row (its logit + ln(count)),
/// which is the softmax over all rows. bf16 only, head_dim 128.
#include <cuda_runtime.h>

#include <cstdint>

namespace dzr::kernels {

inline constexpr int kCrossMaxBranches = 2;

struct CrossContextArgs {
    const void* k = nullptr;  // [rows, heads, 128] bf16, unit last stride
    const void* v = nullptr;
    int64_t k_tok = 0, k_head = 0, v_tok = 0, v_head = 0;
    int32_t rows = 0;
    /// Device int32: rows [0, *distinct) differ and rows [*distinct - 1, rows) are equal; null: all differ. Read
    /// clamped to [1, rows].
    const int32_t* distinct = nullptr;
};

struct CrossAttentionArgs {
    int heads = 0;
    int branches = 1;  // 1 or 2
    int64_t lq = 0;    // query rows per branch: branch b's rows are [b lq, (b + 1) lq) of q and out
    float scale = 1.0f;
    const void* q = nullptr;  // [branches lq, heads, 128] bf16
    int64_t q_tok = 0, q_head = 0;
    void* out = nullptr;
    int64_t o_tok = 0, o_head = 0;
    CrossContextArgs text[kCrossMaxBranches];
    CrossContextArgs image[kCrossMaxBranches];
};

/// True when the kernel takes these arguments: 1 or 2 branches, every context with at least one row, every
/// pointer and row/head stride 16-byte aligned.
bool cross_attention_supported(const CrossAttentionArgs& a);

/// Queues the kernel on `stream`; cudaErrorNotSupported when !cross_attention_supported(a).
cudaError_t cross_attention(const CrossAttentionArgs& a, cudaStream_t stream);

}  // namespace dzr::kernels
