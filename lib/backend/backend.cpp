#include "backend/backend.h"

#include <cmath>
#include <vector>

#include "core/error.h"

namespace dzr {

void Stream::begin_capture() { DZR_THROW("this stream cannot capture graphs"); }

std::unique_ptr<Graph> Stream::end_capture() { DZR_THROW("this stream cannot capture graphs"); }

void Backend::paged_attention(const AttentionParams&, const TensorView&, const PagedKvView&, int, const TensorView&,
                              const TensorView&, const TensorView&) {
    DZR_THROW("backend {} has no paged attention", name());
}

void Backend::resize_bicubic(const TensorView&, const TensorView&) {
    DZR_THROW("backend {} has no device bicubic resize (capabilities().resize_bicubic)", name());
}

void Backend::sin_cos_table(float step, const TensorView& out) {
    DZR_CHECK(out.rank() == 2 && out.dim(1) % 2 == 0 && out.is_contiguous(),
              "sin_cos_table: output must be a contiguous [T, 2·half], got {}", out.str());
    const int64_t rows = out.dim(0), half = out.dim(1) / 2;
    std::vector<float> host(size_t(rows * 2 * half));
    for (int64_t t = 0; t < rows; ++t)
        for (int64_t j = 0; j < half; ++j) {
            const float arg = float(t) * std::exp(-float(j) * step);
            host[size_t(t * 2 * half + j)] = std::sin(arg);
            host[size_t(t * 2 * half + half + j)] = std::cos(arg);
        }
    upload(TensorView(host.data(), DType::F32, out.shape), out);
}

void Backend::count_nonfinite(const TensorView& x, const TensorView& out) {
    DZR_CHECK(x.is_contiguous() && out.dtype == DType::I32 && out.numel() == 1,
              "count_nonfinite: x must be contiguous and out an i32 [1], got {} and {}", x.str(), out.str());
    std::vector<float> host(size_t(x.numel()));
    download(x, TensorView(host.data(), DType::F32, x.shape));
    int32_t n = 0;
    for (float v : host) n += std::isfinite(v) ? 0 : 1;
    upload(TensorView(&n, DType::I32, Shape{1}), out);
}

void Backend::scatter_kv(const PagedKvView&, int, const TensorView&, const TensorView&, const TensorView&, int64_t) {
    DZR_THROW("backend {} has no KV scatter", name());
}

void Backend::quantize_fp8(const TensorView&, const TensorView&, const TensorView&) {
    DZR_THROW("backend {} has no FP8 quantization", name());
}

void Backend::dequantize_fp8(const TensorView&, const TensorView&, const TensorView&) {
    DZR_THROW("backend {} has no FP8 dequantization", name());
}

void Backend::gemm_fp8(const TensorView&, const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                       const TensorView&) {
    DZR_THROW("backend {} has no FP8 GEMM", name());
}

std::unique_ptr<Backend> make_backend(const Device& device, const BackendOptions& options) {
    if (device.is_cpu()) return make_cpu_backend(options);
    return make_cuda_backend(device.index, options);
}

bool cuda_backend_built() {
#ifdef DZR_HAVE_CUDA
    return true;
#else
    return false;
#endif
}

#ifndef DZR_HAVE_CUDA
std::unique_ptr<Backend> make_cuda_backend(int, const BackendOptions&) {
    DZR_THROW("this dzr was built without CUDA (-DDZR_CUDA=OFF); use --device cpu");
}

bool cuda_device_available() { return false; }

int cuda_device_count() { return 0; }
#endif

}  // namespace dzr
