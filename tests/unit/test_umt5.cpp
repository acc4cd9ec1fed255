// umT5 encoder (lib/model/umt5.h): bucket function against the spec, bias layout, and a whole tiny
// forward against a naive re-computation in plain loops written from dreamzero-reference.md §2.1.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/convert.h"
#include "core/error.h"
#include "model/umt5.h"
#include "support/test_support.h"
#include "weights/weight_source.h"
#include "support/map_weight_source.h"

using namespace dzr;
using dzr::test::MapSource;

namespace {


T5Config tiny_config(int text_len) {
    T5Config c;
    c.vocab = 1000;
    c.dim = 64;
    c.dim_attn = 64;
    c.ffn_dim = 128;
    c.num_heads = 2;
    c.num_layers = 2;
    c.num_buckets = 32;
    c.text_len = text_len;
    return c;
}

const std::string kPre = "action_head.text_encoder.";

std::string block_key(int i, const std::string& name) {
    return kPre + "blocks." + std::to_string(i) + "." + name;
}

// Random weights under the real key names (dreamzero-checkpoint-keys.tsv).
MapSource random_checkpoint(const T5Config& c, uint64_t seed) {
    MapSource s;
    const int64_t d = c.dim, da = c.dim_attn, f = c.ffn_dim;
    const float wa = 1.0f / std::sqrt(float(d));
    s.put(kPre + "token_embedding.weight", Shape{c.vocab, d}, seed++, -1.f, 1.f);
    for (int i = 0; i < c.num_layers; ++i) {
        s.put(block_key(i, "norm1.weight"), Shape{d}, seed++, 0.5f, 1.5f);
        s.put(block_key(i, "attn.q.weight"), Shape{da, d}, seed++, -wa, wa);
        s.put(block_key(i, "attn.k.weight"), Shape{da, d}, seed++, -wa, wa);
        s.put(block_key(i, "attn.v.weight"), Shape{da, d}, seed++, -wa, wa);
        s.put(block_key(i, "attn.o.weight"), Shape{d, da}, seed++, -wa, wa);
        s.put(block_key(i, "pos_embedding.embedding.weight"), Shape{c.num_buckets, c.num_heads}, seed++, -2.f,
              2.f);
        s.put(block_key(i, "norm2.weight"), Shape{d}, seed++, 0.5f, 1.5f);
        s.put(block_key(i, "ffn.gate.0.weight"), Shape{f, d}, seed++, -wa, wa);
        s.put(block_key(i, "ffn.fc1.weight"), Shape{f, d}, seed++, -wa, wa);
        s.put(block_key(i, "ffn.fc2.weight"), Shape{d, f}, seed++, -1.f / std::sqrt(float(f)),
              1.f / std::sqrt(float(f)));
    }
    s.put(kPre + "norm.weight", Shape{d}, seed++, 0.5f, 1.5f);
    return s;
}

std::vector<int32_t> random_ids(int len, int vocab, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int32_t> dist(0, vocab - 1);
    std::vector<int32_t> ids(static_cast<size_t>(len));
    for (auto& v : ids) v = dist(rng);
    return ids;
}

// Spec bucket (§2.1), written as thresholds: for 8 <= n the bucket is 8 plus the number of k = 1..7
// with n >= 8·2^(k/2), i.e. n >= 12, 16, 23, 32, 46, 64, 91 (so 15 from n = 91 on; 128 and beyond clamp).
int spec_bucket(int64_t rel) {
    const int offset = rel > 0 ? 16 : 0;
    const int64_t n = rel < 0 ? -rel : rel;
    if (n < 8) return offset + int(n);
    int b = 8;
    for (int64_t t : {12, 16, 23, 32, 46, 64, 91}) b += n >= t ? 1 : 0;
    return offset + b;
}

// ---- the naive encoder -------------------------------------------------------------------------------
using Mat = std::vector<double>;  // row-major

Mat matmul_t(const Mat& x, int64_t rows, int64_t in, const std::vector<float>& w, int64_t out) {
    Mat y(size_t(rows * out), 0.0);  // y = x · wᵀ, w [out, in]
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t o = 0; o < out; ++o) {
            double acc = 0.0;
            for (int64_t i = 0; i < in; ++i) acc += x[size_t(r * in + i)] * w[size_t(o * in + i)];
            y[size_t(r * out + o)] = acc;
        }
    return y;
}

Mat t5_rms(const Mat& x, int64_t rows, int64_t d, const std::vector<float>& w) {
    Mat y(x.size());
    for (int64_t r = 0; r < rows; ++r) {
        double ms = 0.0;
        for (int64_t i = 0; i < d; ++i) ms += x[size_t(r * d + i)] * x[size_t(r * d + i)];
        const double inv = 1.0 / std::sqrt(ms / double(d) + 1e-6);
        for (int64_t i = 0; i < d; ++i) y[size_t(r * d + i)] = x[size_t(r * d + i)] * inv * w[size_t(i)];
    }
    return y;
}

double gelu_tanh(double v) {
    return 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
}

// `logit_scale` is 1 for T5; other values exist only to show the test can tell.
std::vector<float> naive_encoder(const MapSource& s, const T5Config& c, const std::vector<int32_t>& ids,
                                 int n, double logit_scale = 1.0) {
    const int64_t len = c.text_len, d = c.dim, da = c.dim_attn, f = c.ffn_dim, nh = c.num_heads, hd = da / nh;
    const auto emb = s.get(kPre + "token_embedding.weight");
    Mat x(size_t(len * d));
    for (int64_t t = 0; t < len; ++t)
        for (int64_t i = 0; i < d; ++i) x[size_t(t * d + i)] = emb[size_t(ids[size_t(t)] * d + i)];
    for (int layer = 0; layer < c.num_layers; ++layer) {
        auto w = [&](const char* name) { return s.get(block_key(layer, name)); };
        const Mat h = t5_rms(x, len, d, w("norm1.weight"));
        const Mat q = matmul_t(h, len, d, w("attn.q.weight"), da);
        const Mat k = matmul_t(h, len, d, w("attn.k.weight"), da);
        const Mat v = matmul_t(h, len, d, w("attn.v.weight"), da);
        const auto table = w("pos_embedding.embedding.weight");  // [32, H]
        Mat att(size_t(len * da), 0.0);
        std::vector<double> p(static_cast<size_t>(len));
        for (int64_t hh = 0; hh < nh; ++hh)
            for (int64_t i = 0; i < len; ++i) {
                double mx = -INFINITY;
                for (int64_t j = 0; j < len; ++j) {
                    if (j >= n) {  // padding keys take no weight at all
                        p[size_t(j)] = -INFINITY;
                        continue;
                    }
                    double dot = 0.0;
                    for (int64_t e = 0; e < hd; ++e)
                        dot += q[size_t(i * da + hh * hd + e)] * k[size_t(j * da + hh * hd + e)];
                    p[size_t(j)] = logit_scale * dot + table[size_t(spec_bucket(j - i) * nh + hh)];
                    mx = std::max(mx, p[size_t(j)]);
                }
                double sum = 0.0;
                for (int64_t j = 0; j < len; ++j) sum += (p[size_t(j)] = std::exp(p[size_t(j)] - mx));
                for (int64_t j = 0; j < len; ++j)
                    for (int64_t e = 0; e < hd; ++e)
                        att[size_t(i * da + hh * hd + e)] +=
                            p[size_t(j)] / sum * v[size_t(j * da + hh * hd + e)];
            }
        const Mat o = matmul_t(att, len, da, w("attn.o.weight"), d);
        for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
        const Mat h2 = t5_rms(x, len, d, w("norm2.weight"));
        const Mat g = matmul_t(h2, len, d, w("ffn.gate.0.weight"), f);
        Mat a = matmul_t(h2, len, d, w("ffn.fc1.weight"), f);
        for (size_t i = 0; i < a.size(); ++i) a[i] *= gelu_tanh(g[i]);
        const Mat y = matmul_t(a, len, f, w("ffn.fc2.weight"), d);
        for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
    }
    const Mat out = t5_rms(x, len, d, s.get(kPre + "norm.weight"));
    std::vector<float> r(out.size());
    for (int64_t t = 0; t < len; ++t)
        for (int64_t i = 0; i < d; ++i) r[size_t(t * d + i)] = t < n ? float(out[size_t(t * d + i)]) : 0.0f;
    return r;
}

struct Run {
    std::unique_ptr<Backend> be = make_cpu_backend(size_t(64) << 20);
};

std::vector<float> run_encoder(Backend& be, const Umt5Encoder& enc, const std::vector<int32_t>& ids, int n) {
    Tensor out = Tensor::host(Shape{enc.config().text_len, enc.config().dim}, DType::F32);
    enc.forward(be, ids, n, out);
    CHECK(be.workspace().used() == 0);
    return to_f32_vector(out);
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    REQUIRE(a.size() == b.size());
    double m = 0.0;
    for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double(a[i]) - double(b[i])));
    return m;
}

}  // namespace

TEST_CASE("relative bucket matches the spec formula on hand-picked offsets") {
    // rel = key − query; 16 buckets per sign, +16 when rel > 0; exact below 8, log-spaced up to 128.
    const std::vector<std::pair<int64_t, int>> cases = {
        {0, 0},    {1, 17},    {-1, 1},   {7, 23},    {-7, 7},   {8, 24},   {-8, 8},  {11, 24},  {12, 25},
        {-15, 9},  {16, 26},   {-16, 10}, {20, 26},   {-20, 10}, {22, 26},  {23, 27}, {31, 27},  {32, 28},
        {-45, 12}, {46, 29},   {63, 29},  {64, 30},   {-64, 14}, {90, 30},  {91, 31}, {127, 31}, {-127, 15},
        {128, 31}, {-128, 15}, {500, 31}, {-500, 15}, {511, 31}, {-511, 15}};
    for (const auto& [rel, want] : cases) {
        CAPTURE(rel);
        CHECK(t5_relative_bucket(rel, 32) == want);
    }
}

TEST_CASE("relative bucket agrees with the threshold form and exact arithmetic for every offset below 4096") {
    for (int64_t rel = -4096; rel <= 4096; ++rel) {
        CAPTURE(rel);
        REQUIRE(t5_relative_bucket(rel, 32) == spec_bucket(rel));
        const int64_t n = rel < 0 ? -rel : rel;
        if (n >= 8) {
            const int64_t exact = std::min<int64_t>(
                15, 8 + int64_t(std::floor(std::log(n / 8.0) / std::log(16.0) * 8.0 + 1e-12)));
            REQUIRE(t5_relative_bucket(rel, 32) == (rel > 0 ? 16 : 0) + exact);
        }
    }
}

TEST_CASE("attention bias holds each head's table entry at bucket(k − q) and masks padding keys") {
    const T5Config c = tiny_config(150);  // long enough to reach the clamped buckets
    MapSource s = random_checkpoint(c, 1);
    Run r;
    WeightLoader loader(s, *r.be);
    Umt5Encoder enc(loader, c);
    const int n = 97;
    for (int layer = 0; layer < c.num_layers; ++layer) {
        Tensor bias = Tensor::host(Shape{c.num_heads, c.text_len, c.text_len}, DType::F32);
        enc.attention_bias(*r.be, layer, n, bias);
        const auto table = s.get(block_key(layer, "pos_embedding.embedding.weight"));
        const float* b = bias.ptr<float>();
        int bad = 0;
        for (int h = 0; h < c.num_heads; ++h)
            for (int q = 0; q < c.text_len; ++q)
                for (int k = 0; k < c.text_len; ++k) {
                    const float got = b[(size_t(h) * c.text_len + q) * c.text_len + k];
                    const float want =
                        k < n ? table[size_t(spec_bucket(k - q) * c.num_heads + h)] : kT5MaskedLogit;
                    bad += got == want ? 0 : 1;
                }
        CHECK(bad == 0);
    }
    CHECK(r.be->workspace().used() == 0);
}

TEST_CASE("tiny umT5 forward matches a naive re-computation with padding") {
    const T5Config c = tiny_config(140);
    MapSource s = random_checkpoint(c, 2);
    Run r;
    WeightLoader loader(s, *r.be);
    Umt5Encoder enc(loader, c);
    CHECK(loader.unused("action_head.text_encoder.").empty());
    auto ids = random_ids(c.text_len, c.vocab, 3);
    const int n = 37;
    for (int t = n; t < c.text_len; ++t) ids[size_t(t)] = 0;  // the tokenizer pads with id 0
    const auto got = run_encoder(*r.be, enc, ids, n);
    const auto want = naive_encoder(s, c, ids, n);
    CHECK(max_abs_diff(got, want) < 2e-5);
    // The comparison is sharp enough to see a 1/sqrt(head_dim) logit scale, which T5 does not have.
    CHECK(max_abs_diff(got, naive_encoder(s, c, ids, n, 1.0 / std::sqrt(32.0))) > 1e-2);
}

TEST_CASE("tiny umT5 forward matches a naive re-computation without padding") {
    const T5Config c = tiny_config(24);
    MapSource s = random_checkpoint(c, 4);
    Run r;
    WeightLoader loader(s, *r.be);
    Umt5Encoder enc(loader, c);
    const auto ids = random_ids(c.text_len, c.vocab, 5);
    CHECK(max_abs_diff(run_encoder(*r.be, enc, ids, c.text_len), naive_encoder(s, c, ids, c.text_len)) <
          2e-5);
}

TEST_CASE("padding rows are zero and padding tokens do not change the real rows") {
    const T5Config c = tiny_config(40);
    MapSource s = random_checkpoint(c, 6);
    Run r;
    WeightLoader loader(s, *r.be);
    Umt5Encoder enc(loader, c);
    const int n = 13;
    auto ids = random_ids(c.text_len, c.vocab, 7);
    const auto a = run_encoder(*r.be, enc, ids, n);
    for (int t = n; t < c.text_len; ++t) ids[size_t(t)] = (ids[size_t(t)] + 1 + t) % c.vocab;
    const auto b = run_encoder(*r.be, enc, ids, n);
    const size_t real = size_t(n) * size_t(c.dim);
    CHECK(std::vector<float>(a.begin(), a.begin() + long(real)) ==
          std::vector<float>(b.begin(), b.begin() + long(real)));
    double real_norm = 0.0;
    for (size_t i = 0; i < real; ++i) real_norm += std::abs(a[i]);
    CHECK(real_norm > 1.0);
    for (size_t i = real; i < a.size(); ++i) REQUIRE(a[i] == 0.0f);
    // A different real length changes the real rows (the mask is in effect).
    CHECK(max_abs_diff(a, run_encoder(*r.be, enc, ids, n + 1)) > 1e-3);
}

TEST_CASE("umT5 forward fits the workspace it reports and reports its stages") {
    const T5Config c = tiny_config(32);
    MapSource s = random_checkpoint(c, 8);
    auto probe = make_cpu_backend(size_t(8) << 20);
    WeightLoader probe_loader(s, *probe);
    const size_t need = Umt5Encoder(probe_loader, c).workspace_bytes(*probe);

    auto be = make_cpu_backend(need);
    WeightLoader loader(s, *be);
    Umt5Encoder enc(loader, c);
    std::vector<std::pair<std::string, int>> stages;
    Tensor out = Tensor::host(Shape{c.text_len, c.dim}, DType::F32);
    const auto ids = random_ids(c.text_len, c.vocab, 9);
    enc.forward(*be, ids, 20, out, [&](const char* name, int layer, const TensorView& t) {
        stages.emplace_back(name, layer);
        CHECK(t.numel() == int64_t(c.text_len) * c.dim);
    });
    CHECK(be->workspace().high_water() == need);  // a workspace of exactly the measured size, all of it taken
    const std::vector<std::pair<std::string, int>> want = {
        {"umt5.embed", -1}, {"umt5.layer_out", 0}, {"umt5.layer_out", 1}, {"umt5.out", -1}};
    CHECK(stages == want);
}

TEST_CASE("umT5 rejects bad token ids, lengths and outputs with clear errors") {
    const T5Config c = tiny_config(16);
    MapSource s = random_checkpoint(c, 10);
    Run r;
    WeightLoader loader(s, *r.be);
    Umt5Encoder enc(loader, c);
    Tensor out = Tensor::host(Shape{c.text_len, c.dim}, DType::F32);
    auto ids = random_ids(c.text_len, c.vocab, 11);
    CHECK_NOTHROW(enc.forward(*r.be, ids, 5, out));
    CHECK_THROWS_WITH_AS(enc.forward(*r.be, std::vector<int32_t>(15, 1), 5, out),
                         doctest::Contains("expected 16 token ids"), Error);
    CHECK_THROWS_AS(enc.forward(*r.be, ids, 0, out), Error);
    CHECK_THROWS_AS(enc.forward(*r.be, ids, 17, out), Error);
    ids[3] = c.vocab;
    CHECK_THROWS_WITH_AS(enc.forward(*r.be, ids, 5, out), doctest::Contains("position 3"), Error);
    ids[3] = -1;
    CHECK_THROWS_AS(enc.forward(*r.be, ids, 5, out), Error);
    ids[3] = 0;
    Tensor wrong = Tensor::host(Shape{c.text_len, c.dim + 1}, DType::F32);
    CHECK_THROWS_AS(enc.forward(*r.be, ids, 5, wrong), Error);
    CHECK(r.be->workspace().used() == 0);
}

TEST_CASE("umT5 load names the missing or misshapen tensor") {
    const T5Config c = tiny_config(16);
    Run r;
    {
        MapSource s = random_checkpoint(c, 12);
        s.tensors.erase(block_key(1, "ffn.gate.0.weight"));
        WeightLoader loader(s, *r.be);
        CHECK_THROWS_WITH_AS(Umt5Encoder(loader, c),
                             doctest::Contains("action_head.text_encoder.blocks.1.ffn.gate.0.weight"), Error);
    }
    {
        MapSource s = random_checkpoint(c, 13);
        s.put(block_key(0, "pos_embedding.embedding.weight"), Shape{32, 3}, 1, -1.f, 1.f);
        WeightLoader loader(s, *r.be);
        CHECK_THROWS_WITH_AS(Umt5Encoder(loader, c), doctest::Contains("expected [32, 2]"), Error);
    }
    {
        T5Config bad = c;
        bad.dim_attn = 63;
        MapSource s = random_checkpoint(c, 14);
        WeightLoader loader(s, *r.be);
        CHECK_THROWS_AS(Umt5Encoder(loader, bad), Error);
    }
}
