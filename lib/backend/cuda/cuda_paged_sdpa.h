#pragma once
// Internals of the CUDA backend's paged attention without the gather (PagedAttentionImpl::CudnnPaged): cuDNN
// SDPA reading the history straight from the KV pool through the device block table, one plan per shape. The
// current rows are a second, dense cuDNN SDPA; the two parts are merged by their log-sum-exps
// (kernels/attention_merge.cuh). Internal to lib/backend/cuda (cuda_paged_sdpa.cpp).
#include <cudnn.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "backend/cuda/cuda_attention.h"

namespace dzr::cuda_detail {

/// One attention of lq query rows over `hist` history tokens of one pool layer, the block table in device
/// memory. The container is the layer's pool as cuDNN sees it: [num_blocks, H, block_size, D] with the pool's
/// strides (block, head, token, 1), so the pool is read where it lies.
struct PagedSdpaCall {
    DType dtype = DType::BF16;
    int64_t lq = 0, hist = 0, heads = 0, d = 0;
    const void* q = nullptr;
    void* out = nullptr;
    float* stats = nullptr;  // f32 [H, lq]: each row's log-sum-exp of the scaled logits
    int64_t q_tok = 0, q_head = 0, o_tok = 0, o_head = 0;
    const void* k_pool = nullptr;  // element 0 of block 0 of the layer
    const void* v_pool = nullptr;
    int64_t num_blocks = 0, block_size = 0, block_stride = 0, token_stride = 0, head_stride = 0;
    const int32_t* table = nullptr;  // device: the first `pages` entries are read
    int64_t pages = 0;               // ceil(hist / block_size)
    float scale = 1.0f;
};

/// Everything a paged plan depends on: dtype, sizes, strides, the graph kind.
using PagedSdpaKey = std::array<int64_t, 16>;
PagedSdpaKey paged_sdpa_key(const PagedSdpaCall& c, SdpaGraph g);

/// A finalized paged plan (or cuDNN's refusal in sdpa.error) and the device int32 sequence lengths its graph
/// reads (lq at seq_lens[0], hist at seq_lens[4]: 16-byte aligned each), written once when the plan is built:
/// a forward captured into a CUDA graph reads them at the same address on every replay.
struct PagedSdpaPlan {
    SdpaPlan sdpa;
    SdpaGraph graph = SdpaGraph::Unified;
    int32_t* seq_lens = nullptr;

    PagedSdpaPlan() = default;
    PagedSdpaPlan(const PagedSdpaPlan&) = delete;
    PagedSdpaPlan& operator=(const PagedSdpaPlan&) = delete;
    ~PagedSdpaPlan();
};

/// Builds the paged plan of `c`'s shape as graph `g` (Unified: the SDPA node's page tables, cuDNN >= 9.15;
/// Composite: paged cache loads in the matmul-softmax-matmul graph with a padding mask, cuDNN >= 9.5) and
/// writes its sequence lengths to device memory (synchronously: call it outside any capture). Never throws
/// for a refusal (ok = false with the stage); throws dzr::Error when the device allocation fails.
std::unique_ptr<PagedSdpaPlan> build_paged_sdpa_plan(cudnnHandle_t handle, const PagedSdpaCall& c,
                                                     SdpaGraph g);

/// Queues one execution of `plan` on the handle's stream; cuDNN's status.
cudnnStatus_t run_paged_sdpa_plan(cudnnHandle_t handle, const PagedSdpaPlan& plan, const PagedSdpaCall& c,
                                  void* workspace);

/// The backend's paged plans (refusals included, so a refused shape is not rebuilt).
struct PagedSdpaState {
    std::map<PagedSdpaKey, std::unique_ptr<PagedSdpaPlan>> plans;
};

}  // namespace dzr::cuda_detail
