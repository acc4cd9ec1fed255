// `dzr episode synth|inspect|convert`: make a synthetic episode, check episodes the way a rollout
// reads them, and decode .mp4 cameras to .npy for machines without video support.
#include <cstdio>
#include <memory>

#include "apps/dzr/command.h"
#include "core/error.h"
#include "core/log.h"
#include "io/atomic_file.h"
#include "io/episode.h"
#include "io/npy.h"
#include "io/synth_episode.h"
#include "io/video_reader.h"
#include "rollout/frame_schedule.h"
#include "rollout/progress.h"

namespace dzr::app {
namespace {

namespace fs = std::filesystem;

struct SynthArgs {
    std::string out;
    int64_t frames = 100;
    uint64_t seed = 0;
    int width = io::kDroidWidth;
    int height = io::kDroidHeight;
    double fps = io::kDroidFps;
    std::string format = "auto";
};

struct InspectArgs {
    std::string path;
    bool allow_truncate = false;
    std::string prompt;
};

struct ConvertArgs {
    std::string path;
    std::string out;
    bool allow_truncate = false;
};

int run_synth(const SynthArgs& a) {
    io::SynthOptions opt;
    opt.frames = a.frames;
    opt.seed = a.seed;
    opt.width = a.width;
    opt.height = a.height;
    opt.fps = a.fps;
    const std::string format = a.format == "auto" ? (io::video_io_available() ? "both" : "npy") : a.format;
    opt.write_npy_frames = format == "npy" || format == "both";
    if (format == "mp4" || format == "both") {
        DZR_CHECK(io::video_io_available(), "--frames-format {}: {} has no video support; use --frames-format npy",
                  a.format, "this dzr build");
        opt.write_video = [](const fs::path& p, const TensorView& f, double fps) {
            const std::string codec = io::write_video_mp4(p, f, fps);
            log()->info("{}: encoded with {}", p.filename().string(), codec);
            return codec;
        };
    }
    const auto files = io::write_synth_episode(a.out, opt);
    std::printf("wrote synthetic episode %s (%lld frames, %dx%d, %g fps, seed %llu):", a.out.c_str(),
                static_cast<long long>(a.frames), a.width, a.height, a.fps, static_cast<unsigned long long>(a.seed));
    for (const auto& f : files) std::printf(" %s", f.c_str());
    std::printf("\n");
    return 0;
}

io::EpisodeOptions episode_options(bool allow_truncate, const std::string& prompt) {
    io::EpisodeOptions opt;
    opt.allow_truncate = allow_truncate;
    opt.open_video = io::open_video;
    if (!prompt.empty()) opt.prompt = prompt;
    return opt;
}

int run_inspect(const InspectArgs& a) {
    const auto dirs = io::list_episodes(a.path);
    const rollout::FrameSchedule schedule;
    io::EpisodeOptions opt = episode_options(a.allow_truncate, a.prompt);
    opt.min_frames = schedule.min_frames();
    int failed = 0;
    std::vector<std::vector<std::string>> rows;
    for (const auto& dir : dirs) {
        try {
            const io::Episode ep = io::read_episode(dir, opt);
            std::printf("%s", ep.summary().c_str());
            std::printf("  calls: %lld (%s)\n", static_cast<long long>(schedule.num_calls(ep.num_frames)),
                        schedule.describe().c_str());
            rows.push_back({ep.name, std::to_string(ep.num_frames), fmt::format("{}", ep.fps),
                            std::to_string(schedule.num_calls(ep.num_frames)), ep.has_actions() ? "yes" : "no", "ok"});
        } catch (const Error& e) {
            ++failed;
            std::fprintf(stderr, "dzr: error: %s\n", e.what());
            rows.push_back({dir.filename().string(), "", "", "", "", "error"});
        }
    }
    if (dirs.size() > 1)
        std::printf("\n%s", rollout::format_table({"episode", "frames", "fps", "calls", "actions", "status"}, rows).c_str());
    return failed == 0 ? 0 : 1;
}

int run_convert(const ConvertArgs& a) {
    const auto dirs = io::list_episodes(a.path);
    const auto names = io::unique_episode_names(dirs);
    const io::EpisodeOptions opt = episode_options(a.allow_truncate, "");
    const bool single = dirs.size() == 1 && io::is_episode_dir(a.path);
    for (size_t i = 0; i < dirs.size(); ++i) {
        const io::Episode ep = io::read_episode(dirs[i], opt);
        const fs::path out = single ? fs::path(a.out) : fs::path(a.out) / names[i];
        DZR_CHECK(fs::absolute(out).lexically_normal() != fs::absolute(dirs[i]).lexically_normal(),
                  "{}: convert writes a new episode directory; choose an --out other than the source", out.string());
        fs::create_directories(out);
        for (const auto& cam : ep.cameras) io::write_npy(out / (cam.name + ".npy"), cam.frames.view());
        const int64_t T = ep.num_frames;
        if (ep.has_joint_position) io::write_npy_f64(out / io::kJointFile, {T, io::kJointDims}, ep.joint_position);
        if (ep.has_gripper_position) io::write_npy_f64(out / io::kGripperFile, {T, io::kGripperDims}, ep.gripper_position);
        if (ep.has_actions()) io::write_npy_f64(out / io::kActionsFile, {T, io::kActionDims}, ep.actions);
        io::write_file_atomic(out / io::kEpisodeYaml,
                              io::episode_yaml_text(ep.prompt, ep.fps, "converted by dzr episode convert from " +
                                                                           fs::absolute(dirs[i]).string()));
        std::printf("%s -> %s (%lld frames, .npy cameras)\n", dirs[i].string().c_str(), out.string().c_str(),
                    static_cast<long long>(T));
    }
    return 0;
}

CommandRegistrar reg([](CLI::App& app, std::function<int()>& run) {
    auto* cmd = app.add_subcommand("episode", "Make, check and convert episode directories");
    cmd->require_subcommand(1);

    auto synth = std::make_shared<SynthArgs>();
    auto* s = cmd->add_subcommand("synth", "Write a synthetic DROID-like episode (moving shapes, state, actions)");
    s->add_option("--out", synth->out, "Episode directory to write")->required();
    s->add_option("--frames", synth->frames, "Number of frames")->capture_default_str()->check(CLI::Range(1, 100000));
    s->add_option("--seed", synth->seed, "Seed of the trajectories and the prompt")->capture_default_str();
    s->add_option("--width", synth->width, "Frame width")->capture_default_str()->check(CLI::Range(16, 4096));
    s->add_option("--height", synth->height, "Frame height")->capture_default_str()->check(CLI::Range(16, 4096));
    s->add_option("--fps", synth->fps, "Frame rate")->capture_default_str()->check(CLI::PositiveNumber);
    s->add_option("--frames-format", synth->format,
                  "Camera files: npy, mp4, both, or auto (both with video support, else npy)")
        ->capture_default_str()
        ->check(CLI::IsMember({"auto", "npy", "mp4", "both"}));
    s->callback([&run, synth] { run = [synth] { return run_synth(*synth); }; });

    auto inspect = std::make_shared<InspectArgs>();
    auto* i = cmd->add_subcommand("inspect", "Read and validate episodes; print frames, sizes, state and calls");
    i->add_option("path", inspect->path, "Episode directory, parent directory of episodes, or list file")->required();
    i->add_flag("--allow-truncate", inspect->allow_truncate, "Cut cameras and arrays of different lengths to the shortest");
    i->add_option("--prompt", inspect->prompt, "Prompt replacing episode.yaml's");
    i->callback([&run, inspect] { run = [inspect] { return run_inspect(*inspect); }; });

    auto convert = std::make_shared<ConvertArgs>();
    auto* c = cmd->add_subcommand("convert", "Write episodes with .npy camera frames (decodes .mp4)");
    c->add_option("path", convert->path, "Episode directory, parent directory of episodes, or list file")->required();
    c->add_option("--out", convert->out, "Output episode directory (or parent directory for many)")->required();
    c->add_flag("--allow-truncate", convert->allow_truncate, "Cut cameras and arrays of different lengths to the shortest");
    c->callback([&run, convert] { run = [convert] { return run_convert(*convert); }; });
});

}  // namespace
}  // namespace dzr::app
