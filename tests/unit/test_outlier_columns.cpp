// `dzr ckpt make --outlier-columns N --outlier-scale S` (weights/outlier_columns.h): the chosen input columns
// of every Linear weight that --precision fp8 quantizes are the default checkpoint's values times S exactly,
// every other element and tensor keeps the default bytes, the columns are N distinct ones chosen by the seed,
// and bad options fail before anything is written.
#include <doctest/doctest.h>

#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "config/run_config.h"
#include "core/error.h"
#include "core/half.h"
#include "model/inventory.h"
#include "support/cli.h"
#include "support/test_support.h"
#include "weights/checkpoint.h"
#include "weights/outlier_columns.h"
#include "weights/random_checkpoint.h"

using namespace dzr;
namespace fs = std::filesystem;

namespace {

const ModelConfig& tiny_model() {
    static const ModelConfig m = config::load_run_config(test::source_dir() / "configs/tiny.yaml").model;
    return m;
}

void make(const fs::path& dir, DType dtype, uint64_t seed, int columns, float scale = 30.0f) {
    MakeOptions o;
    o.seed = seed;
    o.dtype = dtype;
    o.outliers.columns = columns;
    o.outliers.scale = scale;
    write_random_checkpoint(tiny_model(), o, dir);
}

float value(const TensorView& t, int64_t i) {
    if (t.dtype == DType::F32) return static_cast<const float*>(t.data)[i];
    const uint16_t h = static_cast<const uint16_t*>(t.data)[i];
    return t.dtype == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

/// `x * scale` rounded to the dtype, as the stored value of that dtype.
float scaled(float x, float scale, DType dtype) {
    const float v = x * scale;
    if (dtype == DType::F32) return v;
    return dtype == DType::BF16 ? bf16_to_f32(f32_to_bf16(v)) : f16_to_f32(f32_to_f16(v));
}

/// Compares the outlier checkpoint with the default one of the same seed, element by element.
void check_against_default(DType dtype, int columns, float scale) {
    test::TempDir dir;
    make(dir.path() / "plain", dtype, 7, 0);
    make(dir.path() / "outl", dtype, 7, columns, scale);
    const Checkpoint plain(dir.path() / "plain"), outl(dir.path() / "outl");
    REQUIRE(plain.keys() == outl.keys());
    size_t with_outliers = 0;
    for (const ExpectedWeight& w : expected_weights(tiny_model())) {
        INFO(w.key);
        const TensorView a = *plain.find(w.key), b = *outl.find(w.key);
        REQUIRE(a.shape == b.shape);
        REQUIRE(a.dtype == b.dtype);
        if (!takes_outlier_columns(w)) {
            CHECK(std::memcmp(a.data, b.data, a.nbytes()) == 0);
            continue;
        }
        ++with_outliers;
        const int64_t rows = w.shape[0], in = w.shape[1];
        const std::vector<int64_t> cols = outlier_columns(7, w.key, in, columns);
        std::vector<bool> chosen(size_t(in), false);
        for (int64_t c : cols) chosen[size_t(c)] = true;
        int64_t differ = 0, wrong = 0, changed_elsewhere = 0;
        for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < in; ++c) {
                const int64_t i = r * in + c;
                const float x = value(a, i), y = value(b, i);
                if (chosen[size_t(c)]) {
                    differ += x != y;
                    wrong += y != scaled(x, scale, dtype);
                } else {
                    changed_elsewhere +=
                        std::memcmp(static_cast<const uint8_t*>(a.data) + i * int64_t(dtype_size(dtype)),
                                    static_cast<const uint8_t*>(b.data) + i * int64_t(dtype_size(dtype)),
                                    dtype_size(dtype)) != 0;
                }
            }
        CHECK(wrong == 0);
        CHECK(changed_elsewhere == 0);
        CHECK(differ > rows * columns / 2);  // random values: almost none is 0
    }
    // the twelve FP8 Linears of each DiT layer
    CHECK(with_outliers == size_t(12 * tiny_model().dit.num_layers));
}

}  // namespace

TEST_CASE("outlier columns are the default values times the scale and nothing else changes (f32)") {
    check_against_default(DType::F32, 3, 30.0f);
}

TEST_CASE("outlier columns in a bf16 checkpoint are the default values times the scale, rounded to bf16") {
    check_against_default(DType::BF16, 2, 30.0f);
}

TEST_CASE("outlier columns are distinct, ascending, fixed by the seed and the key") {
    const std::vector<int64_t> a = outlier_columns(1, "action_head.model.blocks.0.ffn.0.weight", 5120, 4);
    CHECK(a.size() == 4);
    CHECK(std::set<int64_t>(a.begin(), a.end()).size() == 4);
    for (size_t i = 1; i < a.size(); ++i) CHECK(a[i - 1] < a[i]);
    for (int64_t c : a) CHECK((c >= 0 && c < 5120));
    CHECK(outlier_columns(1, "action_head.model.blocks.0.ffn.0.weight", 5120, 4) == a);
    CHECK(outlier_columns(2, "action_head.model.blocks.0.ffn.0.weight", 5120, 4) != a);
    CHECK(outlier_columns(1, "action_head.model.blocks.1.ffn.0.weight", 5120, 4) != a);
    // all but one column of a narrow weight: still distinct
    const std::vector<int64_t> most = outlier_columns(3, "k", 8, 7);
    CHECK(std::set<int64_t>(most.begin(), most.end()).size() == 7);
    CHECK(outlier_columns(3, "k", 8, 0).empty());
}

TEST_CASE("outlier options that cannot apply are refused naming the option and the weight") {
    const std::vector<ExpectedWeight> weights = expected_weights(tiny_model());
    OutlierOptions o;
    o.columns = 100000;
    CHECK_THROWS_WITH_AS(check_outlier_options(weights, o), doctest::Contains("--outlier-columns 100000"),
                         Error);
    o.columns = 2;
    o.scale = 0.0f;
    CHECK_THROWS_WITH_AS(check_outlier_options(weights, o), doctest::Contains("--outlier-scale"), Error);
    CHECK_THROWS_AS(outlier_columns(1, "w", 4, 4), Error);
    test::TempDir dir;
    CHECK_THROWS_AS(make(dir.path() / "bad", DType::F32, 1, 100000), Error);
    CHECK_FALSE(fs::exists(dir.path() / "bad"));
}

TEST_CASE("dzr ckpt make --outlier-columns writes the outlier checkpoint; without it the default bytes") {
    if (test::dzr_bin().empty()) {
        MESSAGE("DZR_BIN is not built; skipping");
        return;
    }
    test::TempDir dir;
    const std::string cfg = test::q(test::source_dir() / "configs/tiny.yaml");
    // the library's default checkpoint and the CLI's agree byte for byte (the option off changes nothing)
    make(dir.path() / "lib", DType::BF16, 5, 0);
    auto r = test::run_dzr("ckpt make --config " + cfg + " --seed 5 --out " + test::q(dir.path() / "cli"),
                           dir.path());
    REQUIRE_MESSAGE(r.code == 0, r.err);
    const auto lib = test::snapshot(dir.path() / "lib"), cli = test::snapshot(dir.path() / "cli");
    CHECK(lib == cli);

    make(dir.path() / "lib-outl", DType::BF16, 5, 4, 30.0f);
    r = test::run_dzr("ckpt make --config " + cfg +
                          " --seed 5 --outlier-columns 4 --outlier-scale 30 --out " +
                          test::q(dir.path() / "cli-outl"),
                      dir.path());
    REQUIRE_MESSAGE(r.code == 0, r.err);
    CHECK(r.has("outliers: 4 input columns of each of"));
    CHECK(test::snapshot(dir.path() / "lib-outl") == test::snapshot(dir.path() / "cli-outl"));
    CHECK(test::snapshot(dir.path() / "cli-outl").at("model.safetensors") != cli.at("model.safetensors"));
    CHECK(test::slurp(dir.path() / "cli-outl/config.json").find("outlier_columns") != std::string::npos);
    CHECK(test::slurp(dir.path() / "cli/config.json").find("outlier_columns") == std::string::npos);

    r = test::run_dzr("ckpt make --config " + cfg + " --outlier-scale 30 --out " + test::q(dir.path() / "x"),
                      dir.path());
    CHECK(r.code != 0);
    CHECK(r.has("--outlier-scale needs --outlier-columns"));
    CHECK_FALSE(fs::exists(dir.path() / "x"));
}
