// `dzr info`: build configuration and visible devices.
#include <cstdio>

#include "apps/dzr/command.h"
#include "backend/backend.h"

namespace dzr::app {
namespace {

CommandRegistrar reg([](CLI::App& app, std::function<int()>& run) {
    auto* cmd = app.add_subcommand("info", "Show the build configuration and the visible devices");
    cmd->callback([&run] {
        run = [] {
            std::printf("dzr %s (%s)\n", DZR_VERSION, DZR_GIT_HASH);
            if (cuda_backend_built())
                std::printf("cuda backend: built; device present: %s\n", cuda_device_available() ? "yes" : "no");
            else
                std::printf("cuda backend: not built\n");
#ifdef DZR_HAVE_OPENCV
            std::printf("video decoding: OpenCV\n");
#else
            std::printf("video decoding: not built (episodes must supply .npy frames)\n");
#endif
            return 0;
        };
    });
});

}  // namespace
}  // namespace dzr::app
