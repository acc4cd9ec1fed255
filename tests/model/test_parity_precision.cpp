// `dzr parity run --precision fp8 --kv-dtype fp8` (tiny config, CPU with emulated E4M3, 2 calls: a reset and
// a commit): each option reaches the engine (the dump records it and the actions move away from the plain
// run's, the two options differently), the dump stays finite, and a bad value or FP8 KV with the dense cache
// fails the run with a message naming the option, writing nothing.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "config/run_config.h"
#include "model/inventory.h"
#include "support/cli.h"
#include "support/test_support.h"
#include "weights/random_checkpoint.h"
#include "weights/safetensors.h"

using namespace dzr;
namespace fs = std::filesystem;

namespace {

struct Run {
    nlohmann::json meta;
    std::vector<float> actions;  // c0.actions then c1.actions
};

Run read_run(const fs::path& p) {
    const auto f = SafetensorsFile::open(p);
    Run r;
    r.meta = nlohmann::json::parse(f->metadata().at("parity"));
    for (const char* name : {"c0.actions", "c1.actions"}) {
        const Tensor t = f->tensor(name);
        REQUIRE(t.dtype() == DType::F32);
        r.actions.insert(r.actions.end(), t.ptr<float>(), t.ptr<float>() + t.numel());
    }
    return r;
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
    REQUIRE(a.size() == b.size());
    double d = 0, n = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        d += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
        n += double(b[i]) * b[i];
    }
    return std::sqrt(d / n);
}

bool finite(const std::vector<float>& v) {
    for (float x : v)
        if (!std::isfinite(x)) return false;
    return true;
}

struct Fixture {
    test::TempDir dir;
    std::string base;  // `parity run` without --out
    test::CliResult run(const std::string& name, const std::string& extra) {
        return test::run_dzr(base + " --out " + test::q(dir.path() / name) + " " + extra, dir.path());
    }
};

Fixture* fixture() {
    static std::unique_ptr<Fixture> f = []() -> std::unique_ptr<Fixture> {
        if (test::dzr_bin().empty()) return nullptr;
        auto x = std::make_unique<Fixture>();
        const fs::path config = test::source_dir() / "configs/tiny.yaml";
        MakeOptions mo;
        mo.dtype = DType::F32;
        mo.seed = 3;
        mo.tokenizer = test::data_dir() / "tokenizer/spiece.model";
        write_random_checkpoint(config::load_run_config(config).model, mo, x->dir.path() / "ckpt");
        const auto r = test::run_dzr("parity make-inputs --ckpt " + test::q(x->dir.path() / "ckpt") +
                                         " --out " + test::q(x->dir.path() / "inputs") + " --calls 2",
                                     x->dir.path());
        REQUIRE_MESSAGE(r.code == 0, r.err);
        x->base = "parity run --device cpu --ckpt " + test::q(x->dir.path() / "ckpt") + " --inputs " +
                  test::q(x->dir.path() / "inputs") + " --config " + test::q(config) + " --check-finite";
        return x;
    }();
    if (!f) MESSAGE("DZR_BIN is not built (run through ctest after building dzr_cli); skipping");
    return f.get();
}

}  // namespace

TEST_CASE("parity run's --precision and --kv-dtype reach the engine and are recorded in the dump") {
    Fixture* f = fixture();
    if (!f) return;
    struct Case {
        const char* name;
        const char* args;
        const char* precision;
        const char* kv_dtype;
    };
    const Case cases[] = {{"plain", "", "bf16", "bf16"},
                          {"fp8", "--precision fp8", "fp8", "bf16"},
                          {"fp8kv", "--kv-dtype fp8", "bf16", "fp8"},
                          {"fp8all", "--precision fp8 --kv-dtype fp8 --numerics fast", "fp8", "fp8"}};
    std::vector<Run> runs;
    for (const Case& c : cases) {
        INFO(c.name);
        const auto r = f->run(std::string(c.name) + ".safetensors", c.args);
        REQUIRE_MESSAGE(r.code == 0, r.err);
        runs.push_back(read_run(f->dir.path() / (std::string(c.name) + ".safetensors")));
        CHECK(runs.back().meta.at("precision") == c.precision);
        CHECK(runs.back().meta.at("kv_dtype") == c.kv_dtype);
        CHECK(finite(runs.back().actions));
    }
    // every FP8 setting changes the actions, and the two options change them differently
    for (size_t i = 1; i < runs.size(); ++i) {
        INFO(cases[i].name);
        CHECK(rel_l2(runs[i].actions, runs[0].actions) > 0.0);
    }
    CHECK(rel_l2(runs[1].actions, runs[2].actions) > 0.0);
    MESSAGE("actions rel l2 vs the plain run: fp8 " << rel_l2(runs[1].actions, runs[0].actions) << ", fp8kv "
                                                    << rel_l2(runs[2].actions, runs[0].actions) << ", fp8all "
                                                    << rel_l2(runs[3].actions, runs[0].actions));
}

TEST_CASE("parity run refuses a bad --precision or --kv-dtype, and FP8 KV with the dense cache") {
    Fixture* f = fixture();
    if (!f) return;
    auto r = f->run("bad1.safetensors", "--precision fp16");
    CHECK(r.code != 0);
    CHECK_MESSAGE(r.has("--precision"), r.err);
    r = f->run("bad2.safetensors", "--kv-dtype int8");
    CHECK(r.code != 0);
    CHECK_MESSAGE(r.has("--kv-dtype"), r.err);
    r = f->run("bad3.safetensors", "--kv-dtype fp8 --kv dense");
    CHECK(r.code != 0);
    CHECK_MESSAGE(r.has("paged KV cache"), r.err);
    for (const char* name : {"bad1.safetensors", "bad2.safetensors", "bad3.safetensors"})
        CHECK_FALSE(fs::exists(f->dir.path() / name));
}
