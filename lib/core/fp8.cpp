#include "core/fp8.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "core/convert.h"
#include "core/error.h"
#include "core/half.h"

namespace dzr {

Fp8RowScale fp8_row_scale(float amax) {
    const float a = std::fmax(amax, kFp8MinAmax);
    return {a / kFp8E4M3Max, kFp8E4M3Max / a};
}

float quantize_row_fp8(const float* x, int64_t n, uint8_t* q) {
    float amax = 0.0f;
    for (int64_t c = 0; c < n; ++c) amax = std::fmax(amax, std::fabs(x[c]));
    const Fp8RowScale s = fp8_row_scale(amax);
    for (int64_t c = 0; c < n; ++c) q[c] = f32_to_f8e4m3(x[c] * s.inv);
    return s.scale;
}

void quantize_rows_fp8_host(const TensorView& x, const TensorView& q, const TensorView& scales) {
    DZR_CHECK(x.device.is_cpu() && q.device.is_cpu() && scales.device.is_cpu(),
              "fp8 quantize: host views needed: x {} q {} scales {}", x.str(), q.str(), scales.str());
    DZR_CHECK(dtype_is_float(x.dtype) && x.dtype != DType::F8_E4M3, "fp8 quantize: x {} must be f32, bf16 or f16",
              x.str());
    DZR_CHECK(q.dtype == DType::F8_E4M3 && q.is_contiguous() && q.numel() == x.numel(),
              "fp8 quantize: q {} must be a contiguous f8_e4m3 tensor of x's {} elements", q.str(), x.numel());
    const int64_t cols = x.cols(), rows = x.rows();
    DZR_CHECK(scales.dtype == DType::F32 && scales.is_contiguous() && scales.numel() == rows,
              "fp8 quantize: scales {} must be a contiguous f32 vector of {} rows", scales.str(), rows);
    if (rows == 0 || cols == 0) return;
    DZR_CHECK(x.rank() == 2 || x.is_contiguous(), "fp8 quantize: x {} must be a matrix or contiguous", x.str());
    std::vector<float> row(size_t(cols), 0.0f);
    const TensorView xr = x.rank() == 2 ? x : x.reshape(Shape{rows, cols});
    for (int64_t r = 0; r < rows; ++r) {
        convert_copy_host(xr.slice(0, r, 1), TensorView(row.data(), DType::F32, Shape{1, cols}));
        scales.ptr<float>()[r] = quantize_row_fp8(row.data(), cols, q.ptr<uint8_t>() + r * cols);
    }
}

void dequantize_rows_fp8_host(const TensorView& q, const TensorView& scales, const TensorView& out) {
    DZR_CHECK(q.device.is_cpu() && scales.device.is_cpu() && out.device.is_cpu(),
              "fp8 dequantize: host views needed: q {} scales {} out {}", q.str(), scales.str(), out.str());
    DZR_CHECK(q.dtype == DType::F8_E4M3 && q.is_contiguous(), "fp8 dequantize: q {} must be contiguous f8_e4m3",
              q.str());
    const int64_t cols = q.cols(), rows = q.rows();
    DZR_CHECK(scales.dtype == DType::F32 && scales.is_contiguous() && scales.numel() == rows,
              "fp8 dequantize: scales {} must be a contiguous f32 vector of {} rows", scales.str(), rows);
    DZR_CHECK(out.is_contiguous() && out.numel() == q.numel() && dtype_is_float(out.dtype) &&
                  out.dtype != DType::F8_E4M3,
              "fp8 dequantize: out {} must be a contiguous f32, bf16 or f16 tensor of {} elements", out.str(),
              q.numel());
    if (rows == 0 || cols == 0) return;
    std::vector<float> row(static_cast<size_t>(cols));
    const uint8_t* pq = q.ptr<uint8_t>();
    const char* ps = static_cast<const char*>(scales.data);
    const size_t es = dtype_size(out.dtype);
    for (int64_t r = 0; r < rows; ++r) {
        float s;
        std::memcpy(&s, ps + r * int64_t(sizeof(float)), sizeof(float));  // NOTE: a mapped file may be unaligned
        for (int64_t c = 0; c < cols; ++c) row[size_t(c)] = f8e4m3_to_f32(pq[r * cols + c]) * s;
        convert_copy_host(TensorView(row.data(), DType::F32, Shape{cols}),
                          TensorView(static_cast<char*>(out.data) + size_t(r * cols) * es, out.dtype, Shape{cols}));
    }
}

}  // namespace dzr
