// Nothing silently wrong at run time (docs/RELIABILITY.md): a checkpoint with NaN weights fails the call that
// meets them, naming the stage, call and step, instead of producing plausible actions; a state in degrees
// runs with a warning naming the joint; --resume skips only episodes of the same run; --skip-invalid runs the
// rest.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "backend/blas_kernels.h"
#include "config/run_config.h"
#include "io/atomic_file.h"
#include "io/npy.h"
#include "io/synth_episode.h"
#include "model/inventory.h"
#include "support/cli.h"
#include "support/json_file.h"
#include "support/test_support.h"
#include "weights/random_checkpoint.h"
#include "weights/safetensors.h"

using namespace dzr;
using test::q;
namespace fs = std::filesystem;

namespace {

const fs::path kConfig = test::source_dir() / "configs/tiny.yaml";

struct Fixture {
    test::TempDir dir;
    fs::path ckpt = dir / "ckpt", eps = dir / "eps";

    Fixture() {
        make_checkpoint(ckpt, 0);
        io::SynthOptions so;
        so.frames = 30;  // two calls: frame 0, then the chunk anchored at frame 23
        so.width = 64;
        so.height = 36;
        io::write_synth_episode(eps / "ep_a", so);
    }
    static void make_checkpoint(const fs::path& dir, uint64_t seed) {
        MakeOptions mo;
        mo.dtype = DType::F32;
        mo.seed = seed;
        mo.tokenizer = test::data_dir() / "tokenizer/spiece.model";
        write_random_checkpoint(config::load_run_config(kConfig).model, mo, dir);
    }
    test::CliResult rollout(const fs::path& ck, const fs::path& out, const std::string& extra = "") const {
        return test::run_dzr(
            fmt::format(
                "rollout {} --ckpt {} --out {} --config {} --device cpu --no-warmup --no-plots --quiet "
                "--set rollout.max_chunks=1 {}",
                q(eps), q(ck), q(out), q(kConfig), extra),
            dir.path());
    }
};

/// A copy of `src` whose f32 tensors with a key containing `pattern` get NaN as their first value.
void copy_with_nan(const fs::path& src, const fs::path& dst, const std::string& pattern,
                   int expect_at_least) {
    fs::copy(src, dst, fs::copy_options::recursive);
    const fs::path shard = dst / "model.safetensors";
    const auto file = SafetensorsFile::open(src / "model.safetensors");
    std::string bytes = test::slurp(shard);
    int poked = 0;
    for (const auto& e : file->entries()) {
        if (e.name.find(pattern) == std::string::npos) continue;
        REQUIRE(e.dtype == DType::F32);
        const float nan = std::nanf("");
        std::memcpy(bytes.data() + file->data_offset() + e.begin, &nan, sizeof nan);
        ++poked;
    }
    REQUIRE(poked >= expect_at_least);
    std::ofstream(shard, std::ios::binary | std::ios::trunc) << bytes;
}

#define SKIP_WITHOUT_DZR_BIN()                                                                \
    if (test::dzr_bin().empty()) {                                                            \
        MESSAGE("DZR_BIN is not built (run through ctest after building dzr_cli); skipping"); \
        return;                                                                               \
    }

}  // namespace

TEST_CASE(
    "NaN weights in a q-projection, the action decoder or every DiT layer fail the call naming the stage") {
    SKIP_WITHOUT_DZR_BIN();
    Fixture f;
    const auto episodes = test::snapshot(f.eps);
    // NOTE: before, the action decoder's ReLU turned NaN into 0: all three gave the same finite actions, exit
    // 0.
    const struct {
        const char* pattern;
        int count;
        const char* stage;
    } cases[] = {{"blocks.0.self_attn.q.weight", 1, "the video velocity (after CFG)"},
                 {"action_decoder.layer1.W", 1, "the action velocity"},
                 {".self_attn.q.weight", 2, "the video velocity (after CFG)"}};
    for (const auto& c : cases) {
        CAPTURE(c.pattern);
        const fs::path ck = f.dir / "ckpt-nan", out = f.dir / "out-nan";
        fs::remove_all(ck);
        fs::remove_all(out);
        copy_with_nan(f.ckpt, ck, c.pattern, c.count);
        const auto ckpt_files = test::snapshot(ck);
        const auto r = f.rollout(ck, out);
        CHECK(r.code == 1);
        CHECK(r.has(std::string("episode ep_a: call 0, denoising step 0: ") + c.stage));
        CHECK(r.has("non-finite value"));
        CHECK_FALSE(fs::exists(out / "ep_a/done.json"));
        CHECK_FALSE(fs::exists(out / "ep_a/actions.npy"));
        CHECK(test::snapshot(ck) == ckpt_files);
    }
    CHECK(test::snapshot(f.eps) == episodes);
}

TEST_CASE("NaN weights in the VAE decoder fail the episode naming the decoder, with no video and no done marker") {
    SKIP_WITHOUT_DZR_BIN();
    Fixture f;
    // NOTE: before, the uint8 conversion turned NaN into 0: an all-black predicted video and exit 0
    const fs::path ck = f.dir / "ckpt-nan", out = f.dir / "out-nan";
    copy_with_nan(f.ckpt, ck, "vae.model.decoder.conv1.weight", 1);
    const auto r = f.rollout(ck, out, "--save-video");
    CHECK(r.code == 1);
    CHECK(r.has("the VAE decoder: the decoded video has"));
    CHECK(r.has("non-finite value"));
    CHECK_FALSE(fs::exists(out / "ep_a/done.json"));
    CHECK_FALSE(fs::exists(out / "ep_a/actions.npy"));
    for (const char* video : {"predicted_video.webm", "predicted_video.mp4", "predicted_video.npy"})
        CHECK_FALSE(fs::exists(out / "ep_a" / video));
}

TEST_CASE("joint positions in degrees run with one warning naming the joint and the likely cause") {
    SKIP_WITHOUT_DZR_BIN();
    Fixture f;
    const fs::path jp = f.eps / "ep_a/joint_position.npy";
    const io::NpyArray a = io::read_npy(jp);
    std::vector<double> v = a.to_f64();
    for (double& x : v) x *= 180.0 / 3.14159265358979323846;
    io::write_npy_f64(jp, a.shape(), v);
    const auto r = f.rollout(f.ckpt, f.dir / "out");
    CHECK(r.code == 0);
    CHECK(r.has("episode ep_a: state joint_position["));
    CHECK(r.has("these look like degrees: dzr expects joint positions in radians"));
    const auto manifest = test::read_json(f.dir / "out/ep_a/manifest.json");
    int degrees = 0;
    for (const auto& w : manifest["warnings"])
        degrees += w.get<std::string>().find("look like degrees") != std::string::npos;
    CHECK(degrees == 1);
    // logged once, when the episode is validated
    size_t logged = 0;
    for (size_t at = 0; (at = r.err.find("look like degrees", at)) != std::string::npos; ++at) ++logged;
    CHECK(logged == 1);
}

TEST_CASE(
    "--resume skips only episodes of the same run and refuses another checkpoint, seed, config or numerics") {
    SKIP_WITHOUT_DZR_BIN();
    Fixture f;
    const fs::path out = f.dir / "out";
    REQUIRE(f.rollout(f.ckpt, out).code == 0);
    // What ran is what the manifest says; timings are rounded to microseconds.
    const auto manifest = test::read_json(out / "ep_a/manifest.json");
    CHECK(manifest["config"]["sampling"]["dit_steps"] == "0,1,2,6,10,13,14,15");
    CHECK(manifest["config"]["sampling"]["num_dit_steps"] == 8);
    const auto timing = test::read_json(out / "ep_a/timing.json");
    for (const auto& c : timing["calls"]) {
        CHECK(c["dit_evaluations"] == 8);
        const double ms = c["total_ms"].get<double>();
        CHECK(std::fabs(ms * 1000 - std::round(ms * 1000)) < 1e-6);
    }
    const auto done_mtime = fs::last_write_time(out / "ep_a/done.json");

    auto r = f.rollout(f.ckpt, out, "--resume");
    CHECK(r.code == 0);
    CHECK(r.has("skipped"));
    CHECK(fs::last_write_time(out / "ep_a/done.json") == done_mtime);

    r = f.rollout(f.ckpt, out, "--resume --set sampling.seed=7");
    CHECK(r.code == 1);
    CHECK(r.has("episode ep_a: " + out.string() + "/ep_a was produced by another run"));
    CHECK(r.has("seed: 1140 (recorded) vs 7 (this run)"));
    r = f.rollout(f.ckpt, out, "--resume --set sampling.cfg_scale=3");
    CHECK(r.code == 1);
    CHECK(r.has("run.sampling.cfg_scale: 5.0 (recorded) vs 3.0 (this run)"));
    r = f.rollout(f.ckpt, out, "--resume --kv dense");
    CHECK(r.code == 1);
    CHECK(r.has("numerics.kv_mode: \"paged\" (recorded) vs \"dense\" (this run)"));
    const fs::path other = f.dir / "ckpt-other";
    Fixture::make_checkpoint(other, 1);
    r = f.rollout(other, out, "--resume");
    CHECK(r.code == 1);
    CHECK(r.has("checkpoint.shards[0].data_sample_sha256"));
    CHECK(fs::last_write_time(out / "ep_a/done.json") == done_mtime);

    // The CPU backend's numbers depend on OpenBLAS's kernels: the fingerprint names them, and another table is refused.
    auto done = test::read_json(out / "ep_a/done.json");
    CHECK(done["fingerprint"]["numerics"]["blas_core"] == blas_core_name());
    done["fingerprint"]["numerics"]["blas_core"] = "Sandybridge";
    std::ofstream(out / "ep_a/done.json") << done.dump();
    r = f.rollout(f.ckpt, out, "--resume");
    CHECK(r.code == 1);
    CHECK(r.has("numerics.blas_core: \"Sandybridge\" (recorded)"));

    // A done marker without a fingerprint (an older dzr) cannot be trusted either.
    done.erase("fingerprint");
    std::ofstream(out / "ep_a/done.json") << done.dump();
    r = f.rollout(f.ckpt, out, "--resume");
    CHECK(r.code == 1);
    CHECK(r.has("has no run fingerprint"));
}

TEST_CASE("--resume reruns an episode whose outputs were deleted and refuses one whose inputs changed") {
    SKIP_WITHOUT_DZR_BIN();
    Fixture f;
    const fs::path out = f.dir / "out";
    REQUIRE(f.rollout(f.ckpt, out).code == 0);
    const std::string actions = io::read_file(out / "ep_a/actions.npy");
    fs::remove(out / "ep_a/actions.npy");
    auto r = f.rollout(f.ckpt, out, "--resume");
    CHECK(r.code == 0);
    CHECK(r.has("episode ep_a: finished by an earlier run, but actions.npy of its outputs is missing: it runs again"));
    CHECK(io::read_file(out / "ep_a/actions.npy") == actions);

    // The same frame count, one pixel changed: another episode for the fingerprint.
    const fs::path cam = f.eps / "ep_a/exterior_image_1_left.npy";
    std::string bytes = io::read_file(cam);
    bytes.back() = char(bytes.back() ^ 0x40);
    std::ofstream(cam, std::ios::binary) << bytes;
    r = f.rollout(f.ckpt, out, "--resume");
    CHECK(r.code == 1);
    CHECK(r.has("episode.inputs_sha256"));
}

TEST_CASE("--skip-invalid runs the valid episodes and records the invalid ones in the summary") {
    SKIP_WITHOUT_DZR_BIN();
    Fixture f;
    fs::copy(f.eps / "ep_a", f.eps / "ep_b", fs::copy_options::recursive);
    fs::remove(f.eps / "ep_b/exterior_image_2_left.npy");
    auto r = f.rollout(f.ckpt, f.dir / "out");
    CHECK(r.code == 1);
    CHECK_FALSE(fs::exists(f.dir / "out"));
    r = f.rollout(f.ckpt, f.dir / "out", "--skip-invalid");
    CHECK(r.code == 0);
    CHECK(r.has("dzr: warning: episode ep_b was not run (--skip-invalid)"));
    const auto summary = test::read_json(f.dir / "out/summary.json");
    CHECK(summary["totals"]["ok"] == 1);
    CHECK(summary["totals"]["invalid"] == 1);
    CHECK(summary["episodes"][1]["status"] == "invalid");
    CHECK(summary["episodes"][1]["error"].get<std::string>().find("exterior_image_2_left") !=
          std::string::npos);
    CHECK(fs::exists(f.dir / "out/ep_a/done.json"));
    CHECK_FALSE(fs::exists(f.dir / "out/ep_b"));
}
