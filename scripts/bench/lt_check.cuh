// The status checks of the standalone probes (lt_algos.cu, lt_search.cu, rows_bw.cu): print where and exit.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CHECK_CUDA(x)                                                                          \
    do {                                                                                       \
        cudaError_t e = (x);                                                                   \
        if (e != cudaSuccess) {                                                                \
            std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e));     \
            std::exit(1);                                                                      \
        }                                                                                      \
    } while (0)
#define CHECK_LT(x)                                                                            \
    do {                                                                                       \
        cublasStatus_t st_ = (x);                                                              \
        if (st_ != CUBLAS_STATUS_SUCCESS) {                                                    \
            std::fprintf(stderr, "%s:%d cublasLt %d\n", __FILE__, __LINE__, int(st_));         \
            std::exit(1);                                                                      \
        }                                                                                      \
    } while (0)
