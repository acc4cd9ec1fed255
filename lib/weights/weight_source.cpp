#include "weights/weight_source.h"

#include <exception>

#include "core/convert.h"
#include "core/error.h"
#include "core/fp8.h"
#include "weights/fp8_weights.h"
#include "core/log.h"

namespace dzr {

Tensor WeightLoader::require(const std::string& key, const Shape& shape, WeightInit init) {
    return require(key, shape, backend_.compute_dtype(), init);
}

Tensor WeightLoader::require(const std::string& key, const Shape& shape, DType dtype, WeightInit init) {
    record(key, shape, init, !declare_only_);
    if (declare_only_) return Tensor{};
    if (recording()) return alloc(shape, dtype);
    const TensorView view = stored(key, shape);
    DZR_CHECK(view.dtype != DType::F8_E4M3,
              "{}: tensor {} is stored as f8_e4m3, but only Linear weights (with a .weight_scale) may be FP8",
              source_->location(key), key);
    Tensor t = alloc(shape, dtype);
    upload_or_defer(key, view, t);
    used_.insert(key);
    return t;
}

LinearWeight WeightLoader::require_linear(const std::string& key, const Shape& shape, WeightInit init) {
    record(key, shape, init, !declare_only_, true);
    if (declare_only_) return {};
    DZR_CHECK(shape.rank() == 2, "{}: a Linear weight is [out, in], got {}", key, shape.str());
    const int64_t out = shape[0];
    const auto fp8_tensors = [&] {
        return LinearWeight{alloc(shape, DType::F8_E4M3), alloc(Shape{out}, DType::F32)};
    };
    if (recording()) {
        if (precision_ == Precision::Fp8 && fp8_by_default(key)) return fp8_tensors();
        return {alloc(shape, backend_.compute_dtype()), {}};
    }
    const TensorView view = stored(key, shape);
    const bool stored_fp8 = view.dtype == DType::F8_E4M3;
    const bool run_fp8 = precision_ == Precision::Fp8 && (stored_fp8 || fp8_by_default(key));
    // NOTE: a measuring backend plans with data-less views: nothing may be read, only the dtypes matter
    const bool measuring = backend_.capabilities().measuring;
    const std::string scale_key = stored_fp8 ? fp8_scale_key(key) : std::string();
    if (stored_fp8 && !measuring) {
        const std::string problem = fp8_scale_problem(*source_, key, out);
        DZR_CHECK(problem.empty(), "{}: tensor {}: {}", source_->location(key), key, problem);
    }
    used_.insert(key);
    if (stored_fp8) used_.insert(scale_key);
    if (run_fp8) {
        LinearWeight lw = fp8_tensors();
        if (measuring) return lw;
        if (stored_fp8) {
            put(view, lw.w);
            put(*source_->find(scale_key), lw.scale);
        } else {
            const Fp8Weight q = quantize_weight_fp8(view, key);
            put(q.q, lw.w);
            put(q.scale, lw.scale);
        }
        return lw;
    }
    Tensor w = alloc(shape, backend_.compute_dtype());
    if (measuring) return {w, {}};
    if (stored_fp8) {
        // precision bf16 over an FP8 checkpoint: the stored values times their scales, in the compute dtype
        const Tensor deq = Tensor::host(shape, DType::F32);
        dequantize_rows_fp8_host(view, *source_->find(scale_key), deq);
        put(deq, w);
    } else {
        upload_or_defer(key, view, w);
    }
    return {w, {}};
}

Tensor WeightLoader::alloc(const Shape& shape, DType dtype) {
    return host_alloc_ ? host_alloc_(shape, dtype) : backend_.alloc(shape, dtype);
}

void WeightLoader::put(const TensorView& view, const Tensor& t) {
    if (host_alloc_)
        convert_copy_host(view, t.view());
    else
        backend_.upload(view, t);
}

void WeightLoader::upload_or_defer(const std::string& key, const TensorView& view, const Tensor& t) {
    std::optional<StoredRange> range;
    if (defer_ && !host_alloc_) range = source_->stored_range(key);
    if (range) {
        pending_.push_back({key, range->file, range->offset, view.dtype, t.view()});
        pending_tensors_.push_back(t);
    } else {
        put(view, t);
    }
}

TensorView WeightLoader::stored(const std::string& key, const Shape& shape) const {
    auto view = source_->find(key);
    DZR_CHECK(view.has_value(), "checkpoint is missing tensor {} (expected {})", key, shape.str());
    DZR_CHECK(view->shape == shape, "{}: tensor {}: expected {}, got {} {}", source_->location(key), key,
              shape.str(), dtype_name(view->dtype), view->shape.str());
    DZR_CHECK(dtype_is_float(view->dtype), "{}: tensor {}: expected a float dtype, got {}",
              source_->location(key), key, dtype_name(view->dtype));
    return *view;
}

void WeightLoader::declare(const std::string& key, const Shape& shape, WeightInit init) {
    record(key, shape, init, false);
}

void WeightLoader::record(const std::string& key, const Shape& shape, WeightInit init, bool loaded, bool linear) {
    declarations_.push_back({key, shape, init.resolved(shape), loaded, linear});
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
    if (recording()) return out;
    for (const auto& k : source_->keys())
        if (k.rfind(prefix, 0) == 0 && !used_.count(k)) out.push_back(k);
    return out;
}

}  // namespace dzr
