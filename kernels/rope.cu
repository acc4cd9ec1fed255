// Rotary embedding on interleaved pairs. Each thread rotates kPairs consecutive pairs of one head.
#include <type_traits>

#include "kernels/common.cuh"
#include "kernels/rope.cuh"

namespace dzr::kernels {
namespace {

// kDouble: the table holds (cos_hi, cos_lo, sin_hi, sin_lo) and the rotation runs in double, rounded to f32
// before the output dtype (the reference rotates in complex128 and casts through float).
template <typename Tx, typename To, int kPairs, bool kDouble>
__global__ void rope_kernel(const Tx* x, int64_t x_sl, int64_t x_sh, To* out, int64_t o_sl, int64_t o_sh, int64_t L,
                            int64_t H, int64_t half, const float* table, int64_t P) {
    constexpr int kEntry = kDouble ? 4 : 2;
    const int64_t groups = half / kPairs, total = L * H * groups, step = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
        const int64_t j0 = (i % groups) * kPairs, lh = i / groups, h = lh % H, l = lh / H;
        const Tx* px = x + l * x_sl + h * x_sh + 2 * j0;
        To* po = out + l * o_sl + h * o_sh + 2 * j0;
        float v[2 * kPairs];
        if constexpr (kPairs == 4) {
            Vec8<Tx>::load(px, v);
        } else {
            v[0] = to_f32(px[0]);
            v[1] = to_f32(px[1]);
        }
        // NOTE: the host picks kPairs = 4 only when P % 4 == 0, so a group is wholly rotated or wholly
        // copied.
        if (j0 < P) {
            const float* cs = table + (l * P + j0) * kEntry;
#pragma unroll
            for (int k = 0; k < kPairs; ++k) {
                const float* e = cs + kEntry * k;
                if constexpr (kDouble) {
                    const double c = double(e[0]) + double(e[1]), s = double(e[2]) + double(e[3]);
                    const double x0 = v[2 * k], x1 = v[2 * k + 1];
                    v[2 * k] = float(x0 * c - x1 * s);
                    v[2 * k + 1] = float(x0 * s + x1 * c);
                } else {
                    const float c = e[0], s = e[1], x0 = v[2 * k], x1 = v[2 * k + 1];
                    v[2 * k] = x0 * c - x1 * s;
                    v[2 * k + 1] = x0 * s + x1 * c;
                }
            }
        }
        if constexpr (kPairs == 4) {
            Vec8<To>::store(po, v);
        } else {
            po[0] = from_f32<To>(v[0]);
            po[1] = from_f32<To>(v[1]);
        }
    }
}

}  // namespace

cudaError_t rope(const void* x, DType tx, int64_t x_sl, int64_t x_sh, void* out, DType to, int64_t o_sl,
                 int64_t o_sh, int64_t L, int64_t H, int64_t D, const float* table, int64_t P, bool double_table,
                 cudaStream_t stream) {
    const int64_t half = D / 2;
    if (L * H * half == 0) return cudaSuccess;
    const auto esize = [](DType t) { return int64_t(dtype_size(t)); };
    // 16-byte accesses need every group start aligned: base pointers and row strides in bytes.
    const bool vec = half % 4 == 0 && P % 4 == 0 && aligned16(x) && aligned16(out) && (x_sl * esize(tx)) % 16 == 0 &&
                     (x_sh * esize(tx)) % 16 == 0 && (o_sl * esize(to)) % 16 == 0 && (o_sh * esize(to)) % 16 == 0;
    constexpr int kThreads = 256;
    return dispatch_float2(tx, to, [&](auto xi, auto xo) {
        using Tx = decltype(xi);
        using To = decltype(xo);
        const auto* px = static_cast<const Tx*>(x);
        auto* po = static_cast<To*>(out);
        const auto launch = [&](auto dbl) {
            constexpr bool kDouble = decltype(dbl)::value;
            if (vec)
                rope_kernel<Tx, To, 4, kDouble><<<grid_for(L * H * half / 4, kThreads), kThreads, 0, stream>>>(
                    px, x_sl, x_sh, po, o_sl, o_sh, L, H, half, table, P);
            else
                rope_kernel<Tx, To, 1, kDouble><<<grid_for(L * H * half, kThreads), kThreads, 0, stream>>>(
                    px, x_sl, x_sh, po, o_sl, o_sh, L, H, half, table, P);
        };
        if (double_table) launch(std::true_type{});
        else launch(std::false_type{});
        return cudaGetLastError();
    });
}

}  // namespace dzr::kernels
