#include <doctest/doctest.h>

#include <fstream>
#include <set>
#include <string>

#include "backend/env_settings.h"
#include "config/model_fields.h"
#include "config/model_json.h"
#include "config/run_config.h"
#include "config/run_fields.h"
#include "config/settings.h"
#include "core/error.h"
#include "support/test_support.h"

using namespace dzr;
using namespace dzr::config;
namespace fs = std::filesystem;

namespace {

using test::error_of;
using test::contains;

fs::path config_path(const char* name) {
    return test::source_dir() / "configs" / name;
}

/// configs/tiny.yaml with one line replaced (the first line containing `find`).
std::string tiny_with(const std::string& find, const std::string& replace) {
    std::ifstream f(config_path("tiny.yaml"));
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const size_t p = text.find(find);
    REQUIRE(p != std::string::npos);
    const size_t eol = text.find('\n', p);
    return text.substr(0, p) + replace + text.substr(eol);
}

}  // namespace

TEST_CASE("the DROID config reproduces the real DreamZero geometry and settings") {
    const RunConfig rc = load_run_config(config_path("dreamzero_droid.yaml"));
    // model_config.h's defaults are the real DreamZero-DROID values (dreamzero-reference.md §2)
    CHECK(diff_model_configs(rc.model, ModelConfig{}).empty());
    CHECK(rc.model.dit.dim == 5120);
    CHECK(rc.model.dit.num_layers == 40);
    CHECK(rc.model.dit.head_dim() == 128);
    CHECK(rc.model.dit.local_attn_size() == 9);
    CHECK(rc.model.t5.vocab == 256384);
    CHECK(rc.model.clip.use_layers == 31);
    CHECK(rc.model.vae.temporal_downsample == std::vector<bool>{false, true, true});
    CHECK(rc.sampling.num_inference_steps == 16);
    CHECK(rc.sampling.sigma_shift == 5.0f);
    CHECK(rc.sampling.cfg_scale == 5.0f);
    CHECK(rc.sampling.num_dit_steps == 8);
    CHECK(rc.sampling.seed == 1140);
    CHECK(rc.sampling.dit_step_mask.empty());
    CHECK(rc.kv.window_frames == 9);
    CHECK(rc.kv.memory_budget.kind == KvBudgetKind::Auto);
    CHECK(rc.rollout.stride == 24);
    CHECK(rc.rollout.offsets == std::vector<int>{-23, -16, -8, 0});
    CHECK(rc.embodiment == "oxe_droid");
}

TEST_CASE("the tiny and parity configs load with the geometry they promise") {
    const RunConfig tiny = load_run_config(config_path("tiny.yaml"));
    CHECK(tiny.model.dit.dim == 128);
    CHECK(tiny.model.dit.num_heads == 1);
    CHECK(tiny.model.dit.head_dim() == 128);
    CHECK(tiny.model.dit.text_dim == tiny.model.t5.dim);
    CHECK(tiny.model.dit.image_dim == tiny.model.clip.width);
    CHECK(tiny.model.dit.frame_seqlen == 220);  // (176 / 16) * (320 / 16)
    CHECK(tiny.model.canvas_height == 176);
    CHECK(tiny.model.canvas_width == 320);
    CHECK(tiny.model.t5.vocab == 1000);
    CHECK(tiny.model.clip.num_layers == 3);
    CHECK(tiny.model.clip.use_layers == 2);
    CHECK(tiny.model.vae.base_dim == 4);

    const RunConfig parity = load_run_config(config_path("parity.yaml"));
    CHECK(parity.model.dit.dim == 256);
    CHECK(parity.model.dit.num_heads == 2);
    CHECK(parity.model.clip.width == 1280);
    CHECK(parity.model.clip.num_layers == 2);
    CHECK(parity.model.clip.use_layers == 1);
    CHECK(parity.model.vae.base_dim == 96);
    CHECK(parity.sampling.seed == tiny.sampling.seed);
}

TEST_CASE("command-line overrides set scalars and lists and reject unknown keys") {
    const auto tiny = config_path("tiny.yaml");
    const RunConfig rc = load_run_config(
        tiny, {parse_override("sampling.cfg_scale=3.5"), parse_override("model.dit.num_layers=4"),
               parse_override("rollout.offsets=[-10, 0]"),
               parse_override("sampling.dit_step_mask=[true, false, true, true, "
                              "false, false, true, false, false, false, true, "
                              "false, false, true, true, true]"),
               parse_override("kv.memory_budget=8GiB")});
    CHECK(rc.sampling.cfg_scale == 3.5f);
    CHECK(rc.model.dit.num_layers == 4);
    CHECK(rc.rollout.offsets == std::vector<int>{-10, 0});
    REQUIRE(rc.sampling.dit_step_mask.size() == 16);
    CHECK(rc.sampling.dit_step_mask[0]);
    CHECK_FALSE(rc.sampling.dit_step_mask[1]);
    CHECK(rc.kv.memory_budget.kind == KvBudgetKind::Bytes);
    CHECK(rc.kv.memory_budget.bytes == 8ull << 30);

    std::string msg = error_of([&] { load_run_config(tiny, {parse_override("model.dit.dimm=3")}); });
    CHECK(contains(msg, "unknown key model.dit.dimm"));
    CHECK(contains(msg, "--set model.dit.dimm"));
    CHECK(contains(msg, "tiny.yaml"));

    msg = error_of([&] { load_run_config(tiny, {parse_override("samplingx.seed=1")}); });
    CHECK(contains(msg, "unknown key samplingx"));

    msg = error_of([&] { load_run_config(tiny, {parse_override("model.dit.dim=abc")}); });
    CHECK(contains(msg, "model.dit.dim: expected an integer, got 'abc'"));

    msg = error_of([&] { load_run_config(tiny, {parse_override("model.dit.dim.x=1")}); });
    CHECK(contains(msg, "model.dit.dim is not a map"));

    CHECK(contains(error_of([] { parse_override("sampling.seed"); }), "expected KEY=VALUE"));
    CHECK(contains(error_of([] { parse_override("=3"); }), "invalid key"));
    CHECK(contains(error_of([] { parse_override("a..b=3"); }), "invalid key"));
}

TEST_CASE("config files are read strictly, naming the file and the key") {
    std::string msg =
        error_of([] { parse_run_config(tiny_with("    dim: 128", "    dimm: 128"), "t.yaml"); });
    CHECK(contains(msg, "t.yaml"));
    CHECK(contains(msg, "model.dit.dim is missing"));

    msg = error_of([] { parse_run_config(tiny_with("  cfg_scale:", "  cfg_scal: 5.0"), "t.yaml"); });
    CHECK(contains(msg, "unknown key sampling.cfg_scal"));

    msg = error_of([] { parse_run_config(tiny_with("    num_layers: 2", "    num_layers: 2.5"), "t.yaml"); });
    CHECK(contains(msg, "model.dit.num_layers: expected an integer, got '2.5'"));

    msg = error_of(
        [] { parse_run_config(tiny_with("    has_decoder: true", "    has_decoder: maybe"), "t.yaml"); });
    CHECK(contains(msg, "model.vae.has_decoder: expected true or false"));

    msg = error_of([] { parse_run_config("model: [1, 2\n", "broken.yaml"); });
    CHECK(contains(msg, "broken.yaml: YAML syntax error at line"));

    // Run sections may be left out (the real DreamZero-DROID settings are the defaults); before, a missing one
    // threw yaml-cpp's "invalid node" instead of reading as empty (found by fuzz_run_config).
    std::string text = tiny_with("sampling:", "samplingx:");
    text.replace(text.find("samplingx:"), text.find("kv:") - text.find("samplingx:"), "");
    const RunConfig no_sampling = parse_run_config(text, "t.yaml");
    CHECK(no_sampling.sampling.num_inference_steps == 16);

    msg = error_of([] { parse_run_config("sampling:\n  seed: 1\n", "nomodel.yaml"); });
    CHECK(contains(msg, "nomodel.yaml: the model: section is missing"));

    msg = error_of([] { load_run_config(test::source_dir() / "configs" / "absent.yaml"); });
    CHECK(contains(msg, "absent.yaml"));

    // A repeated key: yaml-cpp keeps both and a lookup takes the first, so the second would vanish silently.
    msg = error_of([] { parse_run_config(tiny_with("sampling:", "sampling:\n  seed: 1\n  seed: 2"), "t.yaml"); });
    CHECK(contains(msg, "t.yaml: line "));
    CHECK(contains(msg, "key 'seed' given twice (first on line "));
}

TEST_CASE("inconsistent geometries and run settings are rejected with every problem listed") {
    std::string msg =
        error_of([] { parse_run_config(tiny_with("    text_dim: 64", "    text_dim: 32"), "t.yaml"); });
    CHECK(contains(msg, "dit.text_dim 32 must equal the umT5 width t5.dim 64"));

    msg = error_of(
        [] { parse_run_config(tiny_with("    frame_seqlen: 220", "    frame_seqlen: 800"), "t.yaml"); });
    CHECK(contains(msg, "dit.frame_seqlen 800"));
    CHECK(contains(msg, "(220)"));

    msg = error_of([] {
        parse_run_config(
            tiny_with("  num_dit_steps: 8", "  num_dit_steps: 8\n  dit_step_mask: [true, false]"), "t.yaml");
    });
    CHECK(contains(msg, "dit_step_mask has 2 entries, expected num_inference_steps = 16"));

    msg = error_of([] {
        parse_run_config(tiny_with("  num_dit_steps: 8",
                                   "  num_dit_steps: 8\n  dit_step_mask: [false, true, true, "
                                   "true, true, true, true, true, true, true, true, true, "
                                   "true, true, true, true]"),
                         "t.yaml");
    });
    CHECK(contains(msg, "dit_step_mask[0] must be true"));

    msg = error_of([] { parse_run_config(tiny_with("  offsets:", "  offsets: [0, -8]"), "t.yaml"); });
    CHECK(contains(msg, "rollout.offsets must increase"));

    msg = error_of([] { parse_run_config(tiny_with("  window_frames:", "  window_frames: -1"), "t.yaml"); });
    CHECK(contains(msg, "t.yaml"));
    CHECK(contains(msg, "window_frames"));

    ModelConfig m;
    m.dit.in_dim = 20;
    m.dit.num_heads = 3;  // 5120 / 3 is not whole (the quotient 1706 is even, so no RoPE complaint)
    const auto problems = check_model_config(m);
    REQUIRE(problems.size() == 2);
    CHECK(contains(problems[0], "dit.dim 5120 is not a multiple of dit.num_heads 3"));
    CHECK(contains(problems[1], "dit.in_dim 20 must be 2 * vae.z_dim + 4 = 36"));
}

TEST_CASE("config.json written from a geometry reads back identically") {
    for (const char* name : {"tiny.yaml", "parity.yaml", "parity_wide.yaml", "dreamzero_droid.yaml"}) {
        const ModelConfig m = load_run_config(config_path(name)).model;
        const auto j = model_config_to_json(m, {{"seed", 7}});
        CHECK(j["model_type"] == "vla");
        CHECK(j["architectures"][0] == "VLA");
        CHECK(j["action_head_cfg"]["config"]["diffusion_model_cfg"]["dim"] == m.dit.dim);
        CHECK(j["dzr"]["seed"] == 7);
        const auto back = model_config_from_json(nlohmann::json::parse(j.dump()), "config.json");
        CHECK(back.defaulted.empty());
        CHECK(diff_model_configs(m, back.model).empty());
    }
}

TEST_CASE("a config.json in the released shape gives the DiT geometry and real defaults elsewhere") {
    // The fields the hydra config of the official repo carries (AH.yaml + DROID overrides); eps as a string.
    const auto j = nlohmann::json::parse(R"({
      "model_type": "vla", "architectures": ["VLA"], "action_horizon": 24, "action_dim": 32,
      "backbone_cfg": {"_target_": "groot.vla.model.dreamzero.backbone.identity.IdentityBackbone"},
      "action_head_cfg": {"_target_": "x.WANPolicyHead", "config": {
        "num_frames": 33, "action_horizon": 24, "max_state_dim": 64, "max_action_dim": 32,
        "hidden_size": 64, "input_embedding_dim": 1536, "num_inference_timesteps": 4,
        "diffusion_model_cfg": {"_target_": "x.CausalWanModel", "model_type": "i2v", "frame_seqlen": 880,
          "dim": 256, "in_dim": 36, "ffn_dim": 512, "out_dim": 16, "freq_dim": 256, "eps": "1e-6",
          "num_heads": 2, "num_layers": 2, "max_chunk_size": 4, "num_frame_per_block": 2,
          "num_action_per_block": 24, "num_state_per_block": 1},
        "text_encoder_cfg": {"_target_": "x.WanTextEncoder", "text_encoder_pretrained_path": null},
        "image_encoder_cfg": {"_target_": "x.WanImageEncoder", "image_encoder_pretrained_path": null},
        "vae_cfg": {"_target_": "x.WanVideoVAE", "vae_pretrained_path": null}}}})");
    const auto r = model_config_from_json(j, "config.json");
    CHECK(r.model.dit.dim == 256);
    CHECK(r.model.dit.num_heads == 2);
    CHECK(r.model.dit.eps == doctest::Approx(1e-6));
    CHECK(r.model.dit.hidden_size == 1024);  // the DiT's own default; the head's hidden_size is not the DiT's
    CHECK(r.model.t5.vocab == 256384);
    CHECK(r.model.clip.width == 1280);
    CHECK(r.model.vae.base_dim == 96);
    const auto& d = r.defaulted;
    CHECK(std::find(d.begin(), d.end(), "t5.vocab") != d.end());
    CHECK(std::find(d.begin(), d.end(), "dit.hidden_size") != d.end());
    CHECK(std::find(d.begin(), d.end(), "dit.dim") == d.end());
    CHECK(std::find(d.begin(), d.end(), "num_frames") == d.end());

    auto broken = j;
    broken["action_head_cfg"]["config"]["diffusion_model_cfg"].erase("num_layers");
    CHECK(contains(error_of([&] { model_config_from_json(broken, "cfg.json"); }),
                   "cfg.json: action_head_cfg.config.diffusion_model_cfg.num_layers is missing"));
    broken = j;
    broken["action_head_cfg"]["config"]["diffusion_model_cfg"]["dim"] = "wide";
    CHECK(contains(error_of([&] { model_config_from_json(broken, "cfg.json"); }),
                   "diffusion_model_cfg.dim: expected an integer, got \"wide\""));
    broken = j;
    broken["action_head_cfg"]["config"].erase("diffusion_model_cfg");
    CHECK(contains(error_of([&] { model_config_from_json(broken, "cfg.json"); }),
                   "no action_head_cfg.config.diffusion_model_cfg"));
    CHECK(contains(error_of([&] { model_config_from_json(nlohmann::json::array(), "cfg.json"); }),
                   "top level"));
}

TEST_CASE("byte sizes and counts parse and print") {
    CHECK(parse_byte_size("1000", "x") == 1000);
    CHECK(parse_byte_size("64MiB", "x") == 64ull << 20);
    CHECK(parse_byte_size("5GB", "x") == 5'000'000'000ull);
    CHECK(parse_byte_size("1.5 GiB", "x") == 1610612736ull);
    CHECK(contains(error_of([] { parse_byte_size("5 parsecs", "--shard-size"); }),
                   "--shard-size: '5 parsecs'"));
    CHECK(contains(error_of([] { parse_byte_size("", "x"); }), "not a byte size"));
    CHECK(contains(error_of([] { parse_byte_size("-3", "x"); }), "not a byte size"));
    CHECK(format_count(22924172116ull) == "22,924,172,116");
    CHECK(format_count(999) == "999");
    CHECK(format_count(1000) == "1,000");
}

TEST_CASE("the run config serializes through the field tables: every setting, with its value and path") {
    RunConfig rc = load_run_config(test::source_dir() / "configs/tiny.yaml",
                                   {parse_override("sampling.cfg_scale=3.5"), parse_override("rollout.max_chunks=2")});
    const auto j = run_config_json(rc);
    CHECK(j["sampling"]["cfg_scale"] == 3.5);
    CHECK(j["sampling"]["num_inference_steps"] == rc.sampling.num_inference_steps);
    CHECK(j["sampling"]["seed"] == rc.sampling.seed);
    CHECK(j["rollout"]["max_chunks"] == 2);
    CHECK(j["rollout"]["offsets"] == nlohmann::ordered_json(rc.rollout.offsets));
    CHECK(j["kv"]["window_frames"] == rc.kv.window_frames);
    CHECK(j["kv"]["memory_budget"] == "auto");
    CHECK(j["embodiment"] == rc.embodiment);
    CHECK(j["model"]["dit"]["dim"] == rc.model.dit.dim);
    CHECK(j["model"]["vae"]["z_dim"] == rc.model.vae.z_dim);
    // one JSON value per table entry
    size_t run_fields = 0, model_fields = 0;
    for_each_run_field(rc, [&](const Setting&, const auto&) { ++run_fields; });
    for_each_model_field(rc.model, [&](const ModelField&, const auto&) { ++model_fields; });
    size_t json_values = 0;
    std::function<void(const nlohmann::ordered_json&)> count = [&](const nlohmann::ordered_json& n) {
        if (n.is_object())
            for (const auto& [k, v] : n.items()) count(v);
        else
            ++json_values;
    };
    count(j);
    CHECK(json_values == run_fields + model_fields);
}

TEST_CASE("run settings have bounds, and the DiT step plan must agree with the step count") {
    std::string msg = error_of([] {
        load_run_config(config_path("tiny.yaml"), {parse_override("sampling.num_inference_steps=100000")});
    });
    CHECK(contains(msg, "sampling.num_inference_steps must be in [1, 1000], got 100000 (set by --set "
                        "sampling.num_inference_steps)"));
    // 20 steps with the 16-step preset num_dit_steps: 8 (the file's) would silently run every step.
    msg = error_of(
        [] { load_run_config(config_path("tiny.yaml"), {parse_override("sampling.num_inference_steps=20")}); });
    CHECK(contains(msg, "sampling.num_dit_steps = 8 has a preset only for num_inference_steps = 16"));
    CHECK(contains(msg, "set sampling.num_dit_steps = 20 to run the DiT at every step"));
    RunConfig rc = load_run_config(config_path("tiny.yaml"), {parse_override("sampling.num_inference_steps=20"),
                                                              parse_override("sampling.num_dit_steps=20")});
    CHECK(rc.sampling.num_dit_steps == 20);
    msg = error_of([] { load_run_config(config_path("tiny.yaml"), {parse_override("sampling.num_dit_steps=10")}); });
    CHECK(contains(msg, "num_dit_steps = 10 (set by --set sampling.num_dit_steps) has no preset for 16 steps"));
    // An explicit mask sets num_dit_steps; a different explicit count is an error.
    msg = error_of([] {
        load_run_config(config_path("tiny.yaml"), {parse_override("sampling.dit_step_mask=[true, true, true, true]"),
                                                   parse_override("sampling.num_inference_steps=4")});
    });
    CHECK(contains(msg, "sampling.num_dit_steps = 8 but sampling.dit_step_mask runs the DiT at 4 steps"));
    rc = load_run_config(config_path("tiny.yaml"), {parse_override("sampling.dit_step_mask=[true, false, true, true]"),
                                                    parse_override("sampling.num_inference_steps=4"),
                                                    parse_override("sampling.num_dit_steps=3")});
    CHECK(rc.sampling.num_dit_steps == 3);
    msg = error_of([] {
        load_run_config(config_path("tiny.yaml"), {parse_override("sampling.dynamic_schedule=true"),
                                                   parse_override("sampling.dit_step_mask=[true]"),
                                                   parse_override("sampling.num_inference_steps=1")});
    });
    CHECK(contains(msg, "dit_step_mask and sampling.dynamic_schedule: true exclude each other"));
    for (const char* o : {"sampling.cfg_scale=1e9", "sampling.sigma_shift=0", "rollout.stride=100000000"})
        CHECK_MESSAGE(!error_of([o] { load_run_config(config_path("tiny.yaml"), {parse_override(o)}); }).empty(), o);
}

TEST_CASE("a quoted value left open that swallows the next keys is an error naming them") {
    // NOTE: yaml-cpp accepts a double quote open to the end of the file; the keys after it vanish into the value.
    const std::string msg = error_of([] {
        parse_run_config(tiny_with("description: tiny random DreamZero for CPU tests",
                                   "embodiment: \"oxe_droid\ndescription: tiny"),
                         "t.yaml");
    });
    CHECK(contains(msg, "t.yaml: line"));
    CHECK(contains(msg, "the quoted value of embodiment is not closed on its line and swallows the keys description, "
                        "model"));
}

TEST_CASE("the settings registry: unique names, keys and flags; every key reads back; one default") {
    std::set<std::string_view> names, keys, flags;
    for (const Setting* s : run_settings()) {
        CAPTURE(s->key);
        CHECK(names.insert(s->name).second);
        CHECK(keys.insert(s->key).second);
        if (!s->flag.empty()) CHECK(flags.insert(s->flag).second);
        CHECK(find_setting(s->key) == s);
        CHECK(find_setting(s->name) == s);
        CHECK(!s->what.empty());
        CHECK(!s->values.empty());
    }
    // the run settings of a config that sets none are the defaults a RunConfig is constructed with
    std::ifstream f(config_path("tiny.yaml"));
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const size_t sampling = text.find("\nsampling:");
    REQUIRE(sampling != std::string::npos);
    const RunConfig bare = parse_run_config(text.substr(0, sampling + 1), "bare.yaml");
    const RunConfig tiny = load_run_config(config_path("tiny.yaml"));
    for (const Setting* s : run_settings()) {
        CAPTURE(s->key);
        CHECK(setting_text(bare, *s) == setting_default(*s));
        // every value, written as text, reads back through --set and through the flag's path
        const std::string value = setting_text(tiny, *s);
        if (value.empty()) continue;
        const RunConfig back = load_run_config(config_path("tiny.yaml"),
                                               {parse_override(std::string(s->key) + "=" + value)});
        CHECK(setting_text(back, *s) == value);
        RunConfig set = RunConfig{};
        set_setting(set, *s, value, "--test");
        CHECK(setting_text(set, *s) == value);
    }
    // a setting's environment variable is one the environment registry reads (backend/env_settings.h)
    for (const Setting* s : run_settings()) {
        if (s->env.empty()) continue;
        CAPTURE(s->env);
        bool registered = false;
        for (const EnvSetting& e : env_settings()) registered |= e.name == s->env;
        CHECK(registered);
    }
    CHECK(setting_default(*find_setting("numerics")) == "fast");
    CHECK(setting_default(*find_setting("kv.mode")) == "paged");
    CHECK(setting_default(*find_setting("text_prepass")) == "true");
}

TEST_CASE("a setting set from text names the flag, what it accepts and the value") {
    RunConfig run;
    CHECK(contains(error_of([&] { set_setting(run, *find_setting("kv.dtype"), "int8", "--kv-dtype"); }),
                   "--kv-dtype: expected bf16 or fp8, got 'int8'"));
    CHECK(contains(error_of([&] { set_setting(run, *find_setting("numerics"), "turbo", "--numerics"); }),
                   "--numerics: expected fast or reference, got 'turbo'"));
    CHECK(contains(error_of([&] { set_setting(run, *find_setting("kv.mode"), "flat", "--kv"); }),
                   "--kv: expected paged or dense, got 'flat'"));
    CHECK(contains(error_of([&] { set_setting(run, *find_setting("gpu_memory_budget"), "12parsecs", "--gpu-memory-budget"); }),
                   "--gpu-memory-budget: '12parsecs' is not a memory size"));
    set_setting(run, *find_setting("numerics"), "reference", "--numerics");
    set_setting(run, *find_setting("kv.mode"), "dense", "--kv");
    set_setting(run, *find_setting("text_prepass"), "false", "--no-text-prepass");
    CHECK(run.numerics == Numerics::Reference);
    CHECK(run.kv.mode == KvMode::Dense);
    CHECK(!run.text_prepass);
    // the YAML keys of the settings that were command-line only
    const RunConfig rc = load_run_config(config_path("tiny.yaml"),
                                         {parse_override("numerics=reference"), parse_override("kv.mode=dense"),
                                          parse_override("text_prepass=false")});
    CHECK(rc.numerics == Numerics::Reference);
    CHECK(rc.kv.mode == KvMode::Dense);
    CHECK(!rc.text_prepass);
    CHECK(contains(error_of([] { load_run_config(config_path("tiny.yaml"), {parse_override("numerics=turbo")}); }),
                   "numerics: expected fast or reference, got 'turbo'"));
}

TEST_CASE("the settings table lists every setting with its key, flag, default and whether it changes the numbers") {
    const std::string table = run_settings_table();
    CHECK(contains(table, "| numerics | `numerics` | `--numerics` | - | `fast` | yes |"));
    CHECK(contains(table, "| cuda_graphs | `cuda_graphs` | `--no-cuda-graphs` | `DZR_CUDA_GRAPHS` | `true` | no |"));
    CHECK(contains(table, "| gpu_memory_budget | `gpu_memory_budget` | `--gpu-memory-budget` | - | (none) | no |"));
    size_t rows = 0;
    for (size_t p = 0; (p = table.find('\n', p)) != std::string::npos; ++p) ++rows;
    CHECK(rows == run_settings().size() + 2);
}
