#pragma once
// The descriptor builder of the CUDA backend's cuDNN SDPA graphs (backend API, no cudnn-frontend): the dense
// graphs of cuda_attention.cpp and the paged ones of cuda_paged_sdpa.cpp. Internal to lib/backend/cuda.
//
// NOTE: fmt's headers are included with two g++ 13 false-positive warnings off, as in cuda_gemm.cpp.
#include <cudnn.h>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Warray-bounds"
#pragma GCC diagnostic ignored "-Wstringop-overflow"
#include <fmt/format.h>
#pragma GCC diagnostic pop

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace dzr::cuda_detail {

/// A failed backend-API call while building an SDPA plan: the stage, cuDNN's status and its last error
/// message.
struct CudnnFailure {
    std::string what;
};

[[noreturn]] inline void cudnn_fail(const char* stage, cudnnStatus_t st) {
    char detail[512] = {0};
    cudnnGetLastErrorString(detail, sizeof(detail));
    throw CudnnFailure{
        fmt::format("{}: {} ({})", stage, cudnnGetErrorString(st), detail[0] ? detail : "no detail")};
}

/// Optional operands of a matmul: the per-batch row (M), column (N) and inner (K) counts read from device
/// int32 tensors (the variable sequence lengths of a padded or paged attention).
struct MatmulOverrides {
    cudnnBackendDescriptor_t m = nullptr, n = nullptr, k = nullptr;
};

/// Optional settings of a pointwise operation: its math precision, a third operand (BINARY_SELECT's mask) and
/// GEN_INDEX's axis.
struct PointwiseExtras {
    cudnnDataType_t precision = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t t = nullptr;
    int64_t axis = -1;
};

/// Descriptors made while building a plan; all are destroyed with the plan (or on failure).
class SdpaBuilder {
  public:
    explicit SdpaBuilder(std::vector<cudnnBackendDescriptor_t>& keep) : keep_(keep) {}

    cudnnBackendDescriptor_t make(cudnnBackendDescriptorType_t type, const char* stage) {
        cudnnBackendDescriptor_t d = nullptr;
        const cudnnStatus_t st = cudnnBackendCreateDescriptor(type, &d);
        if (st != CUDNN_STATUS_SUCCESS) cudnn_fail(stage, st);
        keep_.push_back(d);
        return d;
    }
    static void set(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                    cudnnBackendAttributeType_t type, int64_t count, const void* value, const char* stage) {
        const cudnnStatus_t st = cudnnBackendSetAttribute(d, name, type, count, value);
        if (st != CUDNN_STATUS_SUCCESS) cudnn_fail(stage, st);
    }
    static void set_desc(cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                         cudnnBackendDescriptor_t v, const char* stage) {
        set(d, name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &v, stage);
    }
    static void finalize(cudnnBackendDescriptor_t d, const char* stage) {
        const cudnnStatus_t st = cudnnBackendFinalize(d);
        if (st != CUDNN_STATUS_SUCCESS) cudnn_fail(stage, st);
    }

    cudnnBackendDescriptor_t tensor(int64_t uid, cudnnDataType_t type, std::array<int64_t, 4> dims,
                                    std::array<int64_t, 4> strides, bool is_virtual, bool by_value = false) {
        const char* stage = "tensor descriptor";
        cudnnBackendDescriptor_t t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR, stage);
        const int64_t align = 16;
        set(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type, stage);
        set(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data(), stage);
        set(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data(), stage);
        set(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, stage);
        set(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, stage);
        set(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual, stage);
        if (by_value) set(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, stage);
        finalize(t, stage);
        return t;
    }

    cudnnBackendDescriptor_t matmul(cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                                    cudnnBackendDescriptor_t c, const MatmulOverrides& over = {}) {
        const char* stage = "matmul operation";
        cudnnBackendDescriptor_t desc = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR, stage);
        const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
        set(desc, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, stage);
        finalize(desc, stage);
        cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, stage);
        set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, a, stage);
        set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, b, stage);
        set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, c, stage);
        set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, desc, stage);
        if (over.m) set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, over.m, stage);
        if (over.n) set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, over.n, stage);
        if (over.k) set_desc(op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, over.k, stage);
        finalize(op, stage);
        return op;
    }

    cudnnBackendDescriptor_t pointwise(cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x,
                                       cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t y,
                                       const PointwiseExtras& extra = {}) {
        const char* stage = "pointwise operation";
        cudnnBackendDescriptor_t desc = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, stage);
        set(desc, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, stage);
        set(desc, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &extra.precision, stage);
        if (mode == CUDNN_POINTWISE_GEN_INDEX)
            set(desc, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &extra.axis, stage);
        finalize(desc, stage);
        cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, stage);
        set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, desc, stage);
        set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x, stage);
        if (b) set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, b, stage);
        if (extra.t) set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, extra.t, stage);
        set_desc(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y, stage);
        const float one = 1.0f;
        set(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one, stage);
        set(op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one, stage);
        finalize(op, stage);
        return op;
    }

    cudnnBackendDescriptor_t reduction(cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x,
                                       cudnnBackendDescriptor_t y) {
        const char* stage = "reduction operation";
        cudnnBackendDescriptor_t desc = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, stage);
        const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
        set(desc, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp, stage);
        set(desc, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, stage);
        finalize(desc, stage);
        cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, stage);
        set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, desc, stage);
        set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x, stage);
        set_desc(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y, stage);
        finalize(op, stage);
        return op;
    }

#if CUDNN_VERSION >= 90500
    /// y (virtual) = the rows of `container` ([blocks, H, block_size, D]) that `page_table` ([B, 1, pages, 1]
    /// int32) lists, up to `seq_len` ([B, 1, 1, 1] int32) tokens; y's strides say whether it is K^T or V.
    cudnnBackendDescriptor_t paged_cache_load(cudnnBackendDescriptor_t container,
                                              cudnnBackendDescriptor_t page_table,
                                              cudnnBackendDescriptor_t seq_len, cudnnBackendDescriptor_t y) {
        const char* stage = "paged cache load operation";
        cudnnBackendDescriptor_t op = make(CUDNN_BACKEND_OPERATION_PAGED_CACHE_LOAD_DESCRIPTOR, stage);
        set_desc(op, CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_CONTAINER_DESC, container, stage);
        set_desc(op, CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_PAGE_TABLE_DESC, page_table, stage);
        set_desc(op, CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_SEQUENCE_DESC, seq_len, stage);
        set_desc(op, CUDNN_ATTR_OPERATION_PAGED_CACHE_LOAD_YDESC, y, stage);
        finalize(op, stage);
        return op;
    }
#endif

  private:
    std::vector<cudnnBackendDescriptor_t>& keep_;
};

}  // namespace dzr::cuda_detail
