#include "core/dtype.h"

namespace dzr {

std::optional<DType> dtype_from_safetensors_code(std::string_view code) {
#define DZR_X(e, n, st, b) \
    if (code == st) return DType::e;
    DZR_DTYPE_LIST(DZR_X)
#undef DZR_X
    return std::nullopt;
}

std::optional<DType> dtype_from_name(std::string_view name) {
#define DZR_X(e, n, st, b) \
    if (name == n) return DType::e;
    DZR_DTYPE_LIST(DZR_X)
#undef DZR_X
    return std::nullopt;
}

}  // namespace dzr
