#pragma once
// Device helpers shared by the kernel families (included by kernels/*.cu only): element types,
// f32 conversions, 16-byte vector loads, warp/block reductions and dtype dispatch for launchers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/dtype.h"

namespace dzr::kernels {

using bf16 = __nv_bfloat16;

inline constexpr int kWarp = 32;

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(bf16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }

template <typename T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) {
    return v;
}
template <>
__device__ __forceinline__ bf16 from_f32<bf16>(float v) {
    return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) {
    return __float2half_rn(v);
}

/// The tanh GELU in f32 as PyTorch's CUDA kernel evaluates it (float opmath, no fast-math intrinsics):
/// 0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3))). The activation kernel and the fused GELU-quantize share it.
__device__ __forceinline__ float gelu_tanh(float v) {
    const float cube = v * v * v;
    const float inner = 0.7978845608028654f * (v + 0.044715f * cube);
    return 0.5f * v * (1.f + tanhf(inner));
}

/// Parameter vectors (norm weights, biases) come as f32 or bf16 independent of the activations.
struct ParamPtr {
    const void* data = nullptr;
    bool is_bf16 = false;

    __device__ __forceinline__ float operator[](int64_t i) const {
        return is_bf16 ? __bfloat162float(static_cast<const bf16*>(data)[i]) : static_cast<const float*>(data)[i];
    }
    __host__ __device__ bool defined() const { return data != nullptr; }
};

/// Eight consecutive elements through 16-byte accesses (the pointer must be 16-byte aligned).
template <typename T>
struct Vec8;

template <>
struct Vec8<float> {
    __device__ __forceinline__ static void load(const float* p, float (&v)[8]) {
        const float4 a = reinterpret_cast<const float4*>(p)[0];
        const float4 b = reinterpret_cast<const float4*>(p)[1];
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    }
    __device__ __forceinline__ static void store(float* p, const float (&v)[8]) {
        reinterpret_cast<float4*>(p)[0] = make_float4(v[0], v[1], v[2], v[3]);
        reinterpret_cast<float4*>(p)[1] = make_float4(v[4], v[5], v[6], v[7]);
    }
};

/// Eight bf16 values held in one 16-byte register (a uint4) as f32, and back (round to nearest even).
__device__ __forceinline__ void unpack8(const uint4& raw, float (&v)[8]) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 f = __bfloat1622float2(h[i]);
        v[2 * i] = f.x;
        v[2 * i + 1] = f.y;
    }
}

__device__ __forceinline__ uint4 pack8(const float (&v)[8]) {
    uint4 raw;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
    for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
    return raw;
}

template <>
struct Vec8<bf16> {
    __device__ __forceinline__ static void load(const bf16* p, float (&v)[8]) {
        unpack8(*reinterpret_cast<const uint4*>(p), v);
    }
    __device__ __forceinline__ static void store(bf16* p, const float (&v)[8]) {
        *reinterpret_cast<uint4*>(p) = pack8(v);
    }
};

/// A per-column vector (norm weight or bias, or one group's row of a per-group vector) of f32 or bf16, read 8
/// elements at a time (16-byte aligned); the branch on the dtype is uniform.
struct Vec8Ptr {
    const void* data = nullptr;
    bool is_bf16 = false;
    __device__ __forceinline__ void load(int64_t off, float (&v)[8]) const {
        if (is_bf16)
            Vec8<bf16>::load(static_cast<const bf16*>(data) + off, v);
        else
            Vec8<float>::load(static_cast<const float*>(data) + off, v);
    }
    __host__ __device__ bool defined() const { return data != nullptr; }
};

inline Vec8Ptr vec8(const void* p, DType t) { return {p, t == DType::BF16}; }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = kWarp / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/// Sum over the block; every thread gets the result. `shared` holds kWarp floats. blockDim.x must be
/// a multiple of 32.
__device__ __forceinline__ float block_sum(float v, float* shared) {
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, nwarps = blockDim.x / kWarp;
    v = warp_sum(v);
    __syncthreads();  // NOTE: `shared` may still be read by a previous reduction
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < nwarps ? shared[lane] : 0.f;
    return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float* shared) {
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, nwarps = blockDim.x / kWarp;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    v = lane < nwarps ? shared[lane] : -INFINITY;
    return warp_max(v);
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
/// A stride of `stride` elements of `es` bytes keeps 16-byte alignment.
inline bool aligned16_stride(int64_t stride, size_t es) { return (size_t(stride) * es) % 16 == 0; }

/// Threads per block for a one-block-per-row kernel over `cols` columns, `per_thread` per thread: the smallest
/// power of two from a warp up to 512 that covers them.
inline int row_block_threads(int64_t cols, int per_thread = 8) {
    int t = kWarp;
    while (t < 512 && int64_t(t) * per_thread < cols) t *= 2;
    return t;
}
/// Blocks of a one-block-per-row kernel: one per row, at most 2^20 (the kernel strides over the rest).
inline unsigned row_grid(int64_t rows) { return unsigned(rows < (int64_t(1) << 20) ? rows : (int64_t(1) << 20)); }

/// Calls f(T{}) with T the C++ type of a float dtype (f32, bf16).
template <typename F>
cudaError_t dispatch_float(DType t, F&& f) {
    switch (t) {
        case DType::F32:
            return f(float{});
        case DType::BF16:
            return f(bf16{});
        default:
            return cudaErrorNotSupported;
    }
}

/// Calls f(Tin{}, Tout{}) for two float dtypes.
template <typename F>
cudaError_t dispatch_float2(DType a, DType b, F&& f) {
    return dispatch_float(a, [&](auto ta) { return dispatch_float(b, [&](auto tb) { return f(ta, tb); }); });
}

/// One thread's share of a sum in the order of PyTorch's generic reduction (Reduce.cuh thread_reduce_impl,
/// vt0 = 4): four partial sums, the i-th over value(idx + i·stride + 4k·stride) from idx = first while
/// idx + 3·stride < end, the last partial round (tail) filling sums 0, 1, ... in order, then ((s0 + s1) + s2) + s3.
/// Every add is a rounded f32 add (no contraction).
template <typename F>
__device__ __forceinline__ float torch_thread_sum(int64_t first, int64_t stride, int64_t end, F&& value) {
    float s[4] = {0.f, 0.f, 0.f, 0.f};
    int64_t idx = first;
    for (; idx + 3 * stride < end; idx += 4 * stride) {
#pragma unroll
        for (int i = 0; i < 4; ++i) s[i] = __fadd_rn(s[i], value(idx + i * stride));
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        if (idx >= end) break;
        s[i] = __fadd_rn(s[i], value(idx));
        idx += stride;
    }
    return __fadd_rn(__fadd_rn(__fadd_rn(s[0], s[1]), s[2]), s[3]);
}

inline unsigned grid_for(int64_t n, int threads, int64_t max_blocks = int64_t(1) << 20) {
    int64_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    if (b > max_blocks) b = max_blocks;
    return unsigned(b);
}

/// Launches an elementwise kernel over n elements and returns the launch's error: launch(kVec, grid) with
/// kVec std::true_type (8 elements a thread, a grid over n / 8) when `vec`, else std::false_type (over n).
template <typename Launch>
cudaError_t launch_elementwise(int64_t n, bool vec, int threads, Launch&& launch) {
    if (vec)
        launch(std::true_type{}, grid_for(n / 8, threads));
    else
        launch(std::false_type{}, grid_for(n, threads));
    return cudaGetLastError();
}

}  // namespace dzr::kernels
