#pragma once
/// dzr's own fused attention (FlashAttention-2 style: bf16/f16 tensor-core MMAs with fp32 accumulation,
/// online softmax, the Lq x Lk logits never leave registers). Keys are [history | current]: the history
/// rows are reached through a device block table (paged) and may be empty, so the same kernel runs dense
/// attention (hist_len = 0) and paged attention without a gather. Non-causal, no bias.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace dzr::kernels {

struct FlashAttentionArgs {
    DType dtype = DType::BF16;  // q, k, v, out and the pool: bf16 or f16
    int head_dim = 128;         // 64 or 128
    int heads = 0;
    int64_t lq = 0;
    float scale = 1.0f;
    // q, out: [lq, heads, head_dim] with unit last stride
    const void* q = nullptr;
    int64_t q_tok = 0, q_head = 0;
    void* out = nullptr;
    int64_t o_tok = 0, o_head = 0;
    // history: token t at pool row table[t / block_size] * block_size + t % block_size
    const void* hist_k = nullptr;
    const void* hist_v = nullptr;
    int64_t hist_tok = 0, hist_head = 0;
    int32_t block_size = 1;
    const int32_t* table = nullptr;  // device memory
    int64_t hist_len = 0;
    // current rows: [cur_len, heads, head_dim]
    const void* k = nullptr;
    const void* v = nullptr;
    int64_t k_tok = 0, k_head = 0, v_tok = 0, v_head = 0;
    int64_t cur_len = 0;
};

/// True when the kernel handles these arguments: bf16/f16, head_dim 64 or 128, every pointer and row/head
/// stride 16-byte aligned, at least one key.
bool flash_attention_supported(const FlashAttentionArgs& a);

/// Queues the kernel on `stream`. Returns cudaErrorNotSupported when !flash_attention_supported(a).
cudaError_t flash_attention(const FlashAttentionArgs& a, cudaStream_t stream);

}  // namespace dzr::kernels
