// The FP8 KV pool (kv.dtype: fp8) on the CPU: its sizes, the scatter that quantizes each (token, head) row and the
// attention that dequantizes in the gather (exact against attention over the dequantized rows), both cache paths over
// DreamZero's call cycle, and the config key.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_paged_attention.h"
#include "config/run_config.h"
#include "core/error.h"
#include "core/fp8.h"
#include "core/half.h"
#include "kv/dense_self_attention_cache.h"
#include "kv/kv_cache_manager.h"
#include "kv/paged_self_attention_cache.h"
#include "support/naive_attention.h"
#include "support/test_support.h"

using namespace dzr;

namespace {

using test::naive_attention;

/// One token's [H * D] row as the FP8 pool holds it: each head quantized (core/fp8.h) and dequantized.
std::vector<float> fp8_row(const float* x, int heads, int d) {
    std::vector<float> out(size_t(heads * d));
    std::vector<uint8_t> q(static_cast<size_t>(d));
    for (int h = 0; h < heads; ++h) {
        const float s = quantize_row_fp8(x + h * d, d, q.data());
        for (int c = 0; c < d; ++c) out[size_t(h * d + c)] = f8e4m3_to_f32(q[size_t(c)]) * s;
    }
    return out;
}

KvGeometry small_geometry(int branches, bool fp8) {
    KvGeometry g;
    g.num_layers = 2;
    g.num_kv_heads = 2;
    g.head_dim = 16;
    g.tokens_per_frame = 12;
    g.chunk_frames = 2;
    g.prefill_frames = 1;
    g.register_tokens = 5;
    g.text_tokens = 4;
    g.image_tokens = 3;
    g.num_branches = branches;
    g.dtype = DType::F32;
    g.fp8_pool = fp8;
    return g;
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
    double e = 0, n = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        e += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
        n += double(b[i]) * b[i];
    }
    return std::sqrt(e / n);
}

}  // namespace

TEST_CASE("an FP8 pool holds E4M3 rows and a scale per token and head: about half the bf16 bytes") {
    KvGeometry g;  // DROID: 40 layers, 40 heads x 128
    const size_t bf16_block = plan_kv_memory(g, KvConfig{}, kv_session_bytes(g, KvConfig{})).block_bytes;
    g.fp8_pool = true;
    const KvMemoryPlan fp8 = plan_kv_memory(g, KvConfig{}, kv_session_bytes(g, KvConfig{}));
    CHECK(g.pool_row_bytes() == 40u * (128u + 4u));
    CHECK(fp8.block_bytes == size_t(880) * 2 * 40 * 40 * (128 + 4));
    CHECK(bf16_block == size_t(880) * 2 * 40 * 40 * 128 * 2);
    // the cross caches and the scratch keep the compute dtype
    KvGeometry b = g;
    b.fp8_pool = false;
    const KvMemoryPlan bf = plan_kv_memory(b, KvConfig{}, kv_session_bytes(b, KvConfig{}));
    CHECK(fp8.cross_bytes == bf.cross_bytes);
    CHECK(fp8.scratch_bytes == bf.scratch_bytes);
    CHECK(double(fp8.pool_bytes) / double(bf.pool_bytes) == doctest::Approx(132.0 / 256.0));

    const KvGeometry small = small_geometry(1, true);
    auto be = make_cpu_backend(size_t(16) << 20);
    KvCacheManager m(small, KvConfig{}, kv_session_bytes(small, KvConfig{}), be.get());
    CHECK(m.pool_k(0).dtype == DType::F8_E4M3);
    CHECK(m.pool_k_scale(1).dtype == DType::F32);
    CHECK(m.pool_k_scale(1).shape == Shape{m.pool_k(1).dim(0), small.num_kv_heads});
    CHECK(m.scratch_k(0).dtype == DType::F32);
}

TEST_CASE("FP8 cross caches hold E4M3 K and V with a scale per token and head, written by populate or in place") {
    KvGeometry g;  // DROID
    const size_t bf16_cross = plan_kv_memory(g, KvConfig{}, kv_session_bytes(g, KvConfig{})).cross_bytes;
    g.fp8_cross = true;
    const KvMemoryPlan fp8 = plan_kv_memory(g, KvConfig{}, kv_session_bytes(g, KvConfig{}));
    // text per branch and the shared image: (2 x 512 + 257) tokens, K and V, 40 layers, 40 heads x (128 + 4) bytes
    CHECK(fp8.cross_bytes == size_t(2 * 512 + 257) * 2 * 40 * 40 * (128 + 4));
    CHECK(double(fp8.cross_bytes) / double(bf16_cross) == doctest::Approx(132.0 / 256.0));

    KvGeometry small = small_geometry(2, true);
    small.fp8_cross = true;
    auto be = make_cpu_backend(size_t(16) << 20);
    KvCacheManager m(small, KvConfig{}, kv_session_bytes(small, KvConfig{}), be.get());
    auto s = m.open_session("fp8 cross");
    const int64_t heads = small.num_kv_heads, d = small.head_dim, tokens = small.text_tokens;
    // populate quantizes each token's heads as the FP8 pool does: the cache dequantizes to quantize/dequantize of x
    std::vector<std::vector<float>> vals;
    std::vector<LayerKv> in;
    for (int l = 0; l < small.num_layers; ++l) {
        vals.push_back(test::random_floats(size_t(tokens * heads * d), 30 + uint64_t(l), -4.f, 4.f));
        const TensorView t(vals.back().data(), DType::F32, Shape{tokens, heads, d});
        in.push_back({t, t});
    }
    s->populate_cross(KvSession::kPositive, CrossKind::Text, in);
    const CrossAttentionCache& c = s->cross(KvSession::kPositive, CrossKind::Text);
    REQUIRE(c.fp8());
    for (int l = 0; l < small.num_layers; ++l) {
        CHECK(c.k(l).dtype == DType::F8_E4M3);
        CHECK(c.k_scale(l).shape == Shape{tokens, heads});
        std::vector<float> back(size_t(tokens * heads * d)), want(back.size());
        dequantize_rows_fp8_host(c.v(l).reshape(Shape{tokens * heads, d}), c.v_scale(l).reshape(Shape{tokens * heads}),
                                 TensorView(back.data(), DType::F32, Shape{tokens * heads, d}));
        for (int64_t r = 0; r < tokens * heads; ++r) {
            std::vector<uint8_t> q(static_cast<size_t>(d));
            const float scale = quantize_row_fp8(vals[size_t(l)].data() + r * d, d, q.data());
            for (int64_t i = 0; i < d; ++i) want[size_t(r * d + i)] = f8e4m3_to_f32(q[size_t(i)]) * scale;
        }
        CHECK(back == want);
        CHECK(rel_l2(back, vals[size_t(l)]) < 0.05);
    }
    // in place: the views are E4M3 with their scale views; the image cache is shared by the branches
    const std::vector<LayerKv> views = s->begin_cross_write(KvSession::kNegative, CrossKind::Image);
    REQUIRE(views.size() == size_t(small.num_layers));
    CHECK(views[0].k.dtype == DType::F8_E4M3);
    CHECK(views[1].v_scale.shape == Shape{small.image_tokens, heads});
    s->commit_cross(KvSession::kNegative, CrossKind::Image);
    CHECK(s->cross(KvSession::kPositive, CrossKind::Image).k(1).data == views[1].k.data);
    // one layer at a time from the caller's buffers (the session's FP8 path) stores what populate stores
    s->begin_cross_write(KvSession::kNegative, CrossKind::Text);
    for (int l = 0; l < small.num_layers; ++l)
        s->store_cross_layer(KvSession::kNegative, CrossKind::Text, l, in[size_t(l)].k, in[size_t(l)].v);
    s->commit_cross(KvSession::kNegative, CrossKind::Text);
    const CrossAttentionCache& n = s->cross(KvSession::kNegative, CrossKind::Text);
    for (int l = 0; l < small.num_layers; ++l) {
        CHECK(to_f32_vector(n.k_scale(l)) == to_f32_vector(c.k_scale(l)));
        CHECK(std::memcmp(n.v(l).data, c.v(l).data, size_t(tokens * heads * d)) == 0);
    }
}

TEST_CASE("the FP8 scatter writes each head's codes and scale, and paged attention equals attention over them") {
    const int heads = 2, d = 16, bs = 4, num_ids = 6;
    const int64_t row = heads * d;
    std::vector<uint8_t> kpool(size_t(num_ids * bs * row), 0xff), vpool = kpool;  // 0xff: NaN codes outside use
    std::vector<float> kscale(size_t(num_ids * bs * heads), NAN), vscale = kscale;
    const BlockId table[5] = {4, 1, 3, kNullBlockId, kNullBlockId};
    const int64_t seq_len = 10;
    PagedKvView hist{kpool.data(), vpool.data(), DType::F8_E4M3, heads, d, bs, 0, bs * row, row, d, table, 5, 3,
                     seq_len, kscale.data(), vscale.data()};
    const std::vector<float> hk = test::random_floats(size_t(seq_len * row), 1, -3.f, 3.f);
    const std::vector<float> hv = test::random_floats(size_t(seq_len * row), 2);
    std::vector<int64_t> slots;
    for (int64_t t = 0; t < seq_len; ++t) slots.push_back(int64_t(table[t / bs]) * bs + t % bs);
    scatter_kv_cpu(hist, 0, slots.data(), seq_len, num_ids * bs, Tensor::host_f32(Shape{seq_len, heads, d}, hk),
                   Tensor::host_f32(Shape{seq_len, heads, d}, hv));
    std::vector<std::vector<float>> keys, values;
    for (int64_t t = 0; t < seq_len; ++t) {
        for (int h = 0; h < heads; ++h) {
            std::vector<uint8_t> want(static_cast<size_t>(d));
            const float s = quantize_row_fp8(hk.data() + t * row + h * d, d, want.data());
            CHECK(std::memcmp(kpool.data() + slots[size_t(t)] * row + h * d, want.data(), size_t(d)) == 0);
            CHECK(kscale[size_t(slots[size_t(t)] * heads + h)] == s);
        }
        keys.push_back(fp8_row(hk.data() + t * row, heads, d));
        values.push_back(fp8_row(hv.data() + t * row, heads, d));
    }
    const int64_t cur_len = 5;
    std::vector<float> ck = test::random_floats(size_t(cur_len * row), 3), cv = test::random_floats(size_t(cur_len * row), 4);
    for (int64_t t = 0; t < cur_len; ++t) {  // the current rows are not quantized
        keys.emplace_back(ck.begin() + t * row, ck.begin() + (t + 1) * row);
        values.emplace_back(cv.begin() + t * row, cv.begin() + (t + 1) * row);
    }
    const ContiguousKvView cur{ck.data(), cv.data(), DType::F32, heads, d, 0, row, d, cur_len};
    const int64_t lq = 3;
    const std::vector<float> qv = test::random_floats(size_t(lq * row), 5, -3.f, 3.f);
    const Tensor q = Tensor::host_f32(Shape{lq, heads, d}, qv), out = Tensor::host(Shape{lq, heads, d}, DType::F32);
    const float scale = 1.0f / std::sqrt(float(d));
    paged_attention_cpu(q, hist, cur, 0, scale, out);
    const std::vector<float> got = to_f32_vector(out), want = naive_attention(qv, lq, keys, values, heads, d, scale);
    double worst = 0;
    for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(double(got[i]) - want[i]));
    CHECK(worst <= 1e-6);  // the same dequantized rows: only f32 rounding of code * scale differs

    hist.k_scale = nullptr;
    CHECK_THROWS_WITH_AS(paged_attention_cpu(q, hist, cur, 0, scale, out), doctest::Contains("scales"), Error);
}

TEST_CASE("an FP8 paged cache: both paths agree over DreamZero's cycle and stay near the f32 cache") {
    const KvGeometry g8 = small_geometry(1, true), g32 = small_geometry(1, false);
    const KvConfig c;
    auto be = make_cpu_backend(size_t(16) << 20);
    KvCacheManager m_gather(g8, c, kv_session_bytes(g8, c), be.get()), m_kernel(g8, c, kv_session_bytes(g8, c), be.get());
    auto s_gather = m_gather.open_session("gather"), s_kernel = m_kernel.open_session("kernel");
    PagedSelfAttentionCache gather(*s_gather, 0, PagedAttentionPath::Gather);
    PagedSelfAttentionCache kernel(*s_kernel, 0, PagedAttentionPath::Kernel);
    DenseSelfAttentionCache dense(*be, g32, c);
    const int64_t tpf = g8.tokens_per_frame;
    double worst_paths = 0, worst_rel = 0;
    int csf = 0, with_history = 0;
    uint64_t seed = 1;
    const auto forward = [&](const KvForwardSpec& spec) {
        gather.begin(spec);
        kernel.begin(spec);
        dense.begin(spec);
        const int64_t video = int64_t(spec.video_frames) * tpf, len = video + spec.register_tokens;
        const Shape shape{len, g8.num_kv_heads, g8.head_dim};
        const size_t n = size_t(shape.numel());
        for (int layer = 0; layer < g8.num_layers; ++layer) {
            const uint64_t s = seed++ * 10;
            const Tensor q = Tensor::host_f32(shape, test::random_floats(n, s, -2.f, 2.f));
            const Tensor k = Tensor::host_f32(shape, test::random_floats(n, s + 1, -2.f, 2.f));
            const Tensor v = Tensor::host_f32(shape, test::random_floats(n, s + 2));
            Tensor o[3] = {Tensor::host(shape, DType::F32), Tensor::host(shape, DType::F32), Tensor::host(shape, DType::F32)};
            gather.attend(*be, layer, q, k, v, video, 0.25f, o[0]);
            kernel.attend(*be, layer, q, k, v, video, 0.25f, o[1]);
            dense.attend(*be, layer, q, k, v, video, 0.25f, o[2]);
            const std::vector<float> a = to_f32_vector(o[0]), b = to_f32_vector(o[1]), r = to_f32_vector(o[2]);
            for (size_t i = 0; i < a.size(); ++i) worst_paths = std::max(worst_paths, std::fabs(double(a[i]) - b[i]));
            if (gather.history_tokens() > 0) {
                worst_rel = std::max(worst_rel, rel_l2(a, r));
                ++with_history;
            } else {
                // nothing quantized is read yet: exactly the f32 cache's arithmetic on the gather path
                CHECK(std::memcmp(a.data(), r.data(), a.size() * sizeof(float)) == 0);
            }
        }
        gather.commit();
        kernel.commit();
        dense.commit();
    };
    for (int call = 1; call <= 7; ++call) {
        if (csf >= c.window_frames) {
            s_gather->reset_window();
            s_kernel->reset_window();
            dense.reset();
            csf = 0;
        }
        forward(csf == 0 ? KvForwardSpec::prefill(g8) : KvForwardSpec::commit_chunk(g8));
        if (csf == 0) csf = 1;
        for (int step = 0; step < 2; ++step) forward(KvForwardSpec::denoise(g8));
        csf += 2;
    }
    CHECK(with_history > 0);
    // NOTE: both paths attend over the same dequantized codes (f32 code * scale); they differ only in the dense
    // attention's f32 vs the kernel's double sums, as the f32 pool's paths do (test_kv_attention.cpp: 1e-5)
    CHECK(worst_paths <= 1e-5);
    // NOTE: E4M3 rounds each K and V value to 3 mantissa bits: at most 2^-4 relative, ~3.6% RMS over a binade. The
    // attention output mixes V rows (their error averages) through softmax weights perturbed by K's error in the
    // logits, so its relative RMS error should stay of that order; 10% is twice it. A wrong scale or a misplaced row
    // gives O(100%).
    MESSAGE("FP8 pool vs f32 cache: worst per-layer output rel-L2 " << worst_rel);
    CHECK(worst_rel > 0.0);
    CHECK(worst_rel < 0.1);
    s_gather->close();
    s_kernel->close();
    CHECK(m_gather.pool().num_free() == m_gather.pool().num_blocks());
}

TEST_CASE("kv.dtype and precision are read from a run config and refused when unknown") {
    const auto path = test::source_dir() / "configs/tiny.yaml";
    CHECK(config::load_run_config(path).kv.dtype == Precision::Bf16);
    CHECK(config::load_run_config(path).precision == Precision::Bf16);
    const auto rc = config::load_run_config(path, {config::parse_override("kv.dtype=fp8"),
                                                   config::parse_override("precision=fp8")});
    CHECK(rc.kv.dtype == Precision::Fp8);
    CHECK(rc.precision == Precision::Fp8);
    CHECK_THROWS_WITH_AS(config::load_run_config(path, {config::parse_override("kv.dtype=fp16")}),
                         doctest::Contains("kv.dtype: expected bf16 or fp8, got 'fp16'"), Error);
    CHECK_THROWS_WITH_AS(config::load_run_config(path, {config::parse_override("precision=int4")}),
                         doctest::Contains("precision: expected bf16 or fp8, got 'int4'"), Error);
}
