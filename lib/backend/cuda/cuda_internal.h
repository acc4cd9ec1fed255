#pragma once
// Internals shared by the CUDA backend's translation units: the device guard, operand checks, the
// GEMM call description and the cached cuBLASLt / cuDNN plans.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdint>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "kernels/dit_fused.cuh"
#include "kernels/gemm_fallback.cuh"

namespace dzr::cuda_detail {

/// Makes `index` the current device for the guard's lifetime (restores the previous one).
class DeviceGuard {
public:
    explicit DeviceGuard(int index) {
        DZR_CUDA_CHECK(cudaGetDevice(&prev_));
        if (prev_ != index) DZR_CUDA_CHECK(cudaSetDevice(index));
        changed_ = prev_ != index;
    }
    ~DeviceGuard() {
        if (changed_) cudaSetDevice(prev_);
    }
    DeviceGuard(const DeviceGuard&) = delete;
    DeviceGuard& operator=(const DeviceGuard&) = delete;

private:
    int prev_ = 0;
    bool changed_ = false;
};

inline bool is_float_act(DType t) { return t == DType::F32 || t == DType::BF16; }

/// The row kernels the options choose (kernels/dit_fused.cuh).
inline kernels::RowImpl row_impl(const CudaBackendOptions& o) {
    switch (o.row_kernels) {
        case RowKernels::Warp:
            return kernels::RowImpl::Warp;
        case RowKernels::Stream8:
            return kernels::RowImpl::Stream8;
        default:
            return kernels::RowImpl::Stream;
    }
}

/// A [C, T, H, W] view of a contiguous [T, H, W, C] buffer (conv3d's channels-last input).
inline bool is_channels_last_volume(const TensorView& x) {
    if (x.rank() != 4) return false;
    const int64_t C = x.dim(0), H = x.dim(2), W = x.dim(3);
    return x.strides[0] == 1 && x.strides[3] == C && x.strides[2] == W * C && x.strides[1] == H * W * C;
}

/// Largest power of two (<= 256) that divides the address.
inline int64_t pointer_alignment(const void* p) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    int64_t align = 256;
    while (align > 1 && (a % uintptr_t(align)) != 0) align /= 2;
    return align;
}


/// A cuBLASLt matmul set up for one GemmKey. has_algo = false: cuBLASLt offered nothing, the plain
/// kernel runs instead. bias_in_epilogue = false: the bias dtype differs from the output's, so a
/// separate kernel adds it.
struct GemmPlan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t layout_a = nullptr, layout_b = nullptr, layout_c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool has_algo = false;
    bool bias_in_epilogue = false;

    GemmPlan() = default;
    GemmPlan(const GemmPlan&) = delete;
    GemmPlan& operator=(const GemmPlan&) = delete;
    ~GemmPlan() {
        if (layout_a) cublasLtMatrixLayoutDestroy(layout_a);
        if (layout_b) cublasLtMatrixLayoutDestroy(layout_b);
        if (layout_c) cublasLtMatrixLayoutDestroy(layout_c);
        if (desc) cublasLtMatmulDescDestroy(desc);
    }
};

/// cuDNN descriptors and the chosen algorithm for one conv3d shape. has_algo = false: the direct
/// kernel runs instead.
struct ConvPlan {
    // the legacy API's descriptors and algorithm (used when `graph` is null)
    cudnnTensorDescriptor_t x = nullptr, y = nullptr;
    cudnnFilterDescriptor_t w = nullptr;
    cudnnConvolutionDescriptor_t conv = nullptr;
    cudnnConvolutionFwdAlgo_t algo{};
    // the graph API's execution plan, chosen as PyTorch's cuDNN convolution chooses (cuda_conv.cpp)
    cudnnBackendDescriptor_t graph = nullptr;
    std::vector<cudnnBackendDescriptor_t> keep;  // the graph's descriptors, destroyed after the plan
    std::string engine;                          // which config was taken (logs)
    size_t workspace_bytes = 0;
    bool has_algo = false;

    ConvPlan() = default;
    ConvPlan(const ConvPlan&) = delete;
    ConvPlan& operator=(const ConvPlan&) = delete;
    ~ConvPlan() {
        if (x) cudnnDestroyTensorDescriptor(x);
        if (y) cudnnDestroyTensorDescriptor(y);
        if (w) cudnnDestroyFilterDescriptor(w);
        if (conv) cudnnDestroyConvolutionDescriptor(conv);
        if (graph) cudnnBackendDestroyDescriptor(graph);
        for (auto it = keep.rbegin(); it != keep.rend(); ++it) cudnnBackendDestroyDescriptor(*it);
    }
};

/// One engine config of fast numerics' channels-last convolution (cuda_conv_fast.cpp), finalized.
struct FastConvCandidate {
    cudnnBackendDescriptor_t plan = nullptr;  // the execution plan, owned by the FastConvPlan
    size_t workspace_bytes = 0;
    std::string engine;  // "engine 12 (heuristics B, config 3)" (logs, the report)
    float ms = -1.f;     // the tuner's time (layout kernels + convolution); < 0: not timed or failed
};

/// Fast numerics' plan of one conv3d call shape: the convolution run channels-last (the input transposed and
/// zero-padded into the workspace, a channels-last weight, the output transposed back with the bias) by the
/// fastest engine config measured on the first call, or the reference path (conv3d_planned) when that measured
/// faster or nothing could be timed.
struct FastConvPlan {
    std::string key;
    // cuDNN's view of the channels-last operands: nd = 4 (frames as the batch: kt = 1, temporal stride 1) or 5;
    // dims [N, C, spatial...], all padding materialized (cuDNN pads nothing)
    int nd = 5;
    int64_t x_dims[5] = {}, w_dims[5] = {}, y_dims[5] = {};
    int stride[3] = {1, 1, 1};
    size_t x_bytes = 0, w_bytes = 0, y_bytes = 0;  // the channels-last buffers (x_bytes 0: x is read in place)
    bool x_channels_last = false;                   // the call's x is channels-last already
    bool out_channels_last = false;                 // the call's out is channels-last: cuDNN writes it (y_bytes 0)
    int pad[3] = {};                                // what cuDNN pads (symmetric; with x read in place only)
    size_t declared_bytes = 0;                     // what conv3d_workspace_bytes declares for this path
    std::vector<cudnnBackendDescriptor_t> keep;    // the graph's descriptors
    std::vector<FastConvCandidate> candidates;
    bool tuned = false;
    int chosen = -1;  // a candidate, or -1: the reference path
    float reference_ms = -1.f;
    double tune_ms = 0;  // host time of the tuning (warm-up cost)
    std::string note;    // why the reference path runs, when it is not by measurement

    FastConvPlan() = default;
    FastConvPlan(const FastConvPlan&) = delete;
    FastConvPlan& operator=(const FastConvPlan&) = delete;
    ~FastConvPlan() {
        for (auto& c : candidates)
            if (c.plan) cudnnBackendDestroyDescriptor(c.plan);
        for (auto it = keep.rbegin(); it != keep.rend(); ++it) cudnnBackendDestroyDescriptor(*it);
    }
};

}  // namespace dzr::cuda_detail
