#pragma once
/// Attention over explicit K/V rows in double: the formula the KV-cache tests compare against.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace dzr::test {

/// q: [lq, heads, d] row-major; keys/values: one [heads * d] row per token. out: [lq, heads, d] =
/// softmax(scale · q kᵀ) v per head, in double (zero without keys).
inline std::vector<float> naive_attention(const std::vector<float>& q, int64_t lq,
                                          const std::vector<std::vector<float>>& keys,
                                          const std::vector<std::vector<float>>& values, int heads, int d,
                                          float scale) {
    std::vector<float> out(size_t(lq * heads * d), 0.f);
    if (keys.empty()) return out;
    for (int h = 0; h < heads; ++h) {
        for (int64_t i = 0; i < lq; ++i) {
            std::vector<double> w(keys.size());
            double mx = -INFINITY, sum = 0.0;
            for (size_t j = 0; j < keys.size(); ++j) {
                double dot = 0.0;
                for (int c = 0; c < d; ++c) dot += double(q[size_t((i * heads + h) * d + c)]) * keys[j][size_t(h * d + c)];
                w[j] = dot * scale;
                mx = std::max(mx, w[j]);
            }
            for (double& x : w) sum += (x = std::exp(x - mx));
            for (int c = 0; c < d; ++c) {
                double acc = 0.0;
                for (size_t j = 0; j < keys.size(); ++j) acc += w[j] / sum * values[j][size_t(h * d + c)];
                out[size_t((i * heads + h) * d + c)] = float(acc);
            }
        }
    }
    return out;
}

}  // namespace dzr::test
