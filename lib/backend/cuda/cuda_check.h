#pragma once
/// Error checks for CUDA runtime, cuBLAS(Lt) and cuDNN calls. One generic macro reports the failing
/// expression, file:line, the current device and the library's own error string, and throws dzr::Error.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <string>

#include "core/error.h"

namespace dzr::cuda_detail {

/// Throws dzr::Error: "<lib> error <code> (<what>) in `<expr>` at <file>:<line> on cuda:<device>".
[[noreturn]] void throw_library_error(const char* lib, int code, const char* what, const char* expr, const char* file,
                                      int line);

inline const char* error_string(cudaError_t s) { return cudaGetErrorString(s); }
inline const char* error_string(cublasStatus_t s) { return cublasLtGetStatusString(s); }
inline const char* error_string(cudnnStatus_t s) { return cudnnGetErrorString(s); }

}  // namespace dzr::cuda_detail

/// Evaluates `expr` once; if the status differs from `ok`, throws with the library's error string.
#define DZR_CHECK_GEN(lib, expr, ok)                                                                         \
    do {                                                                                                     \
        const auto dzr_status_ = (expr);                                                                     \
        if (dzr_status_ != (ok))                                                                             \
            ::dzr::cuda_detail::throw_library_error(lib, static_cast<int>(dzr_status_),                      \
                                                    ::dzr::cuda_detail::error_string(dzr_status_), #expr,    \
                                                    __FILE__, __LINE__);                                     \
    } while (0)

#define DZR_CUDA_CHECK(expr) DZR_CHECK_GEN("CUDA", expr, cudaSuccess)
#define DZR_CUBLAS_CHECK(expr) DZR_CHECK_GEN("cuBLAS", expr, CUBLAS_STATUS_SUCCESS)
#define DZR_CUDNN_CHECK(expr) DZR_CHECK_GEN("cuDNN", expr, CUDNN_STATUS_SUCCESS)
