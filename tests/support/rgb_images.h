#pragma once
/// Test images for the preprocessing tests.
#include <cstdint>
#include <random>

#include "policy/preprocess.h"

namespace dzr::test {

/// An h x w RGB image of uniform random bytes (mt19937_64 seeded with `seed`).
inline RgbImage random_image(int h, int w, uint64_t seed) {
    RgbImage img(h, w);
    std::mt19937_64 rng(seed);
    for (auto& p : img.pixels) p = uint8_t(rng() & 0xff);
    return img;
}

}  // namespace dzr::test
