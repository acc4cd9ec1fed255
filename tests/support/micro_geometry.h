#pragma once
/// configs/tiny.yaml shrunk further for the tests whose point does not depend on the model's geometry (an output
/// directory's refusals, bit-equality between two placements or two runs of the same engine): a 64x128 canvas
/// (32x64 views, an 8x16 latent, 32 tokens per latent frame) and 9-frame clips, as `--set` overrides of
/// `dzr ckpt make`, `dzr rollout` and `dzr serve` or as config::Override for load_run_config. Everything else (the
/// widths, the layers, the CLIP input, the 2-frame chunks and 24 actions, sampling, KV window) is the tiny config's.
/// A call costs ~0.1 s instead of ~1.2 s in the release build (the tiny geometry's window reset VAE-encodes 33
/// frames of 176x320: under ASan ~30 s). tests/serve/test_serve.py and tests/dataset/test_lerobot.sh spell the
/// same four overrides.
/// DZR_LONG_TESTS=1 (docs/CI.md) makes long_tests() true: the tests that use this geometry run the tiny one.
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "config/run_config.h"

namespace dzr::test {

inline const std::vector<config::Override>& micro_geometry() {
    static const std::vector<config::Override> o = {{"model.canvas_height", "64"},
                                                    {"model.canvas_width", "128"},
                                                    {"model.dit.frame_seqlen", "32"},
                                                    {"model.num_frames", "9"}};
    return o;
}

/// " --set model.canvas_height=64 ..." for the dzr command line (empty for no overrides).
inline std::string set_options(const std::vector<config::Override>& overrides) {
    std::string s;
    for (const auto& o : overrides) s += fmt::format(" --set {}={}", o.path, o.value);
    return s;
}

/// DZR_LONG_TESTS=1 (or any value but "" and "0"): run the long variants (docs/CI.md).
inline bool long_tests() {
    const char* v = std::getenv("DZR_LONG_TESTS");
    return v != nullptr && std::string_view(v) != "" && std::string_view(v) != "0";
}

/// The overrides a test that can run on either geometry takes: micro_geometry(), none with DZR_LONG_TESTS=1.
inline std::vector<config::Override> ci_geometry() {
    return long_tests() ? std::vector<config::Override>{} : micro_geometry();
}

}  // namespace dzr::test
