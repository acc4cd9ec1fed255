#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "backend/backend.h"
#include "backend/measuring_backend.h"
#include "config/run_config.h"
#include "core/half.h"
#include "model/causal_dit.h"
#include "model/clip_vision.h"
#include "model/inventory.h"
#include "model/umt5.h"
#include "model/wan_vae.h"
#include "support/test_support.h"
#include "weights/inventory.h"
#include "weights/keys.h"
#include "weights/random_checkpoint.h"

using namespace dzr;

namespace {

using test::contains;

/// tests/data/dreamzero-checkpoint-keys.tsv: key -> shape text ("[5120, 36, 1, 2, 2]") and numel.
struct TsvRow {
    std::string shape;
    uint64_t numel = 0;
};

std::map<std::string, TsvRow> read_tsv() {
    std::ifstream f(test::data_dir() / "dreamzero-checkpoint-keys.tsv");
    REQUIRE(f.good());
    std::map<std::string, TsvRow> rows;
    std::string line;
    while (std::getline(f, line)) {
        if (line.empty() || line[0] == '#') continue;
        std::stringstream ss(line);
        std::string key, shape, numel;
        std::getline(ss, key, '\t');
        std::getline(ss, shape, '\t');
        std::getline(ss, numel, '\t');
        REQUIRE(rows.count(key) == 0);
        rows[key] = {shape, std::stoull(numel)};
    }
    return rows;
}

ModelConfig load_model(const char* name) {
    return config::load_run_config(test::source_dir() / "configs" / name).model;
}

/// An in-memory weight source for the check (views over host tensors it owns).
class FakeSource : public WeightSource {
  public:
    void put(const std::string& key, Shape shape, DType dtype = DType::BF16) {
        tensors_[key] = Tensor::host(shape, dtype);
    }
    void erase(const std::string& key) { tensors_.erase(key); }
    std::optional<TensorView> find(const std::string& key) const override {
        auto it = tensors_.find(key);
        if (it == tensors_.end()) return std::nullopt;
        return it->second.view();
    }
    std::vector<std::string> keys() const override {
        std::vector<std::string> out;
        for (const auto& [k, t] : tensors_) out.push_back(k);
        return out;
    }
    std::string location(const std::string&) const override { return "fake.safetensors"; }

  private:
    std::map<std::string, Tensor> tensors_;
};

}  // namespace

TEST_CASE("the DROID config reproduces the verified key inventory exactly") {
    const auto tsv = read_tsv();
    const auto inv = expected_weights(load_model("dreamzero_droid.yaml"));
    CHECK(tsv.size() == 2146);
    CHECK(inv.size() == 2146);

    std::set<std::string> seen;
    uint64_t params = 0;
    for (const auto& w : inv) {
        INFO(w.key);
        CHECK(seen.insert(w.key).second);
        auto it = tsv.find(w.key);
        REQUIRE(it != tsv.end());
        CHECK(w.shape.str() == it->second.shape);
        CHECK(uint64_t(w.shape.numel()) == it->second.numel);
        params += uint64_t(w.shape.numel());
    }
    for (const auto& [key, row] : tsv) {
        INFO(key);
        CHECK(seen.count(key) == 1);
    }
    CHECK(params == 22'924'172'116ull);

    // per-component totals of dreamzero-reference.md §4.2
    const auto c = census(inv);
    CHECK(c.tensors[size_t(Component::Dit)] == 1317);
    CHECK(c.params[size_t(Component::Dit)] == 16'484'292'448ull);
    CHECK(c.tensors[size_t(Component::TextEncoder)] == 242);
    CHECK(c.params[size_t(Component::TextEncoder)] == 5'680'910'336ull);
    CHECK(c.tensors[size_t(Component::ImageEncoder)] == 393);
    CHECK(c.params[size_t(Component::ImageEncoder)] == 632'076'801ull);
    CHECK(c.tensors[size_t(Component::Vae)] == 194);
    CHECK(c.params[size_t(Component::Vae)] == 126'892'531ull);
    CHECK(c.total_tensors() == 2146);
    CHECK(c.total_params() == 22'924'172'116ull);
}

TEST_CASE("the real-width parity config has the DROID shape of every tensor but the token embedding") {
    // configs/parity_wide.yaml: the numerics gate of fast at the real widths (docs/PARITY.md), 2 DiT and umT5
    // layers, 2 stored CLIP blocks, a 1000-token vocabulary.
    const auto tsv = read_tsv();
    const auto inv = expected_weights(load_model("parity_wide.yaml"));
    CHECK(inv.size() == 350);
    uint64_t params = 0;
    for (const auto& w : inv) {
        INFO(w.key);
        const auto it = tsv.find(w.key);
        REQUIRE(it != tsv.end());
        params += uint64_t(w.shape.numel());
        if (w.key == keys::t5("token_embedding.weight"))
            CHECK(w.shape.str() == "[1000, 4096]");
        else
            CHECK(w.shape.str() == it->second.shape);
    }
    CHECK(params == 1'697'073'492ull);
    // every DROID tensor of the first two blocks of each network (and outside the blocks) is there
    const std::set<std::string> have = [&] {
        std::set<std::string> k;
        for (const auto& w : inv) k.insert(w.key);
        return k;
    }();
    for (const auto& [key, row] : tsv) {
        const bool later_block = [&] {
            for (const std::string& prefix : {keys::dit_block(0), keys::t5_block(0), keys::clip_block(0)}) {
                const std::string stem = prefix.substr(0, prefix.size() - 2);  // "...blocks."
                if (key.rfind(stem, 0) == 0) return std::stoi(key.substr(stem.size())) >= 2;
            }
            return false;
        }();
        INFO(key);
        if (!later_block) CHECK(have.count(key) == 1);
    }
}

TEST_CASE("key helpers build the reference key strings") {
    CHECK(keys::dit_block(3) + "self_attn.q.weight" == "action_head.model.blocks.3.self_attn.q.weight");
    CHECK(keys::dit("patch_embedding.weight") == "action_head.model.patch_embedding.weight");
    CHECK(keys::t5_block(23) + "ffn.gate.0.weight" == "action_head.text_encoder.blocks.23.ffn.gate.0.weight");
    CHECK(keys::clip_block(31) + "attn.to_qkv.weight" ==
          "action_head.image_encoder.model.visual.transformer.31.attn.to_qkv.weight");
    CHECK(keys::vae_encoder_down(10) + "residual.0.gamma" ==
          "action_head.vae.model.encoder.downsamples.10.residual.0.gamma");
    CHECK(keys::vae_decoder_up(3) + "time_conv.weight" ==
          "action_head.vae.model.decoder.upsamples.3.time_conv.weight");
    CHECK(keys::vae_encoder_middle(1) + "to_qkv.weight" ==
          "action_head.vae.model.encoder.middle.1.to_qkv.weight");
    CHECK(keys::vae("conv2.bias") == "action_head.vae.model.conv2.bias");
    CHECK(component_of("action_head.model.head.head.weight") == Component::Dit);
    CHECK(component_of("action_head.image_encoder.model.log_scale") == Component::ImageEncoder);
    CHECK(component_of("backbone.x") == Component::Backbone);
    CHECK(component_of("something.else") == Component::Other);
}

TEST_CASE("small geometries scale every shape and keep the key layout") {
    const ModelConfig tiny = load_model("tiny.yaml");
    const auto inv = expected_weights(tiny);
    std::map<std::string, Shape> by_key;
    for (const auto& w : inv) {
        CHECK(by_key.emplace(w.key, w.shape).second);
        CHECK(component_of(w.key) == w.component);
    }
    CHECK(by_key.at(keys::dit_block(1) + "ffn.0.weight") == Shape{256, 128});
    CHECK(by_key.at(keys::dit("patch_embedding.weight")) == Shape{128, 36, 1, 2, 2});
    CHECK(by_key.at(keys::dit("text_embedding.0.weight")) == Shape{128, 64});
    CHECK(by_key.at(keys::dit("img_emb.proj.1.weight")) == Shape{64, 64});
    CHECK(by_key.at(keys::dit("action_encoder.W2.W")) == Shape{1, 256, 128});
    CHECK(by_key.at(keys::t5_block(1) + "pos_embedding.embedding.weight") == Shape{32, 2});
    CHECK(by_key.at(keys::clip("visual.pos_embedding")) == Shape{1, 257, 64});
    CHECK(by_key.count(keys::clip_block(2) + "mlp.2.bias") == 1);  // 3 stored blocks
    CHECK(by_key.count(keys::clip_block(3) + "mlp.2.bias") == 0);
    CHECK(by_key.at(keys::vae_encoder_down(6) + "shortcut.weight") == Shape{16, 8, 1, 1, 1});
    CHECK(by_key.at(keys::vae_decoder_up(3) + "time_conv.weight") == Shape{32, 16, 3, 1, 1});
    CHECK(by_key.at(keys::vae_decoder("head.2.weight")) == Shape{3, 4, 3, 3, 3});
    // DiT layers: 2 blocks of 31 tensors + 39 others
    CHECK(census(inv).tensors[size_t(Component::Dit)] == 2 * 31 + 39);

    ModelConfig no_decoder = tiny;
    no_decoder.vae.has_decoder = false;
    for (const auto& w : expected_weights(no_decoder)) CHECK_FALSE(contains(w.key, "vae.model.decoder."));
}

TEST_CASE("the expected-weights check reports every kind of mismatch in one grouped message") {
    const ModelConfig tiny = load_model("tiny.yaml");
    const auto inv = expected_weights(tiny);
    FakeSource src;
    for (const auto& w : inv) src.put(w.key, w.shape, DType::BF16);
    CHECK(check_weights(src, inv).ok());
    CHECK(check_weights(src, inv).checked == inv.size());

    // f16 and f32 storage are fine too (a network in f16, f32 beside bf16); backbone keys are ignored
    src.put(keys::dit("head.head.bias"), Shape{64}, DType::F32);
    for (const auto& w : inv)
        if (component_of(w.key) == Component::Vae) src.put(w.key, w.shape, DType::F16);
    src.put("backbone.anything", Shape{3});
    CHECK(check_weights(src, inv).ok());

    // one weight relabelled bf16 -> f16 in a bf16 network (same bytes): refused
    src.put(keys::dit("head.modulation"), Shape{1, 2, 128}, DType::F16);
    const auto relabelled = check_weights(src, inv);
    REQUIRE(relabelled.dtype_mismatch.size() == 1);
    CHECK(relabelled.dtype_mismatch[0].key == keys::dit("head.modulation"));
    CHECK(contains(relabelled.dtype_mismatch[0].expected, "bf16 like the DiT's"));
    src.put(keys::dit("head.modulation"), Shape{1, 2, 128}, DType::BF16);

    src.erase(keys::dit_block(0) + "ffn.0.weight");
    src.put(keys::dit_block(1) + "ffn.2.weight", Shape{128, 255});
    src.put(keys::dit_block(1) + "ffn.2.bias", Shape{128}, DType::I32);
    src.put("action_head.model.extra.weight", Shape{2});
    src.put(keys::dit_block(0) + "self_attn.q.lora_A.default.weight", Shape{4, 128});
    const auto r = check_weights(src, inv);
    CHECK_FALSE(r.ok());
    REQUIRE(r.missing.size() == 1);
    CHECK(r.missing[0].key == keys::dit_block(0) + "ffn.0.weight");
    REQUIRE(r.shape_mismatch.size() == 1);
    CHECK(r.shape_mismatch[0].found == "[128, 255]");
    REQUIRE(r.dtype_mismatch.size() == 1);
    CHECK(r.dtype_mismatch[0].found == "i32");
    CHECK(r.unexpected.size() == 1);
    CHECK(r.lora.size() == 1);

    const std::string msg = r.message("checkpoint /x");
    INFO(msg);
    CHECK(contains(msg,
                   "checkpoint /x does not match the expected weights: 1 missing, 1 unexpected, "
                   "1 with the wrong shape, 1 with the wrong dtype, 1 LoRA adapter tensor"));
    CHECK(contains(msg, "action_head.model.blocks.0.ffn.0.weight [256, 128]"));
    CHECK(contains(msg,
                   "action_head.model.blocks.1.ffn.2.weight: expected [128, 256], found [128, 255] "
                   "(fake.safetensors)"));
    CHECK(contains(msg, "expected bf16, f16 or f32, found i32"));
    CHECK(contains(msg, "action_head.model.extra.weight (fake.safetensors)"));
    CHECK(contains(msg, "unmerged PEFT adapters are not supported"));

    // long lists are capped
    FakeSource empty;
    const auto all_missing = check_weights(empty, inv);
    CHECK(all_missing.missing.size() == inv.size());
    const std::string capped = all_missing.message("checkpoint /y", 5);
    CHECK(contains(capped, fmt::format("missing ({})", inv.size())));
    CHECK(contains(capped, fmt::format("... and {} more", inv.size() - 5)));
}

TEST_CASE("random weights are a pure function of seed and key") {
    WeightRng a(1, "k"), b(1, "k"), c(2, "k"), d(1, "k2");
    bool differs_seed = false, differs_key = false;
    for (int i = 0; i < 16; ++i) {
        const uint64_t x = a.next_u64();
        CHECK(x == b.next_u64());
        differs_seed = differs_seed || x != c.next_u64();
        differs_key = differs_key || x != d.next_u64();
    }
    CHECK(differs_seed);
    CHECK(differs_key);

    // moments of the normal generator (n = 200k: the sample std of the mean is ~0.0022)
    WeightRng g(42, "normal");
    double s1 = 0, s2 = 0, s4 = 0;
    const int n = 200000;
    for (int i = 0; i < n; ++i) {
        const double x = g.normal();
        s1 += x;
        s2 += x * x;
        s4 += x * x * x * x;
    }
    CHECK(std::fabs(s1 / n) < 0.012);
    CHECK(std::fabs(s2 / n - 1.0) < 0.02);
    CHECK(std::fabs(s4 / n - 3.0) < 0.1);  // kurtosis of a normal
    WeightRng u(42, "uniform");
    double lo = 1, hi = 0;
    for (int i = 0; i < 10000; ++i) {
        const double x = u.uniform();
        lo = std::min(lo, x);
        hi = std::max(hi, x);
    }
    CHECK(lo >= 0.0);
    CHECK(lo < 0.001);
    CHECK(hi < 1.0);
    CHECK(hi > 0.999);
}

TEST_CASE("random weight fills follow their init kind and dtype") {
    std::vector<uint8_t> out;
    ExpectedWeight c{"k", Shape{3}, Component::Other, {InitKind::Constant, 2.5f}};
    fill_random_weight(c, 0, DType::F32, out);
    REQUIRE(out.size() == 12);
    const float* f = reinterpret_cast<const float*>(out.data());
    CHECK(f[0] == 2.5f);
    CHECK(f[2] == 2.5f);

    ExpectedWeight ones{"n", Shape{4096}, Component::Other, {InitKind::OnesJitter, 0.05f}};
    fill_random_weight(ones, 3, DType::BF16, out);
    REQUIRE(out.size() == 8192);
    double mean = 0;
    for (size_t i = 0; i < 4096; ++i) {
        uint16_t h;
        std::memcpy(&h, out.data() + 2 * i, 2);
        mean += bf16_to_f32(h);
    }
    CHECK(mean / 4096 == doctest::Approx(1.0).epsilon(0.01));

    // f32 and bf16 fills draw the same values (bf16 = rounded f32)
    ExpectedWeight w{"w", Shape{64}, Component::Other, {InitKind::Normal, 0.5f}};
    std::vector<uint8_t> a, b;
    fill_random_weight(w, 9, DType::F32, a);
    fill_random_weight(w, 9, DType::BF16, b);
    for (size_t i = 0; i < 64; ++i) {
        float x;
        uint16_t h;
        std::memcpy(&x, a.data() + 4 * i, 4);
        std::memcpy(&h, b.data() + 2 * i, 2);
        CHECK(f32_to_bf16(x) == h);
    }
}

TEST_CASE("make plans split shards greedily under the size limit") {
    const ModelConfig tiny = load_model("tiny.yaml");
    MakeOptions o;
    o.dtype = DType::F32;
    const MakePlan one = plan_random_checkpoint(tiny, o);
    REQUIRE(one.shards.size() == 1);
    CHECK(one.shards[0].name == "model.safetensors");
    CHECK(one.total_bytes == census(one.weights).total_params() * 4);

    o.shard_size = 1'000'000;
    const MakePlan many = plan_random_checkpoint(tiny, o);
    CHECK(many.indexed());
    CHECK(many.shards.front().name == fmt::format("model-00001-of-{:05d}.safetensors", many.shards.size()));
    uint64_t sum = 0;
    size_t count = 0;
    for (const auto& s : many.shards) {
        sum += s.bytes;
        count += s.weights.size();
        // a shard exceeds the limit only when it holds a single oversized tensor
        CHECK((s.bytes <= o.shard_size || s.weights.size() == 1));
    }
    CHECK(sum == many.total_bytes);
    CHECK(count == many.weights.size());
}

TEST_CASE("the networks load exactly the weights they declare to the inventory, in its order") {
    const ModelConfig tiny = load_model("tiny.yaml");
    const auto inv = expected_weights(tiny);
    FakeSource src;
    for (const auto& w : inv) src.put(w.key, w.shape, DType::BF16);
    auto be = make_cpu_backend();
    WeightLoader loader(src, *be);
    CHECK_FALSE(loader.recording());
    const CausalDit dit(tiny.dit, tiny.canvas_height / 8, tiny.canvas_width / 8, loader);
    const Umt5Encoder t5(loader, tiny.t5);
    const ClipVision clip(loader, tiny.clip, tiny.canvas_height, tiny.canvas_width);
    const WanVae vae(loader, tiny.vae);

    // the loading run declares the inventory, key by key
    REQUIRE(loader.declarations().size() == inv.size());
    for (size_t i = 0; i < inv.size(); ++i) {
        const WeightDeclaration& d = loader.declarations()[i];
        INFO(inv[i].key);
        CHECK(d.key == inv[i].key);
        CHECK(d.shape == inv[i].shape);
        CHECK(d.init == inv[i].init);
    }
    // what it declares without loading is exactly what stays unused: CLIP's skipped weights
    std::set<std::string> declared_only;
    for (const WeightDeclaration& d : loader.declarations())
        if (!d.loaded) declared_only.insert(d.key);
    const auto unused = loader.unused("action_head.");
    const auto skipped = ClipVision::skipped_keys(tiny.clip);
    CHECK(std::set<std::string>(unused.begin(), unused.end()) == declared_only);
    CHECK(std::set<std::string>(skipped.begin(), skipped.end()) == declared_only);
    CHECK(declared_only.size() == 12 + 4);  // the last block, post_norm, head, log_scale
    CHECK(loader.used().size() + declared_only.size() == inv.size());

    // a recording loader reads no source and hands out the backend's tensors
    MeasuringBackend mb(DType::BF16);
    WeightLoader recorder(mb);
    CHECK(recorder.recording());
    const Tensor t = recorder.require("x.weight", Shape{8, 4}, WeightInit::fan_in(2.0f));
    CHECK(t.shape() == Shape{8, 4});
    CHECK(recorder.used().empty());
    CHECK(recorder.unused("").empty());
    REQUIRE(recorder.declarations().size() == 1);
    CHECK(recorder.declarations()[0].init == WeightInit::normal(2.0f / std::sqrt(4.0f)));  // resolved fan-in
}
