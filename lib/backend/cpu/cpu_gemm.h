#pragma once
/// The CPU backend's f32 GEMM: OpenBLAS on a fixed grid of tiles, so that the result does not depend on the
/// thread count (OPENBLAS_NUM_THREADS, the ranks sharing a machine): `mpirun -np N` and one process give the
/// same bits (docs/RELIABILITY.md).
#include <cstdint>

namespace dzr::cpu {

/// C = alpha * op(A) op(B) + beta * C, row-major; op transposes when asked. K may be 0 only when beta scales C
/// (callers handle it).
struct SgemmArgs {
    bool trans_a = false, trans_b = false;
    int64_t M = 0, N = 0, K = 0;
    float alpha = 1.f;
    const float* a = nullptr;
    int64_t lda = 0;
    const float* b = nullptr;
    int64_t ldb = 0;
    float beta = 0.f;
    float* c = nullptr;
    int64_t ldc = 0;
};
void sgemm(const SgemmArgs& args);

/// The threads the tiles run on (the count OpenBLAS was given, read once); tests set it to show it does not
/// change any bit.
int gemm_threads();
void set_gemm_threads(int threads);

}  // namespace dzr::cpu
