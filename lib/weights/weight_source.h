#pragma once
/// Where model code gets its weights. A WeightSource resolves a checkpoint key (used verbatim, e.g.
/// "action_head.model.blocks.3.self_attn.q.weight") to a host view of the stored bytes. Models call
/// WeightLoader::require() once per weight at load and keep typed members; nothing is looked up by
/// string inside a forward.
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/tensor.h"

namespace dzr {

class WeightSource {
public:
    virtual ~WeightSource() = default;
    /// Host view of the stored tensor (any dtype), or nullopt when absent.
    virtual std::optional<TensorView> find(const std::string& key) const = 0;
    /// Every key the source holds.
    virtual std::vector<std::string> keys() const = 0;
    /// Where the key lives, for messages ("model-00003-of-00010.safetensors").
    virtual std::string location(const std::string& key) const = 0;
};

/// Uploads weights to a backend, converting to the backend's compute dtype, and records which keys
/// were used so a load can fail on missing or unused weights.
class WeightLoader {
public:
    WeightLoader(const WeightSource& source, Backend& backend) : source_(source), backend_(backend) {}

    /// The weight `key` with exactly `shape`, on the backend in its compute dtype (or `dtype`).
    /// Throws dzr::Error naming the key, its file, the expected and the found shape.
    Tensor require(const std::string& key, const Shape& shape);
    Tensor require(const std::string& key, const Shape& shape, DType dtype);

    /// Keys of the source under `prefix` that no require() asked for.
    std::vector<std::string> unused(const std::string& prefix) const;
    const std::set<std::string>& used() const { return used_; }
    Backend& backend() { return backend_; }

private:
    const WeightSource& source_;
    Backend& backend_;
    std::set<std::string> used_;
};

}  // namespace dzr
