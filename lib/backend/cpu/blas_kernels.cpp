#include "backend/blas_kernels.h"

#include <cblas.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "backend/env_settings.h"

namespace dzr {

std::string blas_core_name() {
    const char* name = openblas_get_corename();
    return name != nullptr ? std::string(name) : std::string();
}

std::string better_blas_core(const std::string& core_name, bool avx512, bool avx2_fma) {
    // NOTE: only OpenBLAS's fallback is overridden; a core it recognised is its own best choice.
    if (strcasecmp(core_name.c_str(), "Prescott") != 0) return {};
    if (avx512) return "SkylakeX";
    if (avx2_fma) return "Haswell";
    return {};
}

void use_best_blas_kernels(char** argv) {
    if (std::getenv("OPENBLAS_CORETYPE") != nullptr || env_value("DZR_BLAS_CORE_SET")) return;
    if (env_value("DZR_BLAS_CORE") == "keep") return;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
                        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                        __builtin_cpu_supports("avx512vl");
    const bool avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
    const bool avx512 = false, avx2_fma = false;
#endif
    const std::string core = better_blas_core(blas_core_name(), avx512, avx2_fma);
    if (core.empty() || argv == nullptr || argv[0] == nullptr) return;
    if (setenv("OPENBLAS_CORETYPE", core.c_str(), 1) != 0 || setenv("DZR_BLAS_CORE_SET", "1", 1) != 0) return;
    execv("/proc/self/exe", argv);
    // The exec failed (no /proc): go on as started, leaving neither variable to the children (nor to `dzr info`).
    unsetenv("OPENBLAS_CORETYPE");
    unsetenv("DZR_BLAS_CORE_SET");
}

}  // namespace dzr
