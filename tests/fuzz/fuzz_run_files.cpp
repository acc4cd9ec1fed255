// libFuzzer target: the files of a rollout output directory that `dzr summarize`, `dzr report`, `dzr compare` and
// `--resume` read back (plan.json, done.json, metrics.json, timing.json). The first byte picks the file the rest of
// the input becomes; a fixed valid episode sits beside it, and the run is summarized and compared with itself.
#include <cstdint>
#include <filesystem>
#include <string>

#include "core/error.h"
#include "core/json_text.h"
#include "fuzz_support.h"
#include "rollout/compare.h"
#include "rollout/run_plan.h"
#include "rollout/summarize.h"

namespace {

constexpr const char* kFiles[] = {"plan.json", "ep/done.json", "ep/metrics.json", "ep/timing.json"};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    namespace fs = std::filesystem;
    if (size == 0) return 0;
    const fs::path run = dzr::fuzz::scratch_dir() / "run";
    std::error_code ec;
    fs::remove_all(run, ec);
    fs::create_directories(run / "ep");
    dzr::fuzz::write_bytes(run / kFiles[data[0] % 4], data + 1, size - 1);
    try {
        (void)dzr::rollout::read_run_plan(run);
    } catch (const dzr::Error&) {
    }
    // NOTE: the readers below record a damaged file in their result rather than throwing, except for a run
    // without any episode
    try {
        for (const auto& name : dzr::rollout::run_episode_names(run))
            (void)dzr::rollout::episode_from_outputs(run / name, name);
    } catch (const dzr::Error&) {
    }
    const auto c = dzr::rollout::compare_runs(run, run, {});
    (void)dzr::rollout::compare_junit(c);
    (void)dzr::dump_json(dzr::rollout::compare_json(c));
    return 0;
}
