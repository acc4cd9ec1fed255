#pragma once
/// An in-memory checkpoint for network tests: key -> host tensor, with random fills.
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "support/test_support.h"
#include "weights/weight_source.h"

namespace dzr::test {

class MapSource final : public WeightSource {
public:
    std::map<std::string, Tensor> tensors;

    std::optional<TensorView> find(const std::string& key) const override {
        auto it = tensors.find(key);
        if (it == tensors.end()) return std::nullopt;
        return it->second.view();
    }
    std::vector<std::string> keys() const override {
        std::vector<std::string> out;
        for (const auto& [k, v] : tensors) out.push_back(k);
        return out;
    }
    std::string location(const std::string&) const override { return "memory"; }

    /// Uniform values in [lo, hi) from `seed`.
    void put(const std::string& key, Shape shape, uint64_t seed, float lo, float hi) {
        tensors[key] = Tensor::host_f32(shape, random_floats(size_t(shape.numel()), seed, lo, hi));
    }
    /// Uniform values in [lo, hi) drawn from a generator shared by a sequence of puts.
    void put(const std::string& key, Shape shape, std::mt19937_64& rng, float lo, float hi) {
        std::uniform_real_distribution<float> d(lo, hi);
        std::vector<float> v(size_t(shape.numel()));
        for (auto& x : v) x = d(rng);
        tensors[key] = Tensor::host_f32(shape, v);
    }
    std::vector<float> values(const std::string& key) const {
        auto it = tensors.find(key);
        DZR_CHECK(it != tensors.end(), "test source has no tensor {}", key);
        return to_f32_vector(it->second.view());
    }
    std::vector<float> get(const std::string& key) const { return values(key); }
};

}  // namespace dzr::test
