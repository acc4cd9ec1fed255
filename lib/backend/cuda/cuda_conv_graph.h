#pragma once
// The pieces of cuDNN's graph API that the convolution planners share: the reference planner (cuda_conv.cpp, the
// engine PyTorch picks) and fast numerics' autotuner (cuda_conv_fast.cpp). Internal to lib/backend/cuda.
#include <cudnn.h>

#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace dzr::cuda_detail {

inline cudnnDataType_t cudnn_type(DType t) { return t == DType::BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT; }

/// Strides of a packed tensor of nd = 4 or 5 dims (N, C, spatial...): row-major, or channels-last (N,
/// spatial..., C in memory) when `nhwc`.
inline void packed_strides(int nd, const int64_t dims[5], bool nhwc, int64_t strides[5]) {
    if (nhwc) {
        strides[1] = 1;
        int64_t acc = dims[1];
        for (int i = nd - 1; i >= 2; --i) {
            strides[i] = acc;
            acc *= dims[i];
        }
        strides[0] = acc;
    } else {
        strides[nd - 1] = 1;
        for (int i = nd - 2; i >= 0; --i) strides[i] = strides[i + 1] * dims[i + 1];
    }
}

/// A failed graph-API call while planning: the legacy API plans the convolution instead.
struct GraphFailure {
    std::string what;
};

inline void graph_check(cudnnStatus_t st, const char* what) {
    if (st != CUDNN_STATUS_SUCCESS) throw GraphFailure{fmt::format("{}: {}", what, cudnnGetErrorString(st))};
}

/// Descriptors made while building a graph plan; all are destroyed with the plan.
class GraphBuilder {
  public:
    explicit GraphBuilder(std::vector<cudnnBackendDescriptor_t>& keep) : keep_(keep) {}

    cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t type) {
        cudnnBackendDescriptor_t d = nullptr;
        graph_check(cudnnBackendCreateDescriptor(type, &d), "create descriptor");
        keep_.push_back(d);
        return d;
    }
    static void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type,
                    int64_t count, const void* value) {
        graph_check(cudnnBackendSetAttribute(d, name, type, count, value), "set attribute");
    }
    static void set_desc(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name, cudnnBackendDescriptor_t v) {
        set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v);
    }

    /// A packed tensor (packed_strides), 16-byte aligned.
    cudnnBackendDescriptor_t tensor(int64_t uid, DType t, int nd, const int64_t dims[5], bool nhwc) {
        int64_t d[5] = {}, st[5] = {};
        for (int i = 0; i < nd; ++i) d[i] = dims[i];
        packed_strides(nd, d, nhwc, st);
        cudnnBackendDescriptor_t desc = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
        const cudnnDataType_t type = cudnn_type(t);
        const int64_t align = 16;
        set(desc, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
        set(desc, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, nd, d);
        set(desc, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, nd, st);
        set(desc, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
        set(desc, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
        graph_check(cudnnBackendFinalize(desc), "tensor descriptor");
        return desc;
    }

  private:
    std::vector<cudnnBackendDescriptor_t>& keep_;
};

/// Unique ids of the convolution's operands in its graph.
constexpr int64_t kUidX = 1, kUidW = 2, kUidY = 3;

/// The numerical notes of a config's engine as a bit mask (bit n: cudnnBackendNumericalNote_t n; every bit set
/// when the engine cannot be read, so such a config is skipped), and its global index; with `behavior`, its behavior
/// notes likewise (bit n: cudnnBackendBehaviorNote_t n).
uint32_t engine_notes(cudnnBackendDescriptor_t cfg, int64_t* index, uint32_t* behavior = nullptr);

/// The convolution y = conv(x, w) (cross-correlation, f32 compute, symmetric padding `pad`, `stride`) as a
/// finalized one-node operation graph on packed tensors (packed_strides; `nhwc`: x, w and y channels-last). Its
/// descriptors are kept in `b`. Throws GraphFailure.
cudnnBackendDescriptor_t make_conv_graph(GraphBuilder& b, cudnnHandle_t handle, DType dtype, int nd,
                                         const int64_t x_dims[5], const int64_t w_dims[5], const int64_t y_dims[5],
                                         const int pad[3], const int stride[3], bool nhwc);

/// Runs an execution plan of such a graph on x, w, y and a workspace of the plan's size; the cuDNN status.
cudnnStatus_t execute_conv_plan(cudnnHandle_t handle, cudnnBackendDescriptor_t plan, const void* x, const void* w,
                                void* y, void* workspace);

}  // namespace dzr::cuda_detail
