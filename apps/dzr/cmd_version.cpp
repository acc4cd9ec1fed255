// `dzr info`: build configuration and visible devices.
#include <cstdio>
#include <cstdlib>

#include "apps/dzr/command.h"
#include "apps/dzr/datasets.h"
#include "backend/backend.h"
#include "backend/blas_kernels.h"
#include "backend/env_settings.h"
#include "config/settings.h"
#include "core/version.h"
#include "io/video_reader.h"

namespace dzr::app {
namespace {

CommandRegistrar reg([](CLI::App& app, std::function<int()>& run) {
    auto* cmd = app.add_subcommand("info", "Show the build configuration and the visible devices");
    auto env_table = std::make_shared<bool>(false);
    auto settings_table = std::make_shared<bool>(false);
    cmd->add_flag("--env", *env_table, "Print the table of the DZR_* environment variables dzr reads, and exit");
    cmd->add_flag("--settings", *settings_table,
                  "Print the table of the run settings (YAML key, flag, environment variable, default), and exit");
    cmd->callback([&run, env_table, settings_table] {
        run = [env_table, settings_table] {
            if (*env_table || *settings_table) {
                if (*settings_table) std::printf("%s", config::run_settings_table().c_str());
                if (*env_table) std::printf("%s%s", *settings_table ? "\n" : "", env_settings_table().c_str());
                return 0;
            }
            std::printf("dzr %s (%s)\n", dzr::version(), dzr::git_hash());
            if (cuda_backend_built())
                std::printf("cuda backend: built; device present: %s\n", cuda_device_available() ? "yes" : "no");
            else
                std::printf("cuda backend: not built\n");
            std::printf("cpu backend: OpenBLAS kernels %s%s\n", blas_core_name().c_str(),
                        env_value("DZR_BLAS_CORE_SET") ? " (chosen by dzr: OPENBLAS_CORETYPE)" : "");
#ifdef DZR_HAVE_OPENCV
            std::printf("video decoding: OpenCV\n");
#else
            std::printf("video decoding: not built (episodes must supply .npy frames)\n");
#endif
            std::printf("LeRobot datasets: %s\n", dataset_support().c_str());
            if (const auto enc = io::browser_video_encoder())
                std::printf("report videos: %s (%s)\n", enc->codec.c_str(), enc->extension.c_str());
            else
                std::printf("report videos: none (--save-video writes .npy frames; reports show frame strips)\n");
            return 0;
        };
    });
});

}  // namespace
}  // namespace dzr::app
