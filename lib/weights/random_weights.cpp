#include "weights/random_weights.h"

#include <algorithm>
#include <cmath>
#include <thread>

#include "core/half.h"

namespace dzr {

namespace {

/// A counter-based generator (splitmix64): element i of a pool depends on (seed, pool, i) only, so threads fill
/// disjoint ranges independently.
uint64_t mix(uint64_t z) {
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

float value_of(const WeightInit& init, uint64_t bits) {
    // uniform on [-sqrt(3), sqrt(3)): unit variance
    const float u = float(double(bits >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0) * 1.7320508f;
    switch (init.kind) {
        case InitKind::Normal:
        case InitKind::FanIn:  // resolved by the caller: Normal
            return u * init.value;
        case InitKind::OnesJitter:
            return 1.0f + u * init.value;
        case InitKind::Constant:
            return init.value;
    }
    return 0.0f;
}

}  // namespace

RandomWeightSource::RandomWeightSource(const std::vector<ExpectedWeight>& inventory, uint64_t seed, int threads) {
    std::vector<WeightInit> inits;
    std::vector<int64_t> sizes;
    for (const ExpectedWeight& w : inventory) {
        const WeightInit init = w.init.resolved(w.shape);
        size_t p = 0;
        while (p < inits.size() && !(inits[p] == init)) ++p;
        if (p == inits.size()) {
            inits.push_back(init);
            sizes.push_back(0);
        }
        sizes[p] = std::max(sizes[p], w.shape.numel());
        entries_.emplace(w.key, Entry{w.shape, p});
    }
    const int n = threads > 0 ? threads : std::max(1, int(std::thread::hardware_concurrency()));
    pools_.resize(inits.size());
    for (size_t p = 0; p < inits.size(); ++p) {
        std::vector<uint16_t>& pool = pools_[p];
        pool.resize(size_t(sizes[p]));
        const size_t per = (pool.size() + size_t(n) - 1) / size_t(n);
        std::vector<std::thread> workers;
        for (int t = 0; t < n; ++t) {
            const size_t begin = size_t(t) * per, end = std::min(pool.size(), begin + per);
            if (begin >= end) break;
            workers.emplace_back([&, begin, end, p] {
                const uint64_t key = mix(seed ^ (uint64_t(p) << 48));
                for (size_t i = begin; i < end; ++i) pool[i] = f32_to_bf16(value_of(inits[p], mix(key + i)));
            });
        }
        for (auto& w : workers) w.join();
    }
}

std::optional<TensorView> RandomWeightSource::find(const std::string& key) const {
    const auto it = entries_.find(key);
    if (it == entries_.end()) return std::nullopt;
    const std::vector<uint16_t>& pool = pools_[it->second.pool];
    return TensorView(const_cast<uint16_t*>(pool.data()), DType::BF16, it->second.shape, Device::cpu());
}

std::vector<std::string> RandomWeightSource::keys() const {
    std::vector<std::string> out;
    out.reserve(entries_.size());
    for (const auto& [k, e] : entries_) out.push_back(k);
    return out;
}

size_t RandomWeightSource::pool_bytes() const {
    size_t b = 0;
    for (const auto& p : pools_) b += p.size() * sizeof(uint16_t);
    return b;
}

}  // namespace dzr
