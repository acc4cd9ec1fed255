#include "weights/fp8_weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/convert.h"
#include "core/error.h"
#include "core/fp8.h"
#include "core/parallel.h"
#include "weights/keys.h"

namespace dzr {

namespace {

constexpr std::string_view kWeightSuffix = ".weight";
constexpr std::string_view kBlocks = "blocks.";

/// "blocks.3.ffn.0" -> "blocks.*.ffn.0"; other module paths unchanged.
std::string layer_pattern(std::string_view module) {
    if (!keys::has_prefix(module, kBlocks)) return std::string(module);
    size_t i = kBlocks.size();
    const size_t digits = i;
    while (i < module.size() && module[i] >= '0' && module[i] <= '9') ++i;
    if (i == digits || i >= module.size() || module[i] != '.') return std::string(module);
    return std::string(kBlocks) + "*" + std::string(module.substr(i));
}

}  // namespace

const Fp8LayerRule* fp8_layer_rule(std::string_view weight_key) {
    if (!keys::has_prefix(weight_key, keys::kDit) || weight_key.size() <= kWeightSuffix.size() ||
        weight_key.substr(weight_key.size() - kWeightSuffix.size()) != kWeightSuffix)
        return nullptr;
    const std::string pattern = layer_pattern(
        weight_key.substr(keys::kDit.size(), weight_key.size() - keys::kDit.size() - kWeightSuffix.size()));
    for (const Fp8LayerRule& r : kFp8LayerTable)
        if (r.module == pattern) return &r;
    return nullptr;
}

bool fp8_by_default(std::string_view weight_key) {
    const Fp8LayerRule* r = fp8_layer_rule(weight_key);
    return r != nullptr && r->fp8;
}

std::string fp8_scale_key(std::string_view weight_key) {
    DZR_CHECK(weight_key.size() > kWeightSuffix.size() &&
                  weight_key.substr(weight_key.size() - kWeightSuffix.size()) == kWeightSuffix,
              "fp8: {} is not a Linear weight key (no .weight suffix)", weight_key);
    return std::string(weight_key) + "_scale";
}

Fp8Weight quantize_weight_fp8(const TensorView& w, const std::string& key, bool scales_only) {
    DZR_CHECK(w.rank() == 2 && w.device.is_cpu() && dtype_is_float(w.dtype) && w.dtype != DType::F8_E4M3,
              "fp8: tensor {} must be a host f32/bf16/f16 matrix [out, in] to be quantized, got {}", key, w.str());
    const int64_t out = w.dim(0), in = w.dim(1);
    Fp8Weight r{scales_only ? Tensor{} : Tensor::host(Shape{out, in}, DType::F8_E4M3),
                Tensor::host(Shape{out}, DType::F32)};
    // NOTE: rows are independent; a DROID layer's FFN weight has 70 M values, so blocks of rows go to threads
    constexpr int64_t kRowsPerTask = 64;
    const int64_t tasks = (out + kRowsPerTask - 1) / kRowsPerTask;
    const size_t threads = int64_t(out) * in >= (int64_t(1) << 20) ? worker_threads(size_t(tasks), 16) : 1;
    parallel_for(size_t(tasks), threads, [&](size_t task) {
        std::vector<float> row(static_cast<size_t>(in));
        const int64_t o0 = int64_t(task) * kRowsPerTask, o1 = std::min(out, o0 + kRowsPerTask);
        for (int64_t o = o0; o < o1; ++o) {
            convert_copy_host(w.slice(0, o, 1), TensorView(row.data(), DType::F32, Shape{1, in}));
            for (int64_t i = 0; i < in; ++i)
                DZR_CHECK(std::isfinite(row[size_t(i)]),
                          "fp8: tensor {} has a non-finite value {} at [{}, {}]; a weight with NaN or Inf cannot be "
                          "quantized",
                          key, row[size_t(i)], o, i);
            if (scales_only) {
                // NOTE: the amax of quantize_row_fp8, so both give the same scale
                float amax = 0.0f;
                for (int64_t i = 0; i < in; ++i) amax = std::fmax(amax, std::fabs(row[size_t(i)]));
                r.scale.ptr<float>()[o] = fp8_row_scale(amax).scale;
            } else {
                r.scale.ptr<float>()[o] = quantize_row_fp8(row.data(), in, r.q.ptr<uint8_t>() + o * in);
            }
        }
    });
    return r;
}

std::string fp8_scale_problem(const WeightSource& source, const std::string& weight_key, int64_t out) {
    const std::string key = fp8_scale_key(weight_key);
    const auto s = source.find(key);
    if (!s) return fmt::format("{} is missing (an F8_E4M3 weight needs its f32 [{}] scale)", key, out);
    if (s->dtype != DType::F32 || s->shape != Shape{out})
        return fmt::format("{} is {} {}, expected f32 [{}] (one scale per output channel)", key, dtype_name(s->dtype),
                           s->shape.str(), out);
    const auto* bytes = static_cast<const char*>(s->data);
    for (int64_t o = 0; o < out; ++o) {
        float v;
        std::memcpy(&v, bytes + o * int64_t(sizeof(float)), sizeof(float));  // NOTE: safetensors data may be unaligned
        if (!(std::isfinite(v) && v > 0.0f))
            return fmt::format("{} element {} is {}: scales must be finite and positive", key, o, v);
    }
    return {};
}

}  // namespace dzr
