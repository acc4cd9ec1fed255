// Binary ops with broadcasting, affine scale, and bias epilogues.
#include "kernels/common.cuh"
#include "kernels/elementwise.cuh"

namespace dzr::kernels {
namespace {

__device__ __forceinline__ float apply(BinOp op, float x, float y) {
    switch (op) {
        case BinOp::Add:
            return x + y;
        case BinOp::Sub:
            return x - y;
        case BinOp::Div:
            return x / y;  // IEEE division (nvcc's default -prec-div), as PyTorch's div kernel
        default:
            return x * y;
    }
}

// NOTE: kVec handles 8 elements per thread through 16-byte accesses; the host picks it only when every
// pointer is 16-byte aligned, n % 8 == 0 and nb is 1 or a multiple of 8 (so a chunk never straddles b's
// period).
template <typename Ta, typename Tb, typename To, bool kVec>
__global__ void binary_kernel(BinOp op, const Ta* a, const Tb* b, To* out, int64_t n, int64_t nb) {
    const int64_t step = int64_t(gridDim.x) * blockDim.x;
    if constexpr (kVec) {
        for (int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < n / 8; v += step) {
            const int64_t i = v * 8;
            float x[8], y[8];
            Vec8<Ta>::load(a + i, x);
            if (nb == 1) {
                const float b0 = to_f32(b[0]);
#pragma unroll
                for (int k = 0; k < 8; ++k) y[k] = b0;
            } else {
                Vec8<Tb>::load(b + (nb == n ? i : i % nb), y);
            }
#pragma unroll
            for (int k = 0; k < 8; ++k) x[k] = apply(op, x[k], y[k]);
            Vec8<To>::store(out + i, x);
        }
    } else {
        for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
            const float y = to_f32(b[nb == n ? i : i % nb]);
            out[i] = from_f32<To>(apply(op, to_f32(a[i]), y));
        }
    }
}

template <typename Tx, typename To, bool kVec>
__global__ void scale_kernel(const Tx* x, To* out, int64_t n, float alpha, float beta) {
    const int64_t step = int64_t(gridDim.x) * blockDim.x;
    if constexpr (kVec) {
        for (int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; v < n / 8; v += step) {
            float t[8];
            Vec8<Tx>::load(x + v * 8, t);
#pragma unroll
            for (int k = 0; k < 8; ++k) t[k] = fmaf(alpha, t[k], beta);
            Vec8<To>::store(out + v * 8, t);
        }
    } else {
        for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step)
            out[i] = from_f32<To>(fmaf(alpha, to_f32(x[i]), beta));
    }
}

template <typename To>
__global__ void rows_epilogue_kernel(To* out, int64_t batch, int64_t M, int64_t N, int64_t ld,
                                     int64_t batch_stride, bool apply_beta, float beta, ParamPtr bias) {
    const int64_t total = batch * M * N, step = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
        const int64_t n = i % N, m = (i / N) % M, bi = i / (N * M);
        To* p = out + bi * batch_stride + m * ld + n;
        float v = 0.f;
        if (!apply_beta)
            v = to_f32(*p);
        else if (beta != 0.f)
            v = beta * to_f32(*p);
        if (bias.defined()) v += bias[n];
        *p = from_f32<To>(v);
    }
}

template <typename To>
__global__ void channel_bias_kernel(To* out, int64_t C, int64_t S, ParamPtr bias) {
    const int64_t total = C * S, step = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step)
        out[i] = from_f32<To>(to_f32(out[i]) + bias[i / S]);
}

constexpr int kThreads = 256;

}  // namespace

namespace {

template <typename To>
__global__ void sin_cos_table_kernel(float step, int64_t rows, int64_t half, To* out) {
    const int64_t n = rows * half;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
        const int64_t t = i / half, j = i % half;
        // NOTE: one rounded f32 operation per step, as the reference's tensor ops: −j · step, exp, t · e, sin, cos
        const float e = expf(__fmul_rn(-float(j), step));
        const float arg = __fmul_rn(float(t), e);
        out[t * 2 * half + j] = from_f32<To>(sinf(arg));
        out[t * 2 * half + half + j] = from_f32<To>(cosf(arg));
    }
}

}  // namespace

cudaError_t sin_cos_table(float step, int64_t rows, int64_t half, void* out, DType to, cudaStream_t stream) {
    if (rows == 0 || half == 0) return cudaSuccess;
    return dispatch_float(to, [&](auto o) {
        using To = decltype(o);
        sin_cos_table_kernel<To><<<grid_for(rows * half, 256), 256, 0, stream>>>(step, rows, half, static_cast<To*>(out));
        return cudaGetLastError();
    });
}

cudaError_t binary(BinOp op, const void* a, DType ta, const void* b, DType tb, void* out, DType to, int64_t n,
                   int64_t nb, cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    const bool vec = n % 8 == 0 && (nb == 1 || nb % 8 == 0) && aligned16(a) && aligned16(b) && aligned16(out);
    return dispatch_float(ta, [&](auto xa) {
        return dispatch_float2(tb, to, [&](auto xb, auto xo) {
            using Ta = decltype(xa);
            using Tb = decltype(xb);
            using To = decltype(xo);
            const auto* pa = static_cast<const Ta*>(a);
            const auto* pb = static_cast<const Tb*>(b);
            auto* po = static_cast<To*>(out);
            return launch_elementwise(n, vec, kThreads, [&](auto kVec, unsigned grid) {
                binary_kernel<Ta, Tb, To, decltype(kVec)::value><<<grid, kThreads, 0, stream>>>(op, pa, pb, po, n, nb);
            });
        });
    });
}

cudaError_t scale(const void* x, DType tx, void* out, DType to, int64_t n, float alpha, float beta,
                  cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    const bool vec = n % 8 == 0 && aligned16(x) && aligned16(out);
    return dispatch_float2(tx, to, [&](auto xi, auto xo) {
        using Tx = decltype(xi);
        using To = decltype(xo);
        const auto* px = static_cast<const Tx*>(x);
        auto* po = static_cast<To*>(out);
        return launch_elementwise(n, vec, kThreads, [&](auto kVec, unsigned grid) {
            scale_kernel<Tx, To, decltype(kVec)::value><<<grid, kThreads, 0, stream>>>(px, po, n, alpha, beta);
        });
    });
}

cudaError_t rows_epilogue(void* out, DType to, int64_t batch, int64_t M, int64_t N, int64_t ld,
                          int64_t batch_stride, bool apply_beta, float beta, const void* bias, DType tbias,
                          cudaStream_t stream) {
    const int64_t total = batch * M * N;
    if (total == 0) return cudaSuccess;
    const ParamPtr pbias{bias, tbias == DType::BF16};
    return dispatch_float(to, [&](auto xo) {
        using To = decltype(xo);
        rows_epilogue_kernel<To><<<grid_for(total, kThreads), kThreads, 0, stream>>>(
            static_cast<To*>(out), batch, M, N, ld, batch_stride, apply_beta, beta, pbias);
        return cudaGetLastError();
    });
}

cudaError_t channel_bias(void* out, DType to, int64_t C, int64_t S, const void* bias, DType tbias,
                         cudaStream_t stream) {
    if (C * S == 0) return cudaSuccess;
    const ParamPtr pbias{bias, tbias == DType::BF16};
    return dispatch_float(to, [&](auto xo) {
        using To = decltype(xo);
        channel_bias_kernel<To><<<grid_for(C * S, kThreads), kThreads, 0, stream>>>(static_cast<To*>(out), C, S, pbias);
        return cudaGetLastError();
    });
}

}  // namespace dzr::kernels
