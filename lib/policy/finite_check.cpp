#include "policy/finite_check.h"

#include <cmath>
#include <cstdint>

#include "core/error.h"

namespace dzr {

namespace {

[[noreturn]] void fail(std::string_view where, std::string_view what, int64_t count,
                       const std::string& shape) {
    DZR_THROW(
        "{}: {} has {} non-finite value{} (NaN/Inf) in {}; the model or its inputs went wrong (rerun with "
        "--check-finite to find the layer)",
        where, what, count, count == 1 ? "" : "s", shape);
}

}  // namespace

void check_finite_always(Backend& be, std::string_view where, std::string_view what, const TensorView& t) {
    ArenaScope scope(be.workspace());
    const TensorView count = be.scratch(Shape{1}, DType::I32);
    be.count_nonfinite(t, count);
    int32_t n = 0;
    be.download(count, TensorView(&n, DType::I32, Shape{1}));
    if (n != 0) fail(where, what, n, fmt::format("{} {}", dtype_name(t.dtype), t.shape.str()));
}

void check_finite_host(std::string_view where, std::string_view what, const float* values, size_t n) {
    int64_t bad = 0;
    for (size_t i = 0; i < n; ++i) bad += std::isfinite(values[i]) ? 0 : 1;
    if (bad != 0) fail(where, what, bad, fmt::format("{} values", n));
}

}  // namespace dzr
