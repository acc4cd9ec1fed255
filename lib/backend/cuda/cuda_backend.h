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
#include <functional>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "backend/packing.h"

namespace dzr {

namespace cuda_detail {
class PinnedUploadRing;
}

namespace kernels {
struct GemmFallbackArgs;
}

namespace cuda_detail {
/// One (batched) GEMM as cuBLASLt and our fallback kernel both take it (kernels/gemm_fallback.cuh).
using GemmCall = kernels::GemmFallbackArgs;
struct GemmPlan;
struct ConvPlan;
struct FastConvPlan;
struct FastConvCandidate;
struct AttentionCall;
struct SdpaPlan;
struct PagedSdpaState;
enum class SdpaGraph : uint8_t;
using SdpaKey = std::array<int64_t, 21>;  // cuda_attention.h's sdpa_key()
/// Everything a cuBLASLt plan depends on: dtypes, transposes, sizes, leading dims, batch strides,
/// pointer alignments, bias.
using GemmKey = std::array<int64_t, 24>;
}  // namespace cuda_detail

/// Device memory of one GPU: tensors from cudaMalloc, the workspace arena on one allocation.
class CudaSlab;

class CudaDevice final : public DeviceContext, public PackingAllocator {
public:
    /// `pack_weights`: begin_packing() carves from one slab (CudaBackendOptions::pack_weights).
    explicit CudaDevice(int index, bool pack_weights = true);
    ~CudaDevice() override;
    CudaDevice(const CudaDevice&) = delete;
    CudaDevice& operator=(const CudaDevice&) = delete;

    Device device() const override { return Device::cuda(index_); }
    Tensor alloc(Shape shape, DType dtype) override;
    Tensor alloc_pinned(Shape shape, DType dtype) override;
    Arena& workspace() override { return arena_; }
    /// Synchronizes the device before replacing the old workspace.
    void reserve_workspace(size_t bytes) override;
    std::optional<int64_t> memory_in_use() const override;
    std::optional<int64_t> memory_free() const override;
    std::string pci_bus_id() const override;
    /// cudaMemGetInfo of the device: {free, total} bytes.
    std::pair<size_t, size_t> memory_info() const;
    Capabilities capabilities() const override { return caps_; }
    int index() const { return index_; }
    /// The stream alloc() zero-fills on (the backend's), so the fill is ordered before the backend's work.
    void set_stream(cudaStream_t stream) { stream_ = stream; }

    /// backend/packing.h: alloc() carves from one slab (virtual memory management) between these
    /// (backend/cuda/cuda_packing.cpp).
    void begin_packing() override;
    void end_packing() override;

private:
    /// A tensor carved from the current slab (there must be one); undefined when the slab cannot take it.
    Tensor alloc_packed(Shape shape, DType dtype);

    int index_ = 0;
    cudaStream_t stream_ = nullptr;
    void* workspace_base_ = nullptr;
    Arena arena_;
    Capabilities caps_;
    int packing_depth_ = 0;
    bool pack_weights_ = true;
    std::shared_ptr<CudaSlab> slab_;
};

/// One CUDA stream with two pinned staging buffers for host transfers.
class CudaStream final : public Stream {
public:
    /// Each of the two pinned staging buffers used by upload/download.
    static constexpr size_t kStagingBytes = size_t(16) << 20;

    /// `gather`: copies a strided device view into a contiguous one on this stream (download's strided sources).
    CudaStream(CudaDevice& device, std::function<void(const TensorView&, const TensorView&)> gather);
    ~CudaStream() override;
    CudaStream(const CudaStream&) = delete;
    CudaStream& operator=(const CudaStream&) = delete;

    void upload(const TensorView& host_src, const TensorView& dst) override;
    void download(const TensorView& src, const TensorView& host_dst) override;
    void synchronize() override;
    std::unique_ptr<Event> make_event() override;
    void record(Event& e) override;
    void wait(const Event& e) override;
    double elapsed_ms(const Event& from, const Event& to) override;
    void begin_capture() override;
    std::unique_ptr<Graph> end_capture() override;
    void abort_capture() override;
    bool capturing() const override;
    void copy_pinned(const void* pinned_src, const TensorView& dst) override;
    cudaStream_t handle() const { return stream_; }

private:
    CudaDevice& device_;
    std::function<void(const TensorView&, const TensorView&)> gather_;
    cudaStream_t stream_ = nullptr;
    void* staging_[2] = {nullptr, nullptr};
    cudaEvent_t staging_done_[2] = {nullptr, nullptr};
    int next_staging_ = 0;
    std::unique_ptr<cuda_detail::PinnedUploadRing> small_uploads_;  // uploads up to its slot size (cuda_graph.h)
};

class CudaBackend final : public Backend {
public:
    /// Default workspace when make_cuda_backend gets 0 bytes.
    static constexpr size_t kDefaultWorkspaceBytes = size_t(1) << 30;
    /// cuBLASLt's own workspace (NVIDIA recommends 32 MiB on Hopper).
    static constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;

    CudaBackend(int index, const BackendOptions& options);
    ~CudaBackend() override;
    CudaBackend(const CudaBackend&) = delete;
    CudaBackend& operator=(const CudaBackend&) = delete;

    std::string name() const override;
    DType compute_dtype() const override { return DType::BF16; }
    DeviceContext& context() override { return device_; }
    const DeviceContext& context() const override { return device_; }
    Stream& stream() override { return queue_; }
    std::unique_ptr<Stream> make_copy_stream() override;

    size_t conv3d_workspace_bytes(const Conv3dParams& p, const TensorView& x, const TensorView& w,
                                  const TensorView& out) override;
    size_t paged_attention_workspace_bytes(const PagedKvView& history, const TensorView& k_cur) override;
    size_t paged_attention_batched_workspace_bytes(std::span<const PagedKvView> histories,
                                                   const TensorView& k_cur) override;
    /// How many paged_attention_batched calls ran as one batched call, and how many per branch.
    int64_t batched_attention_calls() const { return batched_calls_; }
    int64_t batched_attention_fallbacks() const { return batched_fallbacks_; }
    /// How many paged attentions (a batched call counts once) read [history | current] in place (kv.in_place lanes).
    int64_t in_place_attention_calls() const { return in_place_calls_; }

    void set_cuda_options(const CudaBackendOptions& o) override;
    CudaBackendOptions cuda_options() const override { return options_; }
    std::string last_attention_impl() const override { return attention_impl_name(last_attention_impl_); }
    std::string conv_plan_report() const override;

    // Shorthands of set_cuda_options for the tests.
    void set_attention_impl(AttentionImpl impl) { options_.attention = impl; }
    AttentionImpl attention_impl() const { return options_.attention; }
    /// The implementation that ran the last attention (dense, or the dense part of a gathered paged call).
    AttentionImpl last_attention_kind() const { return last_attention_impl_; }
    /// Choosing Cublas creates the cuBLAS handle now, not inside a forward.
    void set_plain_gemm_impl(PlainGemmImpl impl);
    PlainGemmImpl plain_gemm_impl() const { return options_.plain_gemm; }
    void set_paged_attention_impl(PagedAttentionImpl impl) { options_.paged_attention = impl; }
    /// Direct, Gather or CudnnPaged: how the last paged_attention ran.
    PagedAttentionImpl last_paged_attention_impl() const { return last_paged_impl_; }
    void set_fallback_only(bool on) { options_.fallback_only = on; }
    /// True when the last gemm_fp8 ran through cuBLASLt (false: the plain FP8 kernel).
    bool last_fp8_gemm_used_cublaslt() const { return last_fp8_gemm_lt_; }
    /// True when the last gemm_gelu ran its GELU in cuBLASLt's epilogue (false: the GEMM, then the GELU kernel).
    bool last_gemm_gelu_fused() const { return last_gemm_gelu_fused_; }

    /// The stream all of this backend's work is queued on (for the tests' raw CUDA calls).
    cudaStream_t cuda_stream() const { return stream_; }
    int index() const { return index_; }

private:
    // ---- the ops (Backend::do_<op>) ---------------------------------------------------------------
    void do_copy(const TensorView& src, const TensorView& dst) override;
    void do_fill(const TensorView& dst, float value) override;
    void do_gemm(const GemmParams& p, const TensorView& a, const TensorView& b, const TensorView& bias,
                 const TensorView& out) override;
    void do_binary(const BinaryParams& p, const TensorView& a, const TensorView& b, const TensorView& out) override;
    void do_scale(const ScaleParams& p, const TensorView& x, const TensorView& out) override;
    void do_activation(const ActivationParams& p, const TensorView& x, const TensorView& out) override;
    void do_layer_norm(const LayerNormParams& p, const TensorView& x, const TensorView& weight, const TensorView& bias,
                       const TensorView& out) override;
    void do_rms_norm(const RmsNormParams& p, const TensorView& x, const TensorView& weight,
                     const TensorView& out) override;
    void do_l2_norm(const L2NormParams& p, const TensorView& x, const TensorView& weight,
                    const TensorView& out) override;
    void do_softmax(const SoftmaxParams& p, const TensorView& x, const TensorView& out) override;
    void do_reduce(const ReduceParams& p, const TensorView& x, const TensorView& out) override;
    void do_rope(const RopeParams& p, const TensorView& x, const TensorView& table, const TensorView& out) override;
    void do_attention(const AttentionParams& p, const TensorView& q, const TensorView& k, const TensorView& v,
                      const TensorView& bias, const TensorView& out) override;
    void do_conv3d(const Conv3dParams& p, const TensorView& x, const TensorView& w, const TensorView& bias,
                   const TensorView& out) override;
    void do_resize_bicubic(const TensorView& src, const TensorView& dst) override;
    void do_sin_cos_table(float step, const TensorView& out) override;
    void do_count_nonfinite(const TensorView& x, const TensorView& out) override;
    // FP8 (cuda_fp8.cpp)
    void do_quantize_fp8(const TensorView& x, const TensorView& q, const TensorView& scales) override;
    void do_dequantize_fp8(const TensorView& q, const TensorView& scales, const TensorView& out) override;
    void do_gemm_fp8(const TensorView& xq, const TensorView& x_scales, const TensorView& wq,
                     const TensorView& w_scales, const TensorView& bias, const TensorView& out) override;
    // the fused DiT ops
    void do_ada_layer_norm(const FusedRowParams& p, const TensorView& x, const TensorView& weight,
                           const TensorView& bias, const TensorView& scale, const TensorView& shift,
                           const TensorView& out) override;
    void do_gated_residual(const FusedRowParams& p, const TensorView& x, const TensorView& y,
                           const TensorView& gate) override;
    void do_rms_norm_rope(const FusedRowParams& p, const TensorView& x, const TensorView& weight,
                          const TensorView& table_a, const TensorView& table_b, const TensorView& out) override;
    void do_gated_residual_norm(const FusedRowParams& p, const TensorView& x, const TensorView& y,
                                const TensorView& gate, const TensorView& weight, const TensorView& bias,
                                const TensorView& scale, const TensorView& shift, const TensorView& out) override;
    void do_gemm_gelu(const GemmParams& p, const TensorView& a, const TensorView& b, const TensorView& bias,
                      const TensorView& out) override;
    void do_ada_layer_norm_fp8(const FusedRowParams& p, const TensorView& x, const TensorView& weight,
                               const TensorView& bias, const TensorView& scale, const TensorView& shift,
                               const TensorView& q, const TensorView& scales) override;
    void do_activation_quantize_fp8(const ActivationParams& p, const TensorView& x, const TensorView& q,
                                    const TensorView& scales) override;
    void do_paged_attention(const AttentionParams& p, const TensorView& q, const PagedKvView& history, int layer,
                            const TensorView& k_cur, const TensorView& v_cur, const TensorView& out) override;
    /// Fast numerics, every history of one length, cuDNN allowed: each branch's [history | current] rows gathered
    /// into one [B, Lk, H, D] buffer and one cuDNN SDPA of batch B (docs/PERF.md, "Attention"); otherwise per branch.
    void do_paged_attention_batched(const AttentionParams& p, const TensorView& q,
                                    std::span<const PagedKvView> histories, int layer, const TensorView& k_cur,
                                    const TensorView& v_cur, const TensorView& out) override;
    void do_scatter_kv(const PagedKvView& pool, int layer, const TensorView& slots, const TensorView& k,
                       const TensorView& v, int64_t num_slots) override;

    void run_gemm(const cuda_detail::GemmCall& call);
    /// One cuBLASLt matmul of `plan` (its bias pointer set when the bias is in the epilogue).
    void launch_lt(const cuda_detail::GemmPlan& plan, const cuda_detail::GemmCall& call);
    /// The plan of a GEMM; gelu: with cuBLASLt's GELU (GELU_BIAS with a bias of the output's dtype) epilogue.
    cuda_detail::GemmPlan& gemm_plan(const cuda_detail::GemmCall& call, bool gelu = false);
    /// Fast numerics: times the heuristic's candidates for `plan` on `call`'s operands (the output in arena scratch)
    /// and keeps the fastest when it beats the first by 2%; no-op while capturing, for small GEMMs, or without room.
    void tune_gemm_plan(cuda_detail::GemmPlan& plan, const cuda_detail::GemmCall& call,
                        const cublasLtMatmulHeuristicResult_t* candidates, int count);
    /// gemm's operand checks and its call description.
    cuda_detail::GemmCall make_gemm_call(const GemmParams& p, const TensorView& a, const TensorView& b,
                                         const TensorView& bias, const TensorView& out) const;
    /// gemm_gelu's GEMM: cuBLASLt with the GELU epilogue where it has an algorithm, else run_gemm then the GELU kernel.
    void run_gemm_gelu(const cuda_detail::GemmCall& call);
    cuda_detail::ConvPlan& conv_plan(const std::string& key, DType dtype, int nd, const int64_t x_dims[5],
                                     const int64_t w_dims[5], const int64_t y_dims[5], const int pad[3],
                                     const int stride[3], bool nhwc, size_t ws_limit);
    /// nd = 5: a conv3d on [N, C, T, H, W]; nd = 4: a conv2d on [N, C, H, W] (dims, pad and stride use
    /// their first nd resp. nd - 2 entries). nhwc: input, output and filter are channels-last in memory.
    void build_conv_plan(cuda_detail::ConvPlan& plan, const std::string& key, DType dtype, int nd,
                         const int64_t x_dims[5], const int64_t w_dims[5], const int64_t y_dims[5], const int pad[3],
                         const int stride[3], bool nhwc, size_t ws_limit);
    /// conv3d after its checks: cuDNN with the engine PyTorch would pick (the reference path), or the direct kernel.
    void conv3d_planned(const Conv3dParams& p, const TensorView& x, const TensorView& w, const TensorView& bias,
                        const TensorView& out);
    /// conv3d_planned, a channels-last x transposed to channels-first first.
    void conv3d_reference(const Conv3dParams& p, const TensorView& x, const TensorView& w, const TensorView& bias,
                          const TensorView& out);
    /// conv3d_workspace_bytes of conv3d_planned.
    size_t planned_conv_workspace_bytes(const Conv3dParams& p, const TensorView& x, const TensorView& w,
                                        const TensorView& out);
    // fast numerics' convolutions (cuda_conv_fast.cpp): the channels-last, autotuned path
    /// The plan of this call shape, its candidates enumerated (not yet timed); null when cuDNN offers none.
    cuda_detail::FastConvPlan* fast_conv_plan(const Conv3dParams& p, const TensorView& x, const TensorView& w,
                                              const TensorView& out);
    size_t fast_conv_workspace_bytes(const Conv3dParams& p, const TensorView& x, const TensorView& w,
                                     const TensorView& out);
    /// Runs the call through its fast plan (tuning it on the first call); false: the caller runs conv3d_planned.
    bool run_fast_conv(const Conv3dParams& p, const TensorView& x, const TensorView& w, const TensorView& bias,
                       const TensorView& out);
    void tune_fast_conv(cuda_detail::FastConvPlan& plan, const Conv3dParams& p, const TensorView& x,
                        const TensorView& w, const TensorView& bias, const TensorView& out);
    /// One channels-last run of `c` on buffers the caller took from the arena; the cuDNN status.
    cudnnStatus_t run_fast_candidate(const cuda_detail::FastConvPlan& plan, const cuda_detail::FastConvCandidate& c,
                                     const Conv3dParams& p, const TensorView& x, const TensorView& w,
                                     const TensorView& bias, const TensorView& out, void* xcl, void* wcl, void* ycl,
                                     void* ws);
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
    /// Paged attention without the gather (cuda_paged_sdpa.cpp): cuDNN SDPA over the history through the block
    /// table and over the current rows, merged by their log-sum-exps. False, with the reason in `why` (also logged,
    /// the first time as a warning), when it cannot run the call: cuDNN refuses a graph, the arena lacks room, or a
    /// capture began before the shape's plans were built.
    bool try_paged_sdpa(const AttentionParams& p, const TensorView& q, const PagedKvView& history, int layer,
                        const TensorView& k_cur, const TensorView& v_cur, const TensorView& out, std::string& why);
    void check_device_tensor(const TensorView& t, const char* op, const char* what) const;
    // FP8 (cuda_fp8.cpp): the cuBLASLt plan of an FP8 GEMM shape; the FP8 pool's paged attention and scatter
    using Fp8GemmKey = std::array<int64_t, 11>;
    cuda_detail::GemmPlan& fp8_gemm_plan(int64_t M, int64_t N, int64_t K, int64_t ldc, DType out_dtype, const void* xq,
                                         const void* wq, const void* out, const void* bias, const void* w_scales,
                                         const void* x_scales);
    void paged_attention_fp8(const AttentionParams& p, const TensorView& q, const PagedKvView& history, int layer,
                             const TensorView& k_cur, const TensorView& v_cur, const TensorView& out);
    void scatter_kv_fp8(const PagedKvView& pool, int layer, const TensorView& slots, const TensorView& k,
                        const TensorView& v, int64_t num_slots);
    /// [history (dequantized) | current] K and V rows of one branch into contiguous [hist + cur, H, D] buffers of
    /// the current rows' dtype (the gather of paged_attention_fp8).
    void gather_paged_rows_fp8(const PagedKvView& history, int layer, const TensorView& k_cur, const TensorView& v_cur,
                               void* k_out, void* v_out);
    /// Why the batched path cannot run these operands (empty: it can).
    std::string batched_attention_refusal(std::span<const PagedKvView> histories, const TensorView& q,
                                          const TensorView& k_cur, const TensorView& v_cur, const TensorView& out);

    int index_ = 0;
    CudaDevice device_;
    Arena& arena_;  // device_'s workspace
    CudaStream queue_;
    cudaStream_t stream_ = nullptr;  // queue_'s
    cublasLtHandle_t cublas_ = nullptr;
    cublasHandle_t blas_ = nullptr;
    void* cublas_workspace_ = nullptr;
    cudnnHandle_t cudnn_ = nullptr;
    CudaBackendOptions options_;
    std::map<cuda_detail::GemmKey, std::unique_ptr<cuda_detail::GemmPlan>> gemm_plans_;
    std::map<Fp8GemmKey, std::unique_ptr<cuda_detail::GemmPlan>> fp8_gemm_plans_;
    std::map<std::string, std::unique_ptr<cuda_detail::ConvPlan>> conv_plans_;
    std::map<std::string, std::unique_ptr<cuda_detail::FastConvPlan>> fast_conv_plans_;
    std::map<cuda_detail::SdpaKey, std::unique_ptr<cuda_detail::SdpaPlan>> sdpa_plans_;
    std::unique_ptr<cuda_detail::PagedSdpaState> paged_sdpa_;  // made by the first try_paged_sdpa
    AttentionImpl last_attention_impl_ = AttentionImpl::Gemm;
    PagedAttentionImpl last_paged_impl_ = PagedAttentionImpl::Direct;
    int64_t batched_calls_ = 0, batched_fallbacks_ = 0, in_place_calls_ = 0;
    bool last_fp8_gemm_lt_ = false;
    bool last_gemm_gelu_fused_ = false;
};

}  // namespace dzr
