// Scatter of current K/V rows into pool slots and gather of [block-table history | current] rows. Pure
// data movement: each thread moves one unit (16 bytes when every address and stride allows, else one
// element) of one (row, head) segment of K and the same unit of V.
#include "kernels/common.cuh"
#include "kernels/kv_scatter.cuh"

namespace dzr::kernels {
namespace {

template <typename U>
__global__ void scatter_kernel(KvRows rows, KvPoolLayer pool, const int64_t* slots, int64_t n,
                               int64_t num_slots, int heads, int units, int64_t row_tok, int64_t row_head,
                               int64_t pool_tok, int64_t pool_head) {
    // strides arrive in units of U
    const int64_t per_row = int64_t(heads) * units, total = n * per_row;
    const int64_t step = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
        const int64_t r = i / per_row, rem = i % per_row, h = rem / units, u = rem % units;
        const int64_t slot = slots[r];
        if (slot < 0 || slot >= num_slots) continue;
        const int64_t src = r * row_tok + h * row_head + u, dst = slot * pool_tok + h * pool_head + u;
        static_cast<U*>(pool.k)[dst] = static_cast<const U*>(rows.k)[src];
        static_cast<U*>(pool.v)[dst] = static_cast<const U*>(rows.v)[src];
    }
}

template <typename U>
__global__ void gather_kernel(KvPoolLayer pool, const int32_t* table, int64_t hist, KvRows cur,
                              int64_t cur_len, U* out_k, U* out_v, int heads, int units, int64_t pool_tok,
                              int64_t pool_head, int64_t cur_tok, int64_t cur_head) {
    const int64_t per_row = int64_t(heads) * units, total = (hist + cur_len) * per_row;
    const int64_t step = int64_t(gridDim.x) * blockDim.x;
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) {
        const int64_t t = i / per_row, rem = i % per_row, h = rem / units, u = rem % units;
        U k, v;
        if (t < hist) {
            const int64_t slot = int64_t(table[t / pool.block_size]) * pool.block_size + t % pool.block_size;
            const int64_t src = slot * pool_tok + h * pool_head + u;
            k = static_cast<const U*>(pool.k)[src];
            v = static_cast<const U*>(pool.v)[src];
        } else {
            const int64_t src = (t - hist) * cur_tok + h * cur_head + u;
            k = static_cast<const U*>(cur.k)[src];
            v = static_cast<const U*>(cur.v)[src];
        }
        out_k[i] = k;  // contiguous [rows, heads, units]
        out_v[i] = v;
    }
}

bool divides(int64_t elems, size_t esize, size_t unit) {
    return (size_t(elems) * esize) % unit == 0;
}

/// Picks the widest unit every address and stride allows, then calls f(U{}) with it.
template <typename F>
cudaError_t with_unit(DType dtype, int head_dim, std::initializer_list<const void*> ptrs,
                      std::initializer_list<int64_t> strides, F&& f) {
    const size_t es = dtype_size(dtype);
    if (dtype != DType::F32 && dtype != DType::BF16 && dtype != DType::F16) return cudaErrorNotSupported;
    bool vec = divides(head_dim, es, 16);
    for (const void* p : ptrs) vec = vec && aligned16(p);
    for (int64_t s : strides) vec = vec && divides(s, es, 16);
    if (vec) return f(uint4{}, int(size_t(head_dim) * es / 16));
    if (es == 4) return f(uint32_t{}, head_dim);
    return f(uint16_t{}, head_dim);
}

constexpr int kThreads = 256;

}  // namespace

cudaError_t scatter_kv(const KvRows& rows, const KvPoolLayer& pool, const int64_t* slots, int64_t n,
                       int64_t num_slots, int heads, int head_dim, DType dtype, cudaStream_t stream) {
    if (n <= 0 || heads <= 0 || head_dim <= 0) return cudaSuccess;
    const size_t es = dtype_size(dtype);
    return with_unit(dtype, head_dim, {rows.k, rows.v, pool.k, pool.v},
                     {rows.token_stride, rows.head_stride, pool.token_stride, pool.head_stride},
                     [&](auto unit, int units) {
                         using U = decltype(unit);
                         const int64_t per = int64_t(sizeof(U) / es);  // elements per unit
                         scatter_kernel<U><<<grid_for(n * heads * units, kThreads), kThreads, 0, stream>>>(
                             rows, pool, slots, n, num_slots, heads, units, rows.token_stride / per,
                             rows.head_stride / per, pool.token_stride / per, pool.head_stride / per);
                         return cudaGetLastError();
                     });
}

cudaError_t gather_kv(const KvPoolLayer& pool, const int32_t* table, int64_t hist, const KvRows& cur,
                      int64_t cur_len, void* out_k, void* out_v, int heads, int head_dim, DType dtype,
                      cudaStream_t stream) {
    const int64_t rows = hist + cur_len;
    if (rows <= 0 || heads <= 0 || head_dim <= 0) return cudaSuccess;
    const size_t es = dtype_size(dtype);
    return with_unit(dtype, head_dim, {pool.k, pool.v, cur.k, cur.v, out_k, out_v},
                     {pool.token_stride, pool.head_stride, cur.token_stride, cur.head_stride},
                     [&](auto unit, int units) {
                         using U = decltype(unit);
                         const int64_t per = int64_t(sizeof(U) / es);
                         gather_kernel<U><<<grid_for(rows * heads * units, kThreads), kThreads, 0, stream>>>(
                             pool, table, hist, cur, cur_len, static_cast<U*>(out_k), static_cast<U*>(out_v),
                             heads, units, pool.token_stride / per, pool.head_stride / per,
                             cur.token_stride / per, cur.head_stride / per);
                         return cudaGetLastError();
                     });
}

}  // namespace dzr::kernels
