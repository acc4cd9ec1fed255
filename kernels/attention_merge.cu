// The log-sum-exp merge of two attention parts (kernels/attention_merge.cuh): one thread per 8 consecutive
// head-dim elements of one (token, head) row when every address and stride allows 16-byte accesses, else one
// per element.
#include "kernels/attention_merge.cuh"
#include "kernels/common.cuh"

namespace dzr::kernels {
namespace {

/// The weights of parts a and b of row (t, h); both zero when neither part has a finite log-sum-exp.
__device__ __forceinline__ float2 merge_weights(const AttentionMergeArgs& a, int64_t t, int h) {
    const float la = a.lse_a[int64_t(h) * a.lq + t], lb = a.lse_b[int64_t(h) * a.lq + t];
    const float m = fmaxf(la, lb);
    if (!(m > -INFINITY)) return make_float2(0.f, 0.f);
    const float wa = __expf(la - m), wb = __expf(lb - m);
    const float inv = 1.f / (wa + wb);
    return make_float2(wa * inv, wb * inv);
}

template <typename T>
__global__ void merge_kernel(AttentionMergeArgs a) {
    const int64_t per_row = a.head_dim, total = a.lq * a.heads * per_row;
    const int64_t step = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
        const int64_t row = i / per_row, d = i % per_row, t = row / a.heads;
        const int h = int(row % a.heads);
        const float2 w = merge_weights(a, t, h);
        T* o = static_cast<T*>(a.out) + t * a.o_tok + h * a.o_head + d;
        const T* b = static_cast<const T*>(a.other) + t * a.b_tok + h * a.b_head + d;
        *o = from_f32<T>(w.x * to_f32(*o) + w.y * to_f32(*b));
    }
}

__global__ void merge_kernel_bf16x8(AttentionMergeArgs a) {
    const int64_t per_row = a.head_dim / 8, total = a.lq * a.heads * per_row;
    const int64_t step = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
        const int64_t row = i / per_row, d = (i % per_row) * 8, t = row / a.heads;
        const int h = int(row % a.heads);
        const float2 w = merge_weights(a, t, h);
        bf16* o = static_cast<bf16*>(a.out) + t * a.o_tok + h * a.o_head + d;
        const bf16* b = static_cast<const bf16*>(a.other) + t * a.b_tok + h * a.b_head + d;
        float vo[8], vb[8];
        Vec8<bf16>::load(o, vo);
        Vec8<bf16>::load(b, vb);
#pragma unroll
        for (int k = 0; k < 8; ++k) vo[k] = w.x * vo[k] + w.y * vb[k];
        Vec8<bf16>::store(o, vo);
    }
}

constexpr int kThreads = 256;

}  // namespace

cudaError_t attention_merge(const AttentionMergeArgs& a, cudaStream_t stream) {
    if (a.lq <= 0 || a.heads <= 0 || a.head_dim <= 0) return cudaSuccess;
    const int64_t n = a.lq * a.heads * a.head_dim;
    if (a.dtype == DType::BF16) {
        const size_t es = 2;
        const bool vec = a.head_dim % 8 == 0 && aligned16(a.out) && aligned16(a.other) &&
                         aligned16_stride(a.o_tok, es) && aligned16_stride(a.o_head, es) &&
                         aligned16_stride(a.b_tok, es) && aligned16_stride(a.b_head, es);
        if (vec) {
            merge_kernel_bf16x8<<<grid_for(n / 8, kThreads), kThreads, 0, stream>>>(a);
            return cudaGetLastError();
        }
        merge_kernel<bf16><<<grid_for(n, kThreads), kThreads, 0, stream>>>(a);
        return cudaGetLastError();
    }
    if (a.dtype == DType::F16) {
        merge_kernel<__half><<<grid_for(n, kThreads), kThreads, 0, stream>>>(a);
        return cudaGetLastError();
    }
    return cudaErrorNotSupported;
}

}  // namespace dzr::kernels
