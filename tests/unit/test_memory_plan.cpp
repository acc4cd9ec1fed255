// The memory plan (policy/memory_plan.h) at the DROID and the tiny geometry, checked against figures computed here
// independently: the weights from the reference's checkpoint key list (tests/data/dreamzero-checkpoint-keys.tsv,
// the shapes of the official modules at the DROID config), the KV cache from the geometry by hand; the workspace
// against what a real CPU engine reserves; the budget check and the budget sizes.
#include <doctest/doctest.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <vector>

#include "backend/backend.h"
#include "config/run_config.h"
#include "core/error.h"
#include "policy/memory_plan.h"
#include "support/test_support.h"
#include "model/inventory.h"
#include "weights/checkpoint.h"
#include "weights/random_checkpoint.h"
#include "weights/random_weights.h"

using namespace dzr;

namespace {

config::RunConfig droid() { return config::load_run_config(test::source_dir() / "configs/dreamzero_droid.yaml"); }
config::RunConfig tiny() { return config::load_run_config(test::source_dir() / "configs/tiny.yaml"); }

/// The built-in DROID embodiment with smooth statistics (the plan reads none of them).
Embodiment droid_embodiment() {
    Embodiment e = builtin_embodiment("oxe_droid");
    bind_metadata(e, parse_embodiment_metadata(synthetic_metadata_json(e), "test").at(e.tag), "test");
    return e;
}

PolicyOptions policy(const config::RunConfig& run, bool prepass) {
    PolicyOptions o;
    o.sampling = run.sampling;
    o.kv = run.kv;
    o.text_prepass = prepass;
    return o;
}

MemoryPlan offline_plan(const config::RunConfig& run, WeightPrecision precision, DType kv, bool prepass = true) {
    MemoryPlanOptions po;
    po.precision = precision;
    po.kv_dtype = kv;
    return plan_memory(run.model, droid_embodiment(), policy(run, prepass), po, nullptr);
}

/// Parameters and bytes of the checkpoint key list, per network, read from the TSV (key, shape, numel).
struct KeyListFigures {
    uint64_t dit = 0, umt5 = 0, clip_stored = 0, clip_run = 0, vae = 0, vae_no_decoder = 0;
    uint64_t dit_fp8_bytes = 0;  // the DiT with its layers' linear weights in fp8 + a float32 scale per row
    uint64_t vae_encoder_taps = 0;  // the VAE encoder's convolution weights of more than one tap (kept channels-last)
};

KeyListFigures key_list_figures() {
    std::ifstream f(test::data_dir() / "dreamzero-checkpoint-keys.tsv");
    REQUIRE(f.good());
    // The linear layers of a DiT transformer layer (the reference's WanAttentionBlock): self-attention q, k, v, o;
    // cross-attention q, k, v, o, k_img, v_img; the FFN's two Linears.
    const std::regex linear(R"(action_head\.model\.blocks\.\d+\.(self_attn\.(q|k|v|o)|cross_attn\.(q|k|v|o|k_img|v_img)|ffn\.(0|2))\.weight)");
    // CLIP runs its first 31 blocks (use_layers: the penultimate block's output) without post_norm, head or
    // log_scale (the reference's clip.visual(..., use_31_block=True))
    const std::regex clip_unused(R"(action_head\.image_encoder\.model\.(visual\.transformer\.31\..*|visual\.post_norm\..*|visual\.head|log_scale))");
    KeyListFigures k;
    std::string line;
    int64_t rows = 0;
    while (std::getline(f, line)) {
        if (line.empty() || line[0] == '#') continue;
        std::istringstream in(line);
        std::string key, shape, numel_text;
        std::getline(in, key, '\t');
        std::getline(in, shape, '\t');
        std::getline(in, numel_text, '\t');
        const uint64_t n = std::stoull(numel_text);
        ++rows;
        if (key.rfind("action_head.model.", 0) == 0) {
            k.dit += n;
            if (std::regex_match(key, linear)) {
                const uint64_t out = std::stoull(shape.substr(1, shape.find(',') - 1));  // "[5120, 5120]"
                k.dit_fp8_bytes += n + 4 * out;
            } else {
                k.dit_fp8_bytes += 2 * n;
            }
        } else if (key.rfind("action_head.text_encoder.", 0) == 0) {
            k.umt5 += n;
        } else if (key.rfind("action_head.image_encoder.", 0) == 0) {
            k.clip_stored += n;
            if (!std::regex_match(key, clip_unused)) k.clip_run += n;
        } else if (key.rfind("action_head.vae.", 0) == 0) {
            k.vae += n;
            if (key.find("vae.model.decoder.") == std::string::npos) k.vae_no_decoder += n;
            // "[Co, Ci, kt, kh, kw]" or "[Co, Ci, kh, kw]": the taps are the dimensions after the first two
            std::vector<uint64_t> dims;
            for (size_t i = 1; i < shape.size();) {
                const size_t end = shape.find_first_of(",]", i);
                dims.push_back(std::stoull(shape.substr(i, end - i)));
                i = end + 2;
            }
            uint64_t taps = 1;
            for (size_t d = 2; d < dims.size(); ++d) taps *= dims[d];
            if (key.rfind("action_head.vae.model.encoder.", 0) == 0 && key.ends_with(".weight") && dims.size() >= 4 &&
                taps > 1)
                k.vae_encoder_taps += n;
        } else {
            FAIL("unexpected key " << key);
        }
    }
    CHECK(rows == 2146);
    CHECK(k.dit + k.umt5 + k.clip_stored + k.vae == 22'924'172'116ull);
    return k;
}

/// The DROID KV cache by hand: 40 layers, 40 heads x 128, 880 tokens a frame, a 9-frame window reset at the boundary
/// (7 committed frames per branch, 2 branches, 1 frame a block, the null block), 512 text tokens per branch and 257
/// image tokens shared by the branches, scratch of 2 frames + 24 actions + 1 state per branch, one layer, K and V.
struct DroidKv {
    uint64_t pool, cross, scratch;
};
DroidKv droid_kv(uint64_t element_bytes) {
    const uint64_t row = 40 * 128 * element_bytes;  // one token's K (or V) in one layer
    return {(2 * 7 + 1) * 880 * 40 * 2 * row, (2 * 512 + 257) * 40 * 2 * row, 2 * (2 * 880 + 25) * 2 * row};
}

}  // namespace

TEST_CASE("the DROID plan's weights are the reference key list's parameters in bf16, CLIP's unused block excluded") {
    const KeyListFigures k = key_list_figures();
    const MemoryPlan plan = offline_plan(droid(), WeightPrecision::Bf16, DType::BF16);
    CHECK(plan.part_bytes("weights.dit") == 2 * k.dit);
    CHECK(plan.part_bytes("weights.umt5") == 2 * k.umt5);
    CHECK(plan.part_bytes("weights.clip") == 2 * k.clip_run);
    // the VAE decoder only with --save-video (video_decode): a plain rollout does not load it
    CHECK(plan.part_bytes("weights.vae") == 2 * k.vae_no_decoder);
    CHECK(k.vae - k.vae_no_decoder > 70'000'000ull);
    // the issue's census: DiT 16.5 B, umT5 5.68 B, CLIP 0.63 B stored, VAE 0.13 B
    CHECK(k.dit > 16'400'000'000ull);
    CHECK(k.dit < 16'600'000'000ull);
    CHECK(k.umt5 > 5'670'000'000ull);
    CHECK(k.umt5 < 5'690'000'000ull);
    CHECK(k.clip_run < k.clip_stored);
}

TEST_CASE("an offline plan measures fast numerics by default, counting the VAE encoder's channels-last weights") {
    const config::RunConfig run = droid();
    const KeyListFigures k = key_list_figures();
    MemoryPlanOptions po;
    const MemoryPlan fast = plan_memory(run.model, droid_embodiment(), policy(run, true), po, nullptr);
    po.numerics = Numerics::Reference;
    const MemoryPlan reference = plan_memory(run.model, droid_embodiment(), policy(run, true), po, nullptr);
    CHECK(fast.numerics == Numerics::Fast);
    CHECK(reference.numerics == Numerics::Reference);
    CHECK(fast.to_json()["numerics"] == "fast");
    // the same weights and cross caches; fast numerics add a bf16 channels-last copy of every encoder convolution
    // weight of more than one tap (the 1x1x1 ones are read in place), and kv.in_place auto the lanes' room on a GPU:
    // 5 blocks of 880 tokens (the middle of both branches' 1785 current rows and its tail), which reference numerics do
    // not read in place
    for (const char* key : {"weights.dit", "weights.clip", "weights.vae", "kv.cross"})
        CHECK(fast.part_bytes(key) == reference.part_bytes(key));
    CHECK(fast.part_bytes("kv.pool") == reference.part_bytes("kv.pool") + 5 * uint64_t(880) * 40 * 2 * 40 * 128 * 2);
    CHECK(fast.part_bytes("tables.networks") == reference.part_bytes("tables.networks") + 2 * k.vae_encoder_taps);
    // NOTE: the workspaces are measured, not derived: fast numerics' (the channels-last VAE encode, the batched
    // CFG rows) came out 1.46 GB against reference numerics' 1.89 GB offline (docs/MEMORY.md)
    CHECK(fast.part_bytes("workspace") > 0);
    CHECK(reference.part_bytes("workspace") > 0);
}

TEST_CASE("the DROID plan in fp8 stores the DiT layers' linear weights in one byte plus a float32 scale per row") {
    const KeyListFigures k = key_list_figures();
    const MemoryPlan plan = offline_plan(droid(), WeightPrecision::Fp8, DType::BF16);
    CHECK(plan.part_bytes("weights.dit") == k.dit_fp8_bytes);
    // the other networks stay bf16
    CHECK(plan.part_bytes("weights.umt5") == 2 * k.umt5);
    CHECK(plan.part_bytes("weights.clip") == 2 * k.clip_run);
    // fp8 holds nearly the whole DiT: its bytes are a little over half of bf16's
    CHECK(double(k.dit_fp8_bytes) / double(2 * k.dit) < 0.52);
}

TEST_CASE("the DROID plan's KV cache matches the geometry by hand; an fp8 pool halves with a scale per token and head") {
    config::RunConfig plain = droid();
    plain.kv.in_place = KvInPlace::Off;
    const MemoryPlan bf16 = offline_plan(plain, WeightPrecision::Bf16, DType::BF16);
    const DroidKv kv = droid_kv(2);
    CHECK(bf16.part_bytes("kv.pool") == kv.pool);
    CHECK(bf16.part_bytes("kv.pool") == 10'813'440'000ull);  // docs/PERF.md: the measured plan on the H200
    // kv.in_place (auto: a GPU in fast numerics) lays the branches' blocks in mirrored lanes of 7 with a middle of 4
    // blocks and one tail block (both branches' 1785 current rows of a denoising forward), plus the null block
    const MemoryPlan lanes = offline_plan(droid(), WeightPrecision::Bf16, DType::BF16);
    CHECK(lanes.part_bytes("kv.pool") == (2 * 7 + 4 + 1 + 1) * uint64_t(880) * 40 * 2 * 40 * 128 * 2);
    CHECK(lanes.part_bytes("kv.cross") == kv.cross);
    CHECK(lanes.part_bytes("kv.scratch") == kv.scratch);
    CHECK(bf16.part_bytes("kv.cross") == kv.cross);
    CHECK(bf16.part_bytes("kv.scratch") == kv.scratch);
    CHECK(bf16.part_bytes("kv.scales") == 0);

    const MemoryPlan fp8 = offline_plan(droid(), WeightPrecision::Bf16, DType::F8_E4M3);
    CHECK(fp8.part_bytes("kv.pool") == droid_kv(1).pool);
    // the cross caches are E4M3 with a float32 per token and head too; the scratch keeps the compute dtype
    // (KvCacheManager allocates them so)
    CHECK(fp8.part_bytes("kv.cross") == uint64_t(2 * 512 + 257) * 40 * 2 * 40 * (128 + 4));
    CHECK(fp8.part_bytes("kv.scratch") == kv.scratch);
    // a float32 per token and head, K and V, per layer, in the 15 block ids of 880 tokens
    CHECK(fp8.part_bytes("kv.scales") == uint64_t(15) * 880 * 40 * 2 * 40 * 4);
}

TEST_CASE("a DROID plan for two sessions counts two sessions' blocks, cross caches and buffers, the rest once") {
    config::RunConfig plain = droid();
    plain.kv.in_place = KvInPlace::Off;
    const MemoryPlan one = offline_plan(plain, WeightPrecision::Bf16, DType::BF16);
    MemoryPlanOptions po;
    PolicyOptions o = policy(droid(), true);
    o.max_sessions = 2;  // kv.in_place auto: no lanes for two sessions
    const MemoryPlan two = plan_memory(droid().model, droid_embodiment(), o, po, nullptr);
    const uint64_t block = uint64_t(880) * 40 * 2 * 40 * 128 * 2;
    CHECK(one.part_bytes("kv.pool") == (14 + 1) * block);
    CHECK(two.part_bytes("kv.pool") == (2 * 14 + 1) * block);
    CHECK(two.part_bytes("kv.cross") == 2 * one.part_bytes("kv.cross"));
    CHECK(two.part_bytes("session") == 2 * one.part_bytes("session"));
    for (const char* once : {"kv.scratch", "workspace", "weights.dit", "tables.networks", "cuda.context"})
        CHECK(two.part_bytes(once) == one.part_bytes(once));
    CHECK(two.sessions == 2);
    CHECK(two.to_json()["sessions"] == 2);
    CHECK_FALSE(one.to_json().contains("sessions"));
    CHECK(two.peak_bytes() - one.peak_bytes() ==
          14 * block + one.part_bytes("kv.cross") + one.part_bytes("session"));
}

TEST_CASE("the phases hold their parts: umT5 only in the pre-pass, or in every phase without it") {
    const MemoryPlan with = offline_plan(droid(), WeightPrecision::Bf16, DType::BF16, true);
    const MemoryPlan without = offline_plan(droid(), WeightPrecision::Bf16, DType::BF16, false);
    const auto phase = [](const MemoryPlan& p, const std::string& key) -> const MemoryPhase& {
        for (const auto& ph : p.phases)
            if (ph.key == key) return ph;
        FAIL("no phase " << key);
        return p.phases.at(0);
    };
    const auto sum = [](const MemoryPlan& p, std::initializer_list<const char*> keys) {
        uint64_t s = 0;
        for (const char* k : keys) s += p.part_bytes(k);
        return s;
    };
    const uint64_t resident = sum(with, {"cuda.context", "workspace", "weights.clip", "weights.vae", "weights.dit",
                                         "tables.networks", "kv.pool", "kv.scratch", "kv.cross"});
    CHECK(phase(with, "text_prepass").bytes ==
          sum(with, {"cuda.context", "workspace", "weights.umt5", "tables.umt5", "text.prepass_output"}));
    CHECK(phase(with, "load").bytes == resident);
    CHECK(phase(with, "rollout").bytes == resident + with.part_bytes("session"));
    CHECK(with.peak().key == "rollout");
    CHECK(with.part_bytes("cuda.context") == kCudaContextBytes);

    CHECK(without.phases.size() == 2);  // no pre-pass phase
    CHECK(phase(without, "rollout").bytes ==
          phase(with, "rollout").bytes + without.part_bytes("weights.umt5") + without.part_bytes("tables.umt5"));
    // the pre-pass saves umT5's 11.4 GB at the peak
    CHECK(without.peak_bytes() - with.peak_bytes() > 11'300'000'000ull);
}

TEST_CASE("the tiny plan's KV cache matches the geometry by hand and its workspace is what a CPU engine reserves") {
    const config::RunConfig run = tiny();
    // 2 layers, 1 head x 128, 220 tokens a frame; 15 block ids, (512 + 257) context tokens, 2 x 220 + 25 rows
    const uint64_t row = 128 * 4;  // f32 on the CPU
    const Embodiment e = droid_embodiment();
    const std::unique_ptr<Backend> cpu = make_cpu_backend(size_t(1) << 20);
    MemoryPlanOptions po;
    po.compute_dtype = DType::F32;
    po.kv_dtype = DType::F32;
    po.cuda = false;
    const MemoryPlan plan = plan_memory(run.model, e, policy(run, false), po, cpu.get());
    CHECK(plan.part_bytes("kv.pool") == 15 * 220 * 2 * 2 * row);
    CHECK(plan.part_bytes("kv.cross") == (2 * 512 + 257) * 2 * 2 * row);
    CHECK(plan.part_bytes("kv.scratch") == 2 * (2 * 220 + 25) * 2 * row);
    CHECK(plan.part_bytes("cuda.context") == 0);

    // a real engine on the CPU backend, loaded from random weights: the same workspace, the same KV cache
    const RandomWeightSource weights(expected_weights(run.model), 1, 1);
    const auto engine =
        Engine::create(run.model, weights, e, test::data_dir() / "tokenizer/spiece.model", policy(run, false),
                       {Device::cpu()}, BackendOptions{});
    CHECK(plan.part_bytes("workspace") == engine->workspace_bytes().at(0));
    CHECK(plan.part_bytes("kv.pool") + plan.part_bytes("kv.cross") + plan.part_bytes("kv.scratch") ==
          engine->kv_bytes());
}

TEST_CASE("the tiny plan's weights are a written checkpoint's tensors in bf16, CLIP's unused block excluded") {
    test::TempDir dir;
    const config::RunConfig run = tiny();
    MakeOptions mo;
    mo.tokenizer = test::data_dir() / "tokenizer/spiece.model";
    write_random_checkpoint(run.model, mo, dir / "ckpt");
    const Checkpoint ckpt(dir / "ckpt");
    // tiny CLIP stores 3 blocks and runs 2 (use_layers), without post_norm, head or log_scale
    const std::regex clip_unused(R"(action_head\.image_encoder\.model\.(visual\.transformer\.2\..*|visual\.post_norm\..*|visual\.head|log_scale))");
    uint64_t dit = 0, umt5 = 0, clip = 0, vae = 0;
    for (const std::string& key : ckpt.keys()) {
        const uint64_t n = uint64_t(ckpt.find(key)->numel());
        if (key.rfind("action_head.model.", 0) == 0) dit += n;
        if (key.rfind("action_head.text_encoder.", 0) == 0) umt5 += n;
        if (key.rfind("action_head.image_encoder.", 0) == 0 && !std::regex_match(key, clip_unused)) clip += n;
        if (key.rfind("action_head.vae.", 0) == 0 && key.find("vae.model.decoder.") == std::string::npos) vae += n;
    }
    const MemoryPlan plan = offline_plan(run, WeightPrecision::Bf16, DType::BF16);
    CHECK(plan.part_bytes("weights.dit") == 2 * dit);
    CHECK(plan.part_bytes("weights.umt5") == 2 * umt5);
    CHECK(plan.part_bytes("weights.clip") == 2 * clip);
    CHECK(plan.part_bytes("weights.vae") == 2 * vae);
}

TEST_CASE("a budget the plan exceeds is refused naming the peak phase, its largest parts and the shortfall") {
    const MemoryPlan plan = offline_plan(droid(), WeightPrecision::Bf16, DType::BF16);
    CHECK_NOTHROW(check_memory_budget(plan, plan.peak_bytes(), "budget"));
    const uint64_t budget = 44ull << 30;
    REQUIRE(plan.peak_bytes() > budget);
    std::string message;
    try {
        check_memory_budget(plan, budget, "--gpu-memory-budget 44GiB");
    } catch (const Error& e) {
        message = e.what();
    }
    CHECK(message.find("--gpu-memory-budget 44GiB") != std::string::npos);
    CHECK(message.find("warm-up and rollout calls") != std::string::npos);
    CHECK(message.find("DiT weights") != std::string::npos);
    CHECK(message.find("KV pool") != std::string::npos);
    CHECK(message.find(config::format_count(plan.peak_bytes() - budget)) != std::string::npos);
    // largest first: the DiT's weights before the KV pool
    CHECK(message.find("DiT weights") < message.find("KV pool"));
}

TEST_CASE("memory budgets read 44GiB, 48GB and 32000MiB, and refuse anything else with the option's name") {
    CHECK(config::parse_memory_budget("44GiB", "--gpu-memory-budget") == 44ull << 30);
    CHECK(config::parse_memory_budget("48GB", "--gpu-memory-budget") == 48'000'000'000ull);
    CHECK(config::parse_memory_budget("32000MiB", "--gpu-memory-budget") == 32000ull << 20);
    CHECK(config::parse_memory_budget("47244640256", "--gpu-memory-budget") == 47'244'640'256ull);
    for (const char* bad : {"", "0", "0GiB", "-4GiB", "44 gigs", "GiB", "44GiBs", "nan", "1e400"}) {
        std::string message;
        try {
            config::parse_memory_budget(bad, "--gpu-memory-budget");
        } catch (const Error& e) {
            message = e.what();
        }
        CHECK_MESSAGE(message.find("--gpu-memory-budget") != std::string::npos, bad);
    }
    CHECK_THROWS_AS(parse_weight_precision("fp16", "--precision"), Error);
    CHECK_THROWS_AS(parse_kv_dtype("int8", "--kv-dtype"), Error);
}

TEST_CASE("a config's gpu_memory_budget is read, and a bad one is refused naming the key and the value") {
    const auto run = config::load_run_config(test::source_dir() / "configs/tiny.yaml",
                                             {config::parse_override("gpu_memory_budget=44GiB")});
    CHECK(run.gpu_memory_budget == "44GiB");
    std::string message;
    try {
        config::load_run_config(test::source_dir() / "configs/tiny.yaml",
                                {config::parse_override("gpu_memory_budget=lots")});
    } catch (const Error& e) {
        message = e.what();
    }
    CHECK(message.find("gpu_memory_budget") != std::string::npos);
    CHECK(message.find("lots") != std::string::npos);
}
