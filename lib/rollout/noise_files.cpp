#include "rollout/noise_files.h"

#include "core/error.h"
#include "io/npy.h"

namespace dzr {

std::unique_ptr<NoiseSource> load_noise_npy(const std::filesystem::path& video_npy,
                                            const std::filesystem::path& action_npy) {
    const io::NpyArray video = io::read_npy(video_npy);
    const io::NpyArray action = io::read_npy(action_npy);
    DZR_CHECK(io::npy_dtype_is_float(video.dtype()) && io::npy_dtype_is_float(action.dtype()),
              "noise: {} is {} and {} is {}; float arrays expected", video_npy.string(), video.describe(),
              action_npy.string(), action.describe());
    DZR_CHECK(
        video.rank() >= 1 && video.rank() <= kMaxDims && action.rank() >= 1 && action.rank() <= kMaxDims,
        "noise: {} {} / {} {}: ranks 1..{} expected", video_npy.string(), video.shape_str(),
        action_npy.string(), action.shape_str(), kMaxDims);
    return std::make_unique<FixedNoise>(Shape(video.shape()), video.to_f32(), Shape(action.shape()),
                                        action.to_f32(), video_npy.string() + " and " + action_npy.string());
}

}  // namespace dzr
