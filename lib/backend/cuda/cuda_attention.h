#pragma once
// Internals of the CUDA backend's fused attention: cuDNN SDPA execution plans built through the backend
// (descriptor) API, one per shape key, and the description of one dense attention call that the cuDNN
// graphs, dzr's flash kernel and the GEMM path all take.
#include <cudnn.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"

namespace dzr::cuda_detail {

/// One dense non-causal attention on the device: q [lq, H, D], k/v [lk, H, D(v)], out [lq, H, Dv], each
/// with unit last stride and (token, head) strides in elements.
struct AttentionCall {
    DType dtype = DType::BF16;
    int64_t lq = 0, lk = 0, heads = 0, d = 0, dv = 0;
    const void* q = nullptr;
    const void* k = nullptr;
    const void* v = nullptr;
    void* out = nullptr;
    int64_t q_tok = 0, q_head = 0, k_tok = 0, k_head = 0, v_tok = 0, v_head = 0, o_tok = 0, o_head = 0;
    /// Independent attentions of one shape in one call (cuDNN only: the CFG branches' self-attention): element
    /// strides between them; 0 with batch 1.
    int64_t batch = 1, q_batch = 0, k_batch = 0, v_batch = 0, o_batch = 0;
    float scale = 1.0f;
    /// Optional f32 [batch, H, lq] output: each row's log-sum-exp of the scaled logits (M + log Z, natural log), which
    /// merges this attention with another over other keys (the paged split in cuda_paged_sdpa.cpp).
    float* stats = nullptr;
};

/// The cuDNN operation graph an SDPA plan was built from.
enum class SdpaGraph : uint8_t {
    Unified,    // CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR (cuDNN >= 9.13.1)
    Composite,  // matmul, scale, softmax as max/sub/exp/sum/div with the log-sum-exp stats branch, matmul
};
const char* sdpa_graph_name(SdpaGraph g);

/// A finalized cuDNN execution plan, or the reason cuDNN refused the graph (ok = false).
struct SdpaPlan {
    bool ok = false;
    std::string error;                           // which stage failed and cuDNN's message
    int64_t workspace = 0;                       // bytes the plan needs per execution
    std::string engine;                          // "engine <global index>" of the chosen config
    std::vector<cudnnBackendDescriptor_t> keep;  // every descriptor, destroyed with the plan (plan last)
    cudnnBackendDescriptor_t plan = nullptr;

    SdpaPlan() = default;
    SdpaPlan(const SdpaPlan&) = delete;
    SdpaPlan& operator=(const SdpaPlan&) = delete;
    ~SdpaPlan();
};

/// Everything a plan depends on (dtype, sizes, strides, graph kind); pointers must be 16-byte aligned.
using SdpaKey = std::array<int64_t, 21>;
SdpaKey sdpa_key(const AttentionCall& c, SdpaGraph g);

/// Builds the plan for `c`'s shape; never throws (a refusal comes back as ok = false with the stage).
std::unique_ptr<SdpaPlan> build_sdpa_plan(cudnnHandle_t handle, const AttentionCall& c, SdpaGraph g);

/// Queues one execution of `plan` on the handle's stream with `workspace` (plan.workspace bytes).
void run_sdpa_plan(cudnnHandle_t handle, const SdpaPlan& plan, const AttentionCall& c, void* workspace);
/// run_sdpa_plan that returns cuDNN's status instead of throwing.
cudnnStatus_t try_run_sdpa_plan(cudnnHandle_t handle, const SdpaPlan& plan, const AttentionCall& c,
                                void* workspace);

class SdpaBuilder;
/// The operation graph of `ops` (made with `b`, whose descriptors `plan.keep` holds) and the first engine config
/// that finalizes (heuristics mode A, then the fallback list) into `plan`; throws CudnnFailure
/// (cuda_sdpa_builder.h) with the stage that refused.
void finalize_sdpa_plan(cudnnHandle_t handle, SdpaBuilder& b, const std::vector<cudnnBackendDescriptor_t>& ops,
                        SdpaPlan& plan);
/// Queues one execution of `plan` with `n` tensors (unique ids and pointers; by-value tensors point at host
/// values) and `workspace`; cuDNN's status.
cudnnStatus_t execute_sdpa_plan(cudnnHandle_t handle, const SdpaPlan& plan, int64_t n, const int64_t* uids,
                                void* const* ptrs, void* workspace);

}  // namespace dzr::cuda_detail
