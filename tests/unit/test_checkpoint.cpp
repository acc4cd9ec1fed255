#include <doctest/doctest.h>
#include <fmt/format.h>
#include <sys/wait.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "config/model_fields.h"
#include "config/model_json.h"
#include "config/run_config.h"
#include "backend/backend.h"
#include "core/error.h"
#include "core/half.h"
#include "core/sha256.h"
#include "model/inventory.h"
#include "support/test_support.h"
#include "weights/checkpoint.h"
#include "weights/checksums.h"
#include "weights/inventory.h"
#include "weights/keys.h"
#include "weights/random_checkpoint.h"
#include "weights/safetensors.h"

using namespace dzr;
namespace fs = std::filesystem;

namespace {

using test::error_of;
using test::contains;

fs::path config_path(const char* name) {
    return test::source_dir() / "configs" / name;
}

const ModelConfig& tiny_model() {
    static const ModelConfig m = config::load_run_config(config_path("tiny.yaml")).model;
    return m;
}

void write_text(const fs::path& p, const std::string& text) {
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << text;
}

std::string read_text(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

/// A checkpoint skeleton: the tiny config.json plus shards of small f32 tensors.
struct MicroCheckpoint {
    test::TempDir dir;
    std::vector<float> values = {1.0f, 2.0f};

    MicroCheckpoint() { write_text(dir / "config.json", config::model_config_to_json(tiny_model()).dump()); }

    void shard(const std::string& name, const std::vector<std::string>& keys) {
        std::vector<std::pair<std::string, TensorView>> t;
        for (const auto& k : keys) t.push_back({k, TensorView(values.data(), DType::F32, Shape{2})});
        write_safetensors(dir / name, t);
    }
    void index(const std::map<std::string, std::string>& weight_map) {
        nlohmann::json j = {{"metadata", {{"total_size", 8 * weight_map.size()}}},
                            {"weight_map", weight_map}};
        write_text(dir / "model.safetensors.index.json", j.dump());
    }
    std::string open_error() const {
        return error_of([&] { Checkpoint ck(dir.path()); });
    }
};

/// Writes a tiny random checkpoint (bf16) into `dir` and returns its plan.
MakePlan make_tiny(const fs::path& dir, uint64_t seed, uint64_t shard_size = 5'000'000'000) {
    MakeOptions o;
    o.seed = seed;
    o.shard_size = shard_size;
    return write_random_checkpoint(tiny_model(), o, dir);
}

/// Rewrites a single-shard checkpoint's model.safetensors with one tensor replaced.
void replace_tensor(const fs::path& dir, const std::string& key, DType dtype, Shape shape) {
    const fs::path p = dir / "model.safetensors";
    std::vector<SafetensorsTensorSpec> specs;
    {
        auto f = SafetensorsFile::open(p);
        for (const auto& e : f->entries()) specs.push_back({e.name, e.dtype, e.shape});
    }
    for (auto& s : specs)
        if (s.name == key) s = {key, dtype, shape};
    write_safetensors(p, specs, {},
                      [](size_t, std::vector<uint8_t>& out) { std::fill(out.begin(), out.end(), 0); });
}

/// Runs the dzr binary (ctest sets DZR_BIN); returns the exit code, stdout and stderr.
struct RunResult {
    int code = -1;
    std::string out, err;
};

std::string dzr_bin() {
    const char* bin = std::getenv("DZR_BIN");
    return bin ? bin : "";
}

RunResult run_dzr(const std::string& args, const test::TempDir& scratch) {
    const fs::path out = scratch / "stdout.txt", err = scratch / "stderr.txt";
    const std::string cmd = fmt::format("'{}' {} >'{}' 2>'{}'", dzr_bin(), args, out.string(), err.string());
    const int status = std::system(cmd.c_str());
    RunResult r;
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = read_text(out);
    r.err = read_text(err);
    return r;
}

}  // namespace

TEST_CASE("a sharded checkpoint resolves every key through its index") {
    test::TempDir tmp;
    const fs::path dir = tmp / "ckpt";
    const MakePlan plan = make_tiny(dir, 5, 1'000'000);
    REQUIRE(plan.shards.size() > 1);

    Checkpoint ck(dir);
    CHECK(ck.has_index());
    CHECK(ck.shards().size() == plan.shards.size());
    CHECK(ck.keys().size() == plan.weights.size());
    CHECK(ck.declared_total_size() == plan.total_bytes);
    CHECK(ck.tensor_bytes() == plan.total_bytes);
    CHECK(ck.defaulted_fields().empty());
    CHECK(config::diff_model_configs(ck.model_config(), tiny_model()).empty());
    CHECK(check_weights(ck, expected_weights(ck.model_config())).ok());

    for (const auto& shard : plan.shards) {
        for (size_t wi : shard.weights) {
            const auto& w = plan.weights[wi];
            CHECK(ck.location(w.key) == shard.name);
        }
    }
    // stored bytes are what the generator draws for (seed, key), regenerated independently here
    for (const std::string& key : {keys::dit_block(1) + "ffn.2.weight", keys::t5("token_embedding.weight"),
                                   keys::clip("log_scale"), keys::vae_decoder("head.2.bias")}) {
        const ExpectedWeight* w = nullptr;
        for (const auto& e : plan.weights)
            if (e.key == key) w = &e;
        REQUIRE(w != nullptr);
        std::vector<uint8_t> expected;
        fill_random_weight(*w, 5, DType::BF16, expected);
        auto v = ck.find(key);
        REQUIRE(v.has_value());
        CHECK(v->dtype == DType::BF16);
        CHECK(v->shape == w->shape);
        CHECK(std::memcmp(v->data, expected.data(), expected.size()) == 0);
    }

    const auto& stats = ck.statistics("oxe_droid");
    CHECK(stats.get("action", "joint_position").q01 == std::vector<float>(7, -0.5f));
    CHECK(stats.get("action", "joint_position").q99 == std::vector<float>(7, 0.5f));
    CHECK(stats.get("action", "gripper_position").q99 == std::vector<float>{1.0f});
    CHECK(stats.get("state", "joint_position").dim() == 7);
    CHECK(
        contains(error_of([&] { ck.statistics("franka"); }), "has no embodiment franka (it has: oxe_droid)"));
    CHECK(contains(error_of([&] { stats.get("state", "velocity"); }), "state.velocity"));
}

TEST_CASE("every expected weight of a made checkpoint loads through WeightLoader on the CPU backend") {
    test::TempDir tmp;
    const MakePlan plan = make_tiny(tmp / "ckpt", 11);
    Checkpoint ck(tmp / "ckpt");
    auto be = make_cpu_backend();
    WeightLoader loader(ck, *be);
    for (const auto& w : plan.weights) {
        const Tensor t = loader.require(w.key, w.shape);
        CHECK(t.shape() == w.shape);
    }
    CHECK(loader.unused("action_head.").empty());
    // bf16 storage converted to the backend's f32: compare one tensor with the generator's values
    const ExpectedWeight& w = plan.weights.front();
    std::vector<uint8_t> bf16;
    fill_random_weight(w, 11, DType::BF16, bf16);
    const Tensor t = loader.require(w.key, w.shape, DType::F32);
    const std::vector<float> got = to_f32_vector(t.view());
    REQUIRE(got.size() == size_t(w.shape.numel()));
    for (size_t i = 0; i < got.size(); ++i) {
        uint16_t h;
        std::memcpy(&h, bf16.data() + 2 * i, 2);
        CHECK(got[i] == bf16_to_f32(h));
    }
    CHECK(contains(error_of([&] { loader.require(w.key, Shape{1}); }), "model.safetensors"));
}

TEST_CASE("checkpoint tensors outlive the checkpoint object") {
    MicroCheckpoint m;
    m.shard("model.safetensors", {"a"});
    Tensor t;
    {
        Checkpoint ck(m.dir.path());
        CHECK_FALSE(ck.has_index());
        CHECK(ck.location("a") == "model.safetensors");
        t = ck.tensor("a");
    }
    CHECK(t.ptr<float>()[1] == 2.0f);
}

TEST_CASE("a missing shard is named with the tensors the index puts there") {
    MicroCheckpoint m;
    m.shard("model-00001-of-00002.safetensors", {"a"});
    m.index({{"a", "model-00001-of-00002.safetensors"}, {"b", "model-00002-of-00002.safetensors"}});
    const std::string msg = m.open_error();
    CHECK(contains(msg, m.dir.path().string()));
    CHECK(contains(msg, "shard model-00002-of-00002.safetensors is missing"));
    CHECK(contains(msg, "e.g. b"));
}

TEST_CASE("an index entry absent from its shard is an error naming the tensor and the shard") {
    MicroCheckpoint m;
    m.shard("s1.safetensors", {"a"});
    m.shard("s2.safetensors", {"c"});
    m.index({{"a", "s1.safetensors"}, {"b", "s1.safetensors"}, {"c", "s2.safetensors"}});
    const std::string msg = m.open_error();
    CHECK(contains(msg, "s1.safetensors"));
    CHECK(contains(msg, "tensor b is listed in model.safetensors.index.json but absent from the shard"));
}

TEST_CASE("a shard tensor the index does not list is an error") {
    MicroCheckpoint m;
    m.shard("s1.safetensors", {"a", "x"});
    m.index({{"a", "s1.safetensors"}});
    CHECK(contains(m.open_error(),
                   "tensor x is in the shard but model.safetensors.index.json does not list it"));
}

TEST_CASE("broken index files are rejected by name") {
    MicroCheckpoint m;
    m.shard("s1.safetensors", {"a"});
    write_text(m.dir / "model.safetensors.index.json", "{\"weight_map\": ");
    std::string msg = m.open_error();
    CHECK(contains(msg, "model.safetensors.index.json: not valid JSON"));

    write_text(m.dir / "model.safetensors.index.json", R"({"weight_map": ["a"]})");
    CHECK(contains(m.open_error(), "weight_map must be an object"));

    write_text(m.dir / "model.safetensors.index.json", R"({"weight_map": {"a": "../s1.safetensors"}})");
    CHECK(contains(m.open_error(), "'../s1.safetensors' is not a file name in the directory"));

    write_text(m.dir / "model.safetensors.index.json", R"({"weight_map": {"a": 3}})");
    CHECK(contains(m.open_error(), "weight_map[a] must be a shard file name"));
}

TEST_CASE("a checkpoint without weights, without config.json or with a broken config.json is rejected") {
    MicroCheckpoint m;
    std::string msg = m.open_error();
    CHECK(contains(msg, "no model.safetensors.index.json and no model.safetensors"));

    m.shard("model.safetensors", {"a"});
    fs::remove(m.dir / "config.json");
    msg = m.open_error();
    CHECK(contains(msg, m.dir.path().string()));
    CHECK(contains(msg, "config.json is missing"));

    write_text(m.dir / "config.json", "{\"model_type\": \"vla\",");
    CHECK(contains(m.open_error(), "config.json: not valid JSON"));

    write_text(m.dir / "config.json", R"({"model_type": "vla", "action_head_cfg": {"config": {}}})");
    CHECK(contains(m.open_error(), "config.json: no action_head_cfg.config.diffusion_model_cfg"));

    CHECK(contains(error_of([&] { Checkpoint ck(m.dir / "nowhere"); }), "does not exist"));
}

TEST_CASE("a truncated shard inside a checkpoint is named") {
    MicroCheckpoint m;
    m.shard("model.safetensors", {"a", "b"});
    fs::resize_file(m.dir / "model.safetensors", fs::file_size(m.dir / "model.safetensors") - 4);
    const std::string msg = m.open_error();
    CHECK(contains(msg, (m.dir / "model.safetensors").string()));
    CHECK(contains(msg, "tensor b"));
}

TEST_CASE("malformed metadata.json is rejected naming the file and the entry") {
    MicroCheckpoint m;
    m.shard("model.safetensors", {"a"});
    const fs::path md = m.dir / "experiment_cfg" / "metadata.json";

    write_text(md, "{\"oxe_droid\": {");
    std::string msg = m.open_error();
    CHECK(contains(msg, md.string()));
    CHECK(contains(msg, "not valid JSON"));

    write_text(md, R"({"oxe_droid": {"modalities": {}}})");
    CHECK(contains(m.open_error(), "oxe_droid has no statistics"));

    write_text(
        md, R"({"oxe_droid": {"statistics": {"state": {}, "action": {"joint_position": {"q01": [0, 0]}}}}})");
    CHECK(contains(m.open_error(), "oxe_droid.statistics.action.joint_position needs q01 and q99"));

    write_text(
        md, R"({"oxe_droid": {"statistics": {"state": {}, "action": {"g": {"q01": [0, 0], "q99": [1]}}}}})");
    CHECK(contains(m.open_error(), "oxe_droid.statistics.action.g: q01 has 2 values but q99 has 1"));

    write_text(
        md, R"({"oxe_droid": {"statistics": {"state": {"g": {"q01": ["a"], "q99": [1]}}, "action": {}}}})");
    CHECK(contains(m.open_error(), "oxe_droid.statistics.state.g.q01 must be a list of numbers"));

    write_text(md, R"({"oxe_droid": {"statistics": {"state": {"g": {"q01": [0], "q99": [1], "std": [1, 2]}},
                       "action": {}}}})");
    CHECK(contains(m.open_error(), "oxe_droid.statistics.state.g.std has 2 values, expected 1"));

    write_text(md, R"([1, 2])");
    CHECK(contains(m.open_error(), "expected an object of embodiments"));

    fs::remove(md);
    Checkpoint ck(m.dir.path());
    CHECK_FALSE(ck.has_metadata());
    CHECK(contains(error_of([&] { ck.statistics("oxe_droid"); }), "experiment_cfg/metadata.json is missing"));
}

TEST_CASE("PEFT base_layer keys read as plain keys and collisions or adapters are reported") {
    MicroCheckpoint m;
    m.shard("model.safetensors",
            {"action_head.model.blocks.0.self_attn.q.base_layer.weight",
             "action_head.model.blocks.0.self_attn.q.lora_A.default.weight", "backbone.x"});
    {
        Checkpoint ck(m.dir.path());
        CHECK(ck.find("action_head.model.blocks.0.self_attn.q.weight").has_value());
        CHECK(ck.stored_key("action_head.model.blocks.0.self_attn.q.weight") ==
              "action_head.model.blocks.0.self_attn.q.base_layer.weight");
        CHECK_FALSE(ck.find("action_head.model.blocks.0.self_attn.q.base_layer.weight").has_value());
        const auto r = check_weights(ck, expected_weights(tiny_model()));
        CHECK(r.lora ==
              std::vector<std::string>{"action_head.model.blocks.0.self_attn.q.lora_A.default.weight"});
        CHECK(r.unexpected.empty());  // backbone.x is ignored
        CHECK(r.checked == 0);        // the q weight has the wrong shape here ([2])
    }
    CHECK(normalize_peft_key("a.q.base_layer.weight") == "a.q.weight");
    CHECK(normalize_peft_key("a.q.weight") == "a.q.weight");

    m.shard("model.safetensors", {"k.q.base_layer.weight", "k.q.weight"});
    CHECK(contains(m.open_error(), "are the same weight k.q.weight"));
}

TEST_CASE("shape and dtype mismatches against the config geometry are reported with the shard") {
    test::TempDir tmp;
    const fs::path dir = tmp / "ckpt";
    make_tiny(dir, 3);
    replace_tensor(dir, keys::dit_block(0) + "ffn.0.weight", DType::BF16, Shape{255, 128});
    replace_tensor(dir, keys::dit("head.head.bias"), DType::I32, Shape{64});
    Checkpoint ck(dir);
    const auto r = check_weights(ck, expected_weights(ck.model_config()));
    REQUIRE(r.shape_mismatch.size() == 1);
    CHECK(r.shape_mismatch[0].key == keys::dit_block(0) + "ffn.0.weight");
    CHECK(r.shape_mismatch[0].location == "model.safetensors");
    REQUIRE(r.dtype_mismatch.size() == 1);
    CHECK(r.dtype_mismatch[0].found == "i32");
    const std::string msg = r.message("checkpoint " + dir.string());
    CHECK(contains(msg,
                   "action_head.model.blocks.0.ffn.0.weight: expected [256, 128], found [255, 128] "
                   "(model.safetensors)"));
    CHECK(contains(msg, "action_head.model.head.head.bias: expected bf16, f16 or f32, found i32"));
}

TEST_CASE("a weight relabelled between bf16 and f16 is refused without --hash") {
    test::TempDir tmp;
    const fs::path dir = tmp / "ckpt";
    make_tiny(dir, 3);
    Checkpoint clean(dir);
    CHECK(check_weights(clean, expected_weights(clean.model_config())).dtype_mismatch.empty());
    // NOTE: the same bytes per element, so the reader's size and offset checks pass
    replace_tensor(dir, keys::dit_block(1) + "ffn.2.weight", DType::F16, Shape{128, 256});
    Checkpoint ck(dir);
    const auto r = check_weights(ck, expected_weights(ck.model_config()));
    REQUIRE(r.dtype_mismatch.size() == 1);
    CHECK(r.dtype_mismatch[0].key == keys::dit_block(1) + "ffn.2.weight");
    CHECK(r.dtype_mismatch[0].found == "f16");
    CHECK(contains(r.message("checkpoint " + dir.string()), "expected bf16 like the DiT's"));
    CHECK_FALSE(r.ok());
}

TEST_CASE("the tokenizer is found beside the checkpoint or through conf.yaml") {
    MicroCheckpoint m;
    m.shard("model.safetensors", {"a"});
    CHECK_FALSE(Checkpoint(m.dir.path()).tokenizer_path().has_value());

    test::TempDir elsewhere;
    write_text(elsewhere / "umt5" / "spiece.model", "x");
    write_text(m.dir / "experiment_cfg" / "conf.yaml",
               "model:\n  tokenizer_path: " + (elsewhere / "umt5").string() + "\n");
    CHECK(Checkpoint(m.dir.path()).tokenizer_path() == elsewhere / "umt5" / "spiece.model");

    write_text(m.dir / "experiment_cfg" / "conf.yaml", "tokenizer_path: /definitely/not/here\n");
    CHECK_FALSE(Checkpoint(m.dir.path()).tokenizer_path().has_value());

    write_text(m.dir / "tokenizer" / "spiece.model", "x");
    CHECK(Checkpoint(m.dir.path()).tokenizer_path() == m.dir / "tokenizer" / "spiece.model");
    write_text(m.dir / "spiece.model", "x");
    CHECK(Checkpoint(m.dir.path()).tokenizer_path() == m.dir / "spiece.model");

    CHECK(resolve_tokenizer_path(m.dir.path()) == m.dir / "spiece.model");
    CHECK(resolve_tokenizer_path(elsewhere / "umt5" / "spiece.model") == elsewhere / "umt5" / "spiece.model");
    CHECK(contains(error_of([&] { resolve_tokenizer_path(elsewhere / "nothing"); }), "not found"));
}

TEST_CASE("make is deterministic per seed and refuses to overwrite") {
    test::TempDir tmp;
    make_tiny(tmp / "a", 1);
    make_tiny(tmp / "b", 1);
    make_tiny(tmp / "c", 2);
    for (const char* f : {"config.json", "model.safetensors", "experiment_cfg/metadata.json"})
        CHECK(read_text(tmp / "a" / f) == read_text(tmp / "b" / f));
    CHECK(read_text(tmp / "a" / "model.safetensors").size() ==
          read_text(tmp / "c" / "model.safetensors").size());
    CHECK(read_text(tmp / "a" / "model.safetensors") != read_text(tmp / "c" / "model.safetensors"));
    CHECK(read_text(tmp / "a" / "experiment_cfg/metadata.json") ==
          read_text(tmp / "c" / "experiment_cfg/metadata.json"));
    // a few MB, as promised for the tiny config
    CHECK(fs::file_size(tmp / "a" / "model.safetensors") < 8'000'000);

    const std::string msg = error_of([&] { make_tiny(tmp / "a", 1); });
    CHECK(contains(msg, "already exists and is not an empty directory"));
    CHECK(contains(error_of([&] { make_tiny(tmp / "no" / "such" / "dir", 1); }), "does not exist"));
    size_t entries = 0;
    for (const auto& e : fs::directory_iterator(tmp.path())) {
        (void)e;
        ++entries;
    }
    CHECK(entries == 3);  // a, b, c; no temporary directories left behind
}

TEST_CASE("make writes the same bytes with any number of threads, and the bytes it wrote before") {
    test::TempDir tmp;
    MakeOptions mo;
    mo.seed = 7;
    mo.dtype = DType::BF16;
    mo.shard_size = 1'000'000;
    mo.threads = 1;
    write_random_checkpoint(tiny_model(), mo, tmp / "one");
    mo.threads = 3;
    const MakePlan plan = write_random_checkpoint(tiny_model(), mo, tmp / "three");
    REQUIRE(plan.shards.size() == 3);
    // NOTE: the SHA-256 of the shards as the single-threaded writer made them before the threads came in
    // (configs/tiny.yaml at this commit, seed 7, bf16, 1 MB shards); a change here changes every seed's weights.
    const std::map<std::string, std::string> expected = {
        {"model-00001-of-00003.safetensors", "eb9ec3a62724e8b6d56d6cdd785ff16b711b793082707da93679b91b6ef35ae3"},
        {"model-00002-of-00003.safetensors", "e05780b6daaa0aa4fadc3099f11682b119a4a8a392a4963b855e342e190c344b"},
        {"model-00003-of-00003.safetensors", "3cfd7ada6fbb958e1ef9cf68bd71f7ac74427b7d917385b9a6218404d9993efd"}};
    for (const auto& e : expected) {
        CAPTURE(e.first);
        CHECK(sha256_file(tmp / "one" / e.first) == e.second);
        CHECK(sha256_file(tmp / "three" / e.first) == e.second);
    }
    // checksums.sha256 lists every file, in sha256sum's format
    const auto sums = parse_checksums(read_text(tmp / "three" / kChecksumsFile), "checksums.sha256");
    CHECK(sums.size() == 6);  // 3 shards, the index, config.json, metadata.json
    CHECK(sums.at("model-00002-of-00003.safetensors") == expected.at("model-00002-of-00003.safetensors"));
    CHECK(verify_checksums(tmp / "three", {"model-00001-of-00003.safetensors"}).problems.empty());
}

TEST_CASE("dzr ckpt make, validate and inspect work through the binary with meaningful exit codes") {
    if (dzr_bin().empty()) {
        MESSAGE("DZR_BIN is not set (run through ctest); skipping the binary checks");
        return;
    }
    REQUIRE(fs::exists(dzr_bin()));
    test::TempDir tmp;
    const std::string tiny = config_path("tiny.yaml").string();
    const std::string ck = (tmp / "ck").string();

    RunResult r = run_dzr("ckpt make --config '" + tiny + "' --seed 3 --out '" + ck + "'", tmp);
    CHECK(r.code == 0);
    CHECK(contains(r.out, "writing " + ck + " using the geometry of " + tiny));
    r = run_dzr("ckpt validate '" + ck + "' --config '" + tiny + "'", tmp);
    CHECK(r.code == 0);
    CHECK(r.out.rfind("OK ", 0) == 0);
    CHECK(contains(r.out, "362 tensors"));

    r = run_dzr("ckpt inspect '" + ck + "'", tmp);
    CHECK(r.code == 0);
    CHECK(contains(r.out, "text encoder"));
    CHECK(contains(r.out, "1,301,920"));  // VAE base_dim 4: 243,583 of them

    r = run_dzr("ckpt validate '" + ck + "' --config '" + config_path("parity.yaml").string() + "'", tmp);
    CHECK(r.code == 1);
    CHECK(contains(r.err, "checkpoint geometry differs from"));
    CHECK(contains(r.err, "dit.dim: 128 vs 256"));

    r = run_dzr("ckpt validate '" + ck + "' --config '" + tiny + "' --set model.dit.ffn_dim=512", tmp);
    CHECK(r.code == 1);
    CHECK(contains(r.err, "dit.ffn_dim: 256 vs 512"));

    replace_tensor(ck, keys::dit_block(1) + "ffn.0.bias", DType::BF16, Shape{255});
    r = run_dzr("ckpt validate '" + ck + "'", tmp);
    CHECK(r.code == 1);
    CHECK(contains(r.err, "action_head.model.blocks.1.ffn.0.bias: expected [256], found [255]"));

    fs::resize_file(fs::path(ck) / "model.safetensors", 1000);
    r = run_dzr("ckpt validate '" + ck + "'", tmp);
    CHECK(r.code == 1);
    CHECK(contains(r.err, "model.safetensors"));

    fs::remove(fs::path(ck) / "config.json");
    r = run_dzr("ckpt inspect '" + ck + "'", tmp);
    CHECK(r.code == 1);
    CHECK(contains(r.err, "config.json is missing"));

    const std::string droid = config_path("dreamzero_droid.yaml").string();
    r = run_dzr("ckpt make --config '" + droid + "' --dry-run", tmp);
    CHECK(r.code == 0);
    CHECK(contains(r.out, "2146"));
    CHECK(contains(r.out, "22,924,172,116"));
    CHECK(contains(r.out, "45,848,344,232"));
    r = run_dzr("ckpt make --config '" + droid + "' --out '" + (tmp / "droid").string() + "'", tmp);
    CHECK(r.code == 1);
    CHECK(contains(r.err, "--force"));
    CHECK_FALSE(fs::exists(tmp / "droid"));

    r = run_dzr("ckpt make --config '" + tiny + "' --out '" + (tmp / "x").string() + "' --dtype i32", tmp);
    CHECK(r.code == 1);
    CHECK(contains(r.err, "--dtype i32"));
    r = run_dzr("ckpt make --out '" + (tmp / "x").string() + "'", tmp);  // --config is required
    CHECK(r.code != 0);
    r = run_dzr("ckpt validate", tmp);
    CHECK(r.code != 0);
}
