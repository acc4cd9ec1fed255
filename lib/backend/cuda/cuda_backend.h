#pragma once
/// The CUDA backend: f32 and bf16 with fp32 accumulation. GEMMs go through cuBLASLt (descriptors and
/// heuristic algorithm cached per shape key), 3-D convolutions through cuDNN (algorithm cached per
/// shape), everything else through dzr's kernels in kernels/. All work is queued on one stream per
/// backend; ops take temporaries from the workspace arena and never allocate or wait on the host, so a
/// forward can be captured into a CUDA graph once every shape has run once (the first call of a shape
/// builds its cuBLASLt/cuDNN plan, and the first conv3d creates the cuDNN handle).
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "backend/backend.h"

namespace dzr {

namespace cuda_detail {
struct GemmCall;
struct GemmPlan;
struct ConvPlan;
/// Everything a cuBLASLt plan depends on: dtypes, transposes, sizes, leading dims, batch strides,
/// pointer alignments, bias.
using GemmKey = std::array<int64_t, 24>;
}  // namespace cuda_detail

class CudaBackend final : public Backend {
public:
    /// Default workspace when make_cuda_backend gets 0 bytes.
    static constexpr size_t kDefaultWorkspaceBytes = size_t(1) << 30;
    /// cuBLASLt's own workspace (NVIDIA recommends 32 MiB on Hopper).
    static constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;
    /// Each of the two pinned staging buffers used by upload/download.
    static constexpr size_t kStagingBytes = size_t(16) << 20;

    CudaBackend(int index, size_t workspace_bytes);
    ~CudaBackend() override;
    CudaBackend(const CudaBackend&) = delete;
    CudaBackend& operator=(const CudaBackend&) = delete;

    Device device() const override { return Device::cuda(index_); }
    std::string name() const override;
    DType compute_dtype() const override { return DType::BF16; }

    Tensor alloc(Shape shape, DType dtype) override;
    Arena& workspace() override { return arena_; }
    void reserve_workspace(size_t bytes) override;

    void upload(const TensorView& host_src, const TensorView& dst) override;
    void download(const TensorView& src, const TensorView& host_dst) override;
    void copy(const TensorView& src, const TensorView& dst) override;
    void fill(const TensorView& dst, float value) override;
    void synchronize() override;

    void gemm(const GemmParams& p, const TensorView& a, const TensorView& b, const TensorView& bias,
              const TensorView& out) override;
    void binary(const BinaryParams& p, const TensorView& a, const TensorView& b, const TensorView& out) override;
    void scale(const ScaleParams& p, const TensorView& x, const TensorView& out) override;
    void activation(const ActivationParams& p, const TensorView& x, const TensorView& out) override;
    void layer_norm(const LayerNormParams& p, const TensorView& x, const TensorView& weight, const TensorView& bias,
                    const TensorView& out) override;
    void rms_norm(const RmsNormParams& p, const TensorView& x, const TensorView& weight,
                  const TensorView& out) override;
    void softmax(const SoftmaxParams& p, const TensorView& x, const TensorView& out) override;
    void reduce(const ReduceParams& p, const TensorView& x, const TensorView& out) override;
    void rope(const RopeParams& p, const TensorView& x, const TensorView& table, const TensorView& out) override;
    void attention(const AttentionParams& p, const TensorView& q, const TensorView& k, const TensorView& v,
                   const TensorView& bias, const TensorView& out) override;
    void conv3d(const Conv3dParams& p, const TensorView& x, const TensorView& w, const TensorView& bias,
                const TensorView& out) override;

    /// The stream all of this backend's work is queued on (for events and external kernels).
    cudaStream_t stream() const { return stream_; }
    int index() const { return index_; }
    /// Route GEMMs and conv3d through dzr's plain kernels instead of cuBLASLt / cuDNN (for tests of the
    /// fallback paths that odd shapes take).
    void set_fallback_only(bool on) { fallback_only_ = on; }

private:
    void run_gemm(const cuda_detail::GemmCall& call);
    cuda_detail::GemmPlan& gemm_plan(const cuda_detail::GemmCall& call);
    cuda_detail::ConvPlan& conv_plan(const std::string& key, DType dtype, const int64_t x_dims[5],
                                     const int64_t w_dims[5], const int64_t y_dims[5], const int pad[3],
                                     const int stride[3]);
    void build_conv_plan(cuda_detail::ConvPlan& plan, const std::string& key, DType dtype, const int64_t x_dims[5],
                         const int64_t w_dims[5], const int64_t y_dims[5], const int pad[3], const int stride[3]);
    cudnnHandle_t cudnn();
    void check_device_tensor(const TensorView& t, const char* op, const char* what) const;

    int index_ = 0;
    cudaStream_t stream_ = nullptr;
    cublasLtHandle_t cublas_ = nullptr;
    void* cublas_workspace_ = nullptr;
    cudnnHandle_t cudnn_ = nullptr;
    void* workspace_base_ = nullptr;
    Arena arena_;
    void* staging_[2] = {nullptr, nullptr};
    cudaEvent_t staging_done_[2] = {nullptr, nullptr};
    int next_staging_ = 0;
    bool fallback_only_ = false;
    std::map<cuda_detail::GemmKey, std::unique_ptr<cuda_detail::GemmPlan>> gemm_plans_;
    std::map<std::string, std::unique_ptr<cuda_detail::ConvPlan>> conv_plans_;
};

/// The stream a CUDA backend queues its work on. Throws dzr::Error for other backends.
cudaStream_t cuda_stream(Backend& be);

}  // namespace dzr
