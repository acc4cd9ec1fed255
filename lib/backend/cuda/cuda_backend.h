#pragma once
/// The CUDA backend: f32 and bf16 with fp32 accumulation. GEMMs go through cuBLASLt (descriptors and
/// heuristic algorithm cached per shape key), 3-D convolutions through cuDNN (algorithm cached per
/// shape), attention through cuDNN SDPA (execution plan cached per shape key) or dzr's flash kernel,
/// everything else through dzr's kernels in kernels/. All work is queued on one stream per
/// backend; ops take temporaries from the workspace arena and never allocate or wait on the host, so a
/// forward can be captured into a CUDA graph once every shape has run once (the first call of a shape
/// builds its cuBLASLt/cuDNN plan, and the first conv3d creates the cuDNN handle).
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "backend/backend.h"

namespace dzr {

namespace kernels {
struct GemmFallbackArgs;
}

namespace cuda_detail {
/// One (batched) GEMM as cuBLASLt and our fallback kernel both take it (kernels/gemm_fallback.cuh).
using GemmCall = kernels::GemmFallbackArgs;
struct GemmPlan;
struct ConvPlan;
struct AttentionCall;
struct SdpaPlan;
enum class SdpaGraph : uint8_t;
using SdpaKey = std::array<int64_t, 16>;
/// Everything a cuBLASLt plan depends on: dtypes, transposes, sizes, leading dims, batch strides,
/// pointer alignments, bias.
using GemmKey = std::array<int64_t, 24>;
}  // namespace cuda_detail

/// Which implementation runs Backend::attention (bf16/f16 without bias; f32 and biased attention always take
/// the GEMM path). Auto follows PyTorch's SDPA choice on the H200: above a head dim of 256 (where PyTorch's
/// cuDNN and flash backends refuse) dzr's kernel in the order of PyTorch's memory-efficient backend
/// (kernels/attention_memeff.cuh); otherwise cuDNN's unified SDPA node, then cuDNN's composite SDPA graph,
/// then dzr's flash kernel (head_dim 64/128), then the GEMM path. A forced choice throws when it cannot run
/// the call.
enum class AttentionImpl : uint8_t { Auto, CudnnUnified, CudnnComposite, Flash, MemEfficient, Gemm };
const char* attention_impl_name(AttentionImpl impl);
/// "auto", "cudnn-unified", "cudnn-composite", "flash", "mem-efficient", "gemm"; throws dzr::Error otherwise.
AttentionImpl parse_attention_impl(const std::string& text);

/// Which library runs the bf16 GEMMs that carry no bias (Backend::gemm without a bias vector: what PyTorch runs
/// as torch.mm, a bias-free F.linear or torch.bmm): cuBLASLt (as the GEMMs with a bias, PyTorch's addmm), or the
/// cuBLAS calls PyTorch's default BLAS backend makes for them: cublasGemmEx for one matrix (torch.bmm with a
/// batch of 1 included), cublasGemmStridedBatchedEx for a batch. The two libraries can pick kernels that sum in
/// different orders. Initially from the environment variable DZR_PLAIN_GEMM (lt | cublas); see
/// kPlainGemmDefault for the default. scripts/parity/kernel_probe.py compares both against torch.
enum class PlainGemmImpl : uint8_t { Lt, Cublas };
inline constexpr PlainGemmImpl kPlainGemmDefault = PlainGemmImpl::Lt;
/// "lt", "cublas"; throws dzr::Error otherwise.
PlainGemmImpl parse_plain_gemm_impl(const std::string& text);

/// How Backend::paged_attention runs: Direct = the flash kernel reads the history through the device
/// block table; Gather = one kernel copies [history | current] into the workspace, then the dense
/// attention above. Auto = Gather when cuDNN SDPA takes the dense call, else Direct.
enum class PagedAttentionImpl : uint8_t { Auto, Direct, Gather };

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
    std::optional<int64_t> device_memory_in_use() const override;

    void gemm(const GemmParams& p, const TensorView& a, const TensorView& b, const TensorView& bias,
              const TensorView& out) override;
    void binary(const BinaryParams& p, const TensorView& a, const TensorView& b, const TensorView& out) override;
    void scale(const ScaleParams& p, const TensorView& x, const TensorView& out) override;
    void activation(const ActivationParams& p, const TensorView& x, const TensorView& out) override;
    void layer_norm(const LayerNormParams& p, const TensorView& x, const TensorView& weight, const TensorView& bias,
                    const TensorView& out) override;
    void rms_norm(const RmsNormParams& p, const TensorView& x, const TensorView& weight,
                  const TensorView& out) override;
    bool resize_bicubic(const TensorView& src, const TensorView& dst) override;
    void sin_cos_table(float step, const TensorView& out) override;
    void l2_norm(const L2NormParams& p, const TensorView& x, const TensorView& weight,
                 const TensorView& out) override;
    void softmax(const SoftmaxParams& p, const TensorView& x, const TensorView& out) override;
    void reduce(const ReduceParams& p, const TensorView& x, const TensorView& out) override;
    void count_nonfinite(const TensorView& x, const TensorView& out) override;
    void rope(const RopeParams& p, const TensorView& x, const TensorView& table, const TensorView& out) override;
    void attention(const AttentionParams& p, const TensorView& q, const TensorView& k, const TensorView& v,
                   const TensorView& bias, const TensorView& out) override;
    void conv3d(const Conv3dParams& p, const TensorView& x, const TensorView& w, const TensorView& bias,
                const TensorView& out) override;
    size_t conv3d_workspace_bytes(const Conv3dParams& p, const TensorView& x, const TensorView& w,
                                  const TensorView& out) override;
    void paged_attention(const AttentionParams& p, const TensorView& q, const PagedKvView& history, int layer,
                         const TensorView& k_cur, const TensorView& v_cur, const TensorView& out) override;
    void scatter_kv(const PagedKvView& pool, int layer, const TensorView& slots, const TensorView& k,
                    const TensorView& v, int64_t num_slots) override;

    /// Attention implementation choice (initially from the environment variable DZR_ATTENTION, else Auto).
    void set_attention_impl(AttentionImpl impl) { attention_impl_ = impl; }
    AttentionImpl attention_impl() const { return attention_impl_; }
    /// The implementation that ran the last attention (dense, or the dense part of a gathered paged call).
    AttentionImpl last_attention_impl() const { return last_attention_impl_; }
    /// Choosing Cublas creates the cuBLAS handle now, not inside a forward.
    void set_plain_gemm_impl(PlainGemmImpl impl);
    PlainGemmImpl plain_gemm_impl() const { return plain_impl_; }
    void set_paged_attention_impl(PagedAttentionImpl impl) { paged_impl_ = impl; }
    /// Direct or Gather: how the last paged_attention ran.
    PagedAttentionImpl last_paged_attention_impl() const { return last_paged_impl_; }

    /// The stream all of this backend's work is queued on (for events and external kernels).
    cudaStream_t stream() const { return stream_; }
    int index() const { return index_; }
    /// Route GEMMs and conv3d through dzr's plain kernels instead of cuBLASLt / cuDNN (for tests of the
    /// fallback paths that odd shapes take).
    void set_fallback_only(bool on) { fallback_only_ = on; }

private:
    void run_gemm(const cuda_detail::GemmCall& call);
    cuda_detail::GemmPlan& gemm_plan(const cuda_detail::GemmCall& call);
    cuda_detail::ConvPlan& conv_plan(const std::string& key, DType dtype, int nd, const int64_t x_dims[5],
                                     const int64_t w_dims[5], const int64_t y_dims[5], const int pad[3],
                                     const int stride[3], bool nhwc, size_t ws_limit);
    /// nd = 5: a conv3d on [N, C, T, H, W]; nd = 4: a conv2d on [N, C, H, W] (dims, pad and stride use
    /// their first nd resp. nd - 2 entries). nhwc: input, output and filter are channels-last in memory.
    void build_conv_plan(cuda_detail::ConvPlan& plan, const std::string& key, DType dtype, int nd,
                         const int64_t x_dims[5], const int64_t w_dims[5], const int64_t y_dims[5], const int pad[3],
                         const int stride[3], bool nhwc, size_t ws_limit);
    cudnnHandle_t cudnn();
    /// The cuBLAS handle for PlainGemmImpl::Cublas, made when that is chosen (stream, workspace and math mode set).
    cublasHandle_t blas();
    /// Runs a bias-free bf16 GEMM through cuBLAS as PyTorch does (cublasGemmEx for one matrix,
    /// cublasGemmStridedBatchedEx for a batch); false when the call is not one it takes.
    bool run_gemm_cublas(const cuda_detail::GemmCall& c);
    void attention_gemm(const AttentionParams& p, const TensorView& q, const TensorView& k, const TensorView& v,
                        const TensorView& bias, const TensorView& out);
    const cuda_detail::SdpaPlan* sdpa_plan(const cuda_detail::AttentionCall& c, cuda_detail::SdpaGraph g);
    bool try_sdpa(const cuda_detail::AttentionCall& c, cuda_detail::SdpaGraph g);
    bool try_flash(const cuda_detail::AttentionCall& c);
    bool try_mem_efficient(const cuda_detail::AttentionCall& c);
    AttentionImpl run_fused_attention(const cuda_detail::AttentionCall& c);
    void check_device_tensor(const TensorView& t, const char* op, const char* what) const;

    int index_ = 0;
    cudaStream_t stream_ = nullptr;
    cublasLtHandle_t cublas_ = nullptr;
    cublasHandle_t blas_ = nullptr;
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
    std::map<cuda_detail::SdpaKey, std::unique_ptr<cuda_detail::SdpaPlan>> sdpa_plans_;
    AttentionImpl attention_impl_ = AttentionImpl::Auto;
    AttentionImpl last_attention_impl_ = AttentionImpl::Gemm;
    PagedAttentionImpl paged_impl_ = PagedAttentionImpl::Auto;
    PlainGemmImpl plain_impl_ = PlainGemmImpl::Lt;
    PagedAttentionImpl last_paged_impl_ = PagedAttentionImpl::Direct;
};

/// The stream a CUDA backend queues its work on. Throws dzr::Error for other backends.
cudaStream_t cuda_stream(Backend& be);

}  // namespace dzr
