#include "backend/options.h"

#include <exception>
#include <optional>

#include "backend/env_settings.h"
#include "core/error.h"

namespace dzr {

const char* numerics_name(Numerics n) { return n == Numerics::Reference ? "reference" : "fast"; }

Numerics parse_numerics(const std::string& text) {
    if (text == "reference") return Numerics::Reference;
    if (text == "fast") return Numerics::Fast;
    DZR_THROW("unknown numerics '{}' (reference or fast)", text);
}

const char* attention_impl_name(AttentionImpl impl) {
    switch (impl) {
        case AttentionImpl::Auto:
            return "auto";
        case AttentionImpl::CudnnUnified:
            return "cudnn-unified";
        case AttentionImpl::CudnnComposite:
            return "cudnn-composite";
        case AttentionImpl::Flash:
            return "flash";
        case AttentionImpl::MemEfficient:
            return "mem-efficient";
        case AttentionImpl::Gemm:
            return "gemm";
    }
    return "?";
}

AttentionImpl parse_attention_impl(const std::string& text) {
    for (AttentionImpl i : {AttentionImpl::Auto, AttentionImpl::CudnnUnified, AttentionImpl::CudnnComposite,
                            AttentionImpl::Flash, AttentionImpl::MemEfficient, AttentionImpl::Gemm})
        if (text == attention_impl_name(i)) return i;
    DZR_THROW(
        "unknown attention implementation '{}' (auto, cudnn-unified, cudnn-composite, flash, mem-efficient, gemm)",
        text);
}

PlainGemmImpl parse_plain_gemm_impl(const std::string& text) {
    if (text == "lt") return PlainGemmImpl::Lt;
    if (text == "cublas") return PlainGemmImpl::Cublas;
    DZR_THROW("unknown bias-free GEMM implementation '{}' (lt or cublas)", text);
}

LtAlignment parse_lt_alignment(const std::string& text) {
    if (text == "dzr") return LtAlignment::Dzr;
    if (text == "torch") return LtAlignment::Torch;
    DZR_THROW("unknown cuBLASLt alignment rule '{}' (dzr or torch)", text);
}

namespace {

/// KiB as PyTorch's CUBLASLT_WORKSPACE_SIZE counts them -> bytes, within the CUDA backend's buffer.
size_t parse_lt_workspace_kib(const std::string& text) {
    size_t used = 0;
    long long kib = -1;
    try {
        kib = std::stoll(text, &used);
    } catch (const std::exception&) {
        used = 0;
    }
    DZR_CHECK(used == text.size() && kib >= 0 && size_t(kib) * 1024 <= kMaxLtWorkspaceBytes,
              "'{}' is not a workspace size in KiB from 0 to {}", text, kMaxLtWorkspaceBytes / 1024);
    return size_t(kib) * 1024;
}

ConvApi parse_conv_api(const std::string& text) {
    if (text == "graph") return ConvApi::Graph;
    if (text == "legacy") return ConvApi::Legacy;
    DZR_THROW("unknown convolution API '{}' (graph or legacy)", text);
}

/// Parses a registered variable when it is set: `parse(value)` into `out`, errors naming the variable.
template <typename T, typename F>
void from_env(const char* name, T& out, F parse) {
    const std::optional<std::string> value = env_value(name);
    if (!value) return;
    try {
        out = parse(*value);
    } catch (const Error& e) {
        DZR_THROW("environment variable {}: {}", name, e.what());
    }
}

}  // namespace

ConvTune parse_conv_tune(const std::string& text) {
    if (text == "off") return ConvTune::Off;
    if (text == "auto") return ConvTune::Auto;
    if (text == "channels-last") return ConvTune::ChannelsLast;
    DZR_THROW("unknown convolution tuning '{}' (auto, off or channels-last)", text);
}

RowKernels parse_row_kernels(const std::string& text) {
    if (text == "stream") return RowKernels::Stream;
    if (text == "warp") return RowKernels::Warp;
    if (text == "stream8") return RowKernels::Stream8;
    DZR_THROW("unknown row kernels '{}' (stream, stream8 or warp)", text);
}

bool parse_switch(const std::string& text) {
    if (text == "1" || text == "true" || text == "on") return true;
    if (text == "0" || text == "false" || text == "off") return false;
    DZR_THROW("'{}': expected 0, 1, true, false, on or off", text);
}

bool env_switch_off(const char* name, bool configured, const char* value) {
    if (value == nullptr || *value == '\0') return configured;
    try {
        return parse_switch(value) && configured;
    } catch (const Error& e) {
        DZR_THROW("{}={}: {}", name, value, e.what());
    }
}

BackendOptions apply_env_overrides(BackendOptions o) {
    from_env("DZR_ATTENTION", o.cuda.attention, parse_attention_impl);
    from_env("DZR_PLAIN_GEMM", o.cuda.plain_gemm, parse_plain_gemm_impl);
    from_env("DZR_CONV_API", o.cuda.conv_api, parse_conv_api);
    from_env("DZR_LT_WORKSPACE", o.cuda.lt_workspace_bytes, parse_lt_workspace_kib);
    from_env("DZR_LT_ALIGN", o.cuda.lt_alignment, parse_lt_alignment);
    from_env("DZR_CONV_TUNE", o.cuda.conv_tune, parse_conv_tune);
    from_env("DZR_ROW_KERNELS", o.cuda.row_kernels, parse_row_kernels);
    from_env("DZR_GEMM_TUNE", o.cuda.gemm_tune, parse_switch);
    from_env("DZR_BATCHED_ATTENTION", o.cuda.batched_attention, parse_switch);
    from_env("DZR_PACK_WEIGHTS", o.cuda.pack_weights, [](const std::string& v) { return v != "0"; });
    return o;
}

}  // namespace dzr
