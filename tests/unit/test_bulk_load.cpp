// The bulk loader (weights/bulk_load.h) on the CPU backend: the deferred WeightLoader path gives the bytes
// the old path (one upload per require) gives, for the tiny and a medium geometry, bf16 and f32 storage, into
// f32 and bf16 tensors, with 1..8 reader threads, small reads that split tensors, buffered and O_DIRECT
// reads; the chunk plan's invariants; broken files give one error naming the file and the tensor.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/staging.h"
#include "config/run_config.h"
#include "core/error.h"
#include "support/cli.h"
#include "support/bulk_checkpoints.h"
#include "support/test_support.h"
#include "weights/bulk_load.h"
#include "weights/checkpoint.h"
#include "model/inventory.h"
#include "weights/random_checkpoint.h"
#include "weights/weight_source.h"

using namespace dzr;
namespace fs = std::filesystem;

namespace {

using test::error_of;
using test::contains;

using test::make_checkpoint;
using test::medium_model;
using test::tiny_model;
using Made = test::MadeCheckpoint;

/// Every weight of the plan loaded as `dtype` tensors: through the old path (bulk = nullopt) or the bulk one.
std::vector<Tensor> load_all(const Checkpoint& ck, const MakePlan& plan, Backend& be, DType dtype,
                             const std::optional<BulkLoadOptions>& bulk, BulkLoadStats* stats = nullptr) {
    WeightLoader loader(ck, be);
    if (bulk) loader.defer(*bulk);
    std::vector<Tensor> out;
    for (const auto& w : plan.weights) out.push_back(loader.require(w.key, w.shape, dtype));
    const BulkLoadStats s = loader.finish();
    if (stats) *stats = s;
    return out;
}

/// The number of tensors whose bytes differ (and the first one's key, for the message).
size_t count_different(const MakePlan& plan, const std::vector<Tensor>& a, const std::vector<Tensor>& b,
                       std::string& first) {
    REQUIRE(a.size() == b.size());
    size_t n = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        REQUIRE(a[i].nbytes() == b[i].nbytes());
        if (std::memcmp(a[i].data(), b[i].data(), a[i].nbytes()) == 0) continue;
        if (n++ == 0) first = plan.weights[i].key;
    }
    return n;
}

/// True when some tensor holds a non-zero byte (the bulk path must not leave the zero fill behind).
bool any_nonzero(const std::vector<Tensor>& ts) {
    for (const auto& t : ts) {
        const auto* p = static_cast<const uint8_t*>(t.data());
        if (std::any_of(p, p + t.nbytes(), [](uint8_t b) { return b != 0; })) return true;
    }
    return false;
}

BulkLoadOptions opts(int threads, size_t chunk_bytes, bool direct = false) {
    BulkLoadOptions o;
    o.threads = threads;
    o.chunk_bytes = chunk_bytes;
    o.direct = direct;
    return o;
}

/// Every option set of the bulk path against the old path, into f32 (converting) and bf16 tensors.
void check_identical(const Made& m, const std::vector<int>& threads) {
    const Checkpoint ck(m.dir());
    auto be = make_cpu_backend();
    for (const DType dtype : {DType::F32, DType::BF16}) {
        CAPTURE(dtype_name(dtype));
        const std::vector<Tensor> old = load_all(ck, m.plan, *be, dtype, std::nullopt);
        REQUIRE(any_nonzero(old));
        for (const int t : threads) {
            for (const size_t chunk : {size_t(4096), size_t(100'000), size_t(64) << 20}) {
                for (const bool direct : {false, true}) {
                    CAPTURE(t);
                    CAPTURE(chunk);
                    CAPTURE(direct);
                    BulkLoadStats stats;
                    const std::vector<Tensor> bulk =
                        load_all(ck, m.plan, *be, dtype, opts(t, chunk, direct), &stats);
                    std::string first;
                    CHECK(count_different(m.plan, old, bulk, first) == 0);
                    CHECK(first == "");
                    CHECK(stats.tensors == m.plan.weights.size());
                    CHECK(stats.file_bytes == m.plan.total_bytes);
                    CHECK(stats.slots == 0);  // the CPU path writes straight into the tensors
                    CHECK(stats.threads <= t);
                }
            }
        }
    }
}

}  // namespace

TEST_CASE("the bulk loader gives the old path's bytes at the tiny geometry with 1 to 8 threads") {
    for (const DType stored : {DType::BF16, DType::F32}) {
        CAPTURE(dtype_name(stored));
        auto m = make_checkpoint(tiny_model(), stored, 1'000'000, 21);
        REQUIRE(m->plan.shards.size() > 1);
        check_identical(*m, {1, 2, 3, 4, 5, 6, 7, 8});
    }
}

TEST_CASE("the bulk loader gives the old path's bytes at a medium geometry with several shards") {
    auto m = make_checkpoint(medium_model(), DType::BF16, 8'000'000, 22);
    REQUIRE(m->plan.shards.size() >= 3);
    REQUIRE(m->plan.total_bytes > 20'000'000);
    check_identical(*m, {1, 3, 8});
}

TEST_CASE("the bulk loader reads f16 storage into bf16 and f32 tensors as the old path converts it") {
    auto m = make_checkpoint(tiny_model(), DType::F16, 5'000'000'000, 23);
    check_identical(*m, {1, 4});
}

TEST_CASE("the bulk loader handles skipped tensors, a weight required twice and an empty request") {
    auto m = make_checkpoint(tiny_model(), DType::BF16, 1'000'000, 24);
    const Checkpoint ck(m->dir());
    auto be = make_cpu_backend();
    // every third weight, the first one twice: gaps between the read ranges and two items on one range
    std::vector<size_t> picked;
    for (size_t i = 0; i < m->plan.weights.size(); i += 3) picked.push_back(i);
    picked.push_back(0);
    std::vector<Tensor> old, bulk;
    {
        WeightLoader loader(ck, *be);
        for (size_t i : picked)
            old.push_back(loader.require(m->plan.weights[i].key, m->plan.weights[i].shape));
    }
    WeightLoader loader(ck, *be);
    loader.defer(opts(4, 8192));
    for (size_t i : picked) bulk.push_back(loader.require(m->plan.weights[i].key, m->plan.weights[i].shape));
    const BulkLoadStats stats = loader.finish();
    CHECK(stats.tensors == picked.size());
    for (size_t j = 0; j < picked.size(); ++j) {
        CAPTURE(m->plan.weights[picked[j]].key);
        CHECK(std::memcmp(old[j].data(), bulk[j].data(), old[j].nbytes()) == 0);
    }
    CHECK(loader.unused("").size() == m->plan.weights.size() - (picked.size() - 1));
    // nothing deferred since: finish() reads nothing; the loader stays deferred for a later batch
    CHECK(loader.finish().tensors == 0);
    const auto& last = m->plan.weights.back();
    const Tensor later = loader.require(last.key, last.shape);
    CHECK(loader.finish().tensors == 1);
    WeightLoader plain(ck, *be);
    const Tensor expected = plain.require(last.key, last.shape);
    CHECK(std::memcmp(later.data(), expected.data(), later.nbytes()) == 0);
    WeightLoader idle(ck, *be);
    idle.defer({});
    CHECK(idle.finish().file_bytes == 0);
}

TEST_CASE("the bulk load plan cuts sorted consecutive reads that cover every item once") {
    // Two files; same-dtype items back to back with a gap, an f32 item converted to bf16, a repeated range.
    std::vector<float> dummy(1);
    const auto dst = [&](DType dt, int64_t n) { return TensorView(dummy.data(), dt, Shape{n}); };
    std::vector<BulkLoadItem> items = {
        {"b0", "b.safetensors", 100, DType::BF16, dst(DType::BF16, 3000)},  // [100, 6100)
        {"a1", "a.safetensors", 8 + 6000, DType::BF16, dst(DType::BF16, 10)},
        {"a0", "a.safetensors", 8, DType::BF16, dst(DType::BF16, 3000)},    // [8, 6008)
        {"a2", "a.safetensors", 7000, DType::F32, dst(DType::BF16, 2500)},  // gap before; converted
        {"a0again", "a.safetensors", 8, DType::BF16, dst(DType::BF16, 3000)},
        {"empty", "a.safetensors", 50, DType::BF16, dst(DType::BF16, 0)},
    };
    const BulkPlan plan = plan_bulk_load(items, 4096);
    REQUIRE(plan.files.size() == 2);
    CHECK(plan.files[0] == "a.safetensors");
    std::map<size_t, uint64_t> covered;  // item -> stored bytes covered
    size_t prev_file = 0;
    for (const auto& c : plan.chunks) {
        CHECK(c.bytes <= 4096);
        CHECK(c.bytes > 0);
        CHECK(c.file >= prev_file);
        prev_file = c.file;
        uint64_t pos = c.offset, sum = 0;
        for (const auto& p : c.pieces) {
            const BulkLoadItem& item = items[p.item];
            CHECK(plan.files[c.file] == item.file);
            CHECK(item.offset + p.item_offset == pos);  // consecutive in the file
            pos += p.bytes;
            sum += p.bytes;
            covered[p.item] += p.bytes;
        }
        CHECK(sum == c.bytes);
        if (c.convert) {
            REQUIRE(c.pieces.size() == 1);
            const BulkLoadItem& item = items[c.pieces[0].item];
            CHECK(item.stored != item.dst.dtype);
            CHECK(c.bytes % dtype_size(item.stored) == 0);
            CHECK(c.pieces[0].item_offset % dtype_size(item.stored) == 0);
        }
    }
    for (size_t i = 0; i < items.size(); ++i) {
        CAPTURE(items[i].key);
        CHECK(covered[i] == items[i].stored_bytes());
    }
    // a0: 2 reads; a0again: 2, the second one also holding a1 (back to back); a2: 3 conversions of at most
    // 1024 f32 values; b0: 2
    CHECK(plan.chunks.size() == 2 + 2 + 3 + 2);
    CHECK_THROWS_AS(plan_bulk_load(items, 0), Error);
}

TEST_CASE(
    "a shard truncated after the checkpoint was opened fails the bulk load naming the file and the tensor") {
    auto m = make_checkpoint(tiny_model(), DType::BF16, 1'000'000, 25);
    const Checkpoint ck(m->dir());
    auto be = make_cpu_backend();
    const fs::path last = m->dir() / m->plan.shards.back().name;
    {
        WeightLoader loader(ck, *be);
        loader.defer(opts(3, 65536));
        for (const auto& w : m->plan.weights) loader.require(w.key, w.shape);
        fs::resize_file(last, fs::file_size(last) - 100);
        const std::string msg = error_of([&] { loader.finish(); });
        CAPTURE(msg);
        CHECK(contains(msg, last.string()));
        CHECK(contains(msg, "tensor "));
        CHECK(contains(msg, "shorter than its header says"));
    }
    {
        WeightLoader loader(ck, *be);
        loader.defer(opts(2, 65536));
        for (const auto& w : m->plan.weights) loader.require(w.key, w.shape);
        fs::remove(last);
        const std::string msg = error_of([&] { loader.finish(); });
        CHECK(contains(msg, "cannot open " + last.string()));
    }
}

TEST_CASE("bulk load options out of range are refused by name") {
    auto m = make_checkpoint(tiny_model(), DType::BF16, 5'000'000'000, 26);
    const Checkpoint ck(m->dir());
    auto be = make_cpu_backend();
    WeightLoader loader(ck, *be);
    BulkLoadOptions bad;
    bad.threads = -1;
    loader.defer(bad);
    loader.require(m->plan.weights.front().key, m->plan.weights.front().shape);
    CHECK(contains(error_of([&] { loader.finish(); }), "threads must be in"));
    CHECK(make_staging_ring(*be, StagingOptions{}) == nullptr);  // the CPU backend needs no staging
}

TEST_CASE("dzr bench load times both paths on the CPU and names a bad checkpoint") {
    if (test::dzr_bin().empty()) {
        MESSAGE("DZR_BIN is not set (run through ctest); skipping the binary checks");
        return;
    }
    auto m = make_checkpoint(tiny_model(), DType::BF16, 1'000'000, 27);
    const std::string ck = m->dir().string();
    test::CliResult r =
        test::run_dzr("bench load --checkpoint '" + ck + "' --device cpu --path old", m->tmp.path());
    CHECK(r.code == 0);
    CHECK(r.has("result path=old run=1"));
    r = test::run_dzr("bench load --checkpoint '" + ck +
                          "' --device cpu --threads 3 --staging-mb 1 --direct --repeat 2 "
                          "--json '" +
                          (m->tmp / "load.json").string() + "'",
                      m->tmp.path());
    CHECK(r.code == 0);
    CHECK(r.has("result path=new run=2"));
    CHECK(r.has("3 threads, straight into host tensors"));
    CHECK(fs::exists(m->tmp / "load.json"));
    r = test::run_dzr("bench load --checkpoint '" + ck + "' --device cpu --path sideways", m->tmp.path());
    CHECK(r.code != 0);
    CHECK(r.has("--path must be new or old"));
    r = test::run_dzr("bench load --checkpoint '" + (m->tmp / "nowhere").string() + "' --device cpu",
                      m->tmp.path());
    CHECK(r.code != 0);
    CHECK(r.has("does not exist"));
}
