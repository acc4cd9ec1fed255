// The memory side of `dzr rollout` on the tiny config (CPU): the text encoder pre-pass gives bit-identical actions
// over episodes with different prompts, a prompt it did not encode is an error naming it, the memory plan lands
// next to the measured peak in timing.json and in manifest.json, and a --gpu-memory-budget the plan exceeds refuses
// the run before anything is loaded or written; `dzr plan` prints the plan.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "config/run_config.h"
#include "core/error.h"
#include "io/npy.h"
#include "io/synth_episode.h"
#include "io/video_reader.h"
#include "policy/engine.h"
#include "policy/text_prepass.h"
#include "rollout/runner.h"
#include "support/cli.h"
#include "support/json_file.h"
#include "support/micro_geometry.h"
#include "support/test_support.h"
#include "model/inventory.h"
#include "weights/random_checkpoint.h"
#include "weights/random_weights.h"

using namespace dzr;
namespace fs = std::filesystem;
using test::read_json;

namespace {

/// `geometry`: overrides of the tiny config's model (support/micro_geometry.h).
config::RunConfig tiny(const std::vector<config::Override>& geometry = {}) {
    return config::load_run_config(test::source_dir() / "configs/tiny.yaml", geometry);
}

fs::path make_checkpoint(const test::TempDir& dir, const std::vector<config::Override>& geometry = {}) {
    MakeOptions mo;
    mo.dtype = DType::F32;
    mo.tokenizer = test::data_dir() / "tokenizer/spiece.model";
    write_random_checkpoint(tiny(geometry).model, mo, dir / "ckpt");
    return dir / "ckpt";
}

/// Two synthetic DROID episodes whose prompts differ (the generator picks a prompt by seed).
std::vector<fs::path> make_episodes(const test::TempDir& dir) {
    std::vector<fs::path> eps;
    for (uint64_t seed : {0, 1}) {
        io::SynthOptions so;
        so.frames = 60;
        so.seed = seed;
        eps.push_back(dir / ("episodes/ep" + std::to_string(seed)));
        io::write_synth_episode(eps.back(), so);
    }
    return eps;
}

rollout::RolloutOptions options(const fs::path& ckpt, const std::vector<fs::path>& episodes, const fs::path& out,
                                const std::vector<config::Override>& geometry = {}) {
    rollout::RolloutOptions o;
    o.checkpoint = ckpt;
    o.episodes = episodes;
    o.out_dir = out;
    o.run = tiny(geometry);
    o.run.numerics = Numerics::Reference;
    o.have_config_model = true;
    o.devices = {Device::cpu()};
    o.quiet = true;
    o.report = false;
    o.open_video = io::open_video;
    return o;
}

Embodiment droid_embodiment() {
    Embodiment e = builtin_embodiment("oxe_droid");
    bind_metadata(e, parse_embodiment_metadata(synthetic_metadata_json(e), "test").at(e.tag), "test");
    return e;
}

}  // namespace

TEST_CASE("the text pre-pass gives bit-identical actions over episodes with different prompts") {
    // NOTE: on the micro geometry (what is compared does not depend on it; 32 s of the tiny one on the 2-core CI
    // machine); DZR_LONG_TESTS=1 runs the tiny geometry
    const std::vector<config::Override> geometry = test::ci_geometry();
    test::TempDir dir;
    const fs::path ckpt = make_checkpoint(dir, geometry);
    const std::vector<fs::path> eps = make_episodes(dir);

    auto with = options(ckpt, eps, dir / "with", geometry);
    with.run.text_prepass = true;
    auto without = options(ckpt, eps, dir / "without", geometry);
    without.run.text_prepass = false;
    without.warmup = false;  // a warm-up changes no action; the pre-pass run keeps its own (its prompt pre-encoded)
    REQUIRE(rollout::run_rollout(with).failed == 0);
    REQUIRE(rollout::run_rollout(without).failed == 0);
    for (const char* ep : {"ep0", "ep1"}) {
        const std::string a = test::slurp(dir / "with" / ep / "actions.npy");
        const std::string b = test::slurp(dir / "without" / ep / "actions.npy");
        CHECK_MESSAGE(a.size() > 0, ep);
        CHECK_MESSAGE(a == b, ep);
    }
    // the episodes' prompts differ (two prompts went through the pre-pass)
    CHECK(read_json(dir / "with/ep0/manifest.json")["prompt"] != read_json(dir / "with/ep1/manifest.json")["prompt"]);
}

TEST_CASE("an engine with the text pre-pass holds each prompt once and refuses a prompt it did not encode") {
    const config::RunConfig run = tiny();
    const RandomWeightSource weights(expected_weights(run.model), 3, 1);
    PolicyOptions po;
    po.sampling = run.sampling;
    po.kv = run.kv;
    po.text_prepass = true;
    po.prepass_prompts = {"pick up the cup", "open the drawer", "pick up the cup"};
    const auto engine = Engine::create(run.model, weights, droid_embodiment(),
                                       test::data_dir() / "tokenizer/spiece.model", po, {Device::cpu()}, {});
    REQUIRE(engine->text_embeddings() != nullptr);
    CHECK(engine->text_embeddings()->size() == 3);  // two prompts and the negative one
    auto session = engine->open_session();
    const int H = 180, W = 320;
    std::vector<uint8_t> frames(size_t(H) * W * 3, 128);
    Observation obs;
    obs.views.assign(3, TensorView(frames.data(), DType::U8, Shape{1, H, W, 3}));
    obs.state.assign(8, 0.0);
    obs.prompt = "open the drawer";
    CHECK_NOTHROW(session->step(engine->prepare(obs)));
    obs.prompt = "close the drawer";
    std::string message;
    try {
        session->step(engine->prepare(obs));
    } catch (const Error& e) {
        message = e.what();
    }
    CHECK(message.find("close the drawer") != std::string::npos);
    CHECK(message.find("not among the run's prompts") != std::string::npos);
}

TEST_CASE("a rollout writes its memory plan next to the measured peak") {
    test::TempDir dir;
    const fs::path ckpt = make_checkpoint(dir);
    auto o = options(ckpt, {make_episodes(dir)[0]}, dir / "out");
    o.run.rollout.max_chunks = 1;
    o.warmup = false;
    REQUIRE(rollout::run_rollout(o).failed == 0);
    const auto timing = read_json(dir / "out/ep0/timing.json");
    // on the CPU neither is a GPU figure, but the plan is there
    CHECK(timing["peak_gpu_memory_bytes"].is_null());
    CHECK(timing["planned_peak_gpu_memory_bytes"].is_null());
    REQUIRE(timing["memory_plan"].is_object());
    CHECK(timing["memory_plan"]["device"] == "cpu");
    int64_t most = 0;
    for (const auto& [phase, bytes] : timing["memory_plan"]["phases"].items()) most = std::max(most, bytes.get<int64_t>());
    CHECK(timing["memory_plan"]["peak_bytes"].get<int64_t>() == most);
    const std::string peak = timing["memory_plan"]["peak_phase"];
    CHECK(timing["memory_plan"]["phases"][peak].get<int64_t>() == most);
    for (const char* phase : {"text_prepass", "load", "rollout"}) CHECK(timing["memory_plan"]["phases"].contains(phase));
    const auto manifest = read_json(dir / "out/ep0/manifest.json");
    REQUIRE(manifest["memory_plan"].is_object());
    CHECK(manifest["memory_plan"]["text_prepass"] == true);
    CHECK(manifest["memory_plan"]["peak"]["bytes"] == timing["memory_plan"]["peak_bytes"]);
    CHECK(manifest["config"]["gpu_memory_budget"] == "");
}

TEST_CASE("a rollout over its GPU memory budget is refused before anything is loaded, naming the parts and the shortfall") {
    test::TempDir dir;
    const fs::path ckpt = make_checkpoint(dir);
    auto o = options(ckpt, {make_episodes(dir)[0]}, dir / "out");
    o.run.gpu_memory_budget = "1MiB";
    std::string message;
    try {
        rollout::run_rollout(o);
    } catch (const Error& e) {
        message = e.what();
    }
    CHECK(message.find("before loading the checkpoint's weights; nothing was run") != std::string::npos);
    CHECK(message.find("GPU memory budget 1MiB") != std::string::npos);
    CHECK(message.find("does not fit") != std::string::npos);
    CHECK(message.find("The phase holds:") != std::string::npos);
    CHECK(message.find("workspace") != std::string::npos);
    CHECK(message.find("more than the budget") != std::string::npos);
    CHECK_FALSE(fs::exists(dir / "out"));

    // a budget the plan fits runs
    o.run.gpu_memory_budget = "4GiB";
    o.run.rollout.max_chunks = 1;
    o.warmup = false;
    CHECK(rollout::run_rollout(o).failed == 0);
}

TEST_CASE("dzr rollout and dzr plan read --gpu-memory-budget, refuse bad sizes, and dzr plan prints JSON") {
    if (test::dzr_bin().empty()) return;
    test::TempDir dir;
    const fs::path ckpt = make_checkpoint(dir);
    const fs::path ep = make_episodes(dir)[0];
    const std::string cfg = test::q(test::source_dir() / "configs/tiny.yaml");
    const std::string run = fmt::format("rollout {} --ckpt {} --config {} --quiet --no-warmup --set rollout.max_chunks=1",
                                        test::q(ep), test::q(ckpt), cfg);

    // a refused plan exits 1 and says each of `says`
    const auto refused = [&](const std::string& args, const std::vector<std::string>& says) {
        CAPTURE(args);
        const auto out = test::run_dzr("plan " + args, dir.path());
        CHECK(out.code == 1);
        for (const std::string& s : says) CHECK(out.has(s));
    };
    auto r = test::run_dzr(run + " --out " + test::q(dir / "a") + " --gpu-memory-budget 12parsecs", dir.path());
    CHECK(r.code == 1);
    CHECK(r.has("--gpu-memory-budget: '12parsecs' is not a memory size"));
    CHECK_FALSE(fs::exists(dir / "a"));

    r = test::run_dzr(run + " --out " + test::q(dir / "b") + " --gpu-memory-budget 2MiB", dir.path());
    CHECK(r.code == 1);
    CHECK(r.has("does not fit"));
    CHECK(r.has("workspace"));
    CHECK_FALSE(fs::exists(dir / "b"));

    r = test::run_dzr("plan --config " + cfg + " --json", dir.path());
    REQUIRE(r.code == 0);
    const auto j = nlohmann::json::parse(r.out);
    CHECK(j["precision"] == "bf16");
    CHECK(j["text_prepass"] == true);
    CHECK(j["numerics"] == "fast");  // the rollout's default
    CHECK(j["budget"].is_null());
    uint64_t parts = 0;
    for (const auto& p : j["parts"]) parts += p["bytes"].get<uint64_t>();
    CHECK(parts > j["peak"]["bytes"].get<uint64_t>());  // umT5 and the pre-pass output are not resident at the peak

    refused("--config " + cfg + " --gpu-memory-budget 1GiB", {"does NOT fit"});
    refused("--config " + cfg + " --precision fp16", {"--precision: expected bf16 or fp8, got 'fp16'"});
    refused("--config " + cfg + " --numerics turbo", {"turbo"});
    r = test::run_dzr("plan --config " + cfg + " --numerics reference --json", dir.path());
    REQUIRE(r.code == 0);
    CHECK(nlohmann::json::parse(r.out)["numerics"] == "reference");
    // the run settings' precedence: a flag over --set over the config file
    r = test::run_dzr("plan --config " + cfg + " --set numerics=reference --set precision=fp8 --json", dir.path());
    REQUIRE(r.code == 0);
    CHECK(nlohmann::json::parse(r.out)["numerics"] == "reference");
    CHECK(nlohmann::json::parse(r.out)["precision"] == "fp8");
    r = test::run_dzr("plan --config " + cfg + " --set numerics=reference --numerics fast --json", dir.path());
    REQUIRE(r.code == 0);
    CHECK(nlohmann::json::parse(r.out)["numerics"] == "fast");
    refused("", {"--config"});

    // DROID in bf16 on a 48 GiB card: with the in-place lanes the plan is over, without them it fits, and
    // kv.in_place auto gives them up; forced on, it does not fit
    const std::string droid = test::q(test::source_dir() / "configs/dreamzero_droid.yaml");
    r = test::run_dzr("plan --config " + droid + " --gpu-memory-budget 48GiB --json", dir.path());
    REQUIRE(r.code == 0);
    const auto fitted = nlohmann::json::parse(r.out);
    CHECK(fitted["kv_in_place_given_up"] == true);
    CHECK(fitted["budget"]["fits"] == true);
    CHECK(fitted["offload_layers_chosen"] == 0);
    refused("--config " + droid + " --gpu-memory-budget 48GiB --set kv.in_place=true --set offload_layers=0",
            {"does NOT fit"});
    // lanes forced on: offload_layers auto streams layers instead
    r = test::run_dzr("plan --config " + droid + " --gpu-memory-budget 48GiB --set kv.in_place=true --json", dir.path());
    REQUIRE(r.code == 0);
    CHECK(nlohmann::json::parse(r.out)["offload_layers_chosen"].get<int>() > 0);
    // 44 GiB (a 48 GB card): without the lanes it is still over; offload_layers auto streams the fewest DiT layers
    // from host memory that fit, and says so
    r = test::run_dzr("plan --config " + droid + " --gpu-memory-budget 44GiB --json", dir.path());
    REQUIRE(r.code == 0);
    const auto streamed = nlohmann::json::parse(r.out);
    CHECK(streamed["kv_in_place_given_up"] == true);
    CHECK(streamed["offload_layers_chosen"] == 5);
    CHECK(streamed["offload"]["layers"] == 5);
    CHECK(streamed["budget"]["fits"] == true);
    CHECK(streamed["peak"]["bytes"].get<uint64_t>() <= uint64_t(44) << 30);
    r = test::run_dzr("plan --config " + droid + " --gpu-memory-budget 44GiB", dir.path());
    REQUIRE(r.code == 0);
    CHECK(r.has("offload_layers auto: 5 of the DiT's 40 layers kept in host memory"));
    CHECK(r.has("DiT layer slots"));
    // one layer fewer does not fit: the count is the smallest
    refused("--config " + droid + " --gpu-memory-budget 44GiB --set kv.in_place=false --set offload_layers=4", {});
    // without streaming, the refusal names the settings that would fit, changing the numbers, with their peaks
    refused("--config " + droid + " --gpu-memory-budget 44GiB --set offload_layers=0",
            {"these fit, changing the numbers", "--kv-dtype fp8 (", "--precision fp8 ("});
    refused("--config " + droid + " --gpu-memory-budget 30GiB --set offload_layers=0",
            {"--precision fp8 --kv-dtype fp8 ("});
    refused("--config " + droid + " --set offload_layers=41", {"offload_layers 41 is outside [0, 40]"});
    refused("--config " + droid + " --set offload_layers=some", {"offload_layers"});
    r = test::run_dzr("plan --config " + droid + " --gpu-memory-budget 80GiB --json", dir.path());
    REQUIRE(r.code == 0);
    CHECK(nlohmann::json::parse(r.out)["kv_in_place_given_up"] == false);
}
