#include "backend/cpu/cpu_fp8.h"

#include <array>
#include <vector>

#include "backend/cpu/cpu_gemm.h"
#include "core/error.h"
#include "core/fp8.h"
#include "core/half.h"

namespace dzr::cpu {

namespace {

/// The f32 value of every E4M3 code.
const std::array<float, 256>& e4m3_table() {
    static const std::array<float, 256> table = [] {
        std::array<float, 256> t{};
        for (int i = 0; i < 256; ++i) t[size_t(i)] = f8e4m3_to_f32(uint8_t(i));
        return t;
    }();
    return table;
}

void require_host(const TensorView& t, DType dtype, const char* op, const char* what) {
    DZR_CHECK(t.device.is_cpu() && t.dtype == dtype, "cpu backend: {} needs a host {} {}, got {}", op,
              dtype_name(dtype), what, t.str());
}

/// Decodes a contiguous F8_E4M3 matrix into f32 codes (no scale).
std::vector<float> decode(const TensorView& q) {
    const auto& table = e4m3_table();
    std::vector<float> out(size_t(q.numel()));
    const uint8_t* p = q.ptr<const uint8_t>();
    for (size_t i = 0; i < out.size(); ++i) out[i] = table[p[i]];
    return out;
}

}  // namespace

void quantize_fp8(const TensorView& x, const TensorView& q, const TensorView& scales) {
    const char* op = "quantize_fp8";
    require_host(x, DType::F32, op, "x");
    require_host(q, DType::F8_E4M3, op, "q");
    require_host(scales, DType::F32, op, "scales");
    DZR_CHECK(x.rank() >= 1 && (x.rank() == 2 ? x.strides[1] == 1 || x.dim(1) <= 1 : x.is_contiguous()) &&
                  (q.shape == Shape{x.rows(), x.cols()}),
              "cpu backend: {}: x {} must be [rows, cols] with a unit last stride and q {} the same [rows, cols]", op,
              x.str(), q.str());
    quantize_rows_fp8_host(x, q, scales);
}

void dequantize_fp8(const TensorView& q, const TensorView& scales, const TensorView& out) {
    const char* op = "dequantize_fp8";
    require_host(q, DType::F8_E4M3, op, "q");
    require_host(scales, DType::F32, op, "scales");
    require_host(out, DType::F32, op, "out");
    DZR_CHECK(q.shape == out.shape && q.is_contiguous() && out.is_contiguous(),
              "cpu backend: {}: q {} and out {} must be contiguous and of one shape", op, q.str(), out.str());
    dequantize_rows_fp8_host(q, scales, out);
}

void gemm_fp8(const TensorView& xq, const TensorView& x_scales, const TensorView& wq, const TensorView& w_scales,
              const TensorView& bias, const TensorView& out) {
    const char* op = "gemm_fp8";
    require_host(xq, DType::F8_E4M3, op, "xq");
    require_host(wq, DType::F8_E4M3, op, "wq");
    require_host(x_scales, DType::F32, op, "x_scales");
    require_host(w_scales, DType::F32, op, "w_scales");
    require_host(out, DType::F32, op, "out");
    DZR_CHECK(xq.rank() == 2 && wq.rank() == 2 && out.rank() == 2 && xq.is_contiguous() && wq.is_contiguous(),
              "cpu backend: {} needs contiguous matrices xq [M, K], wq [N, K] and out [M, N]: {} {} {}", op, xq.str(),
              wq.str(), out.str());
    const int64_t M = xq.dim(0), K = xq.dim(1), N = wq.dim(0);
    DZR_CHECK(wq.dim(1) == K && out.dim(0) == M && out.dim(1) == N && (out.strides[1] == 1 || N <= 1),
              "cpu backend: {} shapes disagree: xq {} wq {} out {}", op, xq.str(), wq.str(), out.str());
    DZR_CHECK(x_scales.is_contiguous() && x_scales.numel() == M && w_scales.is_contiguous() && w_scales.numel() == N,
              "cpu backend: {} needs x_scales [{}] and w_scales [{}], got {} and {}", op, M, N, x_scales.str(),
              w_scales.str());
    if (bias.defined()) {
        require_host(bias, DType::F32, op, "bias");
        DZR_CHECK(bias.is_contiguous() && bias.numel() == N, "cpu backend: {} bias {} does not match N={}", op,
                  bias.str(), N);
    }
    if (M == 0 || N == 0) return;
    const int64_t ldc = std::max<int64_t>(out.strides[0], 1);
    float* c = out.ptr<float>();
    if (K == 0) {
        for (int64_t m = 0; m < M; ++m)
            for (int64_t n = 0; n < N; ++n) c[m * ldc + n] = 0.0f;
    } else {
        const std::vector<float> a = decode(xq), b = decode(wq);
        cpu::sgemm({false, true, M, N, K, 1.0f, a.data(), K, b.data(), K, 0.0f, c, ldc});
    }
    const float* sx = x_scales.ptr<const float>();
    const float* sw = w_scales.ptr<const float>();
    const float* pb = bias.defined() ? bias.ptr<const float>() : nullptr;
    for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n) {
            float v = c[m * ldc + n] * sx[m] * sw[n];
            if (pb) v += pb[n];
            c[m * ldc + n] = v;
        }
}

}  // namespace dzr::cpu
