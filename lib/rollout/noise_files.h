#pragma once
/// Noise read from files (parity runs inject the reference's noise): the rollout level reads the .npy files,
/// sampling/noise.h holds the sources.
#include <filesystem>
#include <memory>

#include "sampling/noise.h"

namespace dzr {

/// Noise dumped by the reference as two .npy files (float32/float64/float16; e.g. video [1, 16, 2, 44, 80]
/// and action [1, 24, 32]), used for every call. Errors name the file.
std::unique_ptr<NoiseSource> load_noise_npy(const std::filesystem::path& video_npy,
                                            const std::filesystem::path& action_npy);

}  // namespace dzr
