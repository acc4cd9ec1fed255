// conv3d through cuDNN's convolution API on NCDHW (N = 1), with the algorithm chosen once per shape.
// cuDNN pads symmetrically only, so asymmetric (causal) padding is materialized into a workspace
// buffer first. With Conv3dParams::frames_2d the frames go through cuDNN's 2-D convolution as a batch
// ([T, C, H, W], transposed into the workspace and back), as PyTorch runs a Conv2d over (b t) frames.
// Shapes cuDNN has no algorithm for run dzr's direct kernel.
#include <fmt/format.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_internal.h"
#include "core/log.h"
#include "kernels/conv3d.cuh"
#include "kernels/elementwise.cuh"

namespace dzr {

using cuda_detail::ConvPlan;
using cuda_detail::DeviceGuard;

namespace {

cudnnDataType_t cudnn_type(DType t) { return t == DType::BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT; }

/// A packed tensor of nd = 4 or 5 dims (N, C, spatial...): row-major, or channels-last (N, spatial..., C in
/// memory) when `nhwc`.
void set_tensor(cudnnTensorDescriptor_t desc, DType t, int nd, const int64_t dims[5], bool nhwc = false) {
    int d[5] = {}, s[5] = {};
    for (int i = 0; i < nd; ++i) d[i] = int(dims[i]);
    if (nhwc) {
        s[1] = 1;
        int acc = d[1];
        for (int i = nd - 1; i >= 2; --i) {
            s[i] = acc;
            acc *= d[i];
        }
        s[0] = acc;
    } else {
        s[nd - 1] = 1;
        for (int i = nd - 2; i >= 0; --i) s[i] = s[i + 1] * d[i + 1];
    }
    DZR_CUDNN_CHECK(cudnnSetTensorNdDescriptor(desc, cudnn_type(t), nd, d, s));
}

}  // namespace

ConvPlan& CudaBackend::conv_plan(const std::string& key, DType dtype, int nd, const int64_t x_dims[5],
                                 const int64_t w_dims[5], const int64_t y_dims[5], const int pad[3], const int stride[3],
                                 bool nhwc) {
    auto it = conv_plans_.find(key);
    if (it != conv_plans_.end()) return *it->second;
    auto plan = std::make_unique<ConvPlan>();
    try {
        build_conv_plan(*plan, key, dtype, nd, x_dims, w_dims, y_dims, pad, stride, nhwc);
    } catch (const Error& e) {
        // NOTE: a cuDNN that cannot describe or plan this convolution must not stop the run: the direct
        // kernel computes the same thing, slower, and the warning says so.
        plan->has_algo = false;
        log()->warn("cuDNN cannot plan conv3d {}: {}; using the direct kernel", key, e.what());
    }
    return *conv_plans_.emplace(key, std::move(plan)).first->second;
}

void CudaBackend::build_conv_plan(ConvPlan& plan, const std::string& key, DType dtype, int nd,
                                  const int64_t x_dims[5], const int64_t w_dims[5], const int64_t y_dims[5],
                                  const int pad[3], const int stride[3], bool nhwc) {
    cudnnHandle_t handle = cudnn();
    DZR_CUDNN_CHECK(cudnnCreateTensorDescriptor(&plan.x));
    DZR_CUDNN_CHECK(cudnnCreateTensorDescriptor(&plan.y));
    DZR_CUDNN_CHECK(cudnnCreateFilterDescriptor(&plan.w));
    DZR_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&plan.conv));
    set_tensor(plan.x, dtype, nd, x_dims, nhwc);
    set_tensor(plan.y, dtype, nd, y_dims, nhwc);
    int wd[5];
    for (int i = 0; i < nd; ++i) wd[i] = int(w_dims[i]);
    DZR_CUDNN_CHECK(cudnnSetFilterNdDescriptor(plan.w, cudnn_type(dtype), nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
                                               nd, wd));
    const int dilation[3] = {1, 1, 1};
    DZR_CUDNN_CHECK(cudnnSetConvolutionNdDescriptor(plan.conv, nd - 2, pad, stride, dilation,
                                                    CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    // NOTE: f32 convolutions stay on FMA math so cuDNN cannot pick TF32 tensor-core kernels.
    const cudnnMathType_t math = dtype == DType::F32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH;
    DZR_CUDNN_CHECK(cudnnSetConvolutionMathType(plan.conv, math));

    int out_dims[5] = {};
    DZR_CUDNN_CHECK(cudnnGetConvolutionNdForwardOutputDim(plan.conv, plan.x, plan.w, nd, out_dims));
    for (int i = 0; i < nd; ++i)
        DZR_CHECK(out_dims[i] == y_dims[i], "cuda backend: conv3d: cuDNN computes output dim {} = {}, expected {}", i,
                  out_dims[i], y_dims[i]);

    constexpr int kRequested = 16;
    cudnnConvolutionFwdAlgoPerf_t perf[kRequested];
    int returned = 0;
    const cudnnStatus_t st =
        cudnnGetConvolutionForwardAlgorithm_v7(handle, plan.x, plan.w, plan.conv, plan.y, kRequested, &returned, perf);
    const size_t ws_limit = arena_.measuring() ? SIZE_MAX : arena_.capacity() - arena_.used();
    for (int i = 0; st == CUDNN_STATUS_SUCCESS && i < returned && !plan.has_algo; ++i) {
        if (perf[i].status != CUDNN_STATUS_SUCCESS || perf[i].memory > ws_limit) continue;
        if (dtype == DType::F32 && perf[i].mathType != CUDNN_FMA_MATH && perf[i].mathType != CUDNN_DEFAULT_MATH)
            continue;
        // The heuristic's estimate can differ from what the kernel needs; ask for the real size.
        size_t ws = 0;
        if (dtype != DType::F32) DZR_CUDNN_CHECK(cudnnSetConvolutionMathType(plan.conv, perf[i].mathType));
        if (cudnnGetConvolutionForwardWorkspaceSize(handle, plan.x, plan.w, plan.conv, plan.y, perf[i].algo, &ws) !=
                CUDNN_STATUS_SUCCESS ||
            ws > ws_limit)
            continue;
        plan.algo = perf[i].algo;
        plan.workspace_bytes = ws;
        plan.has_algo = true;
    }
    if (!plan.has_algo)
        log()->warn("cuDNN has no conv3d algorithm for {} ({}); using the direct kernel", key,
                    st == CUDNN_STATUS_SUCCESS ? "none fits" : cudnnGetErrorString(st));
}

void CudaBackend::conv3d(const Conv3dParams& p, const TensorView& x, const TensorView& w, const TensorView& bias,
                         const TensorView& out) {
    for (const auto& [t, what] : {std::pair{&x, "x"}, std::pair{&w, "w"}, std::pair{&out, "out"}}) {
        check_device_tensor(*t, "conv3d", what);
        DZR_CHECK(t->is_contiguous(), "cuda backend: conv3d needs a contiguous {} ({})", what, t->str());
    }
    DZR_CHECK(x.rank() == 4 && w.rank() == 5 && out.rank() == 4,
              "cuda backend: conv3d needs x [C,T,H,W], w [Co,Ci,kt,kh,kw], out [Co,To,Ho,Wo]: {} {} {}", x.str(),
              w.str(), out.str());
    DZR_CHECK(cuda_detail::is_float_act(x.dtype) && w.dtype == x.dtype && out.dtype == x.dtype,
              "cuda backend: conv3d needs x, w, out of one dtype (f32 or bf16): {} {} {}", x.str(), w.str(), out.str());
    const int64_t Ci = x.dim(0), Co = w.dim(0);
    DZR_CHECK(w.dim(1) == Ci, "cuda backend: conv3d weight {} vs input channels {}", w.str(), Ci);
    int64_t in[3], k[3], o[3];
    for (int i = 0; i < 3; ++i) {
        in[i] = x.dim(i + 1);
        k[i] = w.dim(i + 2);
        DZR_CHECK(p.stride[i] >= 1 && p.pad_before[i] >= 0 && p.pad_after[i] >= 0,
                  "cuda backend: conv3d needs strides >= 1 and paddings >= 0");
        o[i] = (in[i] + p.pad_before[i] + p.pad_after[i] - k[i]) / p.stride[i] + 1;
    }
    DZR_CHECK(out.dim(0) == Co && out.dim(1) == o[0] && out.dim(2) == o[1] && out.dim(3) == o[2],
              "cuda backend: conv3d out {} should be [{}, {}, {}, {}]", out.str(), Co, o[0], o[1], o[2]);
    if (bias.defined()) {
        check_device_tensor(bias, "conv3d", "bias");
        DZR_CHECK(cuda_detail::is_float_act(bias.dtype) && bias.is_contiguous() && bias.numel() == Co,
                  "cuda backend: conv3d bias {} must be a contiguous f32 or bf16 vector of {}", bias.str(), Co);
    }
    const bool frames_2d = p.frames_2d, nhwc = p.frames_2d && p.channels_last;
    DZR_CHECK(!p.channels_last || frames_2d, "cuda backend: conv3d: channels_last needs frames_2d");
    DZR_CHECK(!frames_2d || (k[0] == 1 && p.stride[0] == 1 && p.pad_before[0] == 0 && p.pad_after[0] == 0),
              "cuda backend: conv3d as per-frame 2-D convolutions needs a temporal kernel of 1, temporal stride 1 and no "
              "temporal padding: w {}",
              w.str());
    if (out.numel() == 0) return;
    DeviceGuard guard(index_);
    ArenaScope scope(arena_);

    bool done = false;
    if (!fallback_only_ && Ci > 0) {
        // cuDNN pads symmetrically: asymmetric padding is applied by copying into a padded buffer.
        bool symmetric = true;
        for (int i = 0; i < 3; ++i) symmetric = symmetric && p.pad_before[i] == p.pad_after[i];
        const void* src = x.data;
        int64_t x_dims[5] = {1, Ci, in[0], in[1], in[2]};
        int pad[3] = {p.pad_before[0], p.pad_before[1], p.pad_before[2]};
        if (!symmetric) {
            for (int i = 0; i < 3; ++i) {
                x_dims[i + 2] = in[i] + p.pad_before[i] + p.pad_after[i];
                pad[i] = 0;
            }
            void* padded = arena_.alloc(size_t(Ci * x_dims[2] * x_dims[3] * x_dims[4]) * dtype_size(x.dtype));
            DZR_CUDA_CHECK(kernels::pad3d(x.data, padded, x.dtype, Ci, in, p.pad_before, p.pad_after, stream_));
            src = padded;
        }
        const int64_t w_dims[5] = {Co, Ci, k[0], k[1], k[2]};
        const int64_t y_dims[5] = {1, Co, o[0], o[1], o[2]};
        const std::string key =
            fmt::format("{}{} x[{},{},{},{}] w[{},{},{},{}] pad[{},{},{}] stride[{},{},{}]",
                        nhwc ? "2d nhwc " : frames_2d ? "2d " : "",
                        dtype_name(x.dtype), Ci, x_dims[2], x_dims[3], x_dims[4], Co, k[0], k[1], k[2], pad[0],
                        pad[1], pad[2], p.stride[0], p.stride[1], p.stride[2]);
        // 2-D: [Ci, T, H, W] -> [T, Ci, H, W] frames, a [T, Co, Ho, Wo] result, transposed back below
        const int64_t T = x_dims[2], frame_elems = Ci * x_dims[3] * x_dims[4], out_elems = Co * o[1] * o[2];
        const int64_t x4[5] = {T, Ci, x_dims[3], x_dims[4], 0}, w4[5] = {Co, Ci, k[1], k[2], 0},
                      y4[5] = {T, Co, o[1], o[2], 0};
        const int pad2[3] = {pad[1], pad[2], 0}, stride2[3] = {p.stride[1], p.stride[2], 1};
        ConvPlan& plan = frames_2d ? conv_plan(key, x.dtype, 4, x4, w4, y4, pad2, stride2, nhwc)
                                   : conv_plan(key, x.dtype, 5, x_dims, w_dims, y_dims, pad, p.stride);
        if (plan.has_algo) {
            void* dst = out.data;
            const void* wsrc = w.data;
            if (frames_2d) {
                // [Ci, T, H, W] -> frames [T, Ci, H, W], or [T, H, W, Ci] with the weight as [Co, kh, kw, Ci]
                const size_t es = dtype_size(x.dtype);
                const int64_t H = x_dims[3], W = x_dims[4];
                void* frames = arena_.alloc(size_t(T * frame_elems) * es);
                const TensorView in(const_cast<void*>(src), x.dtype, Shape{Ci, T, H, W}, x.device);
                if (nhwc) {
                    copy(in.permute({1, 2, 3, 0}), TensorView(frames, x.dtype, Shape{T, H, W, Ci}, x.device));
                    void* wl = arena_.alloc(size_t(w.numel()) * es);
                    copy(w.reshape(Shape{Co, Ci, k[1], k[2]}).permute({0, 2, 3, 1}),
                         TensorView(wl, w.dtype, Shape{Co, k[1], k[2], Ci}, w.device));
                    wsrc = wl;
                } else {
                    copy(in.permute({1, 0, 2, 3}), TensorView(frames, x.dtype, Shape{T, Ci, H, W}, x.device));
                }
                src = frames;
                dst = arena_.alloc(size_t(T * out_elems) * es);
            }
            void* ws = plan.workspace_bytes > 0 ? arena_.alloc(plan.workspace_bytes) : nullptr;
            const float alpha = 1.f, beta = 0.f;
            const cudnnStatus_t st = cudnnConvolutionForward(cudnn(), &alpha, plan.x, src, plan.w, wsrc, plan.conv,
                                                             plan.algo, ws, plan.workspace_bytes, &beta, plan.y, dst);
            if (st == CUDNN_STATUS_SUCCESS && nhwc)
                copy(TensorView(dst, x.dtype, Shape{T, o[1], o[2], Co}, x.device).permute({3, 0, 1, 2}), out);
            else if (st == CUDNN_STATUS_SUCCESS && frames_2d)
                copy(TensorView(dst, x.dtype, Shape{T, Co, o[1], o[2]}, x.device).permute({1, 0, 2, 3}), out);
            if (st == CUDNN_STATUS_SUCCESS) {
                if (bias.defined())
                    DZR_CUDA_CHECK(kernels::channel_bias(out.data, out.dtype, Co, o[0] * o[1] * o[2], bias.data,
                                                         bias.dtype, stream_));
                done = true;
            } else {
                // NOTE: launch-time refusals (not supported, bad parameters) fall back for good; a fault
                // that broke the context makes the direct kernel's launch check throw below.
                plan.has_algo = false;
                log()->warn("cudnnConvolutionForward failed for {}: {}; using the direct kernel", key,
                            cudnnGetErrorString(st));
            }
        }
    }
    if (!done) {
        kernels::Conv3dDirectArgs a;
        a.dtype = x.dtype;
        a.x = x.data;
        a.w = w.data;
        a.bias = bias.defined() ? bias.data : nullptr;
        a.bias_dtype = bias.dtype;
        a.out = out.data;
        a.Ci = Ci, a.Co = Co;
        for (int i = 0; i < 3; ++i) {
            a.in[i] = in[i];
            a.k[i] = k[i];
            a.o[i] = o[i];
            a.stride[i] = p.stride[i];
            a.pad_before[i] = p.pad_before[i];
        }
        DZR_CUDA_CHECK(kernels::conv3d_direct(a, stream_));
    }
}

}  // namespace dzr
