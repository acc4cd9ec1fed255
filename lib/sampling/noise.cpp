#include "sampling/noise.h"

#include <array>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace dzr {
namespace {

constexpr uint32_t kPhiloxM0 = 0xD2511F53u, kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u, kPhiloxW1 = 0xBB67AE85u;

uint32_t lo32(uint64_t v) {
    return uint32_t(v & 0xffffffffu);
}
uint32_t hi32(uint64_t v) {
    return uint32_t(v >> 32);
}

// Shapes equal after dropping leading 1s.
bool same_shape_modulo_leading_ones(const Shape& a, const Shape& b) {
    auto strip = [](const Shape& s) {
        std::vector<int64_t> d = s.vec();
        size_t k = 0;
        while (k + 1 < d.size() && d[k] == 1) ++k;
        return std::vector<int64_t>(d.begin() + long(k), d.end());
    };
    return strip(a) == strip(b);
}

const char* kind_name(NoiseKind k) {
    return k == NoiseKind::Video ? "video" : "action";
}

}  // namespace

std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
    for (int round = 0; round < 10; ++round) {
        if (round > 0) {
            k[0] += kPhiloxW0;
            k[1] += kPhiloxW1;
        }
        const uint64_t p0 = uint64_t(kPhiloxM0) * c[0];
        const uint64_t p1 = uint64_t(kPhiloxM1) * c[2];
        c = {hi32(p1) ^ c[1] ^ k[0], lo32(p1), hi32(p0) ^ c[3] ^ k[1], lo32(p0)};
    }
    return c;
}

void philox_normal_fill(uint64_t seed, uint64_t stream, std::span<float> out, uint64_t offset) {
    constexpr double kTwoPi = 2.0 * std::numbers::pi;
    constexpr double kInv2To32 = 1.0 / 4294967296.0;
    const std::array<uint32_t, 2> key{lo32(seed), hi32(seed)};
    uint64_t block = ~uint64_t(0);
    float z[4] = {0.f, 0.f, 0.f, 0.f};
    for (size_t i = 0; i < out.size(); ++i) {
        const uint64_t idx = offset + i;
        if (idx / 4 != block) {
            block = idx / 4;
            const auto u = philox4x32_10({lo32(block), hi32(block), lo32(stream), hi32(stream)}, key);
            for (int p = 0; p < 2; ++p) {
                const double ua = (double(u[2 * p]) + 0.5) * kInv2To32;  // (0, 1), never 0 or 1
                const double ub = (double(u[2 * p + 1]) + 0.5) * kInv2To32;
                const double r = std::sqrt(-2.0 * std::log(ua));
                z[2 * p] = float(r * std::cos(kTwoPi * ub));
                z[2 * p + 1] = float(r * std::sin(kTwoPi * ub));
            }
        }
        out[i] = z[idx % 4];
    }
}

void SeededNoise::fill(NoiseKind, int64_t, const Shape& shape, std::span<float> out) {
    DZR_CHECK(out.size() == size_t(shape.numel()), "noise: buffer of {} values for shape {}", out.size(),
              shape.str());
    philox_normal_fill(seed_, 0, out);
}

std::string SeededNoise::describe() const {
    return "philox4x32-10 normal noise, seed " + std::to_string(seed_);
}

FixedNoise::FixedNoise(Shape video_shape, std::vector<float> video, Shape action_shape,
                       std::vector<float> action, std::string origin)
    : video_shape_(video_shape),
      action_shape_(action_shape),
      video_(std::move(video)),
      action_(std::move(action)),
      origin_(std::move(origin)) {
    DZR_CHECK(video_.size() == size_t(video_shape_.numel()),
              "noise ({}): video noise has {} values for shape {}", origin_, video_.size(),
              video_shape_.str());
    DZR_CHECK(action_.size() == size_t(action_shape_.numel()),
              "noise ({}): action noise has {} values for shape {}", origin_, action_.size(),
              action_shape_.str());
}

void FixedNoise::fill(NoiseKind kind, int64_t, const Shape& shape, std::span<float> out) {
    const Shape& have = kind == NoiseKind::Video ? video_shape_ : action_shape_;
    const std::vector<float>& values = kind == NoiseKind::Video ? video_ : action_;
    DZR_CHECK(same_shape_modulo_leading_ones(have, shape), "noise ({}): {} noise has shape {}, expected {}",
              origin_, kind_name(kind), have.str(), shape.str());
    DZR_CHECK(out.size() == values.size(), "noise ({}): buffer of {} values for {} noise of {} values",
              origin_, out.size(), kind_name(kind), values.size());
    std::copy(values.begin(), values.end(), out.begin());
}

void upload_noise(Backend& be, NoiseSource& source, NoiseKind kind, int64_t call_index,
                  const TensorView& dst) {
    DZR_CHECK(dst.is_contiguous(), "noise: destination {} must be contiguous", dst.str());
    std::vector<float> host(size_t(dst.numel()));
    source.fill(kind, call_index, dst.shape, host);
    be.upload(TensorView(host.data(), DType::F32, dst.shape), dst);
}

}  // namespace dzr
