// CPU paged attention and scatter against naive references, and the paged SelfAttentionCache against the
// dense one over DreamZero's call cycle (bit-exact on the gather path).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "kv/dense_self_attention_cache.h"
#include "kv/kv_cache_manager.h"
#include "backend/cpu/cpu_paged_attention.h"
#include "kv/paged_self_attention_cache.h"
#include "support/naive_attention.h"
#include "support/test_support.h"

using namespace dzr;

namespace {

using test::naive_attention;

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    REQUIRE(a.size() == b.size());
    double m = 0.0;
    for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double(a[i]) - double(b[i])));
    return m;
}

KvGeometry small_geometry(int branches) {
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
    return g;
}

/// Runs one forward through a paged and a dense cache with the same random q/k/v in every layer and
/// compares outputs: bit for bit (tolerance 0) or within `tolerance`.
struct Pair {
    PagedSelfAttentionCache& paged;
    DenseSelfAttentionCache& dense;
};

void forward_both(Backend& be, const KvGeometry& g, Pair p, const KvForwardSpec& spec, uint64_t seed,
                  double tolerance, int64_t expect_history) {
    CHECK_FALSE(p.paged.committing());  // outside a forward
    CHECK_FALSE(p.dense.committing());
    p.paged.begin(spec);
    p.dense.begin(spec);
    CHECK(p.paged.history_tokens() == expect_history);
    CHECK(p.dense.history_tokens() == expect_history);
    CHECK(p.paged.committing() == spec.commit);
    CHECK(p.dense.committing() == spec.commit);
    const int64_t video = int64_t(spec.video_frames) * g.tokens_per_frame;
    const int64_t len = video + spec.register_tokens;
    const Shape shape{len, g.num_kv_heads, g.head_dim};
    const size_t n = size_t(shape.numel());
    const float scale = 1.0f / std::sqrt(float(g.head_dim));
    for (int layer = 0; layer < g.num_layers; ++layer) {
        const uint64_t s = seed * 100 + uint64_t(layer) * 3;
        const Tensor q = Tensor::host_f32(shape, test::random_floats(n, s, -2.f, 2.f));
        const Tensor k = Tensor::host_f32(shape, test::random_floats(n, s + 1, -2.f, 2.f));
        const Tensor v = Tensor::host_f32(shape, test::random_floats(n, s + 2));
        const Tensor out_paged = Tensor::host(shape, DType::F32);
        const Tensor out_dense = Tensor::host(shape, DType::F32);
        p.paged.attend(be, layer, q, k, v, video, scale, out_paged);
        p.dense.attend(be, layer, q, k, v, video, scale, out_dense);
        const std::vector<float> a = to_f32_vector(out_paged), b = to_f32_vector(out_dense);
        if (tolerance == 0.0) {
            CHECK_MESSAGE(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0,
                          "layer " << layer << " max |paged - dense| = " << max_abs_diff(a, b));
        } else {
            CHECK(max_abs_diff(a, b) <= tolerance);
        }
    }
    p.paged.commit();
    p.dense.commit();
}

/// DreamZero's 7-call cycle on both CFG branches: prefill, 3 commits, window reset at csf = 9 and prefill,
/// 2 commits; each call followed by `steps` denoise forwards. Checks the KV lengths of reference §1.5.
void dreamzero_cycle(PagedAttentionPath path, double tolerance) {
    const KvGeometry g = small_geometry(2);
    const KvConfig c;
    auto be = make_cpu_backend(size_t(16) << 20);
    // a workspace of exactly what the caches measure for arena planning
    const size_t planned = std::max(PagedSelfAttentionCache::attend_workspace_bytes(g, c, path, *be),
                                    DenseSelfAttentionCache::workspace_bytes(g, c, *be));
    be->reserve_workspace(planned);
    KvCacheManager m(g, c, kv_session_bytes(g, c), be.get());
    auto session = m.open_session("cycle");
    PagedSelfAttentionCache paged[2] = {{*session, 0, path}, {*session, 1, path}};
    DenseSelfAttentionCache dense[2] = {{*be, g, c}, {*be, g, c}};
    const int64_t tpf = g.tokens_per_frame;
    int csf = 0;
    uint64_t seed = 1;
    for (int call = 1; call <= 7; ++call) {
        if (csf >= c.window_frames) {  // R3: csf >= local_attn_size
            session->reset_window();
            for (auto& d : dense) d.reset();
            csf = 0;
        }
        const bool prefill = csf == 0;
        for (int b = 0; b < 2; ++b) {
            const KvForwardSpec spec = prefill ? KvForwardSpec::prefill(g) : KvForwardSpec::commit_chunk(g);
            forward_both(*be, g, {paged[b], dense[b]}, spec, seed++, tolerance, prefill ? 0 : (csf - 2) * tpf);
        }
        if (prefill) csf = 1;
        for (int step = 0; step < 3; ++step)
            for (int b = 0; b < 2; ++b)
                forward_both(*be, g, {paged[b], dense[b]}, KvForwardSpec::denoise(g), seed++, tolerance, csf * tpf);
        csf += 2;
    }
    CHECK(csf == 7);  // calls 5, 6, 7 ran after the reset: csf 1 -> 3 -> 5 -> 7
    // the cycle ran in that workspace and reached the fullest history the plan was measured at
    CHECK(be->workspace().high_water() > 0);
    CHECK(be->workspace().high_water() == planned);
    session->close();
    CHECK(m.pool().num_free() == m.pool().num_blocks());
}

}  // namespace

TEST_CASE("paged attention through a shuffled block table matches a naive loop and never reads padding") {
    const int heads = 2, d = 8, bs = 4, num_ids = 6;
    const int64_t row = heads * d;
    // pool of one layer: [6 block ids, 4 tokens, 2 heads, 8]; everything NaN except the rows the table uses
    std::vector<float> kpool(size_t(num_ids * bs * row), std::numeric_limits<float>::quiet_NaN());
    std::vector<float> vpool = kpool;
    const BlockId table[5] = {4, 1, 3, kNullBlockId, kNullBlockId};
    const int64_t seq_len = 10;  // blocks 4 and 1 full, 2 tokens of block 3
    std::vector<std::vector<float>> keys, values;
    const std::vector<float> hk = test::random_floats(size_t(seq_len * row), 1);
    const std::vector<float> hv = test::random_floats(size_t(seq_len * row), 2);
    for (int64_t t = 0; t < seq_len; ++t) {
        const int64_t slot = int64_t(table[t / bs]) * bs + t % bs;
        std::copy_n(hk.begin() + t * row, row, kpool.begin() + slot * row);
        std::copy_n(hv.begin() + t * row, row, vpool.begin() + slot * row);
        keys.emplace_back(hk.begin() + t * row, hk.begin() + (t + 1) * row);
        values.emplace_back(hv.begin() + t * row, hv.begin() + (t + 1) * row);
    }
    const int64_t cur_len = 5;
    std::vector<float> ck = test::random_floats(size_t(cur_len * row), 3);
    std::vector<float> cv = test::random_floats(size_t(cur_len * row), 4);
    for (int64_t t = 0; t < cur_len; ++t) {
        keys.emplace_back(ck.begin() + t * row, ck.begin() + (t + 1) * row);
        values.emplace_back(cv.begin() + t * row, cv.begin() + (t + 1) * row);
    }
    const PagedKvView hist{kpool.data(), vpool.data(), DType::F32, heads, d, bs, 0, bs * row, row, d, table, 5, 3,
                           seq_len};
    const ContiguousKvView cur{ck.data(), cv.data(), DType::F32, heads, d, 0, row, d, cur_len};
    const int64_t lq = 3;
    const std::vector<float> qv = test::random_floats(size_t(lq * row), 5, -3.f, 3.f);
    const Tensor q = Tensor::host_f32(Shape{lq, heads, d}, qv);
    const Tensor out = Tensor::host(Shape{lq, heads, d}, DType::F32);
    const float scale = 1.0f / std::sqrt(float(d));
    paged_attention_cpu(q, hist, cur, 0, scale, out);
    const std::vector<float> got = to_f32_vector(out);
    for (float x : got) CHECK(std::isfinite(x));
    CHECK(max_abs_diff(got, naive_attention(qv, lq, keys, values, heads, d, scale)) <= 1e-6);

    // the contiguous view of the same rows goes through the same template: identical bits
    const ContiguousKvView dense_hist{const_cast<float*>(hk.data()), const_cast<float*>(hv.data()), DType::F32,
                                      heads, d, 0, row, d, seq_len};
    const Tensor out2 = Tensor::host(Shape{lq, heads, d}, DType::F32);
    contiguous_attention_cpu(q, dense_hist, cur, 0, scale, out2);
    CHECK(std::memcmp(out.data(), out2.data(), out.nbytes()) == 0);
}

TEST_CASE("paged attention with an empty history attends the current rows only, and with no keys gives zeros") {
    const int heads = 1, d = 4;
    const BlockId table[2] = {kNullBlockId, kNullBlockId};
    std::vector<float> pool(2 * 2 * 4, 0.f);
    const PagedKvView empty{pool.data(), pool.data(), DType::F32, heads, d, 2, 0, 8, 4, 4, table, 2, 0, 0};
    std::vector<float> ck = {1, 0, 0, 0, 0, 1, 0, 0}, cv = {1, 2, 3, 4, 5, 6, 7, 8};
    const ContiguousKvView cur{ck.data(), cv.data(), DType::F32, heads, d, 0, 4, 4, 2};
    const Tensor q = Tensor::host_f32(Shape{1, 1, 4}, {2, 0, 0, 0});
    const Tensor out = Tensor::host(Shape{1, 1, 4}, DType::F32);
    paged_attention_cpu(q, empty, cur, 0, 1.0f, out);
    // logits 2 and 0: weights e^2 / (e^2 + 1) and 1 / (e^2 + 1)
    const double w0 = std::exp(2.0) / (std::exp(2.0) + 1.0), w1 = 1.0 - w0;
    const std::vector<float> got = to_f32_vector(out);
    for (int c = 0; c < 4; ++c) CHECK(got[size_t(c)] == doctest::Approx(w0 * cv[size_t(c)] + w1 * cv[size_t(4 + c)]));
    const ContiguousKvView none{ck.data(), cv.data(), DType::F32, heads, d, 0, 4, 4, 0};
    paged_attention_cpu(q, empty, none, 0, 1.0f, out);
    for (float x : to_f32_vector(out)) CHECK(x == 0.0f);
}

TEST_CASE("paged attention refuses non-f32 pools and mismatched heads") {
    const BlockId table[1] = {kNullBlockId};
    std::vector<float> pool(16, 0.f);
    const PagedKvView bf16{pool.data(), pool.data(), DType::BF16, 1, 4, 2, 0, 8, 4, 4, table, 1, 0, 0};
    const ContiguousKvView cur{pool.data(), pool.data(), DType::F32, 1, 4, 0, 4, 4, 1};
    const Tensor q = Tensor::host(Shape{1, 1, 4}, DType::F32);
    const Tensor out = Tensor::host(Shape{1, 1, 4}, DType::F32);
    CHECK_THROWS_WITH_AS(paged_attention_cpu(q, bf16, cur, 0, 1.f, out), doctest::Contains("f32 only"), Error);
    const Tensor q2 = Tensor::host(Shape{1, 2, 4}, DType::F32);
    const PagedKvView f32{pool.data(), pool.data(), DType::F32, 1, 4, 2, 0, 8, 4, 4, table, 1, 0, 0};
    CHECK_THROWS_AS(paged_attention_cpu(q2, f32, cur, 0, 1.f, out), Error);
}

TEST_CASE("scatter writes each row to its slot in the right layer and skips pad slots") {
    const int heads = 2, d = 2, bs = 3, ids = 4, layers = 2;
    const int64_t row = heads * d, layer_stride = int64_t(ids) * bs * row;
    std::vector<float> kpool(size_t(layers * layer_stride), 0.f), vpool = kpool;
    const BlockId table[1] = {kNullBlockId};
    const PagedKvView pool{kpool.data(), vpool.data(), DType::F32, heads, d, bs, layer_stride, bs * row, row, d,
                           table, 1, 0, 0};
    const std::vector<float> kv = test::random_floats(size_t(4 * row), 9);
    const Tensor k = Tensor::host_f32(Shape{4, heads, d}, kv);
    std::vector<float> vv(kv.size());
    for (size_t i = 0; i < vv.size(); ++i) vv[i] = -kv[i];
    const Tensor v = Tensor::host_f32(Shape{4, heads, d}, vv);
    const int64_t slots[4] = {5, 6, kPadSlot, 3};
    scatter_kv_cpu(pool, 1, slots, 4, ids * bs, k, v);
    for (int64_t slot = 0; slot < ids * bs; ++slot) {
        const int src = slot == 5 ? 0 : slot == 6 ? 1 : slot == 3 ? 3 : -1;
        for (int64_t e = 0; e < row; ++e) {
            const float want = src < 0 ? 0.f : kv[size_t(src * row + e)];
            CHECK(kpool[size_t(layer_stride + slot * row + e)] == want);
            CHECK(vpool[size_t(layer_stride + slot * row + e)] == -want);
            CHECK(kpool[size_t(slot * row + e)] == 0.f);  // layer 0 untouched
        }
    }
    const int64_t outside[1] = {12};
    CHECK_THROWS_WITH_AS(scatter_kv_cpu(pool, 0, outside, 1, ids * bs, k, v), doctest::Contains("outside the pool"),
                         Error);
}

TEST_CASE("paged and dense self-attention caches agree bit for bit over DreamZero's 7-call cycle") {
    dreamzero_cycle(PagedAttentionPath::Gather, 0.0);
}

TEST_CASE("the paged attention kernel path agrees with the dense cache over DreamZero's 7-call cycle") {
    dreamzero_cycle(PagedAttentionPath::Kernel, 1e-5);
}

TEST_CASE("paged and dense caches agree bit for bit under sliding eviction with a sink") {
    const KvGeometry g = small_geometry(1);
    KvConfig c;
    c.reset_at_boundary = false;
    c.sink_frames = 1;
    c.window_frames = 5;
    auto be = make_cpu_backend(size_t(16) << 20);
    // a workspace of exactly what the caches measure (their walk runs past the first eviction and trim)
    const size_t planned =
        std::max(PagedSelfAttentionCache::attend_workspace_bytes(g, c, PagedAttentionPath::Gather, *be),
                 DenseSelfAttentionCache::workspace_bytes(g, c, *be));
    be->reserve_workspace(planned);
    KvCacheManager m(g, c, kv_session_bytes(g, c), be.get());
    auto session = m.open_session("sliding");
    PagedSelfAttentionCache paged(*session, 0);
    DenseSelfAttentionCache dense(*be, g, c);
    const int64_t tpf = g.tokens_per_frame;
    int64_t committed = 0;
    uint64_t seed = 500;
    for (int chunk = 0; chunk < 8; ++chunk) {
        const KvForwardSpec spec = chunk == 0 ? KvForwardSpec::prefill(g) : KvForwardSpec::commit_chunk(g);
        // visible history: everything while it fits in sink + window - current frames, then sink + newest
        const int64_t limit = (1 + 5 - spec.video_frames) * tpf;
        forward_both(*be, g, {paged, dense}, spec, seed++, 0.0, std::min(committed, limit));
        committed += spec.video_frames * tpf;
        forward_both(*be, g, {paged, dense}, KvForwardSpec::denoise(g), seed++, 0.0,
                     std::min(committed, (1 + 5 - 2) * tpf));
    }
    CHECK(m.pool().num_free() == 0);  // 6 blocks resident: the plateau of a pool sized for one session
    CHECK(session->table(0).resident().size() == 6);
    CHECK(be->workspace().high_water() == planned);  // the plateau took all of it
}

TEST_CASE("a committing forward leaves the exact K/V rows in its pool slots") {
    const KvGeometry g = small_geometry(1);
    const KvConfig c;
    auto be = make_cpu_backend(size_t(16) << 20);
    KvCacheManager m(g, c, kv_session_bytes(g, c), be.get());
    auto session = m.open_session("rows");
    for (PagedAttentionPath path : {PagedAttentionPath::Gather, PagedAttentionPath::Kernel}) {
        session->reset();
        PagedSelfAttentionCache paged(*session, 0, path);
        paged.begin(KvForwardSpec::prefill(g));
        paged.commit();
        paged.begin(KvForwardSpec::commit_chunk(g));
        const Shape shape{2 * g.tokens_per_frame, g.num_kv_heads, g.head_dim};
        const size_t n = size_t(shape.numel());
        const std::vector<float> kv = test::random_floats(n, 77), vv = test::random_floats(n, 78);
        const Tensor q = Tensor::host_f32(shape, test::random_floats(n, 79));
        const Tensor out = Tensor::host(shape, DType::F32);
        paged.attend(*be, 1, q, Tensor::host_f32(shape, kv), Tensor::host_f32(shape, vv), shape[0], 0.25f, out);
        const std::vector<int64_t> slots = session->table(0).slot_mapping();
        paged.commit();
        const std::vector<float> pk = to_f32_vector(m.pool_k(1)), pv = to_f32_vector(m.pool_v(1));
        const int64_t row = g.num_kv_heads * g.head_dim;
        for (int64_t t = 0; t < shape[0]; ++t) {
            const int64_t slot = slots[size_t(t)];
            CHECK(std::equal(kv.begin() + t * row, kv.begin() + (t + 1) * row, pk.begin() + slot * row));
            CHECK(std::equal(vv.begin() + t * row, vv.begin() + (t + 1) * row, pv.begin() + slot * row));
        }
    }
}

TEST_CASE("a forward that fails between layers is aborted, and after reset paged and dense agree again") {
    const KvGeometry g = small_geometry(1);
    const KvConfig c;
    auto be = make_cpu_backend(size_t(16) << 20);
    KvCacheManager m(g, c, kv_session_bytes(g, c), be.get());
    auto session = m.open_session("fail");
    PagedSelfAttentionCache paged(*session, 0);
    DenseSelfAttentionCache dense(*be, g, c);
    forward_both(*be, g, {paged, dense}, KvForwardSpec::prefill(g), 1, 0.0, 0);
    // a committing forward that dies after layer 0
    paged.begin(KvForwardSpec::commit_chunk(g));
    const Shape shape{2 * g.tokens_per_frame, g.num_kv_heads, g.head_dim};
    const Tensor x = Tensor::host_f32(shape, test::random_floats(size_t(shape.numel()), 2));
    const Tensor out = Tensor::host(shape, DType::F32);
    try {
        paged.attend(*be, 0, x, x, x, shape[0], 0.25f, out);
        throw Error("injected: layer 1 failed");
    } catch (const Error&) {
        paged.abort();
    }
    CHECK(m.pool().num_free() == m.pool().num_blocks());
    CHECK_THROWS_AS(paged.begin(KvForwardSpec::prefill(g)), Error);
    CHECK_THROWS_WITH_AS(paged.attend(*be, 1, x, x, x, shape[0], 0.25f, out), doctest::Contains("outside a forward"),
                         Error);
    session->reset();
    dense.reset();
    forward_both(*be, g, {paged, dense}, KvForwardSpec::prefill(g), 3, 0.0, 0);
    forward_both(*be, g, {paged, dense}, KvForwardSpec::denoise(g), 4, 0.0, g.tokens_per_frame);
}

TEST_CASE("attend checks the forward's token counts and refuses a cache without storage") {
    const KvGeometry g = small_geometry(1);
    const KvConfig c;
    auto be = make_cpu_backend(size_t(16) << 20);
    KvCacheManager m(g, c, kv_session_bytes(g, c), be.get());
    auto session = m.open_session("checks");
    PagedSelfAttentionCache paged(*session, 0);
    paged.begin(KvForwardSpec::denoise(g));
    const Shape wrong{2 * g.tokens_per_frame, g.num_kv_heads, g.head_dim};  // register tokens missing
    const Tensor x = Tensor::host(wrong, DType::F32);
    CHECK_THROWS_WITH_AS(paged.attend(*be, 0, x, x, x, wrong[0], 1.f, x), doctest::Contains("do not match"), Error);
    paged.commit();

    KvCacheManager bookkeeping(g, c, kv_session_bytes(g, c));
    auto s2 = bookkeeping.open_session("no storage");
    PagedSelfAttentionCache p2(*s2, 0);
    p2.begin(KvForwardSpec::prefill(g));
    const Shape one{g.tokens_per_frame, g.num_kv_heads, g.head_dim};
    const Tensor y = Tensor::host(one, DType::F32);
    CHECK_THROWS_WITH_AS(p2.attend(*be, 0, y, y, y, one[0], 1.f, y), doctest::Contains("without storage"), Error);
}

TEST_CASE("attend_branches gives every branch what its own attend gives, on the kernel and the gather path") {
    for (const PagedAttentionPath path : {PagedAttentionPath::Kernel, PagedAttentionPath::Gather}) {
        CAPTURE(int(path));
        const KvGeometry g = small_geometry(2);
        const KvConfig c;
        auto be = make_cpu_backend(size_t(16) << 20);
        KvCacheManager m(g, c, kv_session_bytes(g, c), be.get());
        auto session = m.open_session("branches");
        PagedSelfAttentionCache paged[2] = {{*session, 0, path}, {*session, 1, path}};
        std::vector<SelfAttentionCache*> caches = {&paged[0], &paged[1]};
        const float scale = 1.0f / std::sqrt(float(g.head_dim));
        uint64_t seed = 9;
        for (const KvForwardSpec& spec : {KvForwardSpec::prefill(g), KvForwardSpec::denoise(g),
                                          KvForwardSpec::commit_chunk(g), KvForwardSpec::denoise(g)}) {
            for (auto& p : paged) p.begin(spec);
            const int64_t video = int64_t(spec.video_frames) * g.tokens_per_frame, L = video + spec.register_tokens;
            const Shape both{2 * L, g.num_kv_heads, g.head_dim};
            const size_t n = size_t(both.numel());
            for (int layer = 0; layer < g.num_layers; ++layer, seed += 3) {
                const Tensor q = Tensor::host_f32(both, test::random_floats(n, seed, -2.f, 2.f));
                const Tensor k = Tensor::host_f32(both, test::random_floats(n, seed + 1, -2.f, 2.f));
                // the branches' rows differ, so a branch answered with the other's rows would show
                const Tensor v = Tensor::host_f32(both, test::random_floats(n, seed + 2));
                const Tensor out = Tensor::host(both, DType::F32), each = Tensor::host(both, DType::F32);
                attend_branches(*be, layer, caches, q, k, v, video, scale, out);
                for (int b = 0; b < 2; ++b)
                    paged[b].attend(*be, layer, q.view().slice(0, b * L, L), k.view().slice(0, b * L, L),
                                    v.view().slice(0, b * L, L), video, scale, each.view().slice(0, b * L, L));
                const std::vector<float> a = to_f32_vector(out), e = to_f32_vector(each);
                CHECK(std::memcmp(a.data(), e.data(), a.size() * sizeof(float)) == 0);
            }
            for (auto& p : paged) p.commit();
        }
        // one branch's rows cannot be split into two
        const Shape odd{3, g.num_kv_heads, g.head_dim};
        const Tensor t = Tensor::host(odd, DType::F32);
        for (auto& p : paged) p.begin(KvForwardSpec::denoise(g));
        CHECK_THROWS_WITH_AS(attend_branches(*be, 0, caches, t, t, t, 0, scale, t),
                             doctest::Contains("are not the rows of 2 branches"), Error);
        session->close();
    }
}
