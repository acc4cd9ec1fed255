// Zero padding for 3-D convolutions, a direct convolution kernel (fallback when cuDNN has none), and the
// channels-last transposes of fast numerics' convolutions.
#include "kernels/common.cuh"
#include "kernels/conv3d.cuh"

namespace dzr::kernels {
namespace {

struct PadDims {
    int64_t C, in[3], out[3];
    int before[3];
};

PadDims pad_dims(int64_t C, const int64_t in[3], const int pad_before[3], const int pad_after[3]) {
    PadDims d{};
    d.C = C;
    for (int i = 0; i < 3; ++i) {
        d.in[i] = in[i];
        d.before[i] = pad_before[i];
        d.out[i] = in[i] + pad_before[i] + pad_after[i];
    }
    return d;
}

template <typename T>
__global__ void pad3d_kernel(const T* x, T* xp, PadDims d) {
    const int64_t total = d.C * d.out[0] * d.out[1] * d.out[2], step = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
        const int64_t w = i % d.out[2] - d.before[2];
        const int64_t h = (i / d.out[2]) % d.out[1] - d.before[1];
        const int64_t t = (i / (d.out[2] * d.out[1])) % d.out[0] - d.before[0];
        const int64_t c = i / (d.out[2] * d.out[1] * d.out[0]);
        const bool inside = t >= 0 && t < d.in[0] && h >= 0 && h < d.in[1] && w >= 0 && w < d.in[2];
        xp[i] = inside ? x[((c * d.in[0] + t) * d.in[1] + h) * d.in[2] + w] : from_f32<T>(0.f);
    }
}

template <typename T>
__global__ void conv3d_direct_kernel(Conv3dDirectArgs a) {
    const int64_t total = a.Co * a.o[0] * a.o[1] * a.o[2], step = int64_t(gridDim.x) * blockDim.x;
    const T* x = static_cast<const T*>(a.x);
    const T* w = static_cast<const T*>(a.w);
    T* out = static_cast<T*>(a.out);
    const ParamPtr bias{a.bias, a.bias_dtype == DType::BF16};
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
        const int64_t ow = i % a.o[2], oh = (i / a.o[2]) % a.o[1], ot = (i / (a.o[2] * a.o[1])) % a.o[0];
        const int64_t co = i / (a.o[2] * a.o[1] * a.o[0]);
        float acc = 0.f;
        for (int64_t ci = 0; ci < a.Ci; ++ci)
            for (int64_t kt = 0; kt < a.k[0]; ++kt) {
                const int64_t it = ot * a.stride[0] - a.pad_before[0] + kt;
                if (it < 0 || it >= a.in[0]) continue;
                for (int64_t kh = 0; kh < a.k[1]; ++kh) {
                    const int64_t ih = oh * a.stride[1] - a.pad_before[1] + kh;
                    if (ih < 0 || ih >= a.in[1]) continue;
                    for (int64_t kw = 0; kw < a.k[2]; ++kw) {
                        const int64_t iw = ow * a.stride[2] - a.pad_before[2] + kw;
                        if (iw < 0 || iw >= a.in[2]) continue;
                        const float xv = to_f32(x[((ci * a.in[0] + it) * a.in[1] + ih) * a.in[2] + iw]);
                        const float wv = to_f32(w[(((co * a.Ci + ci) * a.k[0] + kt) * a.k[1] + kh) * a.k[2] + kw]);
                        acc = fmaf(xv, wv, acc);
                    }
                }
            }
        if (bias.defined()) acc += bias[co];
        out[i] = from_f32<T>(acc);
    }
}

// The channels-last transposes: a block moves a 32 x 32 tile (32 channels x 32 positions) through shared memory,
// so both the channels-first side (positions contiguous) and the channels-last side (channels contiguous) are
// read and written by consecutive threads. 32 x 8 threads, 4 rows each.
constexpr int kTile = 32, kTileRows = 8;

/// Block (bx, by, z): positions w0 = bx * 32 of padded row z = (t', h'), channels c0 = by * 32.
template <typename T>
__global__ void to_channels_last_padded_kernel(const T* x, T* xp, PadDims d) {
    __shared__ T tile[kTile][kTile + 1];
    const int64_t rows = d.out[0] * d.out[1];
    const int64_t w0 = int64_t(blockIdx.x) * kTile, c0 = int64_t(blockIdx.y) * kTile;
    for (int64_t row = blockIdx.z; row < rows; row += gridDim.z) {
        const int64_t t = row / d.out[1] - d.before[0], h = row % d.out[1] - d.before[1];
        const bool row_inside = t >= 0 && t < d.in[0] && h >= 0 && h < d.in[1];
        const int64_t w = w0 + threadIdx.x - d.before[2];
        for (int r = threadIdx.y; r < kTile; r += kTileRows) {
            const int64_t c = c0 + r;
            T v = from_f32<T>(0.f);
            if (row_inside && c < d.C && w >= 0 && w < d.in[2]) v = x[((c * d.in[0] + t) * d.in[1] + h) * d.in[2] + w];
            tile[r][threadIdx.x] = v;
        }
        __syncthreads();
        for (int r = threadIdx.y; r < kTile; r += kTileRows) {
            const int64_t wp = w0 + r, c = c0 + threadIdx.x;
            if (wp < d.out[2] && c < d.C) xp[(row * d.out[2] + wp) * d.C + c] = tile[threadIdx.x][r];
        }
        __syncthreads();
    }
}

template <typename T>
__global__ void pad_channels_last_kernel(const T* x, T* xp, PadDims d) {
    const int64_t total = d.C * d.out[0] * d.out[1] * d.out[2], step = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
        const int64_t c = i % d.C, p = i / d.C;
        const int64_t w = p % d.out[2] - d.before[2];
        const int64_t h = (p / d.out[2]) % d.out[1] - d.before[1];
        const int64_t t = p / (d.out[2] * d.out[1]) - d.before[0];
        const bool inside = t >= 0 && t < d.in[0] && h >= 0 && h < d.in[1] && w >= 0 && w < d.in[2];
        xp[i] = inside ? x[((t * d.in[1] + h) * d.in[2] + w) * d.C + c] : from_f32<T>(0.f);
    }
}

/// pad_channels_last over 16-byte units: rows of Cv = C·sizeof(T) / 16 units (C·sizeof(T) a multiple of 16).
__global__ void pad_channels_last_vec_kernel(const uint4* x, uint4* xp, int64_t Cv, PadDims d) {
    const int64_t total = Cv * d.out[0] * d.out[1] * d.out[2], step = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
        const int64_t c = i % Cv, p = i / Cv;
        const int64_t w = p % d.out[2] - d.before[2];
        const int64_t h = (p / d.out[2]) % d.out[1] - d.before[1];
        const int64_t t = p / (d.out[2] * d.out[1]) - d.before[0];
        const bool inside = t >= 0 && t < d.in[0] && h >= 0 && h < d.in[1] && w >= 0 && w < d.in[2];
        xp[i] = inside ? x[((t * d.in[1] + h) * d.in[2] + w) * Cv + c] : make_uint4(0, 0, 0, 0);
    }
}

/// add_bias_rows eight elements a thread (C a multiple of 8, y 16-byte aligned): the same f32 add and rounding.
template <typename T>
__global__ void add_bias_rows_vec_kernel(T* y, int64_t C, int64_t total, ParamPtr bias) {
    const int64_t step = int64_t(gridDim.x) * blockDim.x, n8 = total / 8;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n8; i += step) {
        const int64_t c0 = (i * 8) % C;
        float v[8];
        Vec8<T>::load(y + i * 8, v);
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = v[j] + bias[c0 + j];
        Vec8<T>::store(y + i * 8, v);
    }
}

template <typename T>
__global__ void add_bias_rows_kernel(T* y, int64_t C, int64_t total, ParamPtr bias) {
    const int64_t step = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step)
        y[i] = from_f32<T>(to_f32(y[i]) + bias[i % C]);
}

/// Block (bx, by): positions s0 = bx * 32, channels c0 = by * 32 (grid.y strides over the rest).
template <typename T>
__global__ void channels_first_with_bias_kernel(const T* y, T* out, int64_t C, int64_t S, ParamPtr bias) {
    __shared__ T tile[kTile][kTile + 1];
    const int64_t s0 = int64_t(blockIdx.x) * kTile;
    for (int64_t c0 = int64_t(blockIdx.y) * kTile; c0 < C; c0 += int64_t(gridDim.y) * kTile) {
        for (int r = threadIdx.y; r < kTile; r += kTileRows) {
            const int64_t s = s0 + r, c = c0 + threadIdx.x;
            if (s < S && c < C) tile[r][threadIdx.x] = y[s * C + c];
        }
        __syncthreads();
        for (int r = threadIdx.y; r < kTile; r += kTileRows) {
            const int64_t c = c0 + r, s = s0 + threadIdx.x;
            if (s < S && c < C) {
                const T v = tile[threadIdx.x][r];
                out[c * S + s] = bias.defined() ? from_f32<T>(to_f32(v) + bias[c]) : v;
            }
        }
        __syncthreads();
    }
}

}  // namespace

cudaError_t to_channels_last_padded(const void* x, void* xp, DType t, int64_t C, const int64_t in[3],
                                    const int pad_before[3], const int pad_after[3], cudaStream_t stream) {
    const PadDims d = pad_dims(C, in, pad_before, pad_after);
    const int64_t rows = d.out[0] * d.out[1];
    if (C == 0 || rows == 0 || d.out[2] == 0) return cudaSuccess;
    const int64_t bx = (d.out[2] + kTile - 1) / kTile, by = (C + kTile - 1) / kTile;
    if (bx > INT32_MAX || by > 65535) return cudaErrorInvalidValue;
    const dim3 grid(unsigned(bx), unsigned(by), unsigned(rows < 65535 ? rows : 65535)), block(kTile, kTileRows);
    return dispatch_float(t, [&](auto xt) {
        using T = decltype(xt);
        to_channels_last_padded_kernel<T><<<grid, block, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(xp), d);
        return cudaGetLastError();
    });
}

cudaError_t pad_channels_last(const void* x, void* xp, DType t, int64_t C, const int64_t in[3], const int pad_before[3],
                              const int pad_after[3], cudaStream_t stream) {
    const PadDims d = pad_dims(C, in, pad_before, pad_after);
    const int64_t total = C * d.out[0] * d.out[1] * d.out[2];
    if (total == 0) return cudaSuccess;
    constexpr int kThreads = 256;
    const size_t row_bytes = size_t(C) * dtype_size(t);
    if (row_bytes % 16 == 0 && aligned16(x) && aligned16(xp) && (t == DType::F32 || t == DType::BF16)) {
        // NOTE: a pure copy: 16 bytes of channels a thread, whatever the dtype
        const int64_t Cv = int64_t(row_bytes / 16);
        pad_channels_last_vec_kernel<<<grid_for(total / (C / Cv), kThreads), kThreads, 0, stream>>>(
            static_cast<const uint4*>(x), static_cast<uint4*>(xp), Cv, d);
        return cudaGetLastError();
    }
    return dispatch_float(t, [&](auto xt) {
        using T = decltype(xt);
        pad_channels_last_kernel<T>
            <<<grid_for(total, kThreads), kThreads, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(xp), d);
        return cudaGetLastError();
    });
}

cudaError_t add_bias_rows(void* y, DType t, int64_t C, int64_t S, const void* bias, DType bias_dtype,
                          cudaStream_t stream) {
    const int64_t total = C * S;
    if (total == 0 || bias == nullptr) return cudaSuccess;
    constexpr int kThreads = 256;
    const ParamPtr pb{bias, bias_dtype == DType::BF16};
    const bool vec = C % 8 == 0 && aligned16(y);
    return dispatch_float(t, [&](auto xt) {
        using T = decltype(xt);
        if (vec)
            add_bias_rows_vec_kernel<T>
                <<<grid_for(total / 8, kThreads), kThreads, 0, stream>>>(static_cast<T*>(y), C, total, pb);
        else
            add_bias_rows_kernel<T>
                <<<grid_for(total, kThreads), kThreads, 0, stream>>>(static_cast<T*>(y), C, total, pb);
        return cudaGetLastError();
    });
}

cudaError_t channels_first_with_bias(const void* y, void* out, DType t, int64_t C, int64_t S, const void* bias,
                                     DType bias_dtype, cudaStream_t stream) {
    if (C == 0 || S == 0) return cudaSuccess;
    const int64_t bx = (S + kTile - 1) / kTile, by = (C + kTile - 1) / kTile;
    if (bx > INT32_MAX) return cudaErrorInvalidValue;
    const dim3 grid(unsigned(bx), unsigned(by < 65535 ? by : 65535)), block(kTile, kTileRows);
    const ParamPtr pb{bias, bias_dtype == DType::BF16};
    return dispatch_float(t, [&](auto xt) {
        using T = decltype(xt);
        channels_first_with_bias_kernel<T>
            <<<grid, block, 0, stream>>>(static_cast<const T*>(y), static_cast<T*>(out), C, S, pb);
        return cudaGetLastError();
    });
}

cudaError_t pad3d(const void* x, void* xp, DType t, int64_t C, const int64_t in[3], const int pad_before[3],
                  const int pad_after[3], cudaStream_t stream) {
    const PadDims d = pad_dims(C, in, pad_before, pad_after);
    const int64_t total = C * d.out[0] * d.out[1] * d.out[2];
    if (total == 0) return cudaSuccess;
    constexpr int kThreads = 256;
    return dispatch_float(t, [&](auto xt) {
        using T = decltype(xt);
        pad3d_kernel<T><<<grid_for(total, kThreads), kThreads, 0, stream>>>(static_cast<const T*>(x), static_cast<T*>(xp), d);
        return cudaGetLastError();
    });
}

cudaError_t conv3d_direct(const Conv3dDirectArgs& args, cudaStream_t stream) {
    const int64_t total = args.Co * args.o[0] * args.o[1] * args.o[2];
    if (total == 0) return cudaSuccess;
    constexpr int kThreads = 128;
    return dispatch_float(args.dtype, [&](auto xt) {
        conv3d_direct_kernel<decltype(xt)><<<grid_for(total, kThreads), kThreads, 0, stream>>>(args);
        return cudaGetLastError();
    });
}

}  // namespace dzr::kernels
