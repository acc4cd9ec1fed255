// The documented environment overrides of the backend options (apply_env_overrides): the cuBLASLt workspace and
// alignment rule (DZR_LT_WORKSPACE, DZR_LT_ALIGN) that the parity work at the real widths varies, their defaults
// when unset, and one message naming the variable for a value that cannot be used.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "backend/cuda_archs.h"
#include "backend/env_settings.h"
#include "backend/options.h"
#include "core/error.h"
#include "support/test_support.h"

using namespace dzr;

namespace {

/// Sets (or, with nullptr, unsets) an environment variable for the scope; restores the former value.
class ScopedEnv {
public:
    ScopedEnv(const char* name, const char* value) : name_(name) {
        if (const char* old = std::getenv(name)) old_ = old;
        had_ = std::getenv(name) != nullptr;
        if (value)
            setenv(name, value, 1);
        else
            unsetenv(name);
    }
    ~ScopedEnv() {
        if (had_)
            setenv(name_.c_str(), old_.c_str(), 1);
        else
            unsetenv(name_.c_str());
    }
    ScopedEnv(const ScopedEnv&) = delete;
    ScopedEnv& operator=(const ScopedEnv&) = delete;

private:
    std::string name_, old_;
    bool had_ = false;
};

}  // namespace

TEST_CASE("the cuBLASLt workspace, alignment and plain GEMM default to PyTorch's choices when the variables are unset") {
    const ScopedEnv ws("DZR_LT_WORKSPACE", nullptr), al("DZR_LT_ALIGN", nullptr), pg("DZR_PLAIN_GEMM", nullptr);
    const BackendOptions o = apply_env_overrides({});
    CHECK(o.cuda.lt_workspace_bytes == size_t(1) << 20);
    CHECK(o.cuda.lt_workspace_bytes <= kMaxLtWorkspaceBytes);
    CHECK(o.cuda.lt_alignment == LtAlignment::Dzr);
    CHECK(o.cuda.plain_gemm == PlainGemmImpl::Cublas);
}

TEST_CASE("DZR_LT_WORKSPACE counts KiB as PyTorch's CUBLASLT_WORKSPACE_SIZE does") {
    {
        const ScopedEnv ws("DZR_LT_WORKSPACE", "1024");
        CHECK(apply_env_overrides({}).cuda.lt_workspace_bytes == size_t(1) << 20);
    }
    {
        const ScopedEnv ws("DZR_LT_WORKSPACE", "0");
        CHECK(apply_env_overrides({}).cuda.lt_workspace_bytes == 0);
    }
    {
        const ScopedEnv ws("DZR_LT_WORKSPACE", "32768");
        CHECK(apply_env_overrides({}).cuda.lt_workspace_bytes == kMaxLtWorkspaceBytes);
    }
}

TEST_CASE("DZR_LT_ALIGN picks PyTorch's pointer-only alignments") {
    const ScopedEnv al("DZR_LT_ALIGN", "torch");
    CHECK(apply_env_overrides({}).cuda.lt_alignment == LtAlignment::Torch);
    CHECK(parse_lt_alignment("dzr") == LtAlignment::Dzr);
}

TEST_CASE("an unusable cuBLASLt setting is one error naming the variable") {
    for (const char* bad : {"32769", "-1", "1e3", "1MiB", "lots"}) {
        CAPTURE(bad);
        const ScopedEnv ws("DZR_LT_WORKSPACE", bad);
        const std::string msg = test::error_of([] { apply_env_overrides({}); });
        CHECK(test::contains(msg, "DZR_LT_WORKSPACE"));
        CHECK(test::contains(msg, "32768"));
    }
    const ScopedEnv al("DZR_LT_ALIGN", "cublas");
    const std::string msg = test::error_of([] { apply_env_overrides({}); });
    CHECK(test::contains(msg, "DZR_LT_ALIGN"));
    CHECK(test::contains(msg, "dzr or torch"));
}

TEST_CASE("fast numerics tune their convolutions unless DZR_CONV_TUNE says otherwise") {
    {
        const ScopedEnv t("DZR_CONV_TUNE", nullptr);
        CHECK(apply_env_overrides({}).cuda.conv_tune == ConvTune::Auto);
    }
    {
        const ScopedEnv t("DZR_CONV_TUNE", "off");
        CHECK(apply_env_overrides({}).cuda.conv_tune == ConvTune::Off);
    }
    {
        const ScopedEnv t("DZR_CONV_TUNE", "channels-last");
        CHECK(apply_env_overrides({}).cuda.conv_tune == ConvTune::ChannelsLast);
    }
    CHECK(parse_conv_tune("auto") == ConvTune::Auto);
    const ScopedEnv t("DZR_CONV_TUNE", "on");
    const std::string msg = test::error_of([] { apply_env_overrides({}); });
    CHECK(test::contains(msg, "DZR_CONV_TUNE"));
    CHECK(test::contains(msg, "auto, off or channels-last"));
}

TEST_CASE("DZR_ROW_KERNELS picks the row kernels: stream (the default), stream8 or warp") {
    {
        const ScopedEnv t("DZR_ROW_KERNELS", nullptr);
        CHECK(apply_env_overrides({}).cuda.row_kernels == RowKernels::Stream);
    }
    for (const auto& [text, want] : {std::pair<const char*, RowKernels>{"stream", RowKernels::Stream},
                                     {"stream8", RowKernels::Stream8}, {"warp", RowKernels::Warp}}) {
        CAPTURE(text);
        const ScopedEnv t("DZR_ROW_KERNELS", text);
        CHECK(apply_env_overrides({}).cuda.row_kernels == want);
        CHECK(parse_row_kernels(text) == want);
    }
    const ScopedEnv t("DZR_ROW_KERNELS", "stream16");
    const std::string msg = test::error_of([] { apply_env_overrides({}); });
    CHECK(test::contains(msg, "DZR_ROW_KERNELS"));
    CHECK(test::contains(msg, "stream, stream8 or warp"));
}

TEST_CASE("DZR_GEMM_TUNE and DZR_BATCHED_ATTENTION turn fast numerics' GEMM timing and batched attention on or off") {
    for (const char* name : {"DZR_GEMM_TUNE", "DZR_BATCHED_ATTENTION"}) {
        CAPTURE(name);
        const auto value = [&](const BackendOptions& o) {
            return std::string(name) == "DZR_GEMM_TUNE" ? o.cuda.gemm_tune : o.cuda.batched_attention;
        };
        {
            const ScopedEnv t(name, nullptr);
            CHECK(value(apply_env_overrides({})));  // on by default
        }
        {
            const ScopedEnv t(name, "off");
            CHECK_FALSE(value(apply_env_overrides({})));
        }
        {
            const ScopedEnv t(name, "on");
            CHECK(value(apply_env_overrides({})));
        }
        {
            const ScopedEnv t(name, "false");  // the spellings DZR_CUDA_GRAPHS takes too
            CHECK_FALSE(value(apply_env_overrides({})));
        }
        const ScopedEnv t(name, "maybe");
        const std::string msg = test::error_of([] { apply_env_overrides({}); });
        CHECK(test::contains(msg, name));
        CHECK(test::contains(msg, "expected 0, 1, true, false, on or off"));
    }
}

TEST_CASE("env_switch_off: an environment switch only turns a setting off, and a bad value names the variable") {
    CHECK(env_switch_off("DZR_SHARE_LAYER0", true, nullptr));
    CHECK(env_switch_off("DZR_SHARE_LAYER0", true, ""));
    CHECK_FALSE(env_switch_off("DZR_SHARE_LAYER0", true, "off"));
    CHECK_FALSE(env_switch_off("DZR_SHARE_LAYER0", false, "on"));
    CHECK(env_switch_off("DZR_SHARE_LAYER0", true, "1"));
    const std::string msg = test::error_of([] { env_switch_off("DZR_SHARE_LAYER0", true, "maybe"); });
    CHECK(test::contains(msg, "DZR_SHARE_LAYER0=maybe"));
    CHECK(test::contains(msg, "expected 0, 1"));
}

TEST_CASE("a CUDA build's architectures say which GPUs it runs on") {
    // the release default: sm_90a (H100/H200), sm_80 with PTX (A100 and anything later), sm_89 (L40S)
    for (int cc : {80, 86, 87, 89, 90, 100, 120}) {
        CAPTURE(cc);
        CHECK(cuda_archs_cover("90a;80;89", cc));
    }
    CHECK_FALSE(cuda_archs_cover("90a;80;89", 75));
    // scripts/test.sh without a GPU: sm_90a alone runs on compute capability 9.0 only
    CHECK(cuda_archs_cover("90a", 90));
    for (int cc : {80, 86, 89, 100}) {
        CAPTURE(cc);
        CHECK_FALSE(cuda_archs_cover("90a", cc));
    }
    // SASS runs within its major, PTX from its version on; "-real" is SASS only, "-virtual" PTX only
    CHECK(cuda_archs_cover("80-real", 86));
    CHECK_FALSE(cuda_archs_cover("80-real", 90));
    CHECK(cuda_archs_cover("80-virtual", 90));
    CHECK_FALSE(cuda_archs_cover("86-virtual", 80));
    CHECK(cuda_archs_cover("100f", 103));
    CHECK_FALSE(cuda_archs_cover("100f", 120));
    CHECK(cuda_archs_cover("89,90a", 90));  // the separator lib/CMakeLists.txt passes
    CHECK(cuda_archs_cover("native", 75));
    CHECK_FALSE(cuda_archs_cover("", 90));
    CHECK_FALSE(cuda_archs_cover("sm_90", 90));
}

TEST_CASE("every DZR_ environment variable is read through the one registry") {
    // NOTE: the registry feeds the run fingerprint and the bench record; a variable read past it would change the
    // numbers without either knowing
    std::set<std::string> registered;
    for (const EnvSetting& e : env_settings()) registered.insert(e.name);
    const std::string needle = "getenv(\"DZR_";
    int files = 0;
    for (const char* root : {"lib", "apps", "kernels"})
        for (const auto& entry : std::filesystem::recursive_directory_iterator(test::source_dir() / root)) {
            const std::string ext = entry.path().extension().string();
            if (!entry.is_regular_file() || (ext != ".cpp" && ext != ".h" && ext != ".cu" && ext != ".cuh")) continue;
            ++files;
            std::ifstream f(entry.path());
            const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
            CAPTURE(entry.path().string());
            CHECK(text.find(needle) == std::string::npos);
            // and every DZR_ name quoted in the code is a registered one
            for (size_t at = text.find("\"DZR_"); at != std::string::npos; at = text.find("\"DZR_", at + 1)) {
                const size_t end = text.find('"', at + 1);
                const std::string name = text.substr(at + 1, end - at - 1);
                if (name.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") != std::string::npos) continue;
                CAPTURE(name);
                CHECK(registered.count(name) == 1);
            }
        }
    CHECK(files > 100);
    CHECK_THROWS_AS(env_value("DZR_NOT_A_SETTING"), Error);
}

TEST_CASE("the registry lists the set variables, those that change the numbers for the fingerprint") {
    ScopedEnv tune("DZR_CONV_TUNE", "off"), rows("DZR_ROW_KERNELS", "warp"), empty("DZR_ATTENTION", "");
    const auto numbers = env_values_set(true), all = env_values_set(false);
    const auto has = [](const auto& v, const std::string& name) {
        for (const auto& [k, value] : v)
            if (k == name) return true;
        return false;
    };
    CHECK(has(numbers, "DZR_CONV_TUNE"));  // changes bits: in the fingerprint now
    CHECK_FALSE(has(numbers, "DZR_ROW_KERNELS"));
    CHECK(has(all, "DZR_ROW_KERNELS"));
    CHECK(has(numbers, "DZR_ATTENTION"));  // set, though empty (as the fingerprint always recorded it)
    CHECK_FALSE(env_value("DZR_ATTENTION").has_value());
    CHECK(test::contains(env_settings_table(), "| `DZR_CONV_TUNE` | auto, off, channels-last | auto | yes"));
}
