#include "apps/dzr/bench_dataset.h"

#include <algorithm>
#include <cstdio>
#include <vector>

#include <fmt/format.h>

#include "apps/dzr/datasets.h"
#include "config/embodiment.h"
#include "core/timer.h"
#include "io/video_reader.h"
#include "rollout/episode_layout.h"
#include "rollout/frame_schedule.h"
#include "rollout/progress.h"

namespace dzr::app {

int run_dataset_bench(const DatasetBenchOptions& o) {
    const Embodiment e = builtin_embodiment(o.embodiment);
    io::EpisodeOptions eo;
    eo.layout = rollout::episode_layout(e);
    eo.open_video = io::open_video;
    eo.log_warnings = false;
    const rollout::FrameSchedule schedule;
    const auto refs = io::list_episode_refs(o.path, eo.layout, dataset_opener(), o.selection);
    std::printf("dzr bench prepare --dataset: %s, %zu episode%s, embodiment %s, one episode at a time, median of %d "
                "read%s\n",
                refs.front().source->describe().c_str(), refs.size(), refs.size() == 1 ? "" : "s", e.tag.c_str(),
                o.repeats, o.repeats == 1 ? "" : "s");
    std::vector<std::vector<std::string>> rows;
    double total_ms = 0;
    int64_t total_camera_frames = 0, total_calls = 0, total_bytes = 0;
    for (const auto& ref : refs) {
        std::vector<double> ms;
        io::Episode ep;
        for (int r = 0; r < o.repeats; ++r) {
            Timer t;
            ep = ref.source->read(ref, eo);
            ms.push_back(t.ms());
        }
        std::sort(ms.begin(), ms.end());
        const double m = ms[ms.size() / 2];
        const int64_t calls = schedule.num_calls(ep.num_frames);
        int64_t bytes = 0;
        for (const auto& c : ep.cameras) bytes += int64_t(c.frames.view().numel());
        total_ms += m, total_calls += calls, total_bytes += bytes;
        total_camera_frames += ep.num_frames * int64_t(ep.cameras.size());
        rows.push_back({ep.name, std::to_string(ep.num_frames), std::to_string(ep.cameras.size()), fmt::format("{:.1f}", m),
                        fmt::format("{:.0f}", 1e3 * double(ep.num_frames) * double(ep.cameras.size()) / m),
                        fmt::format("{:.1f}", m / double(calls))});
    }
    std::printf("%s", rollout::format_table({"episode", "frames", "cameras", "read ms", "camera frames/s", "ms per call"},
                                            rows).c_str());
    std::printf("total: %lld camera frames in %.1f ms: %.0f camera frames/s, %.1f MB/s of RGB, %.1f ms per call "
                "(%lld calls)\n",
                (long long)total_camera_frames, total_ms, 1e3 * double(total_camera_frames) / total_ms,
                1e-3 * double(total_bytes) / total_ms, total_ms / double(std::max<int64_t>(total_calls, 1)),
                (long long)total_calls);
    return 0;
}

}  // namespace dzr::app
