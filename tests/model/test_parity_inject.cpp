// `dzr parity run --inject-from` (tiny config, CPU, 2 calls: a reset and a commit): the injected stages
// are the source file's tensors bit for bit, they reach what the DiT and sampler compute (a scaled CLIP
// output changes the actions; a changed commit latent changes only the commit call), injecting dzr's own
// dump changes nothing, and a missing stage, a wrong shape or a pattern that selects nothing fail the
// run with a message naming the tensor.
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "config/run_config.h"
#include "model/inventory.h"
#include "support/test_support.h"
#include "weights/random_checkpoint.h"
#include "weights/safetensors.h"

using namespace dzr;
namespace fs = std::filesystem;

namespace {

/// A dump as host f32 tensors by name.
struct Dump {
    std::map<std::string, Shape> shapes;
    std::map<std::string, std::vector<float>> values;

    bool has(const std::string& name) const { return values.count(name) != 0; }
    const std::vector<float>& at(const std::string& name) const {
        const auto it = values.find(name);
        REQUIRE_MESSAGE(it != values.end(), "no tensor " << name);
        return it->second;
    }
};

Dump read_dump(const fs::path& p) {
    const auto f = SafetensorsFile::open(p);
    Dump d;
    for (const auto& e : f->entries()) {
        REQUIRE(e.dtype == DType::F32);
        const Tensor t = f->tensor(e.name);
        d.shapes[e.name] = e.shape;
        d.values[e.name].assign(t.ptr<float>(), t.ptr<float>() + t.numel());
    }
    return d;
}

void write_dump(const fs::path& p, Dump& d) {
    std::vector<std::pair<std::string, TensorView>> out;
    for (auto& [name, v] : d.values)
        out.emplace_back(name, TensorView(v.data(), DType::F32, d.shapes.at(name)));
    write_safetensors(p, out);
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    REQUIRE(a.size() == b.size());
    float m = 0;
    for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
    return m;
}

std::string read_text(const fs::path& p) {
    std::ifstream f(p);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

/// Runs the dzr binary with `args`; returns the exit code, stderr in `err`.
int run_dzr(const std::string& bin, const std::string& args, const fs::path& log, std::string& err) {
    const std::string cmd = "'" + bin + "' " + args + " >/dev/null 2>'" + log.string() + "'";
    const int status = std::system(cmd.c_str());
    err = read_text(log);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/// The default --inject stages that the 2 calls compute: call 0 (reset) text, CLIP and ys; call 1
/// (commit) the clip latents.
const std::vector<std::string> kInjected = {"c0.text.pos", "c0.text.neg", "c0.clip", "c0.ys", "c1.vae.clip"};

/// Checkpoint, inputs and dzr's own dump, made once for every test case below.
struct Fixture {
    std::string bin;
    test::TempDir dir;
    fs::path config = test::source_dir() / "configs/tiny.yaml";
    std::string base;  // the `parity run` arguments without --out
    Dump own;
    std::string err;

    /// Runs `parity run` writing `name` (with `extra` arguments); stderr in `err`.
    int run(const std::string& name, const std::string& extra) {
        return run_dzr(bin, base + "--out '" + (dir / name).string() + "' " + extra, dir / (name + ".log"),
                       err);
    }
    std::string path(const std::string& name) const { return (dir / name).string(); }
};

/// Null when the dzr binary is not built.
Fixture* fixture() {
    static std::unique_ptr<Fixture> f = []() -> std::unique_ptr<Fixture> {
        const char* bin = std::getenv("DZR_BIN");
        if (!bin || !fs::exists(bin)) return nullptr;
        auto x = std::make_unique<Fixture>();
        x->bin = bin;
        MakeOptions mo;
        mo.dtype = DType::F32;
        mo.seed = 3;
        mo.tokenizer = test::data_dir() / "tokenizer/spiece.model";
        write_random_checkpoint(config::load_run_config(x->config).model, mo, x->dir / "ckpt");
        const std::string ckpt = x->path("ckpt"), inputs = x->path("inputs");
        REQUIRE_MESSAGE(
            run_dzr(x->bin, "parity make-inputs --ckpt '" + ckpt + "' --out '" + inputs + "' --calls 2",
                    x->dir / "make.log", x->err) == 0,
            x->err);
        x->base = "parity run --device cpu --ckpt '" + ckpt + "' --inputs '" + inputs + "' --config '" +
                  x->config.string() + "' ";
        REQUIRE_MESSAGE(x->run("own.safetensors", "") == 0, x->err);
        x->own = read_dump(x->dir / "own.safetensors");
        return x;
    }();
    if (!f) MESSAGE("DZR_BIN is not built (run through ctest after building dzr_cli); skipping");
    return f.get();
}

}  // namespace

TEST_CASE("dzr's own parity dump holds the encoder stages once per computation") {
    Fixture* f = fixture();
    if (!f) return;
    for (const auto& name : kInjected) CHECK_MESSAGE(f->own.has(name), name);
    // dzr encodes the prompt once, and CLIP/ys only on a reset: nothing of them in the commit call.
    CHECK_FALSE(f->own.has("c1.text.pos"));
    CHECK_FALSE(f->own.has("c1.clip"));
    CHECK_FALSE(f->own.has("c0.vae.clip"));
}

TEST_CASE("injecting dzr's own dump reproduces the run exactly") {
    Fixture* f = fixture();
    if (!f) return;
    const Dump& own = f->own;
    std::string& err = f->err;
    REQUIRE_MESSAGE(f->run("same.safetensors", "--inject-from '" + f->path("own.safetensors") + "'") == 0,
                    err);
    CHECK(err.find("injected 5 tensors") != std::string::npos);
    const Dump same = read_dump(f->dir / "same.safetensors");
    CHECK(same.values.size() == own.values.size());
    for (const auto& [name, v] : own.values) {
        INFO(name);
        REQUIRE(same.has(name));
        CHECK(max_abs_diff(same.at(name), v) == 0.0f);
    }
}

TEST_CASE("the injected stages are the source's tensors and change what follows them") {
    Fixture* f = fixture();
    if (!f) return;
    const Dump& own = f->own;
    std::string& err = f->err;
    // The source: dzr's dump with CLIP scaled by 2, the negative text and `ys` perturbed, and the
    // commit latents negated.
    Dump src = own;
    for (float& x : src.values["c0.clip"]) x *= 2.0f;
    for (float& x : src.values["c0.text.neg"]) x *= 0.5f;
    for (float& x : src.values["c0.ys"]) x = 1.25f * x + 0.125f;
    for (float& x : src.values["c1.vae.clip"]) x = -x;
    write_dump(f->dir / "src.safetensors", src);
    REQUIRE_MESSAGE(f->run("inj.safetensors", "--inject-from '" + f->path("src.safetensors") + "'") == 0,
                    err);
    const Dump inj = read_dump(f->dir / "inj.safetensors");
    for (const auto& name : kInjected) {
        INFO(name);
        REQUIRE(inj.has(name));
        CHECK(inj.shapes.at(name) == src.shapes.at(name));
        CHECK(max_abs_diff(inj.at(name), src.at(name)) == 0.0f);
    }
    // Upstream of the encoders nothing changes; the DiT, the sampler and the actions do.
    for (const char* name : {"c0.input.video", "c0.state", "c0.noise.video", "c1.input.video"}) {
        INFO(name);
        CHECK(max_abs_diff(inj.at(name), own.at(name)) == 0.0f);
    }
    for (const char* name :
         {"c0.velocity.cond.0", "c0.velocity.uncond.0", "c0.x", "c0.actions", "c1.actions"}) {
        INFO(name);
        CHECK(max_abs_diff(inj.at(name), own.at(name)) > 1e-4f);
    }
}

TEST_CASE("--inject selects the stages: a changed commit latent changes only the commit call") {
    Fixture* f = fixture();
    if (!f) return;
    const Dump& own = f->own;
    std::string& err = f->err;
    Dump src = own;
    for (float& x : src.values["c1.vae.clip"]) x = -x;
    for (float& x : src.values["c0.clip"]) x *= 2.0f;  // not selected below: must not be injected
    write_dump(f->dir / "src.safetensors", src);
    REQUIRE_MESSAGE(f->run("inj.safetensors",
                           "--inject '^vae\\.clip$' --inject-from '" + f->path("src.safetensors") + "'") == 0,
                    err);
    CHECK(err.find("injected 1 tensors") != std::string::npos);
    const Dump inj = read_dump(f->dir / "inj.safetensors");
    CHECK(max_abs_diff(inj.at("c1.vae.clip"), src.at("c1.vae.clip")) == 0.0f);
    CHECK(max_abs_diff(inj.at("c0.clip"), own.at("c0.clip")) == 0.0f);
    CHECK(max_abs_diff(inj.at("c0.actions"), own.at("c0.actions")) == 0.0f);
    CHECK(max_abs_diff(inj.at("c1.actions"), own.at("c1.actions")) > 1e-4f);
}

TEST_CASE("a stage missing from the source fails the run and names it") {
    Fixture* f = fixture();
    if (!f) return;
    const Dump& own = f->own;
    std::string& err = f->err;
    Dump src = own;
    src.values.erase("c0.ys");
    src.shapes.erase("c0.ys");
    write_dump(f->dir / "src.safetensors", src);
    CHECK(f->run("bad.safetensors", "--inject-from '" + f->path("src.safetensors") + "'") != 0);
    CHECK_MESSAGE(err.find("no tensor c0.ys") != std::string::npos, err);
    CHECK_FALSE(fs::exists(f->dir / "bad.safetensors"));
}

TEST_CASE("a shape mismatch fails the run and names the stage and both shapes") {
    Fixture* f = fixture();
    if (!f) return;
    const Dump& own = f->own;
    std::string& err = f->err;
    Dump src = own;
    const Shape good = src.shapes.at("c0.clip");
    const Shape cut{good[0] - 1, good[1]};
    src.shapes["c0.clip"] = cut;
    src.values["c0.clip"].resize(size_t(cut.numel()));
    write_dump(f->dir / "src.safetensors", src);
    CHECK(f->run("bad.safetensors", "--inject-from '" + f->path("src.safetensors") + "'") != 0);
    CHECK_MESSAGE(err.find("stage clip of call 0") != std::string::npos, err);
    CHECK_MESSAGE(err.find(cut.str()) != std::string::npos, err);
    CHECK_MESSAGE(err.find(good.str()) != std::string::npos, err);
}

TEST_CASE("a pattern that selects nothing in the source is an error") {
    Fixture* f = fixture();
    if (!f) return;
    CHECK(f->run("bad.safetensors",
                 "--inject '^no_such_stage$' --inject-from '" + f->path("own.safetensors") + "'") != 0);
    CHECK_MESSAGE(f->err.find("no_such_stage") != std::string::npos, f->err);
}
