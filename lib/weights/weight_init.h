#pragma once
/// How a weight is initialised when dzr makes one up (`dzr ckpt make`, the benchmark's random weights): a hint
/// each network gives where it declares the weight (WeightLoader::require), recorded in the inventory. Loading a
/// checkpoint ignores it.
#include <cmath>
#include <cstdint>

#include "core/tensor.h"

namespace dzr {

enum class InitKind : uint8_t {
    Normal,      // N(0, value^2)
    OnesJitter,  // 1 + N(0, value^2): norm scales
    Constant,    // value
    FanIn,       // N(0, (value / sqrt(fan_in))^2), fan_in = the product of every dim but the first ([out, in, k...])
};

struct WeightInit {
    /// The standard deviation of biases and the jitter of norm scales.
    static constexpr float kBiasStd = 0.02f;
    static constexpr float kNormJitter = 0.05f;

    InitKind kind = InitKind::FanIn;
    float value = 1.0f;  // Normal: the std; OnesJitter: the jitter's std; Constant: the value; FanIn: the gain

    /// A weight [out, in, k...] scaled by its fan-in (the default of every require()).
    static WeightInit fan_in(float gain = 1.0f) { return {InitKind::FanIn, gain}; }
    static WeightInit normal(float std) { return {InitKind::Normal, std}; }
    static WeightInit constant(float v) { return {InitKind::Constant, v}; }
    /// A bias: N(0, kBiasStd^2).
    static WeightInit bias() { return {InitKind::Normal, kBiasStd}; }
    /// A norm's scale: 1 + N(0, kNormJitter^2).
    static WeightInit norm_scale() { return {InitKind::OnesJitter, kNormJitter}; }

    /// FanIn made Normal for a tensor of `shape`; every other kind as it is.
    WeightInit resolved(const Shape& shape) const {
        if (kind != InitKind::FanIn) return *this;
        int64_t fan_in = 1;
        for (int d = 1; d < shape.rank(); ++d) fan_in *= shape[d];
        return normal(value / std::sqrt(float(fan_in > 0 ? fan_in : 1)));
    }
    bool operator==(const WeightInit& o) const { return kind == o.kind && value == o.value; }
};

}  // namespace dzr
