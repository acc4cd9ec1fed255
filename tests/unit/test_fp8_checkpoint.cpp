// FP8 weights on the CPU: the default layer table, `dzr ckpt quantize` (a real checkpoint that checks, loads and
// round-trips), the refusal of broken scales before any compute, quantize-on-load, and an FP8 Linear against its
// dequantized math.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "config/run_config.h"
#include "core/error.h"
#include "core/fp8.h"
#include "core/half.h"
#include "model/inventory.h"
#include "model/layers.h"
#include "support/cli.h"
#include "support/map_weight_source.h"
#include "support/test_support.h"
#include "weights/checkpoint.h"
#include "weights/checksums.h"
#include "weights/fp8_weights.h"
#include "weights/inventory.h"
#include "weights/keys.h"
#include "weights/quantize_checkpoint.h"
#include "weights/random_checkpoint.h"
#include "weights/safetensors.h"

using namespace dzr;
namespace fs = std::filesystem;

namespace {

using test::error_of;
using test::contains;

const ModelConfig& tiny_model() {
    static const ModelConfig m = config::load_run_config(test::source_dir() / "configs/tiny.yaml").model;
    return m;
}

/// A bf16 tiny checkpoint (as the released one is bf16) with the test tokenizer.
void make_tiny(const fs::path& dir, uint64_t seed = 11) {
    MakeOptions o;
    o.seed = seed;
    o.tokenizer = test::data_dir() / "tokenizer/spiece.model";
    write_random_checkpoint(tiny_model(), o, dir);
}

QuantizeResult quantize(const fs::path& in, const fs::path& out, Precision p = Precision::Fp8,
                        uint64_t shard_size = 5'000'000'000) {
    const Checkpoint ck(in);
    QuantizeOptions o;
    o.precision = p;
    o.shard_size = shard_size;
    return quantize_checkpoint(ck, expected_weights(ck.model_config()), out, o);
}

/// Rewrites a single-shard checkpoint: `edit` may change the name -> host tensor map before it is written back.
void rewrite(const fs::path& dir, const std::function<void(std::map<std::string, Tensor>&)>& edit) {
    const fs::path p = dir / "model.safetensors";
    std::map<std::string, Tensor> tensors;
    {
        const auto f = SafetensorsFile::open(p);
        for (const auto& e : f->entries()) {
            const TensorView v = *f->find(e.name);
            Tensor t = Tensor::host(v.shape, v.dtype);
            if (v.nbytes()) std::memcpy(t.data(), v.data, v.nbytes());
            tensors.emplace(e.name, t);
        }
    }
    edit(tensors);
    std::vector<std::pair<std::string, TensorView>> list;
    for (const auto& [k, t] : tensors) list.emplace_back(k, t.view());
    write_safetensors(p, list);
}

void set_f32(Tensor& t, int64_t i, float v) { std::memcpy(static_cast<char*>(t.data()) + 4 * i, &v, 4); }

const std::string kFfn0 = "action_head.model.blocks.1.ffn.0.weight";

}  // namespace

TEST_CASE("the default FP8 table names the DiT layers' Linears and keeps everything else") {
    CHECK(fp8_by_default("action_head.model.blocks.0.self_attn.q.weight"));
    CHECK(fp8_by_default("action_head.model.blocks.39.ffn.2.weight"));
    CHECK(fp8_by_default("action_head.model.blocks.7.cross_attn.v_img.weight"));
    CHECK_FALSE(fp8_by_default("action_head.model.blocks.0.self_attn.q.bias"));
    CHECK_FALSE(fp8_by_default("action_head.model.blocks.0.modulation"));
    CHECK_FALSE(fp8_by_default("action_head.model.head.head.weight"));
    CHECK_FALSE(fp8_by_default("action_head.model.time_projection.1.weight"));
    CHECK_FALSE(fp8_by_default("action_head.model.blocksX.0.ffn.0.weight"));
    CHECK_FALSE(fp8_by_default("action_head.text_encoder.blocks.0.attn.q.weight"));
    CHECK(fp8_scale_key(kFfn0) == "action_head.model.blocks.1.ffn.0.weight_scale");

    // every row of the table is a Linear weight of the real inventory, and every DiT Linear has a row
    const std::vector<ExpectedWeight> inv = expected_weights(tiny_model());
    std::map<std::string, int> rows_hit;
    for (const ExpectedWeight& e : inv) {
        const Fp8LayerRule* r = fp8_layer_rule(e.key);
        if (r) {
            CHECK_MESSAGE(e.linear, e.key);
            ++rows_hit[std::string(r->module)];
        } else if (e.linear && component_of(e.key) == Component::Dit) {
            FAIL_CHECK("DiT Linear without a row in kFp8LayerTable: " << e.key);
        }
    }
    for (const Fp8LayerRule& r : kFp8LayerTable) CHECK_MESSAGE(rows_hit[std::string(r.module)] > 0, r.module);
    int fp8_rows = 0;
    for (const Fp8LayerRule& r : kFp8LayerTable) fp8_rows += r.fp8 ? 1 : 0;
    CHECK(fp8_rows == 12);
}

TEST_CASE("ckpt quantize writes a real FP8 checkpoint: scales per output channel, the rest byte for byte") {
    test::TempDir tmp;
    make_tiny(tmp / "bf16");
    const QuantizeResult r = quantize(tmp / "bf16", tmp / "fp8");
    const int layers = tiny_model().dit.num_layers;
    CHECK(r.converted == size_t(12 * layers));
    CHECK(r.shards == 1);

    const Checkpoint in(tmp / "bf16"), out(tmp / "fp8");
    const auto inv = expected_weights(out.model_config());
    const WeightCheckReport report = check_weights(out, inv);
    CHECK_MESSAGE(report.ok(), report.message("fp8"));
    CHECK(out.keys().size() == in.keys().size() + size_t(12 * layers));
    for (const char* f : {"config.json", "experiment_cfg/metadata.json", "spiece.model"})
        CHECK_MESSAGE(test::slurp(tmp / "fp8" / f) == test::slurp(tmp / "bf16" / f), f);
    const ChecksumReport sums = verify_checksums(tmp / "fp8", {"model.safetensors"});
    CHECK(sums.had_list);
    CHECK(sums.problems.empty());

    size_t f8 = 0;
    for (const std::string& key : in.keys()) {
        const TensorView a = *in.find(key), b = *out.find(key);
        if (!fp8_by_default(key)) {
            CHECK_MESSAGE(b.dtype == a.dtype, key);
            CHECK_MESSAGE(std::memcmp(a.data, b.data, a.nbytes()) == 0, key);
            CHECK_FALSE(out.find(key + "_scale").has_value());
            continue;
        }
        ++f8;
        REQUIRE(b.dtype == DType::F8_E4M3);
        const TensorView s = *out.find(fp8_scale_key(key));
        REQUIRE(s.dtype == DType::F32);
        REQUIRE(s.shape == Shape{a.dim(0)});
        const int64_t rows = a.dim(0), cols = a.dim(1);
        for (int64_t o = 0; o < rows; ++o) {
            float amax = 0, scale;
            std::memcpy(&scale, static_cast<const char*>(s.data) + 4 * o, 4);
            for (int64_t i = 0; i < cols; ++i) {
                uint16_t h;
                std::memcpy(&h, static_cast<const char*>(a.data) + 2 * (o * cols + i), 2);
                amax = std::max(amax, std::fabs(bf16_to_f32(h)));
            }
            CHECK(scale == amax / 448.0f);
            for (int64_t i = 0; i < cols; ++i) {
                uint16_t h;
                std::memcpy(&h, static_cast<const char*>(a.data) + 2 * (o * cols + i), 2);
                const float w = bf16_to_f32(h);
                const uint8_t code = static_cast<const uint8_t*>(b.data)[o * cols + i];
                // the stored code is exactly the quantization of core/fp8.h
                REQUIRE(code == f32_to_f8e4m3(w * (448.0f / amax)));
            }
        }
    }
    CHECK(f8 == size_t(12 * layers));
}

TEST_CASE("ckpt quantize keeps a weight and its scale in one shard and indexes several shards") {
    test::TempDir tmp;
    make_tiny(tmp / "bf16");
    const QuantizeResult r = quantize(tmp / "bf16", tmp / "fp8", Precision::Fp8, 200'000);
    REQUIRE(r.shards > 1);
    const Checkpoint out(tmp / "fp8");
    CHECK(out.has_index());
    CHECK(check_weights(out, expected_weights(out.model_config())).ok());
    for (const std::string& key : out.keys())
        if (out.find(key)->dtype == DType::F8_E4M3)
            CHECK_MESSAGE(out.shard_of(key) == out.shard_of(fp8_scale_key(key)), key);
}

TEST_CASE("ckpt quantize back to bf16 gives the dequantized values and the original keys") {
    test::TempDir tmp;
    make_tiny(tmp / "bf16");
    quantize(tmp / "bf16", tmp / "fp8");
    const QuantizeResult r = quantize(tmp / "fp8", tmp / "back", Precision::Bf16);
    CHECK(r.converted == size_t(12 * tiny_model().dit.num_layers));
    const Checkpoint fp8(tmp / "fp8"), back(tmp / "back"), orig(tmp / "bf16");
    CHECK(back.keys() == orig.keys());
    CHECK(check_weights(back, expected_weights(back.model_config())).ok());
    const TensorView q = *fp8.find(kFfn0), s = *fp8.find(fp8_scale_key(kFfn0)), w = *back.find(kFfn0);
    REQUIRE(w.dtype == DType::BF16);
    const std::vector<float> got = to_f32_vector(w);
    float scale0;
    std::memcpy(&scale0, s.data, 4);
    for (int64_t i = 0; i < q.dim(1); ++i)
        CHECK(got[size_t(i)] == bf16_to_f32(f32_to_bf16(f8e4m3_to_f32(static_cast<const uint8_t*>(q.data)[i]) * scale0)));
}

TEST_CASE("ckpt quantize refuses its own input, a non-empty output and a broken input") {
    test::TempDir tmp;
    make_tiny(tmp / "bf16");
    CHECK(contains(error_of([&] { quantize(tmp / "bf16", tmp / "bf16"); }), "is the input checkpoint"));
    fs::create_directories(tmp / "full");
    std::ofstream(tmp / "full/x") << "x";
    CHECK(contains(error_of([&] { quantize(tmp / "bf16", tmp / "full"); }), "not an empty directory"));
    rewrite(tmp / "bf16", [](auto& t) { t.erase(kFfn0); });
    const std::string e = error_of([&] { quantize(tmp / "bf16", tmp / "out"); });
    CHECK(contains(e, "missing"));
    CHECK(contains(e, kFfn0));
    CHECK_FALSE(fs::exists(tmp / "out"));
}

TEST_CASE("broken FP8 scales are refused by the checkpoint check, naming the tensor") {
    test::TempDir tmp;
    make_tiny(tmp / "bf16");
    quantize(tmp / "bf16", tmp / "good");
    const std::string scale = fp8_scale_key(kFfn0);
    struct Case {
        const char* what;
        std::function<void(std::map<std::string, Tensor>&)> edit;
        const char* expect;
    };
    const Case cases[] = {
        {"missing", [&](auto& t) { t.erase(scale); }, "is missing"},
        {"nan", [&](auto& t) { set_f32(t.at(scale), 5, NAN); }, "element 5 is nan"},
        {"inf", [&](auto& t) { set_f32(t.at(scale), 0, INFINITY); }, "element 0 is inf"},
        {"zero", [&](auto& t) { set_f32(t.at(scale), 3, 0.0f); }, "element 3 is 0"},
        {"negative", [&](auto& t) { set_f32(t.at(scale), 7, -0.25f); }, "element 7 is -0.25"},
        {"short", [&](auto& t) { t[scale] = Tensor::host(Shape{255}, DType::F32); }, "is f32 [255], expected f32 [256]"},
        {"2-d", [&](auto& t) { t[scale] = Tensor::host(Shape{256, 1}, DType::F32); }, "is f32 [256, 1]"},
        {"bf16", [&](auto& t) { t[scale] = Tensor::host(Shape{256}, DType::BF16); }, "is bf16 [256]"},
    };
    for (const Case& c : cases) {
        CAPTURE(c.what);
        const fs::path dir = tmp / (std::string("case-") + c.what);
        fs::copy(tmp / "good", dir, fs::copy_options::recursive);
        rewrite(dir, c.edit);
        const Checkpoint ck(dir);
        const WeightCheckReport r = check_weights(ck, expected_weights(ck.model_config()));
        REQUIRE(r.fp8_scale.size() == 1);
        CHECK(r.fp8_scale[0].key == kFfn0);
        const std::string msg = r.message("checkpoint");
        CHECK(contains(msg, "1 FP8 weight with a bad scale"));
        CHECK(contains(msg, scale));
        CHECK(contains(msg, c.expect));
        // the loader refuses it too, before anything is uploaded
        auto be = make_cpu_backend();
        WeightLoader loader(ck, *be);
        loader.set_precision(Precision::Fp8);
        const std::string e = error_of([&] { loader.require_linear(kFfn0, Shape{256, 128}); });
        CHECK(contains(e, kFfn0));
        CHECK(contains(e, c.expect));
    }
    // an f8 tensor that is not a Linear weight, and a stray scale
    const fs::path dir = tmp / "stray";
    fs::copy(tmp / "good", dir, fs::copy_options::recursive);
    rewrite(dir, [](auto& t) {
        t["action_head.model.blocks.0.modulation"] = Tensor::host(Shape{1, 6, 128}, DType::F8_E4M3);
        t["action_head.model.head.head.weight_scale"] = Tensor::host(Shape{64}, DType::F32);
    });
    const Checkpoint ck(dir);
    const WeightCheckReport r = check_weights(ck, expected_weights(ck.model_config()));
    REQUIRE(r.dtype_mismatch.size() == 1);
    CHECK(r.dtype_mismatch[0].found == "f8_e4m3");
    REQUIRE(r.unexpected.size() == 1);
    CHECK(contains(r.unexpected[0], "head.head.weight_scale"));
}

TEST_CASE("an FP8 checkpoint loads as FP8, quantizes on load identically, and dequantizes under bf16") {
    test::TempDir tmp;
    make_tiny(tmp / "bf16");
    quantize(tmp / "bf16", tmp / "fp8");
    const Checkpoint bf16(tmp / "bf16"), fp8(tmp / "fp8");
    auto be = make_cpu_backend();
    const Shape shape{256, 128};

    WeightLoader stored(fp8, *be), on_load(bf16, *be), plain(fp8, *be);
    stored.set_precision(Precision::Fp8);
    on_load.set_precision(Precision::Fp8);
    const LinearWeight a = stored.require_linear(kFfn0, shape), b = on_load.require_linear(kFfn0, shape);
    REQUIRE(a.w.dtype() == DType::F8_E4M3);
    REQUIRE(b.w.dtype() == DType::F8_E4M3);
    CHECK(std::memcmp(a.w.data(), b.w.data(), a.w.nbytes()) == 0);
    CHECK(std::memcmp(a.scale.data(), b.scale.data(), a.scale.nbytes()) == 0);
    CHECK(stored.used().count(fp8_scale_key(kFfn0)) == 1);

    // precision bf16 over the FP8 checkpoint: the compute dtype, values times scales
    const LinearWeight c = plain.require_linear(kFfn0, shape);
    CHECK_FALSE(c.scale.defined());
    REQUIRE(c.w.dtype() == DType::F32);
    CHECK(c.w.ptr<float>()[1] == f8e4m3_to_f32(a.w.ptr<uint8_t>()[1]) * a.scale.ptr<float>()[0]);

    // a table weight stays bf16 under precision fp8 when it is not in the table
    const LinearWeight head = on_load.require_linear(keys::dit("head.head.weight"), Shape{64, 128});
    CHECK_FALSE(head.scale.defined());
}

TEST_CASE("an FP8 Linear equals its dequantized math on the CPU backend") {
    auto be = make_cpu_backend();
    const int64_t M = 9, K = 96, N = 40;
    test::MapSource src;
    std::mt19937_64 rng(3);
    src.put("m.weight", Shape{N, K}, rng, -0.3f, 0.3f);
    src.put("m.bias", Shape{N}, rng, -0.1f, 0.1f);
    WeightLoader loader(src, *be);
    loader.set_precision(Precision::Fp8);
    Linear lin;
    // NOTE: "m" is no DiT key, so the default table would keep it f32: load it as FP8 through a stored weight below
    lin.load(loader, "m", K, N);
    REQUIRE_FALSE(lin.fp8());
    const Fp8Weight q = quantize_weight_fp8(src.tensors.at("m.weight"), "m.weight");
    lin.w = q.q;
    lin.scale = q.scale;
    REQUIRE(lin.fp8());

    std::vector<float> x = test::random_floats(size_t(M * K), 4, -2.0f, 2.0f);
    for (int64_t k = 0; k < K; ++k) x[size_t(3 * K + k)] = 0.0f;  // an all-zero token
    std::vector<float> out(size_t(M * N), NAN);
    lin.forward(*be, TensorView(x.data(), DType::F32, Shape{M, K}), TensorView(out.data(), DType::F32, Shape{M, N}));
    CHECK(be->workspace().used() == 0);

    // reference: both operands quantized as core/fp8.h says, dequantized, multiplied in double
    std::vector<uint8_t> xq(size_t(M * K));
    std::vector<float> xs(static_cast<size_t>(M));
    for (int64_t m = 0; m < M; ++m) xs[size_t(m)] = quantize_row_fp8(x.data() + m * K, K, xq.data() + m * K);
    const float* bias = src.tensors.at("m.bias").ptr<float>();
    double err = 0, ref_norm = 0;
    for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
            double acc = 0;
            for (int64_t k = 0; k < K; ++k)
                acc += double(f8e4m3_to_f32(xq[size_t(m * K + k)]) * xs[size_t(m)]) *
                       double(f8e4m3_to_f32(q.q.ptr<uint8_t>()[n * K + k]) * q.scale.ptr<float>()[n]);
            const double ref = acc + bias[n];
            // NOTE: f32 sums of 96 products and two f32 scale products: a few ulp of the row's magnitude
            CHECK(std::fabs(out[size_t(m * N + n)] - ref) <= 1e-5 * (1.0 + std::fabs(ref)));
            err += (out[size_t(m * N + n)] - ref) * (out[size_t(m * N + n)] - ref);
            ref_norm += ref * ref;
        }
    CHECK(std::sqrt(err / ref_norm) < 1e-6);
    for (int64_t n = 0; n < N; ++n) CHECK(out[size_t(3 * N + n)] == bias[n]);  // the zero token gives the bias
}

TEST_CASE("an input quantized once gives every FP8 Linear the output of its own quantization") {
    auto be = make_cpu_backend();
    const int64_t M = 7, K = 64, N = 24;
    std::mt19937_64 rng(5);
    std::vector<Linear> lins(3);
    for (size_t i = 0; i < lins.size(); ++i) {
        test::MapSource src;
        src.put("m.weight", Shape{N, K}, rng, -0.3f, 0.3f);
        src.put("m.bias", Shape{N}, rng, -0.1f, 0.1f);
        WeightLoader loader(src, *be);
        lins[i].load(loader, "m", K, N);
        const Fp8Weight q = quantize_weight_fp8(src.tensors.at("m.weight"), "m.weight");
        lins[i].w = q.q;
        lins[i].scale = q.scale;
    }
    std::vector<float> x = test::random_floats(size_t(M * K), 6, -3.0f, 3.0f);
    const TensorView xv(x.data(), DType::F32, Shape{M, K});
    {
        ArenaScope scope(be->workspace());
        const Fp8Input xq = Fp8Input::quantize(*be, xv, true);
        REQUIRE(xq.defined());
        for (const Linear& lin : lins) {
            std::vector<float> own(size_t(M * N), NAN), shared(size_t(M * N), NAN);
            lin.forward(*be, xv, TensorView(own.data(), DType::F32, Shape{M, N}));
            lin.forward(*be, xv, xq, TensorView(shared.data(), DType::F32, Shape{M, N}));
            CHECK(std::memcmp(own.data(), shared.data(), own.size() * sizeof(float)) == 0);
        }
        // a quantization of another width is refused, naming both
        const Fp8Input narrow = Fp8Input::quantize(*be, xv.slice(1, 0, K / 2), true);
        std::vector<float> out(size_t(M * N));
        CHECK(test::contains(test::error_of([&] {
                                 lins[0].forward(*be, xv, narrow, TensorView(out.data(), DType::F32, Shape{M, N}));
                             }),
                             "does not match"));
    }
    CHECK_FALSE(Fp8Input::quantize(*be, xv, false).defined());
    CHECK(be->workspace().used() == 0);
}

TEST_CASE("dzr ckpt quantize and validate work through the binary") {
    if (test::dzr_bin().empty()) {
        MESSAGE("DZR_BIN is not set (run through ctest); skipping the binary checks");
        return;
    }
    test::TempDir tmp;
    make_tiny(tmp / "bf16");
    using test::q;
    test::CliResult r = test::run_dzr("ckpt quantize --precision fp8 " + q(tmp / "bf16") + " " + q(tmp / "fp8"), tmp.path());
    CHECK(r.code == 0);
    CHECK(r.has("24 Linear weights quantized to f8_e4m3"));
    r = test::run_dzr("ckpt validate " + q(tmp / "fp8") + " --hash", tmp.path());
    CHECK(r.code == 0);
    CHECK(r.has("f8_e4m3"));
    r = test::run_dzr("ckpt quantize --precision fp4 " + q(tmp / "bf16") + " " + q(tmp / "x"), tmp.path());
    CHECK(r.code != 0);
    CHECK(r.has("--precision: expected bf16 or fp8, got 'fp4'"));
    CHECK_FALSE(fs::exists(tmp / "x"));

    rewrite(tmp / "fp8", [](auto& t) { set_f32(t.at(fp8_scale_key(kFfn0)), 2, NAN); });
    r = test::run_dzr("ckpt validate " + q(tmp / "fp8"), tmp.path());
    CHECK(r.code == 1);
    CHECK(r.has("action_head.model.blocks.1.ffn.0.weight_scale element 2 is nan"));
}
