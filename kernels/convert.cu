// Strided copies with dtype conversion, and fills.
#include "kernels/common.cuh"
#include "kernels/convert.cuh"

#include <type_traits>

namespace dzr::kernels {
namespace {

struct Layout {
    int rank;
    int64_t shape[kMaxCopyDims];
    int64_t stride[kMaxCopyDims];
};

template <typename Ts, typename Td>
__device__ __forceinline__ Td convert_one(Ts v) {
    if constexpr (std::is_same_v<Ts, Td>)
        return v;
    else
        return from_f32<Td>(to_f32(v));
}

// NOTE: Index is int32 when every element index and source offset fits, which makes the per-element
// divisions much cheaper than 64-bit ones.
template <typename Ts, typename Td, typename Index>
__global__ void strided_copy_kernel(const Ts* src, Layout lay, Td* dst, Index n) {
    const Index step = Index(gridDim.x) * Index(blockDim.x);
    for (Index i = Index(blockIdx.x) * Index(blockDim.x) + Index(threadIdx.x); i < n; i += step) {
        Index rest = i, off = 0;
        for (int d = lay.rank - 1; d >= 0; --d) {
            const Index extent = Index(lay.shape[d]);
            off += (rest % extent) * Index(lay.stride[d]);
            rest /= extent;
        }
        dst[i] = convert_one<Ts, Td>(src[off]);
    }
}

template <typename Ts, typename Td>
__global__ void contiguous_convert_kernel(const Ts* src, Td* dst, int64_t n) {
    const int64_t step = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step)
        dst[i] = convert_one<Ts, Td>(src[i]);
}

/// A copy whose source is contiguous along dim u but strided along the last dim (a transpose, e.g. a
/// permuted view): 32 x 32 tiles through shared memory so both the reads (along u) and the writes (along
/// the last dim) are coalesced. The remaining dims are flattened into `outer`.
struct TileDims {
    int rank;
    int u;
    int64_t shape[kMaxCopyDims];
    int64_t src_stride[kMaxCopyDims];
    int64_t dst_stride[kMaxCopyDims];
    int64_t outer;
};

constexpr int kTile = 32;
constexpr int kTileRows = 8;

template <typename Ts, typename Td>
__global__ void tiled_copy_kernel(const Ts* src, Td* dst, TileDims t) {
    __shared__ Td tile[kTile][kTile + 1];  // NOTE: +1 column avoids bank conflicts on the transposed read
    const int last = t.rank - 1;
    const int64_t U = t.shape[t.u], C = t.shape[last], c_stride = t.src_stride[last], u_dst = t.dst_stride[t.u];
    const int64_t u0 = int64_t(blockIdx.y) * kTile, c0 = int64_t(blockIdx.x) * kTile;
    const int tx = threadIdx.x, ty = threadIdx.y;
    for (int64_t o = blockIdx.z; o < t.outer; o += gridDim.z) {
        int64_t rest = o, src_off = 0, dst_off = 0;
        for (int d = last - 1; d >= 0; --d) {
            if (d == t.u) continue;
            const int64_t e = rest % t.shape[d];
            rest /= t.shape[d];
            src_off += e * t.src_stride[d];
            dst_off += e * t.dst_stride[d];
        }
        // tile[c][u] = src[u0 + tx, c0 + ty + k]: consecutive threads read consecutive u.
        for (int k = 0; k < kTile; k += kTileRows) {
            const int64_t u = u0 + tx, c = c0 + ty + k;
            if (u < U && c < C) tile[ty + k][tx] = convert_one<Ts, Td>(src[src_off + u + c * c_stride]);
        }
        __syncthreads();
        // dst[u0 + ty + k, c0 + tx]: consecutive threads write consecutive c.
        for (int k = 0; k < kTile; k += kTileRows) {
            const int64_t u = u0 + ty + k, c = c0 + tx;
            if (u < U && c < C) dst[dst_off + u * u_dst + c] = tile[tx][ty + k];
        }
        __syncthreads();
    }
}

template <typename T>
__global__ void fill_kernel(T* dst, int64_t n, T value) {
    const int64_t step = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) dst[i] = value;
}

// Drops extent-1 dims and merges dims that are contiguous with respect to each other.
Layout collapse(const StridedLayout& in) {
    Layout out{};
    out.rank = 0;
    for (int d = 0; d < in.rank; ++d) {
        if (in.shape[d] == 1) continue;
        if (out.rank > 0 && out.stride[out.rank - 1] == in.shape[d] * in.stride[d]) {
            out.shape[out.rank - 1] *= in.shape[d];
            out.stride[out.rank - 1] = in.stride[d];
        } else {
            out.shape[out.rank] = in.shape[d];
            out.stride[out.rank] = in.stride[d];
            ++out.rank;
        }
    }
    if (out.rank == 0) {
        out.rank = 1;
        out.shape[0] = 1;
        out.stride[0] = 1;
    }
    return out;
}

template <typename F>
cudaError_t dispatch_convertible(DType t, F&& f) {
    switch (t) {
        case DType::F32:
            return f(float{});
        case DType::BF16:
            return f(bf16{});
        case DType::F16:
            return f(__half{});
        default:
            return cudaErrorNotSupported;
    }
}

// Same-dtype copies move raw elements of the dtype's size.
template <typename F>
cudaError_t dispatch_raw(DType t, F&& f) {
    switch (dtype_size(t)) {
        case 1:
            return f(uint8_t{});
        case 2:
            return f(uint16_t{});
        case 4:
            return f(uint32_t{});
        case 8:
            return f(uint64_t{});
        default:
            return cudaErrorNotSupported;
    }
}

bool convertible(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

template <typename Ts, typename Td>
cudaError_t launch_copy(const void* src, const Layout& lay, void* dst, int64_t n, cudaStream_t stream) {
    constexpr int kThreads = 256;
    const auto* ps = static_cast<const Ts*>(src);
    auto* pd = static_cast<Td*>(dst);
    if (lay.rank == 1 && lay.stride[0] == 1) {
        contiguous_convert_kernel<Ts, Td><<<grid_for(n, kThreads), kThreads, 0, stream>>>(ps, pd, n);
        return cudaGetLastError();
    }
    // A source contiguous along some inner dim but not the last one: tiled transpose.
    const int last = lay.rank - 1;
    int u = -1;
    for (int d = 0; d < last; ++d)
        if (lay.stride[d] == 1) u = d;
    if (u >= 0 && lay.stride[last] != 1 && lay.shape[u] >= kTile / 2 && lay.shape[last] >= kTile / 2 &&
        (lay.shape[u] + kTile - 1) / kTile <= 65535) {
        TileDims t{};
        t.rank = lay.rank;
        t.u = u;
        t.outer = 1;
        int64_t acc = 1;
        for (int d = last; d >= 0; --d) {
            t.shape[d] = lay.shape[d];
            t.src_stride[d] = lay.stride[d];
            t.dst_stride[d] = acc;  // dst is contiguous
            acc *= lay.shape[d];
            if (d != u && d != last) t.outer *= lay.shape[d];
        }
        const dim3 block(kTile, kTileRows);
        const dim3 grid(unsigned((lay.shape[last] + kTile - 1) / kTile), unsigned((lay.shape[u] + kTile - 1) / kTile),
                        unsigned(t.outer < 65535 ? t.outer : 65535));
        tiled_copy_kernel<Ts, Td><<<grid, block, 0, stream>>>(ps, pd, t);
        return cudaGetLastError();
    }
    int64_t max_off = 0;
    for (int d = 0; d < lay.rank; ++d) max_off += (lay.shape[d] - 1) * lay.stride[d];
    bool small = n < (int64_t(1) << 31) && max_off < (int64_t(1) << 31);
    for (int d = 0; d < lay.rank; ++d) small = small && lay.stride[d] >= 0;
    if (small)
        strided_copy_kernel<Ts, Td, int32_t><<<grid_for(n, kThreads), kThreads, 0, stream>>>(ps, lay, pd, int32_t(n));
    else
        strided_copy_kernel<Ts, Td, int64_t><<<grid_for(n, kThreads), kThreads, 0, stream>>>(ps, lay, pd, n);
    return cudaGetLastError();
}

}  // namespace

bool convert_supported(DType src, DType dst) {
    return (src == dst && dtype_size(src) <= 8) || (convertible(src) && convertible(dst));
}

cudaError_t convert_copy(const void* src, DType ts, const StridedLayout& layout, void* dst, DType td,
                         cudaStream_t stream) {
    int64_t n = 1;
    for (int d = 0; d < layout.rank; ++d) n *= layout.shape[d];
    if (n == 0) return cudaSuccess;
    const Layout lay = collapse(layout);
    if (ts == td) {
        if (lay.rank == 1 && lay.stride[0] == 1)
            return cudaMemcpyAsync(dst, src, size_t(n) * dtype_size(ts), cudaMemcpyDeviceToDevice, stream);
        return dispatch_raw(ts, [&](auto raw) {
            using T = decltype(raw);
            return launch_copy<T, T>(src, lay, dst, n, stream);
        });
    }
    return dispatch_convertible(ts, [&](auto xs) {
        return dispatch_convertible(td, [&](auto xd) {
            return launch_copy<decltype(xs), decltype(xd)>(src, lay, dst, n, stream);
        });
    });
}

bool fill_supported(DType t) { return convertible(t) || t == DType::I32; }

cudaError_t fill(void* dst, DType t, int64_t n, float value, cudaStream_t stream) {
    if (n == 0) return cudaSuccess;
    constexpr int kThreads = 256;
    const unsigned grid = grid_for(n, kThreads);
    switch (t) {
        case DType::F32:
            fill_kernel<float><<<grid, kThreads, 0, stream>>>(static_cast<float*>(dst), n, value);
            break;
        case DType::BF16:
            fill_kernel<bf16><<<grid, kThreads, 0, stream>>>(static_cast<bf16*>(dst), n, __float2bfloat16_rn(value));
            break;
        case DType::F16:
            fill_kernel<__half><<<grid, kThreads, 0, stream>>>(static_cast<__half*>(dst), n, __float2half_rn(value));
            break;
        case DType::I32:
            fill_kernel<int32_t><<<grid, kThreads, 0, stream>>>(static_cast<int32_t*>(dst), n, int32_t(value));
            break;
        default:
            return cudaErrorNotSupported;
    }
    return cudaGetLastError();
}

}  // namespace dzr::kernels
