// `dzr episode synth|inspect|convert`: make a synthetic episode of an embodiment, check episodes against an
// embodiment the way a rollout reads them, and decode .mp4 cameras to .npy for machines without video support.
#include <cstdio>
#include <memory>

#include "apps/dzr/command.h"
#include "apps/dzr/datasets.h"
#include "config/embodiment.h"
#include "core/error.h"
#include "core/log.h"
#include "io/atomic_file.h"
#include "io/episode.h"
#include "io/episode_source.h"
#include "io/npy.h"
#include "io/output_guard.h"
#include "io/synth_episode.h"
#include "io/video_reader.h"
#include "rollout/episode_layout.h"
#include "rollout/frame_schedule.h"
#include "weights/checkpoint.h"
#include "rollout/progress.h"

namespace dzr::app {
namespace {

namespace fs = std::filesystem;

/// Which embodiment an episode is read as: --ckpt's (its --embodiment, or its only one), else the built-in
/// --embodiment (oxe_droid by default).
struct EmbodimentArgs {
    std::string embodiment;
    std::string ckpt;

    Embodiment resolve() const {
        if (!ckpt.empty()) {
            const Checkpoint ck(ckpt);
            return select_embodiment(load_checkpoint_embodiments(ck.dir()), embodiment, ck.model_config());
        }
        return builtin_embodiment(embodiment.empty() ? "oxe_droid" : embodiment);
    }

    void add_to(CLI::App* cmd) {
        cmd->add_option("--embodiment", embodiment, "Embodiment tag (built-in: oxe_droid, agibot, yam; with --ckpt: "
                                                    "one of the checkpoint's)");
        cmd->add_option("--ckpt", ckpt, "Take the embodiment from this checkpoint's experiment_cfg");
    }
};

struct SynthArgs {
    std::string out;
    bool force = false;
    int64_t frames = 100;
    uint64_t seed = 0;
    int width = 0;     // 0: the embodiment's recorded size (DROID 320x180; 640x480 when it has none)
    int height = 0;
    double fps = 0.0;  // 0: the embodiment's
    std::string format = "auto";
    EmbodimentArgs embodiment;
};

struct InspectArgs {
    std::string path;
    io::DatasetSelection select;
    bool allow_truncate = false;
    std::string prompt;
    EmbodimentArgs embodiment;
};

struct ConvertArgs {
    std::string path;
    io::DatasetSelection select;
    std::string out;
    bool allow_truncate = false;
    EmbodimentArgs embodiment;
};

int run_synth(const SynthArgs& a) {
    std::error_code ec;
    // NOTE: a recorded episode is never overwritten by a synthetic one by accident
    DZR_CHECK(a.force || !fs::exists(a.out, ec) || (fs::is_directory(a.out, ec) && fs::is_empty(a.out, ec)),
              "--out {}: exists and is not an empty directory (an episode?); --force writes the synthetic episode's "
              "files into it", a.out);
    const Embodiment e = a.embodiment.resolve();
    io::SynthOptions opt;
    opt.layout = rollout::episode_layout(e);
    opt.frames = a.frames;
    opt.seed = a.seed;
    const CameraSpec& cam = e.cameras.at(0);
    opt.width = a.width > 0 ? a.width : cam.width > 0 ? cam.width : 640;
    opt.height = a.height > 0 ? a.height : cam.height > 0 ? cam.height : 480;
    opt.fps = a.fps > 0 ? a.fps : opt.layout.fps;
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
    std::printf("wrote synthetic %s episode %s (%lld frames, %dx%d, %g fps, seed %llu):", e.tag.c_str(), a.out.c_str(),
                static_cast<long long>(a.frames), opt.width, opt.height, opt.fps,
                static_cast<unsigned long long>(a.seed));
    for (const auto& f : files) std::printf(" %s", f.c_str());
    std::printf("\n");
    return 0;
}

io::EpisodeOptions episode_options(bool allow_truncate, const std::string& prompt, const Embodiment& e) {
    io::EpisodeOptions opt;
    opt.layout = rollout::episode_layout(e);
    opt.allow_truncate = allow_truncate;
    opt.open_video = io::open_video;
    if (!prompt.empty()) opt.prompt = prompt;
    return opt;
}

int run_inspect(const InspectArgs& a) {
    const Embodiment e = a.embodiment.resolve();
    const rollout::FrameSchedule schedule;
    io::EpisodeOptions opt = episode_options(a.allow_truncate, a.prompt, e);
    opt.min_frames = schedule.min_frames();
    opt.decode_frames = false;  // NOTE: the listing needs sizes and timestamps, not pixels
    const auto refs = io::list_episode_refs(a.path, opt.layout, dataset_opener(), a.select);
    int failed = 0;
    std::vector<std::vector<std::string>> rows;
    for (const auto& ref : refs) {
        // What the embodiment needs and the episode lacks, all of it, before decoding anything.
        const std::vector<std::string> problems = ref.source->check(ref, opt.layout);
        if (!problems.empty()) {
            ++failed;
            for (const auto& p : problems) std::fprintf(stderr, "dzr: error: %s\n", p.c_str());
            rows.push_back({ref.id, "", "", "", "", "error", ""});
            continue;
        }
        try {
            const io::Episode ep = ref.source->read(ref, opt);
            std::printf("%s", ep.summary().c_str());
            std::printf("  calls: %lld (%s)\n", static_cast<long long>(schedule.num_calls(ep.num_frames)),
                        schedule.describe().c_str());
            rows.push_back({ep.name, std::to_string(ep.num_frames), fmt::format("{}", ep.fps),
                            std::to_string(schedule.num_calls(ep.num_frames)), ep.has_actions() ? "yes" : "no", "ok",
                            ep.prompt.size() > 48 ? ep.prompt.substr(0, 45) + "..." : ep.prompt});
        } catch (const Error& e) {
            ++failed;
            std::fprintf(stderr, "dzr: error: %s\n", e.what());
            rows.push_back({ref.id, "", "", "", "", "error", ""});
        }
    }
    if (refs.size() > 1)
        std::printf("\n%s", rollout::format_table({"episode", "frames", "fps", "calls", "actions", "status", "prompt"}, rows)
                                .c_str());
    return failed == 0 ? 0 : 1;
}

int run_convert(const ConvertArgs& a) {
    const io::EpisodeOptions opt = episode_options(a.allow_truncate, "", a.embodiment.resolve());
    const auto refs = io::list_episode_refs(a.path, opt.layout, dataset_opener(), a.select);
    const auto names = io::unique_episode_names(refs);
    const bool single = refs.size() == 1 && refs[0].index < 0 && io::is_episode_dir(a.path, opt.layout);
    // NOTE: every output checked before anything is written: none may land inside a source episode or dataset
    io::InputSet inputs;
    for (size_t i = 0; i < refs.size(); ++i)
        for (const fs::path& in : refs[i].source->inputs(refs[i])) inputs.add_dir(in, "episode " + names[i]);
    for (size_t i = 0; i < refs.size(); ++i)
        inputs.check_output_dir(single ? fs::path(a.out) : fs::path(a.out) / names[i]);
    for (size_t i = 0; i < refs.size(); ++i) {
        const io::Episode ep = refs[i].source->read(refs[i], opt);
        const fs::path out = single ? fs::path(a.out) : fs::path(a.out) / names[i];
        fs::create_directories(out);
        for (const auto& cam : ep.cameras) io::write_npy(out / (cam.name + ".npy"), cam.frames.view());
        const int64_t T = ep.num_frames;
        for (const auto& st : ep.state)
            if (st.present) io::write_npy_f64(out / (st.name + ".npy"), {T, st.dim}, st.values);
        if (ep.has_actions()) io::write_npy_f64(out / io::kActionsFile, {T, ep.action_dim}, ep.actions);
        io::write_file_atomic(out / io::kEpisodeYaml,
                              io::episode_yaml_text(ep.prompt, ep.fps, "converted by dzr episode convert from " +
                                                                           refs[i].location()));
        std::printf("%s -> %s (%lld frames, .npy cameras)\n", refs[i].location().c_str(), out.string().c_str(),
                    static_cast<long long>(T));
    }
    return 0;
}

CommandRegistrar reg([](CLI::App& app, std::function<int()>& run) {
    auto* cmd = app.add_subcommand("episode", "Make, check and convert episodes (directories and LeRobot datasets)");
    cmd->require_subcommand(1);

    auto synth = std::make_shared<SynthArgs>();
    auto* s = cmd->add_subcommand("synth", "Write a synthetic episode of an embodiment (moving shapes, state, actions)");
    s->add_option("--out", synth->out, "Episode directory to write")->required();
    s->add_flag("--force", synth->force, "Write into an existing, non-empty directory");
    s->add_option("--frames", synth->frames, "Number of frames")->capture_default_str()->check(CLI::Range(1, 100000));
    s->add_option("--seed", synth->seed, "Seed of the trajectories and the prompt")->capture_default_str();
    s->add_option("--width", synth->width, "Frame width (default: the embodiment's recorded size)")
        ->check(CLI::Range(16, 4096));
    s->add_option("--height", synth->height, "Frame height (default: the embodiment's recorded size)")
        ->check(CLI::Range(16, 4096));
    s->add_option("--fps", synth->fps, "Frame rate (default: the embodiment's)")->check(CLI::PositiveNumber);
    synth->embodiment.add_to(s);
    s->add_option("--frames-format", synth->format,
                  "Camera files: npy, mp4, both, or auto (both with video support, else npy)")
        ->capture_default_str()
        ->check(CLI::IsMember({"auto", "npy", "mp4", "both"}));
    s->callback([&run, synth] { run = [synth] { return run_synth(*synth); }; });

    auto inspect = std::make_shared<InspectArgs>();
    auto* i = cmd->add_subcommand("inspect", "Read and validate episodes; print frames, sizes, state and calls");
    i->add_option("path", inspect->path,
                  "LeRobot dataset root, episode directory, parent directory of episodes, or list file")->required();
    i->add_option("--episodes", inspect->select.episodes, "Of a LeRobot dataset, only these episode indices: 0-99,120");
    i->add_option("--split", inspect->select.split, "Of a LeRobot dataset, only this split of meta/info.json");
    i->add_flag("--allow-truncate", inspect->allow_truncate, "Cut cameras and arrays of different lengths to the shortest");
    i->add_option("--prompt", inspect->prompt, "Prompt replacing episode.yaml's");
    inspect->embodiment.add_to(i);
    i->callback([&run, inspect] { run = [inspect] { return run_inspect(*inspect); }; });

    auto convert = std::make_shared<ConvertArgs>();
    auto* c = cmd->add_subcommand("convert", "Write episodes as directories with .npy camera frames (decodes .mp4 and datasets)");
    c->add_option("path", convert->path,
                  "LeRobot dataset root, episode directory, parent directory of episodes, or list file")->required();
    c->add_option("--episodes", convert->select.episodes, "Of a LeRobot dataset, only these episode indices: 0-99,120");
    c->add_option("--split", convert->select.split, "Of a LeRobot dataset, only this split of meta/info.json");
    c->add_option("--out", convert->out, "Output episode directory (or parent directory for many)")->required();
    c->add_flag("--allow-truncate", convert->allow_truncate, "Cut cameras and arrays of different lengths to the shortest");
    convert->embodiment.add_to(c);
    c->callback([&run, convert] { run = [convert] { return run_convert(*convert); }; });
});

}  // namespace
}  // namespace dzr::app
