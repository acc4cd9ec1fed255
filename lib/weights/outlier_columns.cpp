#include "weights/outlier_columns.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "core/error.h"
#include "core/half.h"
#include "weights/fp8_weights.h"
#include "weights/random_checkpoint.h"

namespace dzr {

bool takes_outlier_columns(const ExpectedWeight& w) {
    return w.linear && w.shape.rank() == 2 && fp8_by_default(w.key);
}

std::vector<int64_t> outlier_columns(uint64_t seed, std::string_view key, int64_t in_features, int count) {
    DZR_CHECK(count >= 0 && count < in_features,
              "outlier columns: weight {} has {} input columns, cannot choose {}", key, in_features, count);
    WeightRng rng(seed, std::string(key) + "#outlier_columns");
    std::vector<int64_t> cols;
    cols.reserve(size_t(count));
    // NOTE: rejection of repeats; count is a few columns of thousands, so this draws little more than count
    // values
    while (int(cols.size()) < count) {
        const int64_t c = int64_t(rng.next_u64() % uint64_t(in_features));
        if (std::find(cols.begin(), cols.end(), c) == cols.end()) cols.push_back(c);
    }
    std::sort(cols.begin(), cols.end());
    return cols;
}

void apply_outlier_columns(const ExpectedWeight& w, uint64_t seed, const OutlierOptions& o, DType dtype,
                           std::vector<uint8_t>& bytes) {
    if (!o.enabled() || !takes_outlier_columns(w)) return;
    DZR_CHECK(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16,
              "outlier columns: weight {} is {}, expected f32, bf16 or f16", w.key, dtype_name(dtype));
    const int64_t rows = w.shape[0], in = w.shape[1];
    const size_t es = dtype_size(dtype);
    DZR_CHECK(bytes.size() == size_t(rows * in) * es, "outlier columns: weight {} has {} bytes, expected {}",
              w.key, bytes.size(), size_t(rows * in) * es);
    const std::vector<int64_t> cols = outlier_columns(seed, w.key, in, o.columns);
    for (int64_t r = 0; r < rows; ++r)
        for (const int64_t c : cols) {
            uint8_t* p = bytes.data() + size_t(r * in + c) * es;
            if (dtype == DType::F32) {
                float v;
                std::memcpy(&v, p, 4);
                v *= o.scale;
                std::memcpy(p, &v, 4);
            } else {
                uint16_t h;
                std::memcpy(&h, p, 2);
                const float v = (dtype == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h)) * o.scale;
                h = dtype == DType::BF16 ? f32_to_bf16(v) : f32_to_f16(v);
                std::memcpy(p, &h, 2);
            }
        }
}

size_t check_outlier_options(const std::vector<ExpectedWeight>& weights, const OutlierOptions& o) {
    DZR_CHECK(o.columns >= 0, "--outlier-columns must be at least 0, got {}", o.columns);
    DZR_CHECK(std::isfinite(o.scale) && o.scale != 0.0f,
              "--outlier-scale must be finite and non-zero, got {}", o.scale);
    size_t n = 0;
    for (const auto& w : weights) {
        if (!takes_outlier_columns(w)) continue;
        DZR_CHECK(o.columns < w.shape[1],
                  "--outlier-columns {}: weight {} has {} input columns (at most {} can be outliers)",
                  o.columns, w.key, w.shape[1], w.shape[1] - 1);
        ++n;
    }
    return n;
}

}  // namespace dzr
