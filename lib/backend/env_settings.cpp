#include "backend/env_settings.h"

#include <fmt/format.h>

#include <cstdlib>

#include "core/error.h"

namespace dzr {

namespace {

// NOTE: `changes_numbers` is true unless the variable is known to keep every bit (a test compares them)
constexpr EnvSetting kEnvSettings[] = {
    {"DZR_ATTENTION", "auto, cudnn-unified, cudnn-composite, flash, mem-efficient, gemm", "auto", true,
     "the CUDA attention implementation"},
    {"DZR_PLAIN_GEMM", "cublas, lt", "cublas", true, "the library of the bias-free bf16 GEMMs"},
    {"DZR_CONV_API", "graph, legacy", "graph", true, "the cuDNN convolution API"},
    {"DZR_CONV_TUNE", "auto, off, channels-last", "auto", true,
     "fast numerics' VAE convolutions: engines chosen by timing (off: fixed, bit-reproducible)"},
    {"DZR_GEMM_TUNE", "on, off (or 1, 0, true, false)", "on", true,
     "fast numerics' large GEMMs: cuBLASLt algorithms chosen by timing (off: fixed, bit-reproducible)"},
    {"DZR_LT_WORKSPACE", "KiB", "1024", true, "the cuBLASLt workspace (changes the algorithms it may pick)"},
    {"DZR_LT_ALIGN", "dzr, torch", "dzr", true, "the alignment rule cuBLASLt is told the operands follow"},
    {"DZR_BATCHED_ATTENTION", "on, off", "on", true, "the CFG branches' self-attention as one cuDNN call of batch 2"},
    {"DZR_SHARE_LAYER0", "on, off", "on", true, "layer 0's self-attention computed once for both CFG branches"},
    {"DZR_ROW_KERNELS", "stream, stream8, warp", "stream", false,
     "the row kernels' launch shape (the same bits: tests/cuda/test_fp8.cpp)"},
    {"DZR_CUDA_GRAPHS", "on, off", "on", false,
     "replay the captured CUDA graph of each forward shape (the same bits: tests/cuda/test_graphs.cpp)"},
    {"DZR_PACK_WEIGHTS", "0", "packed", false, "0: every weight its own cudaMalloc instead of one slab per device"},
    {"DZR_BLAS_CORE", "keep", "dzr picks", true,
     "keep: OpenBLAS's own kernel table where dzr would restart with its AVX-512/AVX2 one (docs/DESIGN.md)"},
    {"DZR_BLAS_CORE_SET", "(internal)", "unset", false, "set by dzr when it restarted itself with OPENBLAS_CORETYPE"},
};

const EnvSetting& find(std::string_view name) {
    for (const EnvSetting& s : kEnvSettings)
        if (name == s.name) return s;
    DZR_THROW("environment variable {} is not in dzr's list of settings (backend/env_settings.cpp)", name);
}

}  // namespace

std::span<const EnvSetting> env_settings() { return kEnvSettings; }

std::optional<std::string> env_value(std::string_view name) {
    const EnvSetting& s = find(name);
    const char* v = std::getenv(s.name);
    if (v == nullptr || *v == '\0') return std::nullopt;
    return std::string(v);
}

std::vector<std::pair<std::string, std::string>> env_values_set(bool numbers_only) {
    std::vector<std::pair<std::string, std::string>> out;
    for (const EnvSetting& s : kEnvSettings) {
        if (numbers_only && !s.changes_numbers) continue;
        if (const char* v = std::getenv(s.name)) out.emplace_back(s.name, v);
    }
    return out;
}

std::string env_settings_table() {
    std::string t = "| variable | values | default | changes the numbers | what it picks |\n";
    t += "| --- | --- | --- | --- | --- |\n";
    for (const EnvSetting& s : kEnvSettings)
        t += fmt::format("| `{}` | {} | {} | {} | {} |\n", s.name, s.values, s.default_value,
                         s.changes_numbers ? "yes (in the run fingerprint)" : "no", s.what);
    return t;
}

}  // namespace dzr
