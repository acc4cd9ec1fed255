// libFuzzer target: episode.yaml text, read through read_episode() in a small episode directory (three
// 1-frame 2x2 cameras), so camera-file overrides, fps and prompt checks run as in a rollout.
#include <cstdint>

#include "core/error.h"
#include "fuzz_support.h"
#include "io/episode.h"
#include "io/npy.h"

namespace {

const std::filesystem::path& episode_dir() {
    static const std::filesystem::path dir = [] {
        const auto d = dzr::fuzz::scratch_dir() / "ep";
        std::filesystem::create_directories(d);
        const std::vector<uint8_t> frame(2 * 2 * 3, 128);
        for (auto cam : dzr::io::kCameraNames) {
            const dzr::TensorView v(const_cast<uint8_t*>(frame.data()), dzr::DType::U8,
                                    dzr::Shape{1, 2, 2, 3});
            dzr::io::write_npy(d / (std::string(cam) + ".npy"), v);
        }
        return d;
    }();
    return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const auto& dir = episode_dir();
    dzr::fuzz::write_bytes(dir / std::string(dzr::io::kEpisodeYaml), data, size);
    try {
        dzr::io::read_episode(dir, dzr::io::EpisodeOptions{});
    } catch (const dzr::Error&) {
    }
    return 0;
}
