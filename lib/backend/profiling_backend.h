#pragma once
/// A Backend that runs every op on another backend and brackets it with the Profiler's events (profiler.h). The
/// wrapped backend's device, stream, numerics and implementation choices are the ones in effect; the autocast
/// state set on this backend is passed on to it for each op.
#include <memory>

#include "backend/backend.h"
#include "backend/profiler.h"

namespace dzr {

class ProfilingBackend final : public Backend {
public:
    /// time_ops false: the ops run untimed (Profiler::ops_timed), regions and the kernel tracer only.
    explicit ProfilingBackend(std::unique_ptr<Backend> inner, bool time_ops = true);

    Profiler* profiler() override { return &profiler_; }
    Backend& inner() { return *inner_; }

    std::string name() const override { return inner_->name(); }
    DType compute_dtype() const override { return inner_->compute_dtype(); }
    DeviceContext& context() override { return inner_->context(); }
    const DeviceContext& context() const override { return inner_->context(); }
    Stream& stream() override { return inner_->stream(); }
    std::unique_ptr<Stream> make_copy_stream() override { return inner_->make_copy_stream(); }
    void set_cuda_options(const CudaBackendOptions& options) override { inner_->set_cuda_options(options); }
    CudaBackendOptions cuda_options() const override { return inner_->cuda_options(); }
    std::string last_attention_impl() const override { return inner_->last_attention_impl(); }
    std::string conv_plan_report() const override { return inner_->conv_plan_report(); }

    void copy(const TensorView& src, const TensorView& dst) override;
    void fill(const TensorView& dst, float value) override;
    void gemm(const GemmParams& p, const TensorView& a, const TensorView& b, const TensorView& bias,
              const TensorView& out) override;
    void binary(const BinaryParams& p, const TensorView& a, const TensorView& b, const TensorView& out) override;
    void scale(const ScaleParams& p, const TensorView& x, const TensorView& out) override;
    void activation(const ActivationParams& p, const TensorView& x, const TensorView& out) override;
    void layer_norm(const LayerNormParams& p, const TensorView& x, const TensorView& weight, const TensorView& bias,
                    const TensorView& out) override;
    void rms_norm(const RmsNormParams& p, const TensorView& x, const TensorView& weight,
                  const TensorView& out) override;
    void l2_norm(const L2NormParams& p, const TensorView& x, const TensorView& weight, const TensorView& out) override;
    void softmax(const SoftmaxParams& p, const TensorView& x, const TensorView& out) override;
    void reduce(const ReduceParams& p, const TensorView& x, const TensorView& out) override;
    void rope(const RopeParams& p, const TensorView& x, const TensorView& table, const TensorView& out) override;
    void attention(const AttentionParams& p, const TensorView& q, const TensorView& k, const TensorView& v,
                   const TensorView& bias, const TensorView& out) override;
    void conv3d(const Conv3dParams& p, const TensorView& x, const TensorView& w, const TensorView& bias,
                const TensorView& out) override;
    size_t conv3d_workspace_bytes(const Conv3dParams& p, const TensorView& x, const TensorView& w,
                                  const TensorView& out) override;
    size_t paged_attention_workspace_bytes(const PagedKvView& history, const TensorView& k_cur) override;
    size_t paged_attention_batched_workspace_bytes(std::span<const PagedKvView> histories,
                                                   const TensorView& k_cur) override;
    void resize_bicubic(const TensorView& src, const TensorView& dst) override;
    void sin_cos_table(float step, const TensorView& out) override;
    void count_nonfinite(const TensorView& x, const TensorView& out) override;
    void quantize_fp8(const TensorView& x, const TensorView& q, const TensorView& scales) override;
    void ada_layer_norm_fp8(const FusedRowParams& p, const TensorView& x, const TensorView& weight,
                            const TensorView& bias, const TensorView& scale, const TensorView& shift, const TensorView& q,
                            const TensorView& scales) override;
    void activation_quantize_fp8(const ActivationParams& p, const TensorView& x, const TensorView& q,
                                 const TensorView& scales) override;
    void dequantize_fp8(const TensorView& q, const TensorView& scales, const TensorView& out) override;
    void gemm_fp8(const TensorView& xq, const TensorView& x_scales, const TensorView& wq, const TensorView& w_scales,
                  const TensorView& bias, const TensorView& out) override;
    void ada_layer_norm(const FusedRowParams& p, const TensorView& x, const TensorView& weight, const TensorView& bias,
                        const TensorView& scale, const TensorView& shift, const TensorView& out) override;
    void gated_residual(const FusedRowParams& p, const TensorView& x, const TensorView& y,
                        const TensorView& gate) override;
    void rms_norm_rope(const FusedRowParams& p, const TensorView& x, const TensorView& weight,
                       const TensorView& table_a, const TensorView& table_b, const TensorView& out) override;
    void gated_residual_norm(const FusedRowParams& p, const TensorView& x, const TensorView& y, const TensorView& gate,
                             const TensorView& weight, const TensorView& bias, const TensorView& scale,
                             const TensorView& shift, const TensorView& out) override;
    void gemm_gelu(const GemmParams& p, const TensorView& a, const TensorView& b, const TensorView& bias,
                   const TensorView& out) override;
    void paged_attention(const AttentionParams& p, const TensorView& q, const PagedKvView& history, int layer,
                         const TensorView& k_cur, const TensorView& v_cur, const TensorView& out) override;
    void paged_attention_batched(const AttentionParams& p, const TensorView& q, std::span<const PagedKvView> histories,
                                 int layer, const TensorView& k_cur, const TensorView& v_cur,
                                 const TensorView& out) override;
    void scatter_kv(const PagedKvView& pool, int layer, const TensorView& slots, const TensorView& k,
                    const TensorView& v, int64_t num_slots) override;

private:
    /// Runs `f` on the inner backend between the op's events, under this backend's autocast state.
    template <class F>
    void run(std::string key, F&& f);

    std::unique_ptr<Backend> inner_;
    Profiler profiler_;
};

}  // namespace dzr
