// The sample rollout (tiny config, CPU) with FP8 DiT weights (`precision: fp8`, quantized on load and read from a
// `dzr ckpt quantize` checkpoint) and with the FP8 KV pool (`kv.dtype: fp8`): every output written, the actions finite
// and close to the bf16 run's, measured against how much a different noise seed moves them.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "config/run_config.h"
#include "io/npy.h"
#include "io/synth_episode.h"
#include "io/video_reader.h"
#include "model/inventory.h"
#include "rollout/runner.h"
#include "support/json_file.h"
#include "support/test_support.h"
#include "weights/checkpoint.h"
#include "weights/quantize_checkpoint.h"
#include "weights/random_checkpoint.h"

using namespace dzr;
namespace fs = std::filesystem;

namespace {

fs::path sample_episode(const test::TempDir& dir) {
    if (io::video_io_available()) return test::source_dir() / "samples/episode_000";
    const fs::path ep = dir / "samples/episode_000";
    if (!fs::exists(ep)) io::write_synth_episode(ep, io::SynthOptions{});
    return ep;
}

/// One rollout of the sample (3 calls, no warm-up: the tiny model's calls are what is compared); returns its
/// actions [calls, 24, 8].
std::vector<float> rollout_actions(const test::TempDir& dir, const fs::path& ckpt, const std::string& name,
                                   Precision weights, Precision kv, uint64_t seed = 1140) {
    rollout::RolloutOptions o;
    o.checkpoint = ckpt;
    o.episodes = {sample_episode(dir)};
    o.out_dir = dir / name;
    o.run = config::load_run_config(test::source_dir() / "configs/tiny.yaml");
    o.run.rollout.max_chunks = 2;
    o.run.numerics = Numerics::Reference;
    o.run.precision = weights;
    o.run.kv.dtype = kv;
    o.run.sampling.seed = seed;
    o.have_config_model = true;
    o.devices = {Device::cpu()};
    o.quiet = true;
    o.warmup = false;
    o.report = false;
    o.open_video = io::open_video;
    const rollout::RolloutResult r = rollout::run_rollout(o);
    REQUIRE(r.failed == 0);
    const fs::path ep = dir / name / "episode_000";
    const auto manifest = test::read_json(ep / "manifest.json");
    CHECK(manifest["config"]["precision"] == precision_name(weights));
    CHECK(manifest["config"]["kv"]["dtype"] == precision_name(kv));
    const io::NpyArray a = io::read_npy(ep / "actions.npy");
    REQUIRE(a.shape() == std::vector<int64_t>{3, 24, 8});
    return a.to_f32();
}

/// RMS of the difference of two action sets in normalized units: the tiny checkpoint's oxe_droid statistics
/// (droid_metadata_json) give every action dimension q01..q99 of width 1 (relative joints -0.5..0.5, gripper
/// 0..1), so a normalized difference is the robot-unit difference / 0.5 (both runs add the same state).
double normalized_rms(const std::vector<float>& a, const std::vector<float>& b) {
    double e = 0;
    for (size_t i = 0; i < a.size(); ++i) e += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    return std::sqrt(e / double(a.size())) / 0.5;
}

}  // namespace

TEST_CASE("the sample rollout with FP8 weights and with an FP8 KV pool stays close to the bf16 rollout") {
    test::TempDir dir;
    const auto cfg = config::load_run_config(test::source_dir() / "configs/tiny.yaml");
    MakeOptions mo;
    mo.tokenizer = test::data_dir() / "tokenizer/spiece.model";  // bf16 weights, as the released checkpoint
    write_random_checkpoint(cfg.model, mo, dir / "ckpt");
    {
        const Checkpoint ck(dir / "ckpt");
        const auto stats = ck.statistics("oxe_droid");
        for (const char* key : {"joint_position", "gripper_position"})
            for (size_t i = 0; i < stats.action.at(key).q01.size(); ++i)
                REQUIRE(stats.action.at(key).q99[i] - stats.action.at(key).q01[i] == doctest::Approx(1.0));
        quantize_checkpoint(ck, expected_weights(ck.model_config()), dir / "ckpt-fp8", QuantizeOptions{});
    }

    const std::vector<float> bf16 = rollout_actions(dir, dir / "ckpt", "bf16", Precision::Bf16, Precision::Bf16);
    const std::vector<float> reseeded =
        rollout_actions(dir, dir / "ckpt", "seed", Precision::Bf16, Precision::Bf16, 1141);
    const std::vector<float> fp8 = rollout_actions(dir, dir / "ckpt", "fp8", Precision::Fp8, Precision::Bf16);
    const std::vector<float> stored = rollout_actions(dir, dir / "ckpt-fp8", "fp8-stored", Precision::Fp8, Precision::Bf16);
    const std::vector<float> kv = rollout_actions(dir, dir / "ckpt", "kv-fp8", Precision::Bf16, Precision::Fp8);
    for (const auto* run : {&fp8, &stored, &kv})
        for (float v : *run) REQUIRE(std::isfinite(v));

    // quantized on load or read from the quantized checkpoint: the same E4M3 weights, the same actions
    CHECK(stored == fp8);

    const double seed_rms = normalized_rms(reseeded, bf16);
    const double fp8_rms = normalized_rms(fp8, bf16), kv_rms = normalized_rms(kv, bf16);
    MESSAGE("normalized action RMS vs the bf16 rollout: FP8 weights " << fp8_rms << ", FP8 KV " << kv_rms
                                                                      << ", another noise seed " << seed_rms);
    // NOTE: the yardstick is the sampler itself: a different noise seed gives another valid sample of the same
    // policy. FP8 perturbs every DiT forward by E4M3 rounding (about 4% of its output, test_dit_forward.cpp), and the
    // same perturbation goes through CFG and the 16 sampler steps, so it must move the actions an order of magnitude
    // less than resampling does: under a tenth of the seed-to-seed distance. A wrong scale or a broken pool moves
    // them as much as a new sample or more; a run where FP8 did not engage gives exactly zero.
    CHECK(fp8_rms > 0.0);
    CHECK(kv_rms > 0.0);
    CHECK(fp8_rms < seed_rms / 10);
    CHECK(kv_rms < seed_rms / 10);
}
