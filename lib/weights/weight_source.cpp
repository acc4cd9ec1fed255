#include "weights/weight_source.h"

#include <exception>

#include "core/error.h"
#include "core/log.h"

namespace dzr {

Tensor WeightLoader::require(const std::string& key, const Shape& shape) {
    return require(key, shape, backend_.compute_dtype());
}

Tensor WeightLoader::require(const std::string& key, const Shape& shape, DType dtype) {
    auto view = source_.find(key);
    DZR_CHECK(view.has_value(), "checkpoint is missing tensor {} (expected {})", key, shape.str());
    DZR_CHECK(view->shape == shape, "{}: tensor {}: expected {}, got {} {}", source_.location(key), key,
              shape.str(), dtype_name(view->dtype), view->shape.str());
    DZR_CHECK(dtype_is_float(view->dtype), "{}: tensor {}: expected a float dtype, got {}", source_.location(key),
              key, dtype_name(view->dtype));
    Tensor t = backend_.alloc(shape, dtype);
    std::optional<StoredRange> range;
    if (defer_) range = source_.stored_range(key);
    if (range) {
        pending_.push_back({key, range->file, range->offset, view->dtype, t.view()});
        pending_tensors_.push_back(t);
    } else {
        backend_.upload(*view, t);
    }
    used_.insert(key);
    return t;
}

WeightLoader::~WeightLoader() {
    if (!pending_.empty() && std::uncaught_exceptions() == 0)
        log()->error("weight loader: {} deferred weights were never read (finish() was not called)", pending_.size());
}

void WeightLoader::defer(const BulkLoadOptions& options) {
    if (backend_.capabilities().measuring) return;
    defer_ = options;
}

BulkLoadStats WeightLoader::finish() {
    std::vector<BulkLoadItem> items = std::move(pending_);
    std::vector<Tensor> keep = std::move(pending_tensors_);
    pending_.clear();
    pending_tensors_.clear();
    if (items.empty()) return {};
    return bulk_load(items, backend_, *defer_);
}

std::vector<std::string> WeightLoader::unused(const std::string& prefix) const {
    std::vector<std::string> out;
    for (const auto& k : source_.keys())
        if (k.rfind(prefix, 0) == 0 && !used_.count(k)) out.push_back(k);
    return out;
}

}  // namespace dzr
