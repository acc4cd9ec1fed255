// Packed persistent allocations on the GPU (backend/packing.h): tensors carved from one slab hold what is written
// to them, take less device memory than one cudaMalloc each when their sizes are not whole 2 MiB pages, and give
// their memory back when the last of them is freed; outside a scope alloc() is as before.
#include <doctest/doctest.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "backend/backend.h"
#include "backend/packing.h"
#include "support/test_support.h"

DZR_TEST_REQUIRES_GPU()

using namespace dzr;

namespace {

Backend& gpu() {
    static std::unique_ptr<Backend> be = make_cuda_backend(0, size_t(16) << 20);
    return *be;
}

int64_t in_use() {
    gpu().stream().synchronize();
    return gpu().context().memory_in_use().value();
}

// 12.5 pages of 2 MiB: an E4M3 [5120, 5120] weight
constexpr int64_t kBytes = 26'214'400;
constexpr int kTensors = 24;

std::vector<Tensor> allocate(bool packed) {
    std::vector<Tensor> out;
    std::optional<PackedAllocations> scope;
    if (packed) scope.emplace(gpu());
    for (int i = 0; i < kTensors; ++i) out.push_back(gpu().context().alloc(Shape{kBytes}, DType::U8));
    return out;
}

}  // namespace

TEST_CASE("packed tensors hold their own values and are zero-filled") {
    std::vector<Tensor> t;
    {
        PackedAllocations scope(gpu());
        for (int i = 0; i < 5; ++i) t.push_back(gpu().context().alloc(Shape{1000 + 37 * i}, DType::F32));
    }
    for (size_t i = 0; i < t.size(); ++i) {
        std::vector<float> zeros(size_t(t[i].numel()), -1.0f);
        gpu().download(t[i], TensorView(zeros.data(), DType::F32, t[i].shape()));
        for (float z : zeros) REQUIRE(z == 0.0f);
        CHECK(reinterpret_cast<uintptr_t>(t[i].data()) % 256 == 0);
    }
    // neighbours do not overlap: each gets its own values back
    for (size_t i = 0; i < t.size(); ++i) {
        std::vector<float> v(size_t(t[i].numel()), float(i + 1));
        gpu().upload(TensorView(v.data(), DType::F32, t[i].shape()), t[i]);
    }
    for (size_t i = 0; i < t.size(); ++i) {
        std::vector<float> back(size_t(t[i].numel()));
        gpu().download(t[i], TensorView(back.data(), DType::F32, t[i].shape()));
        for (float b : back) REQUIRE(b == float(i + 1));
    }
}

TEST_CASE("packing saves the page rounding of odd-sized tensors and gives the memory back when they are freed") {
    const int64_t base = in_use();
    int64_t plain = 0, packed = 0;
    {
        const std::vector<Tensor> t = allocate(false);
        plain = in_use() - base;
    }
    CHECK(in_use() - base < (int64_t(4) << 20));
    {
        const std::vector<Tensor> t = allocate(true);
        packed = in_use() - base;
    }
    const int64_t after = in_use() - base;
    MESSAGE("24 tensors of 12.5 pages: one cudaMalloc each " << plain << " bytes, packed " << packed
                                                                << " bytes, after freeing " << after);
    const int64_t payload = kTensors * kBytes;
    CHECK(plain >= payload);
    CHECK(packed >= payload);
    // one cudaMalloc each rounds every tensor up to 13 pages: 24 MiB more than the payload; packed, at most a page
    CHECK(plain - payload >= int64_t(20) << 20);
    CHECK(packed - payload <= int64_t(2) << 20);
    CHECK(after < (int64_t(4) << 20));
}
