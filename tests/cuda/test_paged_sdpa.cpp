// Paged attention without the gather (PagedAttentionImpl::CudnnPaged, a forced choice): cuDNN SDPA over
// the history through a shuffled device block table, a dense cuDNN SDPA over the current rows, merged by
// their log-sum-exps. Checked against an f64 reference on the host and against the gathered path, over empty,
// one-block, several-block and partial-block histories, small and DreamZero-sized current rows; a CUDA graph
// captured once replays with new block-table contents as the eager call; reference numerics keep the gather.
//
// Auto gathers (the cuDNN paged path measured slower on cuDNN 9.14, docs/KV_CACHE.md); the tests force
// CudnnPaged. Where cuDNN refuses the paged graphs (cuDNN 9.14 has no page tables on the unified node and its
// composite graph needs power-of-2 blocks) the forced choice throws; the tests then check the gathered results,
// warn, and print which path ran ("ran gather"), so a device log shows whether the cuDNN path was exercised.
#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/half.h"
#include "support/test_support.h"

DZR_TEST_REQUIRES_GPU()

using namespace dzr;

namespace {

/// bf16's unit roundoff (8 significand bits, round to nearest even).
constexpr double kBf16Unit = 1.0 / 256.0;

CudaBackend& fast_gpu() {
    static std::unique_ptr<Backend> be = [] {
        BackendOptions o;
        o.numerics = Numerics::Fast;
        o.workspace_bytes = size_t(2) << 30;
        return make_cuda_backend(0, o);
    }();
    return dynamic_cast<CudaBackend&>(*be);
}

const char* impl_name(PagedAttentionImpl i) {
    switch (i) {
        case PagedAttentionImpl::Auto:
            return "auto";
        case PagedAttentionImpl::Direct:
            return "direct";
        case PagedAttentionImpl::Gather:
            return "gather";
        case PagedAttentionImpl::CudnnPaged:
            return "cudnn paged";
    }
    return "?";
}

/// bf16-representable values in [lo, hi), as f32.
std::vector<float> bf16_values(int64_t n, uint64_t seed, float lo, float hi) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = bf16_to_f32(f32_to_bf16(dist(rng)));
    return v;
}

/// Writes host values into an existing device tensor (converted to its dtype), in stream order.
void write(CudaBackend& be, const std::vector<float>& v, const TensorView& dst) {
    REQUIRE(int64_t(v.size()) == dst.numel());
    if (v.empty()) return;
    Tensor host = Tensor::host(dst.shape, DType::F32);
    std::copy(v.begin(), v.end(), host.ptr<float>());
    be.upload(host, dst);
    be.synchronize();
}

Tensor upload(CudaBackend& be, const std::vector<float>& v, Shape shape, DType dtype = DType::BF16) {
    Tensor d = be.alloc(shape, dtype);
    write(be, v, d);
    return d;
}

std::vector<float> download(CudaBackend& be, const TensorView& d) {
    be.synchronize();
    Tensor h = Tensor::host(d.shape, DType::F32);
    be.download(d, h);
    return std::vector<float>(h.ptr<float>(), h.ptr<float>() + h.numel());
}

Tensor poisoned(CudaBackend& be, Shape s) {
    Tensor t = be.alloc(s, DType::BF16);
    REQUIRE(cudaMemsetAsync(t.data(), 0xFF, t.nbytes(), be.cuda_stream()) == cudaSuccess);
    return t;
}

/// A two-layer pool of `ids` blocks per layer; the layer under test holds the history rows at the blocks
/// `table` lists (in order), every other row of both layers is NaN, so a read outside the table shows.
struct Pool {
    int64_t heads = 0, dim = 0, bs = 0, ids = 0, hist = 0;
    int layer = 1;
    std::vector<BlockId> table;
    std::vector<float> k_hist, v_hist;  // [hist, H, D] in history order
    Tensor k, v, table_dev;

    int64_t row() const { return heads * dim; }
    PagedKvView view() const {
        PagedKvView p{};
        p.k_base = k.data(), p.v_base = v.data(), p.dtype = DType::BF16;
        p.num_heads = int32_t(heads), p.head_dim = int32_t(dim), p.block_size = int32_t(bs);
        p.token_stride = row(), p.head_stride = dim, p.block_stride = bs * row(),
        p.layer_stride = ids * bs * row();
        p.block_table = table_dev.ptr<const BlockId>();
        p.table_width = int32_t(table.size());
        p.num_table_blocks = int32_t((hist + bs - 1) / bs);
        p.seq_len = hist;
        return p;
    }
};

/// The pool's layer contents for `table` (history rows at their slots, NaN elsewhere), both layers.
std::vector<float> pool_contents(const Pool& p, const std::vector<BlockId>& table,
                                 const std::vector<float>& rows) {
    std::vector<float> all(size_t(2 * p.ids * p.bs * p.row()), NAN);
    const int64_t base = int64_t(p.layer) * p.ids * p.bs * p.row();
    for (int64_t t = 0; t < p.hist; ++t) {
        const int64_t slot = int64_t(table[size_t(t / p.bs)]) * p.bs + t % p.bs;
        std::copy_n(rows.begin() + t * p.row(), p.row(), all.begin() + base + slot * p.row());
    }
    return all;
}

Pool make_pool(CudaBackend& be, int64_t heads, int64_t dim, int64_t bs, int64_t hist, uint64_t seed) {
    Pool p;
    p.heads = heads, p.dim = dim, p.bs = bs, p.hist = hist;
    const int64_t pages = (hist + bs - 1) / bs;
    p.ids = pages + 3;
    // a shuffled table over blocks 1..ids-1 (block 0 is the null block), padded with null blocks
    std::vector<BlockId> blocks(size_t(p.ids - 1));
    std::iota(blocks.begin(), blocks.end(), BlockId(1));
    std::shuffle(blocks.begin(), blocks.end(), std::mt19937_64(seed));
    p.table.assign(blocks.begin(), blocks.begin() + pages);
    p.table.push_back(kNullBlockId);
    p.table.push_back(kNullBlockId);
    p.k_hist = bf16_values(hist * p.row(), seed + 1, -2.f, 2.f);
    p.v_hist = bf16_values(hist * p.row(), seed + 2, -1.f, 1.f);
    const Shape pool_shape{2 * p.ids * bs, heads, dim};
    p.k = upload(be, pool_contents(p, p.table, p.k_hist), pool_shape);
    p.v = upload(be, pool_contents(p, p.table, p.v_hist), pool_shape);
    p.table_dev = upload(be, std::vector<float>(p.table.begin(), p.table.end()),
                         Shape{int64_t(p.table.size())}, DType::I32);
    return p;
}

/// The exact attention of query row t over [history | current] (f64), and A = sum_j p_j |v_j| per element:
/// the scale of the bf16 error bound (cuDNN rounds P to bf16 before P V, and each part's output once).
void exact_row(const Pool& pool, const std::vector<float>& q, const std::vector<float>& k_cur,
               const std::vector<float>& v_cur, int64_t cur, int64_t t, double scale,
               std::vector<double>& out, std::vector<double>& abs_scale) {
    const int64_t H = pool.heads, D = pool.dim, row = pool.row(), lk = pool.hist + cur;
    out.assign(size_t(row), 0.0);
    abs_scale.assign(size_t(row), 0.0);
    std::vector<double> logits(static_cast<size_t>(lk));
    for (int64_t h = 0; h < H; ++h) {
        const float* qr = q.data() + t * row + h * D;
        const auto key = [&](int64_t j) {
            return j < pool.hist ? pool.k_hist.data() + j * row + h * D
                                 : k_cur.data() + (j - pool.hist) * row + h * D;
        };
        const auto value = [&](int64_t j) {
            return j < pool.hist ? pool.v_hist.data() + j * row + h * D
                                 : v_cur.data() + (j - pool.hist) * row + h * D;
        };
        double m = -INFINITY;
        for (int64_t j = 0; j < lk; ++j) {
            const float* kr = key(j);
            double s = 0;
            for (int64_t d = 0; d < D; ++d) s += double(qr[d]) * kr[d];
            logits[size_t(j)] = s * scale;
            m = std::max(m, logits[size_t(j)]);
        }
        double z = 0;
        for (int64_t j = 0; j < lk; ++j) z += std::exp(logits[size_t(j)] - m);
        for (int64_t j = 0; j < lk; ++j) {
            const double pj = std::exp(logits[size_t(j)] - m) / z;
            const float* vr = value(j);
            for (int64_t d = 0; d < D; ++d) {
                out[size_t(h * D + d)] += pj * vr[d];
                abs_scale[size_t(h * D + d)] += pj * std::fabs(vr[d]);
            }
        }
    }
}

struct Case {
    int64_t heads, dim, bs, hist, cur, lq;
    bool strided_cur = false;  // k and v interleaved in one [cur, 2, H, D] buffer
};

struct Worst {
    double err = 0, bound_ratio = 0;
};

/// Runs `impl` on the fast backend; the output on the host and which implementation ran.
std::vector<float> run(CudaBackend& be, PagedAttentionImpl impl, const Pool& pool, const TensorView& q,
                       const TensorView& k, const TensorView& v, float scale, PagedAttentionImpl* ran) {
    struct Restore {
        CudaBackend& be;
        ~Restore() { be.set_paged_attention_impl(PagedAttentionImpl::Auto); }
    } restore{be};
    be.set_paged_attention_impl(impl);
    const Tensor out = poisoned(be, q.shape);
    be.paged_attention({scale}, q, pool.view(), pool.layer, k, v, out);
    std::vector<float> host = download(be, out);
    if (ran) *ran = be.last_paged_attention_impl();
    return host;
}

void check_case(const Case& c, int64_t sampled_rows) {
    CudaBackend& be = fast_gpu();
    CAPTURE(c.heads);
    CAPTURE(c.dim);
    CAPTURE(c.bs);
    CAPTURE(c.hist);
    CAPTURE(c.cur);
    CAPTURE(c.lq);
    const Pool pool = make_pool(be, c.heads, c.dim, c.bs, c.hist, uint64_t(7 * c.hist + c.cur + c.dim));
    const int64_t row = pool.row();
    const std::vector<float> q = bf16_values(c.lq * row, 11, -2.f, 2.f);
    const std::vector<float> k = bf16_values(c.cur * row, 12, -2.f, 2.f);
    const std::vector<float> v = bf16_values(c.cur * row, 13, -1.f, 1.f);
    const Tensor qd = upload(be, q, Shape{c.lq, c.heads, c.dim});
    Tensor kd, vd, kvd;
    TensorView kv_k, kv_v;
    if (c.strided_cur) {
        std::vector<float> kv(size_t(2 * c.cur * row));
        for (int64_t t = 0; t < c.cur; ++t) {
            std::copy_n(k.begin() + t * row, row, kv.begin() + 2 * t * row);
            std::copy_n(v.begin() + t * row, row, kv.begin() + (2 * t + 1) * row);
        }
        kvd = upload(be, kv, Shape{c.cur, 2, c.heads, c.dim});
        const Shape strides{2 * row, c.dim, 1};
        kv_k = TensorView(kvd.data(), DType::BF16, Shape{c.cur, c.heads, c.dim}, strides, kvd.device());
        kv_v = TensorView(static_cast<char*>(kvd.data()) + row * 2, DType::BF16, Shape{c.cur, c.heads, c.dim},
                          strides, kvd.device());
    } else {
        kd = upload(be, k, Shape{c.cur, c.heads, c.dim}), vd = upload(be, v, Shape{c.cur, c.heads, c.dim});
        kv_k = kd.view(), kv_v = vd.view();
    }
    const float scale = 1.f / std::sqrt(float(c.dim));
    // fast numerics' Auto gathers (with no history: the dense attention over the current rows where they lie);
    // the forced cuDNN paged path runs where cuDNN takes its graphs, else throws
    PagedAttentionImpl ran = PagedAttentionImpl::Auto;
    const std::vector<float> automatic = run(be, PagedAttentionImpl::Auto, pool, qd, kv_k, kv_v, scale, &ran);
    CHECK(ran == PagedAttentionImpl::Gather);
    std::vector<float> paged;
    const std::string forced_error = test::error_of(
        [&] { paged = run(be, PagedAttentionImpl::CudnnPaged, pool, qd, kv_k, kv_v, scale, nullptr); });
    const bool paged_ran = forced_error.empty();
    if (paged_ran) {
        ran = PagedAttentionImpl::CudnnPaged;
    } else {
        CHECK(test::contains(forced_error, "cudnn-paged cannot run"));
        WARN_MESSAGE(false, "cuDNN refused the paged graphs (" << forced_error
                                                               << "); the gathered path was checked");
    }
    const std::vector<float> gathered =
        run(be, PagedAttentionImpl::Gather, pool, qd, kv_k, kv_v, scale, nullptr);

    // the exact result on (a sample of) the query rows
    const int64_t rows = std::min(sampled_rows, c.lq);
    std::vector<int64_t> pick(size_t(c.lq));
    std::iota(pick.begin(), pick.end(), int64_t(0));
    std::shuffle(pick.begin(), pick.end(), std::mt19937_64(5));
    pick.resize(size_t(rows));
    Worst wp, wg;
    int64_t bad_paged = 0, bad_gather = 0, bad_pair = 0;
    std::vector<double> exact, abs_scale;
    for (const int64_t t : pick) {
        exact_row(pool, q, k, v, c.cur, t, scale, exact, abs_scale);
        for (int64_t e = 0; e < row; ++e) {
            const size_t i = size_t(t * row + e);
            const double a = abs_scale[size_t(e)];
            // NOTE: each part rounds P to bf16 (u · sum p|v|) and its output once (u · |part|); the merge
            // rounds once more (u · |out|): together at most 3u · A, A = sum p|v| >= |out|. The gathered
            // call: 2u · A.
            const double bound = 3 * kBf16Unit * a + 1e-6, gather_bound = 2 * kBf16Unit * a + 1e-6;
            const double eg = std::fabs(gathered[i] - exact[size_t(e)]),
                         ea = std::fabs(automatic[i] - exact[size_t(e)]);
            if (!(eg <= gather_bound)) ++bad_gather;
            if (!(ea <= gather_bound)) ++bad_gather;
            wg.err = std::max({wg.err, eg, ea});
            wg.bound_ratio = std::max(wg.bound_ratio, std::max(eg, ea) / gather_bound);
            if (!paged_ran) continue;
            const double ep = std::fabs(paged[i] - exact[size_t(e)]);
            if (!(ep <= bound)) ++bad_paged;
            if (!(std::fabs(double(paged[i]) - gathered[i]) <= bound + gather_bound)) ++bad_pair;
            wp.err = std::max(wp.err, ep);
            wp.bound_ratio = std::max(wp.bound_ratio, ep / bound);
        }
    }
    CHECK(bad_paged == 0);
    CHECK(bad_gather == 0);
    CHECK(bad_pair == 0);
    std::printf(
        "H %lld D %lld block %lld history %lld current %lld Lq %lld%s: ran %s; "
        "max |err| vs f64 on %lld rows: paged %.3e (%.2f of its bound), gather %.3e (%.2f)\n",
        (long long)c.heads, (long long)c.dim, (long long)c.bs, (long long)c.hist, (long long)c.cur,
        (long long)c.lq, c.strided_cur ? " (strided k/v)" : "", impl_name(ran), (long long)rows, wp.err,
        wp.bound_ratio, wg.err, wg.bound_ratio);
}

}  // namespace

TEST_CASE(
    "cudnn paged attention over a shuffled block table matches the exact result and the gathered path") {
    // histories: none, one block, several blocks, a partial last block; current rows from 1 up; Lq != current
    for (const Case& c :
         {Case{4, 128, 64, 0, 37, 37}, Case{4, 128, 64, 64, 50, 50}, Case{4, 128, 64, 200, 70, 70},
          Case{2, 64, 40, 90, 37, 29}, Case{8, 128, 96, 192, 1, 1}, Case{4, 64, 32, 96, 0, 20},
          Case{3, 128, 48, 144, 33, 33, true}})
        check_case(c, c.lq);
}

TEST_CASE("cudnn paged attention at DreamZero's shapes matches the exact result on sampled rows") {
    // 2 history frames of 880 tokens and the 1785 current rows of a denoising forward, 40 heads x 128
    check_case(Case{40, 128, 880, 2 * 880, 1785, 1785}, 48);
}

TEST_CASE("a captured cudnn paged attention replays with new block-table contents as the eager call") {
    CudaBackend& be = fast_gpu();
    const int64_t H = 4, D = 128, bs = 64, hist = 3 * bs, cur = 40;
    const Pool pool = make_pool(be, H, D, bs, hist, 77);
    const int64_t row = pool.row();
    const Tensor q = upload(be, bf16_values(cur * row, 1, -2.f, 2.f), Shape{cur, H, D});
    const Tensor k = upload(be, bf16_values(cur * row, 2, -2.f, 2.f), Shape{cur, H, D});
    const Tensor v = upload(be, bf16_values(cur * row, 3, -1.f, 1.f), Shape{cur, H, D});
    const float scale = 1.f / std::sqrt(float(D));
    // a second table (the same blocks in another order) with a second history placed behind it
    std::vector<BlockId> other(pool.table.begin(), pool.table.end());
    std::reverse(other.begin(), other.begin() + 3);
    const std::vector<float> other_k = bf16_values(hist * row, 4, -2.f, 2.f);
    const std::vector<float> other_v = bf16_values(hist * row, 5, -1.f, 1.f);
    const std::vector<float> table_a(pool.table.begin(), pool.table.end()),
        table_b(other.begin(), other.end());

    REQUIRE(be.numerics() == Numerics::Fast);
    struct Restore {
        CudaBackend& be;
        ~Restore() { be.set_paged_attention_impl(PagedAttentionImpl::Auto); }
    } restore{be};
    const Tensor out = poisoned(be, Shape{cur, H, D});
    // eager with table A (builds the plans): the forced cuDNN paged path where cuDNN takes it (64-token blocks),
    // else Auto's gather
    be.set_paged_attention_impl(PagedAttentionImpl::CudnnPaged);
    if (!test::error_of([&] { be.paged_attention({scale}, q, pool.view(), pool.layer, k, v, out); }).empty()) {
        be.set_paged_attention_impl(PagedAttentionImpl::Auto);
        be.paged_attention({scale}, q, pool.view(), pool.layer, k, v, out);
    }
    const std::vector<float> eager_a = download(be, out);
    const PagedAttentionImpl ran = be.last_paged_attention_impl();

    be.stream().begin_capture();
    be.paged_attention({scale}, q, pool.view(), pool.layer, k, v, out);
    const std::unique_ptr<Graph> graph = be.stream().end_capture();
    REQUIRE(graph);

    // table B with its own history rows: eager, then the graph
    write(be, pool_contents(pool, other, other_k), pool.k);
    write(be, pool_contents(pool, other, other_v), pool.v);
    write(be, table_b, pool.table_dev);
    be.paged_attention({scale}, q, pool.view(), pool.layer, k, v, out);
    const std::vector<float> eager_b = download(be, out);
    REQUIRE(cudaMemsetAsync(out.data(), 0xFF, out.nbytes(), be.cuda_stream()) == cudaSuccess);
    graph->launch();
    const std::vector<float> replay_b = download(be, out);
    CHECK(replay_b == eager_b);
    CHECK(eager_b != eager_a);  // the new table was read

    // table A again, replayed only
    write(be, pool_contents(pool, pool.table, pool.k_hist), pool.k);
    write(be, pool_contents(pool, pool.table, pool.v_hist), pool.v);
    write(be, table_a, pool.table_dev);
    REQUIRE(cudaMemsetAsync(out.data(), 0xFF, out.nbytes(), be.cuda_stream()) == cudaSuccess);
    graph->launch();
    CHECK(download(be, out) == eager_a);
    std::printf("graph replay with a new block table: ran %s, replay == eager\n", impl_name(ran));
    if (ran != PagedAttentionImpl::CudnnPaged)
        WARN_MESSAGE(false,
                     "cuDNN refused the paged graphs here (see the log); the gathered fallback was replayed");
}

TEST_CASE("reference numerics keep the gathered paged attention") {
    auto owned = make_cuda_backend(0, size_t(256) << 20);
    CudaBackend& be = dynamic_cast<CudaBackend&>(*owned);
    const int64_t H = 2, D = 64, bs = 32, hist = 64, cur = 16;
    const Pool pool = make_pool(be, H, D, bs, hist, 3);
    const Tensor q = upload(be, bf16_values(cur * H * D, 1, -2.f, 2.f), Shape{cur, H, D});
    const Tensor k = upload(be, bf16_values(cur * H * D, 2, -2.f, 2.f), Shape{cur, H, D});
    const Tensor v = upload(be, bf16_values(cur * H * D, 3, -1.f, 1.f), Shape{cur, H, D});
    const Tensor out = poisoned(be, Shape{cur, H, D});
    REQUIRE(be.numerics() == Numerics::Reference);
    be.paged_attention({0.125f}, q, pool.view(), pool.layer, k, v, out);
    be.synchronize();
    CHECK(be.last_paged_attention_impl() != PagedAttentionImpl::CudnnPaged);
}
