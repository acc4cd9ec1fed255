// The bulk loader on the GPU: a load through pinned staging slots (backend/staging.h) on the ring's copy
// stream gives the tensors the plain path (one upload per require) gives, bit for bit, for bf16 and f32
// storage into bf16 and f32 tensors, with 1..8 threads, reads that split tensors, one slot or several,
// buffered and O_DIRECT reads; the ring's copies start after the allocations' zero fill and are complete
// after finish().
#include <doctest/doctest.h>

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/staging.h"
#include "config/run_config.h"
#include "core/error.h"
#include "support/bulk_checkpoints.h"
#include "support/test_support.h"
#include "model/inventory.h"
#include "weights/bulk_load.h"
#include "weights/checkpoint.h"
#include "weights/random_checkpoint.h"
#include "weights/weight_source.h"

DZR_TEST_REQUIRES_GPU()

using namespace dzr;
namespace fs = std::filesystem;

namespace {

Backend& gpu() {
    static std::unique_ptr<Backend> be = make_cuda_backend(0, size_t(64) << 20);
    return *be;
}

using test::make_checkpoint;
using test::medium_model;
using test::tiny_model;
using Made = test::MadeCheckpoint;

/// Every weight as `dtype` device tensors, downloaded to host bytes after the load.
std::vector<std::vector<uint8_t>> load_all(const Checkpoint& ck, const MakePlan& plan, DType dtype,
                                           const std::optional<BulkLoadOptions>& bulk,
                                           BulkLoadStats* stats = nullptr) {
    Backend& be = gpu();
    std::vector<Tensor> dev;
    {
        WeightLoader loader(ck, be);
        if (bulk) loader.defer(*bulk);
        for (const auto& w : plan.weights) dev.push_back(loader.require(w.key, w.shape, dtype));
        const BulkLoadStats s = loader.finish();
        if (stats) *stats = s;
    }
    std::vector<std::vector<uint8_t>> out;
    for (const Tensor& t : dev) {
        out.emplace_back(t.nbytes());
        be.download(t, TensorView(out.back().data(), t.dtype(), t.shape()));
    }
    return out;
}

size_t count_different(const std::vector<std::vector<uint8_t>>& a,
                       const std::vector<std::vector<uint8_t>>& b) {
    REQUIRE(a.size() == b.size());
    size_t n = 0;
    for (size_t i = 0; i < a.size(); ++i) n += a[i] == b[i] ? 0 : 1;
    return n;
}

BulkLoadOptions opts(int threads, size_t chunk_bytes, int slots, bool direct) {
    BulkLoadOptions o;
    o.threads = threads;
    o.chunk_bytes = chunk_bytes;
    o.slots = slots;
    o.direct = direct;
    return o;
}

void check_identical(const Made& m, const std::vector<int>& threads, const std::vector<size_t>& chunks) {
    const Checkpoint ck(m.dir());
    for (const DType dtype : {DType::BF16, DType::F32}) {
        CAPTURE(dtype_name(dtype));
        const auto plain = load_all(ck, m.plan, dtype, std::nullopt);
        bool nonzero = false;
        for (const auto& t : plain)
            for (uint8_t b : t) nonzero = nonzero || b != 0;
        REQUIRE(nonzero);
        for (const int t : threads)
            for (const size_t chunk : chunks)
                for (const int slots : {0, 1})
                    for (const bool direct : {false, true}) {
                        CAPTURE(t);
                        CAPTURE(chunk);
                        CAPTURE(slots);
                        CAPTURE(direct);
                        BulkLoadStats stats;
                        const auto staged =
                            load_all(ck, m.plan, dtype, opts(t, chunk, slots, direct), &stats);
                        CHECK(count_different(plain, staged) == 0);
                        CHECK(stats.slots == (slots > 0 ? slots : stats.threads + 2));
                        CHECK(stats.file_bytes == m.plan.total_bytes);
                    }
    }
}

}  // namespace

TEST_CASE("a pinned-staging load equals the plain upload bit for bit at the tiny geometry") {
    for (const DType stored : {DType::BF16, DType::F32}) {
        CAPTURE(dtype_name(stored));
        auto m = make_checkpoint(tiny_model(), stored, 1'000'000, 31);
        check_identical(*m, {1, 2, 4, 8}, {4096, 100'000, size_t(64) << 20});
    }
}

TEST_CASE("a pinned-staging load equals the plain upload bit for bit at a medium geometry") {
    auto m = make_checkpoint(medium_model(), DType::BF16, 8'000'000, 32);
    check_identical(*m, {3, 8}, {65536, size_t(1) << 20});
}

TEST_CASE("the staging ring's copies follow the zero fill and are on the device after finish") {
    Backend& be = gpu();
    auto ring = make_staging_ring(be, StagingOptions{size_t(1) << 20, 2});
    REQUIRE(ring != nullptr);
    CHECK(ring->slots() == 2);
    CHECK(ring->slot_bytes() == size_t(1) << 20);
    // NOTE: allocations zero-fill on the backend's stream; begin() orders the ring's copies after them.
    std::vector<Tensor> dst;
    for (int i = 0; i < 6; ++i) dst.push_back(be.alloc(Shape{int64_t(1) << 18}, DType::F32));
    ring->begin();
    for (int i = 0; i < 6; ++i) {
        const int slot = i % 2;
        uint8_t* p = ring->acquire(slot);
        CHECK(reinterpret_cast<uintptr_t>(p) % 4096 == 0);
        auto* f = reinterpret_cast<float*>(p);
        for (int64_t j = 0; j < dst[size_t(i)].numel(); ++j) f[j] = float(i * 1000 + j % 977);
        ring->copy(slot, 0, dst[size_t(i)].data(), dst[size_t(i)].nbytes());
        ring->release(slot);
    }
    ring->finish();
    for (int i = 0; i < 6; ++i) {
        std::vector<float> host(size_t(dst[size_t(i)].numel()));
        be.download(dst[size_t(i)], TensorView(host.data(), DType::F32, dst[size_t(i)].shape()));
        size_t wrong = 0;
        for (size_t j = 0; j < host.size(); ++j)
            wrong += host[j] == float(i * 1000 + int64_t(j) % 977) ? 0 : 1;
        CAPTURE(i);
        CHECK(wrong == 0);
    }
    CHECK_THROWS_AS(ring->copy(0, (size_t(1) << 20) - 4, dst[0].data(), 8), Error);
}
