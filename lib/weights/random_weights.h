#pragma once
/// Random weights with no file: a WeightSource over host pools, one pool per initialisation of an inventory
/// (model/inventory.h), each as large as the largest tensor that uses it; every tensor of an initialisation is a
/// view of its pool's first elements. For benchmarks at the real geometry (`dzr bench rollout`): the 46 GB of a
/// DROID checkpoint are never written, and the host holds only a few GB. The values follow each tensor's
/// initialisation (a uniform distribution with its standard deviation), so forwards stay finite; they are not the
/// values `dzr ckpt make` writes.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "weights/inventory.h"
#include "weights/weight_source.h"

namespace dzr {

class RandomWeightSource final : public WeightSource {
public:
    /// bf16 pools for the weights of `inventory` (model/inventory.h expected_weights), filled with `threads`
    /// threads (0: hardware concurrency).
    RandomWeightSource(const std::vector<ExpectedWeight>& inventory, uint64_t seed, int threads = 0);

    std::optional<TensorView> find(const std::string& key) const override;
    std::vector<std::string> keys() const override;
    std::string location(const std::string& key) const override { (void)key; return "random (no file)"; }
    /// Host bytes of the pools.
    size_t pool_bytes() const;

private:
    struct Entry {
        Shape shape;
        size_t pool = 0;
    };
    std::map<std::string, Entry> entries_;
    std::vector<std::vector<uint16_t>> pools_;
};

}  // namespace dzr
