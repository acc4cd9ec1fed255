// `dzr rollout --save-video` on the tiny config (CPU): the decoded prediction and the observed
// canvases, their frame counts, the timing entry, and the error for a checkpoint without a decoder.
#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "config/run_config.h"
#include "core/error.h"
#include "io/atomic_file.h"
#include "io/npy.h"
#include "io/synth_episode.h"
#include "io/video_reader.h"
#include "model/inventory.h"
#include "rollout/predicted_video.h"
#include "rollout/runner.h"
#include "support/json_file.h"
#include "support/test_support.h"
#include "weights/random_checkpoint.h"

using namespace dzr;
namespace fs = std::filesystem;
using test::read_json;

namespace {

fs::path synth_episode(const test::TempDir& dir) {
    const fs::path ep = dir / "episode_000";
    if (!fs::exists(ep)) io::write_synth_episode(ep, io::SynthOptions{});
    return ep;
}

rollout::RolloutOptions video_options(const fs::path& episode, const fs::path& ckpt, const fs::path& out) {
    rollout::RolloutOptions o;
    o.checkpoint = ckpt;
    o.episodes = {episode};
    o.out_dir = out;
    o.run = config::load_run_config(test::source_dir() / "configs/tiny.yaml");
    o.run.rollout.max_chunks = 2;  // 3 calls
    o.run.numerics = Numerics::Reference;
    o.have_config_model = true;
    o.devices = {Device::cpu()};
    o.quiet = true;
    o.warmup = false;
    o.open_video = io::open_video;
    o.save_video = true;
    return o;
}

bool all_equal(const uint8_t* p, size_t n) { return std::all_of(p, p + n, [&](uint8_t v) { return v == p[0]; }); }

}  // namespace

TEST_CASE("observed frame indices follow the decoded frames of each prediction") {
    // First call of an episode: reference frame 0 opens the stream (1 decoded frame), then the 2
    // predicted latents stand for the next call's frames [0, 7, 15, 23], each twice (its VAE clip).
    const std::vector<int64_t> next = {0, 7, 15, 23};
    CHECK(rollout::observed_frame_indices(true, true, 0, next, 2) ==
          std::vector<int64_t>{0, 0, 0, 7, 7, 15, 15, 23, 23});
    // A commit call: 8 frames.
    const std::vector<int64_t> next2 = {24, 31, 39, 47};
    CHECK(rollout::observed_frame_indices(false, false, 23, next2, 2) ==
          std::vector<int64_t>{24, 24, 31, 31, 39, 39, 47, 47});
    // A window reset later in the stream: its reference latent decodes to 4 frames.
    CHECK(rollout::observed_frame_indices(false, true, 95, next2, 2) ==
          std::vector<int64_t>{95, 95, 95, 95, 24, 24, 31, 31, 39, 39, 47, 47});
    // The first prediction of a stream always carries the reference latent.
    CHECK_THROWS_AS(rollout::observed_frame_indices(true, false, 0, next, 2), Error);
}

TEST_CASE("the video accumulator joins predictions along time") {
    rollout::VideoAccumulator acc;
    // Two predictions [z=2, f, h=1, w=2] with value = 100 c + 10 f + x.
    for (int64_t f : {3, 2}) {
        Tensor t = Tensor::host(Shape{2, f, 1, 2}, DType::F32);
        for (int64_t c = 0; c < 2; ++c)
            for (int64_t k = 0; k < f; ++k)
                for (int64_t x = 0; x < 2; ++x) t.ptr<float>()[(c * f + k) * 2 + x] = float(100 * c + 10 * (k + (f == 2 ? 3 : 0)) + x);
        acc.add(t, std::vector<int64_t>(size_t(f), 0));
    }
    REQUIRE(acc.latent_frames() == 5);
    const Tensor j = acc.joined();
    REQUIRE(j.shape() == Shape{2, 5, 1, 2});
    for (int64_t c = 0; c < 2; ++c)
        for (int64_t k = 0; k < 5; ++k)
            for (int64_t x = 0; x < 2; ++x) CHECK(j.ptr<float>()[(c * 5 + k) * 2 + x] == float(100 * c + 10 * k + x));
}

TEST_CASE("rollout --save-video writes the decoded prediction next to the observed canvases") {
    test::TempDir dir;
    const auto cfg = config::load_run_config(test::source_dir() / "configs/tiny.yaml");
    REQUIRE(cfg.model.vae.has_decoder);
    MakeOptions mo;
    mo.dtype = DType::F32;
    mo.tokenizer = test::data_dir() / "tokenizer/spiece.model";
    write_random_checkpoint(cfg.model, mo, dir / "ckpt");
    const fs::path episode = synth_episode(dir);

    // 3 calls: 3 + 2 + 2 = 7 latent frames -> 1 + 4 * 6 = 25 frames of the 176x320 canvas.
    const int64_t T = 25, H = cfg.model.canvas_height, W = cfg.model.canvas_width;

    SUBCASE(".npy when there is no video encoder") {
        auto opt = video_options(episode, dir / "ckpt", dir / "out");
        const auto r = rollout::run_rollout(opt);
        REQUIRE(r.failed == 0);
        const fs::path out = dir / "out/episode_000";
        const io::NpyArray pred = io::read_npy(out / "predicted_video.npy");
        const io::NpyArray obs = io::read_npy(out / "observed_video.npy");
        REQUIRE(pred.shape() == std::vector<int64_t>{T, H, W, 3});
        REQUIRE(obs.shape() == std::vector<int64_t>{T, H, W, 3});
        CHECK(pred.dtype() == io::NpyDType::U1);
        const auto* p = static_cast<const uint8_t*>(pred.data());
        CHECK_FALSE(all_equal(p, size_t(T * H * W * 3)));
        CHECK_FALSE(all_equal(static_cast<const uint8_t*>(obs.data()), size_t(T * H * W * 3)));

        const auto timing = read_json(out / "timing.json");
        REQUIRE(timing["video"].is_object());
        CHECK(timing["video"]["latent_frames"].get<int>() == 7);
        CHECK(timing["video"]["frames"].get<int>() == T);
        CHECK(timing["video"]["fps"].get<double>() == 5.0);
        CHECK(timing["peak_gpu_memory_bytes"].is_null());
        const auto done = read_json(out / "done.json");
        const auto files = done["files"].get<std::vector<std::string>>();
        CHECK(std::count(files.begin(), files.end(), "predicted_video.npy") == 1);

        // Actions do not depend on whether the video is saved.
        auto plain = video_options(episode, dir / "ckpt", dir / "plain");
        plain.save_video = false;
        rollout::run_rollout(plain);
        CHECK(io::read_npy(dir / "plain/episode_000/actions.npy").to_f32() == io::read_npy(out / "actions.npy").to_f32());
        CHECK(read_json(dir / "plain/episode_000/timing.json")["video"].is_null());
        CHECK_FALSE(fs::exists(dir / "plain/episode_000/predicted_video.npy"));
    }
    SUBCASE("a video browsers play with the OpenCV encoder") {
        if (!io::video_io_available()) return;
        auto opt = video_options(episode, dir / "ckpt", dir / "out");
        opt.video_encoder = io::browser_video_encoder();
        REQUIRE_MESSAGE(opt.video_encoder.has_value(), "this OpenCV/FFmpeg build encodes neither VP8, VP9 nor H.264");
        const auto r = rollout::run_rollout(opt);
        REQUIRE(r.failed == 0);
        const std::string ext = opt.video_encoder->extension;
        CHECK((ext == ".webm" || ext == ".mp4"));
        for (const std::string& name : {"predicted_video" + ext, "observed_video" + ext}) {
            const Tensor frames = io::open_video(dir / "out/episode_000" / name)->read_all();
            REQUIRE(frames.shape() == Shape{T, H, W, 3});
            CHECK_FALSE(all_equal(frames.ptr<uint8_t>(), size_t(frames.numel())));
        }
        for (const auto& e : fs::directory_iterator(dir / "out/episode_000"))
            CHECK(e.path().filename().string().find(io::kTempMarker) == std::string::npos);
    }
}

TEST_CASE("rollout --save-video with a checkpoint without the VAE decoder names the missing keys") {
    test::TempDir dir;
    auto cfg = config::load_run_config(test::source_dir() / "configs/tiny.yaml");
    cfg.model.vae.has_decoder = false;
    MakeOptions mo;
    mo.dtype = DType::F32;
    mo.tokenizer = test::data_dir() / "tokenizer/spiece.model";
    write_random_checkpoint(cfg.model, mo, dir / "ckpt");
    auto opt = video_options(synth_episode(dir), dir / "ckpt", dir / "out");
    opt.have_config_model = false;
    CHECK_THROWS_WITH_AS(rollout::run_rollout(opt), doctest::Contains("action_head.vae.model.decoder."), Error);
    CHECK_FALSE(fs::exists(dir / "out/episode_000/actions.npy"));
}
