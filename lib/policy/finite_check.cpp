#include "policy/finite_check.h"

#include <cmath>

#include "core/error.h"

namespace dzr {

namespace {

[[noreturn]] void fail(std::string_view where, std::string_view what, int64_t count, const std::string& shape) {
    DZR_THROW(
        "{}: {} has {} non-finite value{} (NaN/Inf) in {}; the model or its inputs went wrong (rerun with "
        "--check-finite to find the layer)",
        where, what, count, count == 1 ? "" : "s", shape);
}

}  // namespace

FiniteChecks::FiniteChecks(Backend& be, int capacity) : be_(be) {
    counts_ = be_.alloc(Shape{capacity}, DType::I32);
    labels_.reserve(size_t(capacity));
    host_.resize(size_t(capacity));
}

void FiniteChecks::begin_call(int call) {
    call_ = call;
    labels_.clear();
}

void FiniteChecks::check(const char* what, int step, const TensorView& t) {
    const int64_t slot = int64_t(labels_.size());
    DZR_CHECK(slot < counts_.numel(), "finite checks: more than {} in one call", counts_.numel());
    be_.count_nonfinite(t, counts_.view().slice(0, slot, 1));
    labels_.push_back({what, step, t.numel()});
}

void FiniteChecks::verify() {
    if (labels_.empty() || be_.capabilities().measuring) return;
    const int64_t n = int64_t(labels_.size());
    be_.download(counts_.view().slice(0, 0, n), TensorView(host_.data(), DType::I32, Shape{n}));
    for (int64_t i = 0; i < n; ++i) {
        if (host_[size_t(i)] == 0) continue;
        const Label& l = labels_[size_t(i)];
        const std::string where = l.step >= 0 ? fmt::format("call {}, denoising step {}", call_, l.step)
                                              : fmt::format("call {}, after denoising", call_);
        fail(where, l.what, host_[size_t(i)], fmt::format("{} values", l.numel));
    }
}

void check_finite_host(std::string_view where, std::string_view what, const float* values, size_t n) {
    int64_t bad = 0;
    for (size_t i = 0; i < n; ++i) bad += std::isfinite(values[i]) ? 0 : 1;
    if (bad != 0) fail(where, what, bad, fmt::format("{} values", n));
}

}  // namespace dzr
