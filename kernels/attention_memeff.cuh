#pragma once
/// Attention in the arithmetic of PyTorch's memory-efficient SDPA forward for a head dim above 128: the
/// kernel PyTorch 2.x's `_efficient_attention_forward` dispatches to for bf16/f16 on sm_80+ there
/// (xFormers' cutlassF, the 32-query x 128-key tile with the output accumulated in f32 across key blocks;
/// read in PyTorch's kernel_forward.h, not copied). PyTorch's SDPA picks that backend when its flash and
/// cuDNN backends refuse the head dim (the Wan VAE's mid-block attention: one head of 384), so a
/// bit-identical bf16 VAE needs this order:
///  - S = Q K^T per 128-key block as a chain of mma.sync m16n8k8 steps over the head dim (PyTorch's
///    instruction shape for 16-bit types) (f32 accumulator),
///    then S * scale, then * log2(e), each rounded;
///  - the running row max over the block's valid keys; the previous max's correction exp2(m' - m) scales the
///    running sum; P = exp2(S - m) in f32, rounded to the input dtype for P V;
///  - the row sum of P in the thread order of the MMA layout: each thread's 8 columns of a 32-key warp tile in
///    sequence, the 4 threads of a row by butterfly, the 4 warp tiles in order, added to the running sum;
///  - O_block = P V per 128-column chunk as a chain of m16n8k8 steps over the keys, combined with the f32
///    accumulator as o = o_block + r * o (one FMA; r the max correction), the last block scaled by 1 / sum.
/// Non-causal, no bias, no dropout.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace dzr::kernels {

struct MemEffAttentionArgs {
    DType dtype = DType::BF16;  // q, k, v, out: bf16 or f16
    int heads = 0;
    int64_t lq = 0, lk = 0;
    int d = 0, dv = 0;  // head dims of q/k and of v/out
    float scale = 1.0f;
    // [L, heads, dim] with unit last stride
    const void* q = nullptr;
    int64_t q_tok = 0, q_head = 0;
    const void* k = nullptr;
    int64_t k_tok = 0, k_head = 0;
    const void* v = nullptr;
    int64_t v_tok = 0, v_head = 0;
    void* out = nullptr;
    int64_t o_tok = 0, o_head = 0;
};

/// True when the kernel runs these arguments: bf16/f16; max(d, dv) > 128 (PyTorch runs another tile below);
/// d and dv multiples of 8 and at most 512; 16-byte aligned pointers and token/head strides; lq, lk > 0.
bool mem_eff_attention_supported(const MemEffAttentionArgs& a);

/// Queues the kernel on `stream`. Returns cudaErrorNotSupported when !mem_eff_attention_supported(a).
cudaError_t mem_eff_attention(const MemEffAttentionArgs& a, cudaStream_t stream);

}  // namespace dzr::kernels
