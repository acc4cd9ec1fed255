#pragma once
/// Plain views of KV memory for attention kernels: PagedKvView (history reached through a block table)
/// and ContiguousKvView (rows one after another: the scratch, a dense history). Both are trivially
/// copyable standard-layout structs with no std:: containers, so they can be passed by value to a CUDA
/// kernel later, and they share one accessor set (num_tokens, k, v), so attention is written once as a
/// template over the view type.
///
/// Element offsets, all in elements of `dtype`:
///   paged:      layer * layer_stride + block_table[t / block_size] * block_stride + (t % block_size) * token_stride
///               + head * head_stride
///   contiguous: layer * layer_stride + t * token_stride + head * head_stride
///
/// An FP8 pool (dtype F8_E4M3, kv.dtype: fp8) has one f32 scale per token and head (core/fp8.h's row quantization
/// of that head's head_dim values): k_scale / v_scale are laid out as the pool without its head_dim axis, so the
/// scale of the row at element offset o is k_scale[o / head_dim] (head_stride == head_dim).
#include <cstdint>
#include <type_traits>

#include "core/dtype.h"

namespace dzr {

/// A KV block id (kv::BlockPool hands them out); block 0 is the null block that pads block tables.
using BlockId = int32_t;
inline constexpr BlockId kNullBlockId = 0;
/// A slot (block_id * block_size + offset) that scatter_kv skips: the padding rows of a slot mapping.
inline constexpr int64_t kPadSlot = -1;

struct PagedKvView {
    void* k_base;                  // element 0 of block 0 of layer 0 (pool K)
    void* v_base;                  // same for V
    DType dtype;
    int32_t num_heads;
    int32_t head_dim;
    int32_t block_size;            // tokens per block
    int64_t layer_stride;          // elements between layers
    int64_t block_stride;          // elements between blocks (= block_size * token_stride)
    int64_t token_stride;          // elements between tokens (= num_heads * head_stride)
    int64_t head_stride;           // elements between heads (= head_dim)
    const BlockId* block_table;    // [table_width] visible history blocks, padded with kNullBlockId
    int32_t table_width;           // padded width (constant for a session)
    int32_t num_table_blocks;      // real entries: ceil(seq_len / block_size)
    int64_t seq_len;               // visible history tokens
    void* k_scale = nullptr;       // FP8 pool: f32 scales of K (see above); null otherwise
    void* v_scale = nullptr;
    /// In place (KvGeometry::lanes, BlockTable::in_place): the seq_len history rows and the open forward's current
    /// rows lie one after the other from slot in_place_slot on (in the order attention needs none of), current row i at
    /// slot in_place_current + i, which the forward may write; -1 otherwise.
    int64_t in_place_slot = -1;
    int64_t in_place_current = -1;
    /// Current rows already at their in-place slots (a committing forward's scattered video rows).
    int64_t in_place_stored = 0;

    int64_t num_tokens() const { return seq_len; }
    bool fp8() const { return dtype == DType::F8_E4M3; }
    int64_t offset(int layer, int64_t token, int head) const {
        const int64_t block = block_table[token / block_size];
        return layer * layer_stride + block * block_stride + (token % block_size) * token_stride + head * head_stride;
    }
    /// Offset of a pool slot (block_id * block_size + offset), independent of the block table: scatter target.
    int64_t slot_offset(int layer, int64_t slot, int head) const {
        return layer * layer_stride + slot * token_stride + head * head_stride;
    }
    template <typename T>
    T* k(int layer, int64_t token, int head) const {
        return static_cast<T*>(k_base) + offset(layer, token, head);
    }
    template <typename T>
    T* v(int layer, int64_t token, int head) const {
        return static_cast<T*>(v_base) + offset(layer, token, head);
    }
    /// FP8 pool: the scale of the row at (layer, token, head) / of pool slot `slot`.
    float* k_scale_at(int layer, int64_t token, int head) const {
        return static_cast<float*>(k_scale) + offset(layer, token, head) / head_dim;
    }
    float* v_scale_at(int layer, int64_t token, int head) const {
        return static_cast<float*>(v_scale) + offset(layer, token, head) / head_dim;
    }
    int64_t slot_scale_offset(int layer, int64_t slot, int head) const { return slot_offset(layer, slot, head) / head_dim; }
};

struct ContiguousKvView {
    void* k_base;                  // element 0 of token 0 of layer 0
    void* v_base;
    DType dtype;
    int32_t num_heads;
    int32_t head_dim;
    int64_t layer_stride;          // 0 when the view holds one layer reused by every layer (scratch)
    int64_t token_stride;
    int64_t head_stride;
    int64_t length;                // tokens

    int64_t num_tokens() const { return length; }
    int64_t offset(int layer, int64_t token, int head) const {
        return layer * layer_stride + token * token_stride + head * head_stride;
    }
    template <typename T>
    T* k(int layer, int64_t token, int head) const {
        return static_cast<T*>(k_base) + offset(layer, token, head);
    }
    template <typename T>
    T* v(int layer, int64_t token, int head) const {
        return static_cast<T*>(v_base) + offset(layer, token, head);
    }
};

static_assert(std::is_trivially_copyable_v<PagedKvView> && std::is_standard_layout_v<PagedKvView>);
static_assert(std::is_trivially_copyable_v<ContiguousKvView> && std::is_standard_layout_v<ContiguousKvView>);

}  // namespace dzr
