// Strided same-dtype copies on the host: the layout changes the models make (channels-first <->
// channels-last, head splits, stride-0 upsampling views) as row copies, blocked transposes or plain
// loops over the two innermost dims, after merging the dims that are contiguous with each other.
#include <algorithm>
#include <array>
#include <cstring>

#include "backend/cpu/cpu_kernels.h"
#include "core/dtype.h"

namespace dzr::cpu {
namespace {

struct Layout {
    std::array<int64_t, kMaxDims> shape{};
    std::array<int64_t, kMaxDims> stride{};
    int rank = 0;
};

/// Drops size-1 dims and merges neighbours where the outer one steps exactly over the inner one.
Layout collapse(const TensorView& v) {
    Layout l;
    for (int d = 0; d < v.rank(); ++d) {
        if (v.shape[d] == 1) continue;
        if (l.rank > 0 && l.stride[size_t(l.rank - 1)] == v.strides[d] * v.shape[d]) {
            l.shape[size_t(l.rank - 1)] *= v.shape[d];
            l.stride[size_t(l.rank - 1)] = v.strides[d];
            continue;
        }
        l.shape[size_t(l.rank)] = v.shape[d];
        l.stride[size_t(l.rank)] = v.strides[d];
        ++l.rank;
    }
    return l;
}

constexpr int64_t kTile = 32;

/// dst [n1, n0] (contiguous) = src[i1 * s1 + i0 * s0].
template <typename E>
void copy_2d(const E* src, int64_t n1, int64_t s1, int64_t n0, int64_t s0, E* dst) {
    if (s0 == 1) {
        for (int64_t i1 = 0; i1 < n1; ++i1) std::memcpy(dst + i1 * n0, src + i1 * s1, size_t(n0) * sizeof(E));
        return;
    }
    if (s1 == 1) {
        // a transpose: tiles keep both the strided reads and the writes in cache
        for (int64_t b1 = 0; b1 < n1; b1 += kTile) {
            const int64_t e1 = std::min(n1, b1 + kTile);
            for (int64_t b0 = 0; b0 < n0; b0 += kTile) {
                const int64_t e0 = std::min(n0, b0 + kTile);
                for (int64_t i1 = b1; i1 < e1; ++i1)
                    for (int64_t i0 = b0; i0 < e0; ++i0) dst[i1 * n0 + i0] = src[i1 + i0 * s0];
            }
        }
        return;
    }
    for (int64_t i1 = 0; i1 < n1; ++i1)
        for (int64_t i0 = 0; i0 < n0; ++i0) dst[i1 * n0 + i0] = src[i1 * s1 + i0 * s0];
}

template <typename E>
void copy_layout(const E* src, const Layout& l, E* dst) {
    if (l.rank == 0) {
        *dst = *src;
        return;
    }
    if (l.rank == 1) {
        copy_2d(src, 1, 0, l.shape[0], l.stride[0], dst);
        return;
    }
    const int outer_rank = l.rank - 2;
    const int64_t n1 = l.shape[size_t(l.rank - 2)], s1 = l.stride[size_t(l.rank - 2)];
    const int64_t n0 = l.shape[size_t(l.rank - 1)], s0 = l.stride[size_t(l.rank - 1)];
    int64_t outer = 1;
    for (int d = 0; d < outer_rank; ++d) outer *= l.shape[size_t(d)];
    std::array<int64_t, kMaxDims> idx{};
    int64_t off = 0;
    for (int64_t o = 0; o < outer; ++o) {
        copy_2d(src + off, n1, s1, n0, s0, dst + o * n1 * n0);
        for (int d = outer_rank - 1; d >= 0; --d) {
            off += l.stride[size_t(d)];
            if (++idx[size_t(d)] < l.shape[size_t(d)]) break;
            off -= l.stride[size_t(d)] * l.shape[size_t(d)];
            idx[size_t(d)] = 0;
        }
    }
}

template <typename E>
void copy_typed(const TensorView& src, const TensorView& dst) {
    copy_layout(static_cast<const E*>(src.data), collapse(src), static_cast<E*>(dst.data));
}

}  // namespace

bool copy_same_dtype(const TensorView& src, const TensorView& dst) {
    if (src.dtype != dst.dtype) return false;
    if (src.numel() == 0) return true;
    if (src.is_contiguous()) {
        if (src.data != dst.data) std::memmove(dst.data, src.data, src.nbytes());
        return true;
    }
    switch (dtype_size(src.dtype)) {
        case 1:
            copy_typed<uint8_t>(src, dst);
            return true;
        case 2:
            copy_typed<uint16_t>(src, dst);
            return true;
        case 4:
            copy_typed<uint32_t>(src, dst);
            return true;
        case 8:
            copy_typed<uint64_t>(src, dst);
            return true;
        default:
            return false;
    }
}

}  // namespace dzr::cpu
