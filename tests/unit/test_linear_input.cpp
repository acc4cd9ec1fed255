// What a Linear reads (model/layers.h LinearInput): a norm's codes alone for FP8 readers, the rows otherwise, an input
// quantized once for several readers, and a GELU left pending for the next Linear's quantization; each gives the
// output of the plain path (the rows, each Linear quantizing for itself), bit for bit.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/layers.h"
#include "support/map_weight_source.h"
#include "support/test_support.h"
#include "weights/fp8_weights.h"

using namespace dzr;

namespace {

constexpr int64_t M = 9, K = 64, N = 48;

/// A Linear [out, in] with a bias, its weight FP8 (per-channel scales) or f32.
Linear make_linear(Backend& be, int64_t in, int64_t out, bool fp8, uint64_t seed) {
    std::mt19937_64 rng(seed);
    test::MapSource src;
    src.put("m.weight", Shape{out, in}, rng, -0.3f, 0.3f);
    src.put("m.bias", Shape{out}, rng, -0.1f, 0.1f);
    WeightLoader loader(src, be);
    Linear lin;
    lin.load(loader, "m", in, out);
    if (fp8) {
        const Fp8Weight q = quantize_weight_fp8(src.tensors.at("m.weight"), "m.weight");
        lin.w = q.q;
        lin.scale = q.scale;
    }
    return lin;
}

std::vector<float> nans(int64_t n) { return std::vector<float>(size_t(n), NAN); }
TensorView view(std::vector<float>& v, Shape shape) { return TensorView(v.data(), DType::F32, shape); }
bool same(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// A modulated norm over two token groups (rows [0, 5) and [5, M)).
struct Norm {
    std::vector<float> scale = test::random_floats(size_t(2 * K), 11, -0.5f, 0.5f);
    std::vector<float> shift = test::random_floats(size_t(2 * K), 12, -0.5f, 0.5f);
    AdaLayerNorm norm() { return {FusedRowParams{1e-6f, 5, M}, {}, {}, view(scale, {2, K}), view(shift, {2, K})}; }
};

}  // namespace

TEST_CASE("a norm writes its codes alone for FP8 readers, and the rows for any other reader or a trace") {
    auto be = make_cpu_backend();
    std::vector<float> x = test::random_floats(size_t(M * K), 3, -2.0f, 2.0f);
    Norm n;
    for (bool fp8 : {false, true}) {
        CAPTURE(fp8);
        const Linear q = make_linear(*be, K, N, fp8, 1), k = make_linear(*be, K, N, true, 2);
        std::vector<float> plain = nans(M * N), fused = nans(M * N);
        std::vector<float> rows = nans(M * K);
        {  // the rows, the Linear quantizing them itself
            ArenaScope scope(be->workspace());
            n.norm().forward(*be, view(x, {M, K}), view(rows, {M, K}), {&q}, true);
            q.forward(*be, view(rows, {M, K}), view(plain, {M, N}));
        }
        std::vector<float> untouched = nans(M * K);
        {
            ArenaScope scope(be->workspace());
            const LinearInput in = n.norm().forward(*be, view(x, {M, K}), view(untouched, {M, K}), {&q, &k}, false);
            CHECK(in.rows.defined() == !fp8);     // FP8 readers only: the codes alone, the rows not written
            CHECK(in.fp8.defined());              // several readers, one FP8: quantized once
            CHECK(std::isnan(untouched[0]) == fp8);
            q.forward(*be, in, view(fused, {M, N}));
        }
        CHECK(same(plain, fused));
    }
    CHECK(be->workspace().used() == 0);
}

TEST_CASE("an input is quantized once only when several readers share it and one is FP8") {
    auto be = make_cpu_backend();
    std::vector<float> x = test::random_floats(size_t(M * K), 4);
    const Linear a = make_linear(*be, K, N, false, 1), b = make_linear(*be, K, N, true, 2);
    ArenaScope scope(be->workspace());
    CHECK_FALSE(LinearInput::shared(*be, view(x, {M, K}), {&b}).fp8.defined());
    CHECK_FALSE(LinearInput::shared(*be, view(x, {M, K}), {&a, &a}).fp8.defined());
    CHECK(LinearInput::shared(*be, view(x, {M, K}), {&a, &b}).fp8.defined());
}

TEST_CASE("a GELU left pending after a fused norm gives the FFN the output of the GELU applied") {
    auto be = make_cpu_backend();
    const int64_t F = 96;
    std::vector<float> x = test::random_floats(size_t(M * K), 5, -2.0f, 2.0f);
    Norm n;
    for (bool fp8_down : {false, true}) {
        CAPTURE(fp8_down);
        const Linear up = make_linear(*be, K, F, true, 1), down = make_linear(*be, F, N, fp8_down, 2);
        std::vector<float> out[2] = {nans(M * N), nans(M * N)};
        for (int keep_rows = 0; keep_rows < 2; ++keep_rows) {
            ArenaScope scope(be->workspace());
            std::vector<float> rows = nans(M * K), hidden = nans(M * F);
            const LinearInput in = n.norm().forward(*be, view(x, {M, K}), view(rows, {M, K}), {&up}, keep_rows == 1);
            const LinearInput act = up.forward_gelu(*be, in, view(hidden, {M, F}));
            CHECK(act.gelu == (keep_rows == 0));  // after the codes alone, the reader applies the GELU
            down.forward(*be, act, view(out[keep_rows], {M, N}));
        }
        CHECK(same(out[0], out[1]));
    }
}

TEST_CASE("codes alone refuse a reader that is not FP8") {
    auto be = make_cpu_backend();
    std::vector<float> x = test::random_floats(size_t(M * K), 6);
    std::vector<float> rows(size_t(M * K)), out(size_t(M * N));
    const Linear fp8 = make_linear(*be, K, N, true, 1), plain = make_linear(*be, K, N, false, 2);
    Norm n;
    ArenaScope scope(be->workspace());
    const LinearInput in = n.norm().forward(*be, view(x, {M, K}), view(rows, {M, K}), {&fp8}, false);
    CHECK(test::contains(test::error_of([&] { plain.forward(*be, in, view(out, {M, N})); }), "codes"));
}
