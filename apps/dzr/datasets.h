#pragma once
// The dataset reader the engine gets from the application (io::DatasetOpener): LeRobot through Arrow and FFmpeg
// in builds that have them (lib/dataset/), none otherwise (the engine then names what the build lacks).
#include <string>

#include "io/episode_source.h"
#if DZR_HAVE_DATASETS
#include "dataset/lerobot.h"
#endif

namespace dzr::app {

inline io::DatasetOpener dataset_opener() {
#if DZR_HAVE_DATASETS
    return dataset::open_lerobot;
#else
    return {};
#endif
}

/// "Arrow 26.0.1, libavformat 59.27.100, ..." or "none (built without Arrow and FFmpeg)".
inline std::string dataset_support() {
#if DZR_HAVE_DATASETS
    return dataset::dataset_libraries();
#else
    return "none (built without Arrow and FFmpeg)";
#endif
}

}  // namespace dzr::app
