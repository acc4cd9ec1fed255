#pragma once
/// A Backend that computes nothing and only measures: allocations return views of a fake, never
/// dereferenced address, and the workspace arena records its high-water mark. Running a model's
/// forwards on it (with shape-only weights) sizes the real backend's workspace at load.
#include <cstdint>

#include "backend/backend.h"

namespace dzr {

class MeasuringBackend final : public Backend {
public:
    /// planner: the backend that will run the calls, asked for the library workspace of its convolutions
    /// (Backend::conv3d_workspace_bytes); may be null.
    explicit MeasuringBackend(DType compute_dtype, Backend* planner = nullptr);

    /// A fake address for data-less tensors: never dereferenced, but arithmetic on it is defined.
    static void* fake_address();
    /// A data-less tensor of the given shape (for shape-only weight sources).
    static Tensor shape_only(Shape shape, DType dtype);

    Device device() const override { return Device::cpu(); }
    std::string name() const override { return "measuring"; }
    DType compute_dtype() const override { return dtype_; }
    /// Distinct fake addresses per allocation, so aliasing checks see distinct tensors.
    Tensor alloc(Shape shape, DType dtype) override;
    Arena& workspace() override { return arena_; }
    void reserve_workspace(size_t) override {}
    void upload(const TensorView&, const TensorView&) override {}
    void download(const TensorView&, const TensorView&) override {}
    void copy(const TensorView& src, const TensorView& dst) override;
    void fill(const TensorView&, float) override {}
    void synchronize() override {}
    void gemm(const GemmParams&, const TensorView&, const TensorView&, const TensorView&, const TensorView&) override {}
    void binary(const BinaryParams&, const TensorView&, const TensorView&, const TensorView&) override {}
    void scale(const ScaleParams&, const TensorView&, const TensorView&) override {}
    void activation(const ActivationParams&, const TensorView&, const TensorView&) override {}
    void layer_norm(const LayerNormParams&, const TensorView&, const TensorView&, const TensorView&,
                    const TensorView&) override {}
    void rms_norm(const RmsNormParams&, const TensorView&, const TensorView&, const TensorView&) override {}
    void l2_norm(const L2NormParams&, const TensorView&, const TensorView&, const TensorView&) override {}
    void softmax(const SoftmaxParams&, const TensorView&, const TensorView&) override {}
    void reduce(const ReduceParams&, const TensorView&, const TensorView&) override {}
    void rope(const RopeParams&, const TensorView&, const TensorView&, const TensorView&) override {}
    void attention(const AttentionParams&, const TensorView&, const TensorView&, const TensorView&,
                   const TensorView&, const TensorView&) override {}
    /// Reserves what the CUDA backend's cuDNN path takes besides cuDNN's own workspace: the padded input
    /// (asymmetric padding), and for frames_2d the input and output transposed to frames.
    void conv3d(const Conv3dParams& p, const TensorView& x, const TensorView& w, const TensorView&,
                const TensorView& out) override;
    /// Reserves what the CUDA backend's gather path takes: [history | current] K and V rows.
    void paged_attention(const AttentionParams&, const TensorView&, const PagedKvView& history, int,
                         const TensorView& k_cur, const TensorView&, const TensorView&) override {
        ArenaScope scope(arena_);
        const Shape rows{history.seq_len + k_cur.dim(0), history.num_heads, history.head_dim};
        arena_.alloc_view(rows, history.dtype);
        arena_.alloc_view(rows, history.dtype);
    }
    void scatter_kv(const PagedKvView&, int, const TensorView&, const TensorView&, const TensorView&,
                    int64_t) override {}
    void count_nonfinite(const TensorView&, const TensorView&) override {}

private:
    Backend* planner_ = nullptr;
    DType dtype_;
    Arena arena_;
    uintptr_t next_alloc_ = 0;
};

}  // namespace dzr
