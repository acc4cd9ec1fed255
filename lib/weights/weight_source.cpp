#include "weights/weight_source.h"

#include "core/error.h"

namespace dzr {

Tensor WeightLoader::require(const std::string& key, const Shape& shape, WeightInit init) {
    return require(key, shape, backend_.compute_dtype(), init);
}

Tensor WeightLoader::require(const std::string& key, const Shape& shape, DType dtype, WeightInit init) {
    record(key, shape, init, !declare_only_);
    if (declare_only_) return Tensor{};
    if (recording()) return backend_.alloc(shape, dtype);
    auto view = source_->find(key);
    DZR_CHECK(view.has_value(), "checkpoint is missing tensor {} (expected {})", key, shape.str());
    DZR_CHECK(view->shape == shape, "{}: tensor {}: expected {}, got {} {}", source_->location(key), key,
              shape.str(), dtype_name(view->dtype), view->shape.str());
    DZR_CHECK(dtype_is_float(view->dtype), "{}: tensor {}: expected a float dtype, got {}",
              source_->location(key), key, dtype_name(view->dtype));
    Tensor t = backend_.alloc(shape, dtype);
    backend_.upload(*view, t);
    used_.insert(key);
    return t;
}

void WeightLoader::declare(const std::string& key, const Shape& shape, WeightInit init) {
    record(key, shape, init, false);
}

void WeightLoader::record(const std::string& key, const Shape& shape, WeightInit init, bool loaded) {
    declarations_.push_back({key, shape, init.resolved(shape), loaded});
}

std::vector<std::string> WeightLoader::unused(const std::string& prefix) const {
    std::vector<std::string> out;
    if (recording()) return out;
    for (const auto& k : source_->keys())
        if (k.rfind(prefix, 0) == 0 && !used_.count(k)) out.push_back(k);
    return out;
}

}  // namespace dzr
