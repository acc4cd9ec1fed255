#pragma once
/// OpenBLAS's kernels for this CPU.
///
/// OpenBLAS built with DYNAMIC_ARCH (Debian's and Ubuntu's packages) picks its kernel table once, when the library
/// loads: from OPENBLAS_CORETYPE when that is set, else from the CPU's model number. A CPU newer than its table
/// (Debian 12's OpenBLAS 0.3.21 on a Sapphire Rapids Xeon reports itself as "Intel(R) Xeon(R) Processor") falls back
/// to the Prescott (SSE3) kernels, and the CPU backend's GEMMs then run about 5x slower than with the AVX-512 ones
/// (a [465 x 512 x 128] pair: 4.0 ms against 0.8 ms, 2 threads, docs/PERF.md). Since the choice is made before main,
/// it can only be changed by starting the program again with OPENBLAS_CORETYPE set.
#include <string>

namespace dzr {

/// The kernel table OpenBLAS runs on ("SkylakeX", "Haswell", "Prescott", ...).
std::string blas_core_name();

/// The OPENBLAS_CORETYPE this CPU can run better than OpenBLAS's fallback: "SkylakeX" (AVX-512 F, CD, BW, DQ, VL),
/// "Haswell" (AVX2 and FMA); empty when OpenBLAS did not fall back to Prescott or the CPU has neither.
/// `core_name` is blas_core_name()'s answer (a parameter, so the rule can be tested).
std::string better_blas_core(const std::string& core_name, bool avx512, bool avx2_fma);

/// At the top of main, before any thread starts: when OPENBLAS_CORETYPE is unset and better_blas_core() names a
/// core, sets OPENBLAS_CORETYPE to it and executes the same program again (/proc/self/exe, the same argv and
/// environment; DZR_BLAS_CORE_SET marks the second start, so this happens once). Returns when there is nothing to do
/// or the exec failed (the program then goes on with the slower kernels). DZR_BLAS_CORE=keep turns it off.
void use_best_blas_kernels(char** argv);

}  // namespace dzr
