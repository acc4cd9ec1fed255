// `dzr parity attention|linear|conv3d|op` on bad operands: one error naming the file (or the option), a
// non-zero exit and no output file, in any build (the operands are checked before a device is opened).
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "io/npy.h"
#include "support/test_support.h"

using namespace dzr;
namespace fs = std::filesystem;

namespace {

std::string slurp(const fs::path& p) {
    std::ifstream f(p);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}

void write_f32(const fs::path& p, const std::vector<int64_t>& shape, float value) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v(size_t(n), value);
    io::write_npy_f32(p, shape, v);
}

}  // namespace

TEST_CASE("dzr parity kernel commands reject bad operands with one message naming the file") {
    const char* bin = std::getenv("DZR_BIN");
    if (!bin || !fs::exists(bin)) {
        MESSAGE("DZR_BIN not built; skipping the command-line checks");
        return;
    }
    test::TempDir dir;
    const fs::path good2 = dir / "good2.npy", good1 = dir / "good1.npy", rank1 = dir / "rank1.npy";
    const fs::path not_bf16 = dir / "not_bf16.npy", out = dir / "out.npy";
    write_f32(good2, {4, 8}, 0.5f);
    write_f32(good1, {8}, 1.0f);
    write_f32(rank1, {32}, 0.5f);
    write_f32(not_bf16, {4, 8}, 0.1f);  // 0.1 is not a bf16 number
    const auto run = [&](const std::string& args) {
        const fs::path err = dir / "stderr.txt";
        const std::string cmd = std::string(bin) + " parity " + args + " > /dev/null 2> " + err.string();
        const int rc = std::system(cmd.c_str());
        return std::make_pair(WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, slurp(err));
    };
    const std::string o = " --out " + out.string();
    struct Case {
        std::string args;
        std::vector<std::string> expect;
    };
    const std::vector<Case> cases = {
        {"op --op layer_norm --x " + not_bf16.string() + o, {not_bf16.string(), "element 0", "not a finite bf16"}},
        {"op --op layer_norm --x " + (dir / "missing.npy").string() + o, {"missing.npy"}},
        {"op --op swiglu --x " + good2.string() + o, {"unknown op 'swiglu'"}},
        {"op --op gelu_tanh --x " + good2.string() + " --w " + good1.string() + o, {"takes no --w"}},
        {"op --op layer_norm --x " + good2.string() + " --w " + rank1.string() + o, {"do not match 8 columns"}},
        {"linear --x " + good2.string() + " --w " + rank1.string() + o, {rank1.string(), "w must be float32 [N, K]"}},
        {"linear --x " + good2.string() + " --w " + good2.string() + " --b " + rank1.string() + o,
         {"shapes disagree"}},
        {"conv3d --x " + good2.string() + " --w " + good2.string() + o, {good2.string(), "[Ci, T, H, W]"}},
        {"attention --q " + good2.string() + " --k " + good2.string() + " --v " + good2.string() + " --out " +
             (dir / "attn").string(),
         {good2.string(), "[L, heads, head_dim]"}},
    };
    for (const Case& c : cases) {
        CAPTURE(c.args);
        const auto [rc, err] = run(c.args);
        CHECK(rc != 0);
        for (const std::string& e : c.expect) CHECK_MESSAGE(err.find(e) != std::string::npos, err);
        CHECK(!fs::exists(out));
        CHECK(!fs::exists(dir / "attn"));
    }
}
