// `dzr rollout` refuses bad inputs before the checkpoint's weights are loaded, with one message naming the
// file or option, a non-zero exit, no output and no input changed (docs/RELIABILITY.md lists the cases); and
// `dzr ckpt validate` finds what a rollout would trip over later.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "config/run_config.h"
#include "io/npy.h"
#include "io/run_lock.h"
#include "io/synth_episode.h"
#include "model/inventory.h"
#include "support/cli.h"
#include "support/json_file.h"
#include "support/micro_geometry.h"
#include "support/test_support.h"
#include "weights/random_checkpoint.h"

using namespace dzr;
using test::q;
namespace fs = std::filesystem;

namespace {

const fs::path kConfig = test::source_dir() / "configs/tiny.yaml";

/// A tiny checkpoint with the test tokenizer, a parent of two short episodes and a scratch directory.
/// `micro`: the checkpoint and the rollouts take test::micro_geometry() (support/micro_geometry.h), for the cases
/// that roll out: what they check (an output directory's refusals, --force) does not depend on the geometry, and
/// under ASan a rollout of the tiny geometry takes ~40 s (mostly the VAE's 33-frame conditioning encode), of the
/// micro one ~5 s. (sanitize/tiny_rollout rolls out the tiny geometry itself under the sanitizers.)
struct Fixture {
    test::TempDir dir;
    fs::path ckpt = dir / "ckpt", eps = dir / "eps";
    std::string geometry;  // the --set options of the micro geometry, or none

    explicit Fixture(bool micro = false) {
        const std::vector<config::Override> overrides =
            micro ? test::micro_geometry() : std::vector<config::Override>{};
        geometry = test::set_options(overrides);
        MakeOptions mo;
        mo.dtype = DType::F32;
        mo.tokenizer = test::data_dir() / "tokenizer/spiece.model";
        write_random_checkpoint(config::load_run_config(kConfig, overrides).model, mo, ckpt);
        io::SynthOptions so;
        so.frames = 30;
        so.width = 64;
        so.height = 36;
        for (const char* name : {"ep_a", "ep_b"}) io::write_synth_episode(eps / name, so);
    }
    /// `dzr rollout` of `episodes` with the tiny config and `extra` options.
    test::CliResult rollout(const fs::path& episodes, const fs::path& out, const std::string& extra = "",
                            const std::string& device = "cpu") const {
        return test::run_dzr(
            fmt::format("rollout {} --ckpt {} --out {} --config {} --device {} --no-warmup --quiet{} {}",
                        q(episodes), q(ckpt), q(out), q(kConfig), device, geometry, extra),
            dir.path());
    }
    std::map<std::string, std::string> inputs() const {
        auto s = test::snapshot(eps);
        for (const auto& [k, v] : test::snapshot(ckpt)) s["ckpt/" + k] = v;
        return s;
    }
};

/// Overwrites value `index` (float64 elements after the header) of a .npy file.
void poke_f64(const fs::path& npy, int64_t index, double value) {
    const io::NpyArray a = io::read_npy(npy);
    REQUIRE(a.dtype() == io::NpyDType::F8);
    std::vector<double> v = a.to_f64();
    v[size_t(index)] = value;
    io::write_npy_f64(npy, a.shape(), v);
}

bool loaded_weights(const test::CliResult& r) {
    return r.has("warm-up") || r.has("  load  ") || r.has("median ms");
}

#define SKIP_WITHOUT_DZR_BIN()                                                                \
    if (test::dzr_bin().empty()) {                                                            \
        MESSAGE("DZR_BIN is not built (run through ctest after building dzr_cli); skipping"); \
        return;                                                                               \
    }

}  // namespace

TEST_CASE(
    "a rollout whose outputs would land in an input is refused naming both paths, whatever the spelling") {
    SKIP_WITHOUT_DZR_BIN();
    Fixture f;
    const auto before = f.inputs();
    // The case: --out is the episodes' parent, so <out>/ep_a is the episode itself.
    auto r = f.rollout(f.eps, f.eps);
    CHECK(r.code == 1);
    CHECK(r.has((f.eps / "ep_a").string()));
    CHECK(r.has("dzr never writes into its inputs"));
    // The same directory through a symlink and through `..`.
    fs::create_directory_symlink(f.eps, f.dir / "link");
    r = f.rollout(f.eps, f.dir / "link");
    CHECK(r.code == 1);
    CHECK(r.has("is the episode ep_a " + fs::canonical(f.eps / "ep_a").string()));
    r = f.rollout(f.eps, f.eps / "ep_a" / ".." / ".");
    CHECK(r.code == 1);
    CHECK(r.has("is the episode ep_a"));
    // Inside the checkpoint, and an output file that is the config.
    r = f.rollout(f.eps, f.ckpt / "runs");
    CHECK(r.code == 1);
    CHECK(r.has("lies inside the checkpoint " + fs::canonical(f.ckpt).string()));
    fs::create_directories(f.dir / "cfgdir");
    fs::copy_file(kConfig, f.dir / "cfgdir/summary.json");
    r = test::run_dzr(fmt::format("rollout {} --ckpt {} --out {} --config {} --quiet", q(f.eps), q(f.ckpt),
                                  q(f.dir / "cfgdir"), q(f.dir / "cfgdir/summary.json")),
                      f.dir.path());
    CHECK(r.code == 1);
    CHECK(r.has("would replace the config"));
    // A hard link of the config as OUT/summary.json: another path, the same inode (as with a bind mount).
    fs::create_directories(f.dir / "linked");
    fs::create_hard_link(f.dir / "cfgdir/summary.json", f.dir / "linked/summary.json");
    r = test::run_dzr(fmt::format("rollout {} --ckpt {} --out {} --config {} --quiet", q(f.eps), q(f.ckpt),
                                  q(f.dir / "linked"), q(f.dir / "cfgdir/summary.json")),
                      f.dir.path());
    CHECK(r.code == 1);
    CHECK(r.has("output " + (f.dir / "linked/summary.json").string() + " would replace the config"));
    CHECK(f.inputs() == before);
    CHECK_FALSE(fs::exists(f.ckpt / "runs"));
    CHECK_FALSE(loaded_weights(r));
}

TEST_CASE("every invalid episode is reported at once before the weights are loaded, and nothing is written") {
    SKIP_WITHOUT_DZR_BIN();
    Fixture f;
    io::SynthOptions so;
    so.frames = 30;
    so.width = 64;
    so.height = 36;
    for (const char* name : {"ep_c", "ep_d"}) io::write_synth_episode(f.eps / name, so);
    poke_f64(f.eps / "ep_a/joint_position.npy", 9, std::nan(""));  // NaN in the state
    poke_f64(f.eps / "ep_b/joint_position.npy", 2, 1e300);         // finite in float64, inf in float32
    io::write_npy_f64(f.eps / "ep_c/joint_position.npy", {30, 6},
                      std::vector<double>(180, 0.0));  // wrong shape
    fs::remove(f.eps / "ep_d/wrist_image_left.npy");
    const auto before = f.inputs();
    // NOTE: on a machine without a GPU the CUDA backend cannot start; the episodes' problems still come
    // first, because nothing that needs the device (or the weights) runs before every input is checked.
    const bool gpu = cuda_device_available();
    const auto r = f.rollout(f.eps, f.dir / "out", "", gpu ? "cpu" : "cuda");
    CHECK(r.code == 1);
    // every problem at once: the four episodes' and, without a GPU, the device's (listed, never tried)
    CHECK(r.has(fmt::format("{} problems found before loading the checkpoint's weights; nothing was run", gpu ? 4 : 5)));
    CHECK(r.has("ep_a/joint_position.npy: row 1, column 2 is nan"));
    CHECK(r.has("ep_b/joint_position.npy: row 0, column 2 is 1e+300, beyond the float32 range"));
    CHECK(r.has("ep_c/joint_position.npy: expected shape [T, 7], found float64 [30, 6]"));
    CHECK(r.has("missing camera file wrist_image_left"));
    CHECK(r.has("--skip-invalid"));
    if (!gpu) CHECK(r.has("--device cuda"));
    CHECK_FALSE(r.has("memory plan"));
    CHECK_FALSE(loaded_weights(r));
    CHECK_FALSE(fs::exists(f.dir / "out"));
    CHECK(f.inputs() == before);
    // --dry-run checks the same and loads nothing, also for valid episodes.
    const auto dry = f.rollout(f.eps / "ep_a", f.dir / "out", "--dry-run");
    CHECK(dry.code == 1);
    fs::remove_all(f.eps / "ep_a");
    fs::remove_all(f.eps / "ep_b");
    fs::remove_all(f.eps / "ep_c");
    fs::remove_all(f.eps / "ep_d");
    io::write_synth_episode(f.eps / "ep_e", so);
    const auto ok = f.rollout(f.eps, f.dir / "out", "--dry-run");
    CHECK(ok.code == 0);
    CHECK(ok.has("dry run: 1 episode checked (0 invalid)"));
    CHECK_FALSE(fs::exists(f.dir / "out"));
}

TEST_CASE("an unwritable --out and out-of-range options fail at once, before any episode is computed") {
    SKIP_WITHOUT_DZR_BIN();
    Fixture f;
    std::ofstream(f.dir / "a_file") << "x";
    auto r = f.rollout(f.eps, f.dir / "a_file" / "out");
    CHECK(r.code == 1);
    CHECK(r.has("cannot create the output directory " + (f.dir / "a_file" / "out").string()));
    CHECK_FALSE(loaded_weights(r));
    r = f.rollout(f.eps, f.dir / "out", "--metric-steps 0");
    CHECK(r.code == 1);
    CHECK(r.has("--metric-steps must be -1 (all) or in [1, 24]"));
    CHECK_FALSE(fs::exists(f.dir / "out"));
    // a signed overflow in the metric rows before: the option is bounded now
    r = f.rollout(f.eps, f.dir / "out", "--metric-offset 9223372036854775800");
    CHECK(r.code != 0);
    CHECK(r.has("--metric-offset"));
    CHECK_FALSE(fs::exists(f.dir / "out"));
    // a step count that used to hang, and one whose step plan disagrees with num_dit_steps
    r = f.rollout(f.eps, f.dir / "out", "--set sampling.num_inference_steps=100000");
    CHECK(r.code == 1);
    CHECK(r.has("sampling.num_inference_steps must be in [1, 1000], got 100000"));
    r = f.rollout(f.eps, f.dir / "out", "--set sampling.num_inference_steps=20");
    CHECK(r.code == 1);
    CHECK(r.has("num_dit_steps = 8 has a preset only for num_inference_steps = 16"));
    CHECK_FALSE(fs::exists(f.dir / "out"));
    // absurd sizes are refused here, before the weights load (a window that once tried a 45 TB pool)
    r = f.rollout(f.eps, f.dir / "out", "--set kv.window_frames=100000000");
    CHECK(r.code == 1);
    CHECK(r.has("kv.window_frames: must lie in [1, 1024], got 100000000"));
    CHECK_FALSE(loaded_weights(r));
    {
        const fs::path sliver = f.dir / "sliver";
        fs::create_directories(sliver / "ep_s");
        fs::copy(f.eps / "ep_a", sliver / "ep_s", fs::copy_options::recursive);
        io::write_npy(sliver / "ep_s/wrist_image_left.npy", io::NpyDType::U1, {30, 1, 2000, 3},
                      std::vector<uint8_t>(30 * 2000 * 3, 7).data());
        r = f.rollout(sliver, f.dir / "out");
        CHECK(r.code == 1);
        CHECK(r.has("wrist_image_left.npy: camera frames are 2000x1 (width x height)"));
        CHECK_FALSE(loaded_weights(r));
    }
    CHECK_FALSE(fs::exists(f.dir / "out"));
    // the root of the file system is never an output directory
    r = f.rollout(f.eps, "/");
    CHECK(r.code == 1);
    CHECK(r.has("--out /: the file system's root is never an output directory"));
}

TEST_CASE("an output directory with an earlier run's results is refused unless --resume or --force") {
    SKIP_WITHOUT_DZR_BIN();
    Fixture f(/*micro=*/true);  // three real rollouts
    const fs::path out = f.dir / "out";
    auto r = f.rollout(f.eps / "ep_a", out, "--set rollout.max_chunks=1 --no-plots");
    REQUIRE(r.code == 0);
    // the plan is written before the first episode, so a killed run's summary still knows what was planned
    CHECK(fs::exists(out / "plan.json"));
    const std::string actions = test::slurp(out / "ep_a/actions.npy");
    // before, this silently replaced the results (and with other episodes mixed two runs in one report)
    r = f.rollout(f.eps, out, "--set rollout.max_chunks=1 --no-plots");
    CHECK(r.code == 1);
    CHECK(r.has("holds the results of an earlier run (ep_a): --resume finishes that run, --force reruns"));
    CHECK_FALSE(loaded_weights(r));
    CHECK_FALSE(fs::exists(out / "ep_b"));
    CHECK(test::slurp(out / "ep_a/actions.npy") == actions);
    r = f.rollout(f.eps, out, "--set rollout.max_chunks=1 --no-plots --force");
    CHECK(r.code == 0);
    CHECK(fs::exists(out / "ep_b/done.json"));

    // nor do converted episodes or quantized checkpoints land inside their sources
    const auto ckpt_before = test::snapshot(f.ckpt);
    r = test::run_dzr(fmt::format("ckpt quantize --precision fp8 {} {}", q(f.ckpt), q(f.ckpt / "sub")), f.dir.path());
    CHECK(r.code == 1);
    CHECK(r.has("lies inside the input checkpoint"));
    CHECK(test::snapshot(f.ckpt) == ckpt_before);
    const auto ep_before = test::snapshot(f.eps / "ep_b");
    r = test::run_dzr(fmt::format("episode convert {} --out {}", q(f.eps / "ep_b"), q(f.eps / "ep_b" / "conv")),
                      f.dir.path());
    CHECK(r.code == 1);
    CHECK(r.has("lies inside the episode ep_b"));
    CHECK(test::snapshot(f.eps / "ep_b") == ep_before);

    // a synthetic episode never lands on an existing one by accident
    const auto before = test::snapshot(f.eps / "ep_a");
    r = test::run_dzr(fmt::format("episode synth --out {} --frames 10 --frames-format npy", q(f.eps / "ep_a")),
                      f.dir.path());
    CHECK(r.code == 1);
    CHECK(r.has("exists and is not an empty directory"));
    CHECK(test::snapshot(f.eps / "ep_a") == before);
}

TEST_CASE("a GPU this machine lacks is one problem line, and no memory plan is tried for it") {
    SKIP_WITHOUT_DZR_BIN();
    Fixture f;
    const int gpus = cuda_device_count();
    const auto r = f.rollout(f.eps, f.dir / "out", "", fmt::format("cuda:{}", gpus));
    CHECK(r.code == 1);
    CHECK(r.has(cuda_backend_built() ? fmt::format("--device cuda:{}: no such GPU ({} visible)", gpus, gpus)
                                     : fmt::format("--device cuda:{}: this dzr was built without CUDA", gpus)));
    // one cause, one message: no warning about the memory plan it could not make
    CHECK(r.has("1 problem found"));
    CHECK_FALSE(r.has("memory plan"));
    CHECK_FALSE(fs::exists(f.dir / "out"));
}

TEST_CASE("a second rollout into an output directory in use fails at once naming the other process") {
    SKIP_WITHOUT_DZR_BIN();
    Fixture f;
    fs::create_directories(f.dir / "out");
    const io::RunLock held(f.dir / "out", ".dzr-rollout.lock", "dzr rollout (the first run)");
    const auto r = f.rollout(f.eps, f.dir / "out");
    CHECK(r.code == 1);
    CHECK(r.has(fmt::format("is in use by another dzr run: pid {} on", ::getpid())));
    CHECK(r.has("(dzr rollout (the first run))"));
    CHECK_FALSE(loaded_weights(r));
    CHECK_FALSE(fs::exists(f.dir / "out/ep_a"));
}

TEST_CASE("a sharded and an unsharded run exclude each other from one output directory") {
    SKIP_WITHOUT_DZR_BIN();
    Fixture f;
    fs::create_directories(f.dir / "out");
    {
        // a rank of a sharded run holds the run lock shared
        const io::RunLock rank(f.dir / "out", ".dzr-rollout.lock", "dzr rollout --shard 0/2", true);
        const auto r = f.rollout(f.eps, f.dir / "out");
        CHECK(r.code == 1);
        CHECK(r.has("is in use by another dzr run: the ranks of a sharded run"));
        CHECK_FALSE(fs::exists(f.dir / "out/ep_a"));
    }
    // an unsharded run holds it alone: a rank is refused
    const io::RunLock whole(f.dir / "out", ".dzr-rollout.lock", "dzr rollout (unsharded)");
    const auto r = f.rollout(f.eps, f.dir / "out", "--shard 1/2");
    CHECK(r.code == 1);
    CHECK(r.has("(dzr rollout (unsharded))"));
    CHECK_FALSE(fs::exists(f.dir / "out/ep_a"));
}

TEST_CASE("an episode.yaml whose open quote swallows the next keys is refused naming them") {
    SKIP_WITHOUT_DZR_BIN();
    Fixture f;
    std::ofstream(f.eps / "ep_b/episode.yaml") << "prompt: \"put the cup away\nfps: 15\n";
    const auto r = f.rollout(f.eps, f.dir / "out");
    CHECK(r.code == 1);
    CHECK(
        r.has("ep_b/episode.yaml: line 1: the quoted prompt is not closed on its line and swallows the line "
              "starting with 'fps'"));
    CHECK_FALSE(fs::exists(f.dir / "out"));
}

TEST_CASE(
    "metadata with q01 >= q99 is refused by the rollout and by ckpt validate, naming key and dimension") {
    SKIP_WITHOUT_DZR_BIN();
    Fixture f;
    const fs::path md = f.ckpt / "experiment_cfg/metadata.json";
    auto j = nlohmann::json::parse(test::slurp(md));
    j["oxe_droid"]["statistics"]["state"]["joint_position"]["q99"][2] =
        j["oxe_droid"]["statistics"]["state"]["joint_position"]["q01"][2];
    j["oxe_droid"]["statistics"]["action"]["gripper_position"]["q01"][0] = 2.0;
    std::ofstream(md) << j.dump(2);
    const auto r = f.rollout(f.eps, f.dir / "out");
    CHECK(r.code == 1);
    CHECK(r.has(
        "oxe_droid.statistics.state.joint_position: dimension 2: q01 = -0.95 must be below q99 = -0.95"));
    CHECK(r.has("oxe_droid.statistics.action.gripper_position: dimension 0: q01 = 2 must be below q99 = 1"));
    CHECK_FALSE(loaded_weights(r));
    CHECK_FALSE(fs::exists(f.dir / "out"));
    const auto v = test::run_dzr("ckpt validate " + q(f.ckpt), f.dir.path());
    CHECK(v.code == 1);
    CHECK(v.has("state.joint_position: dimension 2"));
}

TEST_CASE("ckpt validate loads the tokenizer, and --hash finds a changed header dtype or flipped data bits") {
    SKIP_WITHOUT_DZR_BIN();
    Fixture f;
    auto r = test::run_dzr("ckpt validate --hash " + q(f.ckpt), f.dir.path());
    REQUIRE(r.code == 0);
    CHECK(r.has("SHA-256: 4 files match checksums.sha256"));
    CHECK(r.has("tokenizer spiece.model"));

    // A damaged spiece.model: before, only the rollout failed (inside sentencepiece).
    const std::string good_tok = test::slurp(f.ckpt / "spiece.model");
    std::ofstream(f.ckpt / "spiece.model", std::ios::binary) << good_tok.substr(0, good_tok.size() / 2);
    r = test::run_dzr("ckpt validate " + q(f.ckpt), f.dir.path());
    CHECK(r.code == 1);
    CHECK(r.has("tokenizer " + (f.ckpt / "spiece.model").string() + ": cannot load the sentencepiece model"));
    std::ofstream(f.ckpt / "spiece.model", std::ios::binary) << good_tok;

    // F32 -> I32 in the header keeps every size, so the structure checks pass; the checksum does not.
    const fs::path shard = f.ckpt / "model.safetensors";
    std::string bytes = test::slurp(shard);
    const size_t at = bytes.find("\"dtype\":\"F32\"");
    REQUIRE(at != std::string::npos);
    bytes.replace(at, 13, "\"dtype\":\"I32\"");
    std::ofstream(shard, std::ios::binary) << bytes;
    r = test::run_dzr("ckpt validate --hash " + q(f.ckpt), f.dir.path());
    CHECK(r.code == 1);
    CHECK(r.has(shard.string() + ": SHA-256 "));
    CHECK(r.has("but checksums.sha256 says"));

    // Flipped bits deep in the tensor data: only the checksum sees them.
    bytes.replace(at, 13, "\"dtype\":\"F32\"");
    bytes[bytes.size() - 1000] ^= 0x10;
    std::ofstream(shard, std::ios::binary) << bytes;
    CHECK(test::run_dzr("ckpt validate " + q(f.ckpt), f.dir.path()).code == 0);
    r = test::run_dzr("ckpt validate --hash " + q(f.ckpt), f.dir.path());
    CHECK(r.code == 1);
    CHECK(r.has("(the file changed or is damaged)"));
}
