#include "backend/cpu/cpu_gemm.h"

#include <cblas.h>

#include <algorithm>
#include <atomic>

#include "core/parallel.h"

namespace dzr::cpu {

namespace {

// NOTE: OpenBLAS picks its kernels by shape (small matrices, gemv-like rows) and splits its work by its thread
// count, so one call's bits depend on OPENBLAS_NUM_THREADS. Here every call covers a tile of a fixed grid at one
// OpenBLAS thread: a tile's bits depend on its shape only, and dzr's threads only choose who computes it.
constexpr int64_t kTileRows = 1024, kTileCols = 256;
// Below this many multiply-adds a GEMM runs on the calling thread (starting threads costs more than it saves).
constexpr int64_t kParallelMacs = int64_t(1) << 24;

std::atomic<int> g_threads{0};

int init_threads() {
    int t = g_threads.load();
    if (t > 0) return t;
    // NOTE: the thread count OpenBLAS would have used (OPENBLAS_NUM_THREADS, else the cores); OpenBLAS itself
    // then runs every call on one thread
    t = std::max(1, openblas_get_num_threads());
    openblas_set_num_threads(1);
    int expected = 0;
    return g_threads.compare_exchange_strong(expected, t) ? t : expected;
}

}  // namespace

int gemm_threads() { return init_threads(); }

void set_gemm_threads(int threads) {
    init_threads();
    g_threads.store(std::max(1, threads));
}

void sgemm(const SgemmArgs& g) {
    if (g.M <= 0 || g.N <= 0) return;
    const int threads = init_threads();
    const int64_t row_tiles = (g.M + kTileRows - 1) / kTileRows, col_tiles = (g.N + kTileCols - 1) / kTileCols;
    const auto tile = [&](size_t i) {
        const int64_t m0 = int64_t(i) / col_tiles * kTileRows, n0 = int64_t(i) % col_tiles * kTileCols;
        const int64_t m = std::min(kTileRows, g.M - m0), n = std::min(kTileCols, g.N - n0);
        // A is [M, K] (or [K, M] transposed), B is [K, N] (or [N, K] transposed), C is [M, N]
        const float* a = g.trans_a ? g.a + m0 : g.a + m0 * g.lda;
        const float* b = g.trans_b ? g.b + n0 * g.ldb : g.b + n0;
        cblas_sgemm(CblasRowMajor, g.trans_a ? CblasTrans : CblasNoTrans, g.trans_b ? CblasTrans : CblasNoTrans,
                    int(m), int(n), int(g.K), g.alpha, a, int(g.lda), b, int(g.ldb), g.beta, g.c + m0 * g.ldc + n0,
                    int(g.ldc));
    };
    const size_t tiles = size_t(row_tiles * col_tiles);
    const bool parallel = threads > 1 && tiles > 1 && g.M * g.N * g.K >= kParallelMacs;
    parallel_for(tiles, parallel ? size_t(threads) : 1, tile);
}

}  // namespace dzr::cpu
