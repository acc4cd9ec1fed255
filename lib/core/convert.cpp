#include "core/convert.h"

#include <array>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/half.h"

namespace dzr {
namespace {

double load(const char* p, DType t) {
    switch (t) {
        case DType::F32: {
            float f;
            std::memcpy(&f, p, 4);
            return f;
        }
        case DType::BF16: {
            uint16_t h;
            std::memcpy(&h, p, 2);
            return bf16_to_f32(h);
        }
        case DType::F16: {
            uint16_t h;
            std::memcpy(&h, p, 2);
            return f16_to_f32(h);
        }
        case DType::F8_E4M3:
            return f8e4m3_to_f32(uint8_t(*p));
        case DType::I32: {
            int32_t v;
            std::memcpy(&v, p, 4);
            return v;
        }
        case DType::I64: {
            int64_t v;
            std::memcpy(&v, p, 8);
            return double(v);
        }
        case DType::U8:
            return uint8_t(*p);
    }
    return 0;
}

void store(char* p, DType t, double v) {
    switch (t) {
        case DType::F32: {
            float f = float(v);
            std::memcpy(p, &f, 4);
            return;
        }
        case DType::BF16: {
            uint16_t h = f32_to_bf16(float(v));
            std::memcpy(p, &h, 2);
            return;
        }
        case DType::F16: {
            uint16_t h = f32_to_f16(float(v));
            std::memcpy(p, &h, 2);
            return;
        }
        case DType::F8_E4M3:
            // NOTE: a plain cast (no scale), saturating at ±448 (core/half.h); scaled quantization is core/fp8.h
            *p = char(f32_to_f8e4m3(float(v)));
            return;
        case DType::I32: {
            int32_t x = int32_t(v);
            std::memcpy(p, &x, 4);
            return;
        }
        case DType::I64: {
            int64_t x = int64_t(v);
            std::memcpy(p, &x, 8);
            return;
        }
        case DType::U8:
            *p = char(uint8_t(v));
            return;
    }
}

}  // namespace

void convert_copy_host(const TensorView& src, const TensorView& dst) {
    DZR_CHECK(src.device.is_cpu() && dst.device.is_cpu(), "convert_copy_host needs host views: {} -> {}",
              src.str(), dst.str());
    DZR_CHECK(src.numel() == dst.numel(), "copy: element counts differ: {} -> {}", src.str(), dst.str());
    DZR_CHECK(dst.is_contiguous(), "copy: destination must be contiguous: {}", dst.str());
    const int64_t n = src.numel();
    if (n == 0) return;
    if (src.is_contiguous() && src.dtype == dst.dtype) {
        if (src.data != dst.data) std::memmove(dst.data, src.data, size_t(n) * dtype_size(src.dtype));
        return;
    }
    const size_t es = dtype_size(src.dtype), ed = dtype_size(dst.dtype);
    const char* ps = static_cast<const char*>(src.data);
    char* pd = static_cast<char*>(dst.data);
    // NOTE: tight loops for the pairs model inputs and uploads use (the generic path below goes through a
    // double per element and costs ~10x more); same values: f32_to_bf16 / bf16_to_f32 are what store/load use.
    if (src.is_contiguous() && src.dtype == DType::F32 && dst.dtype == DType::BF16) {
        const auto* s32 = static_cast<const float*>(src.data);
        auto* d16 = static_cast<uint16_t*>(dst.data);
        for (int64_t i = 0; i < n; ++i) d16[i] = f32_to_bf16(s32[i]);
        return;
    }
    if (src.is_contiguous() && src.dtype == DType::BF16 && dst.dtype == DType::F32) {
        const auto* s16 = static_cast<const uint16_t*>(src.data);
        auto* d32 = static_cast<float*>(dst.data);
        for (int64_t i = 0; i < n; ++i) d32[i] = bf16_to_f32(s16[i]);
        return;
    }
    if (src.is_contiguous()) {
        for (int64_t i = 0; i < n; ++i) store(pd + i * ed, dst.dtype, load(ps + i * es, src.dtype));
        return;
    }
    std::array<int64_t, kMaxDims> idx{};
    const int r = src.rank();
    for (int64_t i = 0; i < n; ++i) {
        int64_t off = 0;
        for (int d = 0; d < r; ++d) off += idx[d] * src.strides[d];
        store(pd + i * ed, dst.dtype, load(ps + off * int64_t(es), src.dtype));
        for (int d = r - 1; d >= 0; --d) {
            if (++idx[d] < src.shape[d]) break;
            idx[d] = 0;
        }
    }
}

}  // namespace dzr
