// Ctrl-C during `dzr rollout` (tiny config, CPU): the binary is started as a child process, gets
// SIGINT once its first call is reported on stderr, stops after the current call, exits with 130 and
// leaves only complete files (actions.npy with the calls done, no temporary files, no done marker).
#include <doctest/doctest.h>

#include <signal.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "config/run_config.h"
#include "io/atomic_file.h"
#include "io/npy.h"
#include "io/result_writer.h"
#include "io/synth_episode.h"
#include "model/inventory.h"
#include "support/child_process.h"
#include "support/json_file.h"
#include "support/test_support.h"
#include "weights/random_checkpoint.h"

using namespace dzr;
namespace fs = std::filesystem;
using test::read_json;

TEST_CASE("Ctrl-C stops dzr rollout after the current call and leaves only complete files") {
    const char* bin = std::getenv("DZR_BIN");
    if (!bin || !fs::exists(bin)) {
        MESSAGE("DZR_BIN is not built (run through ctest after building dzr_cli); skipping");
        return;
    }
    test::TempDir dir;
    const fs::path config = test::source_dir() / "configs/tiny.yaml";
    const auto cfg = config::load_run_config(config);
    MakeOptions mo;
    mo.dtype = DType::F32;
    mo.tokenizer = test::data_dir() / "tokenizer/spiece.model";
    write_random_checkpoint(cfg.model, mo, dir / "ckpt");
    // 400 frames: 1 + 16 calls (anchors 23, 47, ..., 383), far more than run before the signal lands.
    io::SynthOptions so;
    so.frames = 400;
    io::write_synth_episode(dir / "episodes/ep", so);
    const int64_t scheduled = 17;

    test::Child child({bin, "rollout", (dir / "episodes/ep").string(), "--ckpt", (dir / "ckpt").string(), "--out",
                       (dir / "out").string(), "--config", config.string(), "--device", "cpu", "--no-warmup",
                       "--no-plots"});
    // Progress lines (stderr is not a terminal) read "episode 1/1 ep  call k/17 ...".
    const bool started = child.read_until("call 1/");
    if (started) REQUIRE(kill(child.pid(), SIGINT) == 0);
    const int code = child.wait_exit_code();
    INFO("stderr:\n" << child.err());
    REQUIRE(started);
    CHECK(code == 130);
    CHECK(child.err().find("interrupted") != std::string::npos);

    const fs::path out = dir / "out/ep";
    CHECK_FALSE(fs::exists(out / std::string(io::kDoneMarker)));
    for (const auto& e : fs::recursive_directory_iterator(dir / "out"))
        CHECK_MESSAGE(e.path().filename().string().find(io::kTempMarker) == std::string::npos, e.path().string());

    // The actions of the calls done, whole; timing and manifest agree on the count.
    const io::NpyArray actions = io::read_npy(out / "actions.npy");
    REQUIRE(actions.shape().size() == 3);
    const int64_t done = actions.shape()[0];
    CHECK(done >= 1);
    CHECK(done < scheduled);
    CHECK(actions.shape()[1] == 24);
    CHECK(actions.shape()[2] == 8);
    CHECK(read_json(out / "timing.json")["calls"].size() == size_t(done));
    const auto manifest = read_json(out / "manifest.json");
    CHECK(manifest["interrupted"]["calls_done"].get<int64_t>() == done);
    CHECK(manifest["interrupted"]["calls_scheduled"].get<int64_t>() == scheduled);
    const auto summary = read_json(dir / "out/summary.json");
    CHECK(summary["episodes"][0]["status"] == "interrupted");
    CHECK(summary["episodes"][0]["num_calls"].get<int64_t>() == done);
    // Metrics belong to finished episodes only.
    CHECK_FALSE(fs::exists(out / "metrics.json"));
}
