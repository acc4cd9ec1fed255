#pragma once
/// Element types. One X-macro list drives the enum, names, sizes and safetensors codes.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace dzr {

//  X(enum, short name, safetensors code, bytes)
#define DZR_DTYPE_LIST(X)            \
    X(F32, "f32", "F32", 4)          \
    X(BF16, "bf16", "BF16", 2)       \
    X(F16, "f16", "F16", 2)          \
    X(I32, "i32", "I32", 4)          \
    X(I64, "i64", "I64", 8)          \
    X(U8, "u8", "U8", 1)             \
    X(F8_E4M3, "f8_e4m3", "F8_E4M3", 1)

enum class DType : uint8_t {
#define DZR_X(e, n, st, b) e,
    DZR_DTYPE_LIST(DZR_X)
#undef DZR_X
};

constexpr size_t dtype_size(DType t) {
    switch (t) {
#define DZR_X(e, n, st, b) \
    case DType::e:         \
        return b;
        DZR_DTYPE_LIST(DZR_X)
#undef DZR_X
    }
    return 0;
}

constexpr std::string_view dtype_name(DType t) {
    switch (t) {
#define DZR_X(e, n, st, b) \
    case DType::e:         \
        return n;
        DZR_DTYPE_LIST(DZR_X)
#undef DZR_X
    }
    return "?";
}

/// The dtype code used in safetensors headers ("BF16", "F32", ...).
constexpr std::string_view dtype_safetensors_code(DType t) {
    switch (t) {
#define DZR_X(e, n, st, b) \
    case DType::e:         \
        return st;
        DZR_DTYPE_LIST(DZR_X)
#undef DZR_X
    }
    return "?";
}

std::optional<DType> dtype_from_safetensors_code(std::string_view code);
std::optional<DType> dtype_from_name(std::string_view name);  // "f32", "bf16", ...

constexpr bool dtype_is_float(DType t) {
    return t == DType::F32 || t == DType::BF16 || t == DType::F16 || t == DType::F8_E4M3;
}

}  // namespace dzr
