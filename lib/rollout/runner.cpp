#include "rollout/runner.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <future>

#include "backend/backend.h"
#include "backend/gpu_telemetry.h"
#include "config/model_fields.h"
#include "config/run_fields.h"
#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "io/atomic_file.h"
#include "io/episode.h"
#include "io/result_writer.h"
#include "policy/step_plan.h"
#include "rollout/episode_layout.h"
#include "rollout/fingerprint.h"
#include "rollout/frame_schedule.h"
#include "rollout/noise_files.h"
#include "rollout/predicted_video.h"
#include "rollout/progress.h"
#include "rollout/report_html.h"
#include "rollout/run_memory.h"
#include "rollout/validate.h"
#include "weights/checkpoint.h"
#include "weights/random_checkpoint.h"

namespace dzr::rollout {

std::atomic<bool>& interrupt_flag() {
    static std::atomic<bool> flag{false};
    return flag;
}

namespace {

/// The frames of every camera for a call, each copied into a contiguous uint8 [T, H, W, 3] buffer.
struct CallFrames {
    std::vector<std::vector<uint8_t>> data;
    std::vector<TensorView> views;
};

void gather_frames(const io::Episode& ep, const std::vector<int64_t>& frames, CallFrames& out) {
    out.data.resize(ep.cameras.size());
    out.views.resize(ep.cameras.size());
    for (size_t c = 0; c < ep.cameras.size(); ++c) {
        const Tensor& all = ep.cameras[c].frames;
        const int64_t H = all.shape()[1], W = all.shape()[2];
        const size_t frame_bytes = size_t(H * W * 3);
        out.data[c].resize(frames.size() * frame_bytes);
        for (size_t i = 0; i < frames.size(); ++i)
            std::memcpy(out.data[c].data() + i * frame_bytes, all.ptr<uint8_t>() + size_t(frames[i]) * frame_bytes,
                        frame_bytes);
        out.views[c] = TensorView(out.data[c].data(), DType::U8, Shape{int64_t(frames.size()), H, W, 3});
    }
}

Observation make_observation(const io::Episode& ep, const ScheduledCall& call, CallFrames& frames) {
    gather_frames(ep, call.frames, frames);
    Observation obs;
    // The episode's cameras and state keys are in the embodiment's order (io::EpisodeLayout).
    obs.views = frames.views;
    obs.state = ep.state_at(call.anchor);
    obs.prompt = ep.prompt;
    return obs;
}

CallTiming to_call_timing(const ScheduledCall& call, const PolicyCallResult& r) {
    CallTiming t;
    t.call = call.index;
    t.anchor = call.anchor;
    t.frames = call.frames;
    t.total_ms = r.times.total;
    t.phase(Phase::Preprocess) = r.times.preprocess;
    t.host_prepare_ms = r.times.host_prepare;
    t.dit_evaluations = r.dit_evaluations;
    t.phase(Phase::TextEncoder) = r.times.text_encoder;
    t.phase(Phase::ImageEncoder) = r.times.image_encoder;
    t.phase(Phase::VaeEncode) = r.times.vae_encode;
    t.phase(Phase::KvCommit) = r.times.kv_commit;
    t.phase(Phase::Dit) = r.times.dit;
    t.phase(Phase::Scheduler) = r.times.scheduler;
    t.phase(Phase::Postprocess) = r.times.postprocess;
    return t;
}

}  // namespace

double run_warmup(Engine& engine, Session& session, int& calls) {
    Timer t;
    // Frames at the recorded size (DROID's when the embodiment leaves it open).
    const Embodiment& e = engine.embodiment();
    const int fh = e.cameras[0].height > 0 ? e.cameras[0].height : io::kDroidHeight;
    const int fw = e.cameras[0].width > 0 ? e.cameras[0].width : io::kDroidWidth;
    std::vector<uint8_t> buf(size_t(4) * size_t(fh) * size_t(fw) * 3);
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = uint8_t((i * 2654435761u) >> 24);
    Observation obs;
    obs.prompt = kWarmupPrompt;
    obs.state.assign(size_t(e.state_dim()), 0.0);
    const int window_calls = engine.model().dit.max_chunk_size + 1;
    for (int c = 0; c < window_calls + 1; ++c) {
        const int T = c == 0 ? 1 : 4;
        obs.views.assign(e.cameras.size(), TensorView(buf.data(), DType::U8, Shape{T, fh, fw, 3}));
        PreparedObservation prepared = engine.prepare(obs);
        session.step(prepared);
        engine.recycle(std::move(prepared));
        ++calls;
    }
    // NOTE: the rollout prepares call i + 1 while call i steps, so it holds two sets of host buffers; the
    // sequential warm-up left one. A second set now keeps the first timed 4-frame call from allocating
    // (and page-faulting) ~3 MB of fresh memory.
    {
        obs.views.assign(e.cameras.size(), TensorView(buf.data(), DType::U8, Shape{4, fh, fw, 3}));
        PreparedObservation a = engine.prepare(obs), b = engine.prepare(obs);
        engine.recycle(std::move(a));
        engine.recycle(std::move(b));
    }
    session.reset();
    for (int d = 0; const KvCacheManager* m = engine.kv_manager(d); ++d) {
        DZR_CHECK(m->pool().num_free() == m->pool().num_blocks(),
                  "warm-up left the KV pool of {} with {} of {} blocks free (a leak)",
                  engine.placement().backends[size_t(d)]->device().str(), m->pool().num_free(), m->pool().num_blocks());
    }
    return t.ms();
}

namespace {

/// The next call's frames after `calls[i]` (the schedule's next anchor when `i` is the last call),
/// clamped to the episode.
std::vector<int64_t> next_call_frames(const FrameSchedule& schedule, const std::vector<ScheduledCall>& calls, size_t i,
                                      int64_t num_frames) {
    std::vector<int64_t> frames;
    if (i + 1 < calls.size()) {
        frames = calls[i + 1].frames;
    } else {
        // NOTE: call i + 1 is 4-frame chunk i (the first call is not a chunk).
        const int64_t anchor = schedule.anchor_of(int64_t(i));
        for (int64_t o : schedule.config().offsets) frames.push_back(anchor + o);
    }
    for (int64_t& f : frames) f = std::clamp<int64_t>(f, 0, num_frames - 1);
    return frames;
}

/// Decodes the episode's predicted video and writes it and the observed canvases (MP4 or .npy).
VideoTiming write_predicted_video(Engine& engine, const VideoAccumulator& acc, const io::Episode& ep,
                                  const RolloutOptions& opt, io::ResultWriter& writer) {
    VideoTiming vt;
    vt.fps = kVideoFps;
    vt.latent_frames = acc.latent_frames();
    Timer timer;
    const Tensor predicted = engine.decode_video(acc.joined());
    vt.decode_ms = timer.ms();
    vt.frames = predicted.shape()[0];
    timer.reset();
    const ModelConfig& m = engine.model();
    const Tensor observed = observed_canvases(ep, acc.observed(), canvas_spec(engine.embodiment(), m));
    DZR_CHECK(observed.shape() == predicted.shape(), "video: {} predicted frames but {} observed ones",
              predicted.view().str(), observed.view().str());
    if (opt.video_encoder) {
        const io::VideoEncoder& enc = *opt.video_encoder;
        for (const auto& [stem, frames] : {std::pair{"predicted_video", &predicted}, std::pair{"observed_video", &observed}})
            // NOTE: clang before 16 cannot capture a structured binding
            writer.write_with(stem + enc.extension, [&, video = frames](const std::filesystem::path& p) {
                enc.write(p, video->view(), vt.fps);
            });
    } else {
        log()->info("video: this build has no video encoder browsers play; writing predicted_video.npy and "
                    "observed_video.npy (uint8 [T, H, W, 3]) in {} instead", writer.dir().string());
        writer.write_npy("predicted_video.npy", predicted.view());
        writer.write_npy("observed_video.npy", observed.view());
    }
    vt.write_ms = timer.ms();
    return vt;
}

/// The episodes of a run, resolved from the given paths (datasets, or directories of the embodiment's layout),
/// with their output names.
struct EpisodePlan {
    std::vector<io::EpisodeRef> refs;
    std::vector<std::string> names;
};

EpisodePlan plan_episodes(const RolloutOptions& opt, const io::EpisodeLayout& layout) {
    EpisodePlan plan;
    for (const auto& e : opt.episodes) {
        auto found = io::list_episode_refs(e, layout, opt.open_dataset, opt.dataset_selection);
        plan.refs.insert(plan.refs.end(), found.begin(), found.end());
    }
    DZR_CHECK(!plan.refs.empty(), "no episodes found in the given paths");
    plan.names = io::unique_episode_names(plan.refs);
    return plan;
}

/// The checkpoint's embodiment the run uses (--embodiment, else the config's, else the checkpoint's only one),
/// checked against its geometry. Reads config.json and experiment_cfg only (no weights).
Embodiment rollout_embodiment(const RolloutOptions& opt) {
    const ModelConfig model = Checkpoint(opt.checkpoint).model_config();
    const std::string& tag = opt.run.embodiment;
    return select_embodiment(load_checkpoint_embodiments(opt.checkpoint), tag, model);
}

FrameSchedule make_frame_schedule(const config::RolloutConfig& r) {
    FrameScheduleConfig sc;
    sc.start_frame = r.start_frame;
    sc.stride = r.stride;
    sc.offsets.assign(r.offsets.begin(), r.offsets.end());
    sc.max_chunks = r.max_chunks > 0 ? r.max_chunks : -1;
    return FrameSchedule(sc);
}

/// What the run loaded once: the engine (checkpoint, backends, networks, KV pools) and its session, and what the
/// reports say of them.
struct LoadedRun {
    std::unique_ptr<Engine> engine;
    std::unique_ptr<Session> session;
    double load_ms = 0;
    int warmup_calls = 0;
    double warmup_ms = 0;
    /// Device-wide memory in use, sampled between calls only (after the load, the warm-up, each call and
    /// the video decode); the maximum so far goes into each episode's timing.json.
    std::optional<int64_t> peak_memory;

    void sample_memory() {
        if (const auto m = engine->device_memory_in_use()) peak_memory = std::max(peak_memory.value_or(0), *m);
    }
};

/// Loads the engine (the checkpoint checked against the run's geometry) on the run's devices and opens its session;
/// with the text pre-pass, umT5 encodes the valid episodes' prompts first. Validation's memory decisions apply.
LoadedRun load_run(const RolloutOptions& opt, const ValidatedRun& checked) {
    LoadedRun run;
    Timer load_timer;
    EngineOptions eo = rollout_engine_options(opt, checked.prompts);
    checked.memory_choices.apply(eo.run);
    if (!opt.noise_video.empty() || !opt.noise_action.empty()) {
        DZR_CHECK(!opt.noise_video.empty() && !opt.noise_action.empty(),
                  "--noise-video and --noise-action go together");
        eo.noise = load_noise_npy(opt.noise_video, opt.noise_action);
    }
    run.engine = Engine::load(eo);
    run.session = run.engine->open_session();
    run.load_ms = load_timer.ms();
    run.sample_memory();
    return run;
}

/// The start banner's warning for a checkpoint of random weights (empty for a real one).
std::string random_note(const Engine& engine) {
    const auto note = random_weights_note(engine.checkpoint()->config_json());
    return note ? fmt::format("\n  weights     {}: the actions are noise and the MSE means nothing", *note) : "";
}

/// The manifest.json of one episode: what ran, with which settings.
RunManifest make_manifest(const RolloutOptions& opt, const LoadedRun& run, const FrameSchedule& schedule,
                          const std::string& episode_location, const io::Episode& ep,
                          std::chrono::system_clock::time_point run_start, const std::optional<MemoryPlan>& memory_plan) {
    RunManifest manifest;
    manifest.episode = episode_location;
    manifest.checkpoint = opt.checkpoint.string();
    manifest.overrides = opt.overrides;
    manifest.seed = opt.run.sampling.seed;
    manifest.device = run.engine->devices();
    manifest.command_line = opt.command_line;
    manifest.start_time = iso8601_utc(run_start);
    // NOTE: every setting the run used (the config, its --set overrides and the command line's flags), from the
    // registry the config readers walk
    manifest.config = config::run_config_json(opt.run);
    // NOTE: the DiT evaluations that ran, as the step plan has them (a preset's count, a mask, or dynamic)
    const StepSchedule steps = make_step_schedule(opt.run.sampling);
    manifest.config["sampling"]["num_dit_steps"] = steps.is_dynamic() ? Json(nullptr) : Json(steps.num_network_steps());
    manifest.config["sampling"]["dit_steps"] = steps.describe();
    manifest.config["devices"] = run.engine->devices();
    manifest.config["rollout"]["schedule"] = schedule.describe();
    manifest.config["config_file"] = opt.run.source.string();
    manifest.config["embodiment"] = run.engine->embodiment().tag;
    manifest.extra = Json{{"policy", run.engine->describe()},
                          {"embodiment_source", run.engine->embodiment().source},
                          {"prompt", ep.prompt},
                          {"tokenizer", run.engine->tokenizer_path().string()},
                          {"warnings", ep.warnings}};
    manifest.extra["memory_plan"] = memory_plan ? memory_plan->to_json() : Json(nullptr);
    const auto random = random_weights_note(run.engine->checkpoint()->config_json());
    manifest.extra["random_weights"] = random ? Json(*random) : Json(nullptr);
    return manifest;
}

/// What one episode's calls produced, before anything is written.
struct EpisodeRun {
    io::ActionChunks chunks;
    TimingReport timing;
    VideoAccumulator video;
    std::vector<ScheduledCall> calls;
    bool interrupted = false;
};

/// Runs the calls of one episode (the host side of call i + 1 prepared on a second thread while call i runs)
/// and fills the summary's timings as it goes.
EpisodeRun run_episode_calls(const RolloutOptions& opt, LoadedRun& run, const FrameSchedule& schedule,
                             const io::Episode& ep, EpisodeSummary& summary, ProgressLine& progress,
                             const std::string& progress_prefix, int64_t episode_number, int64_t num_episodes) {
    Engine& engine = *run.engine;
    Session& session = *run.session;
    EpisodeRun er;
    er.chunks.horizon = engine.model().dit.num_action_per_block;
    er.chunks.dims = engine.embodiment().action_dim();
    er.chunks.columns = action_column_names(engine.embodiment());
    er.calls = schedule.calls(ep.num_frames);
    const std::vector<ScheduledCall>& calls = er.calls;
    session.reset();
    er.timing.device = engine.devices();
    er.timing.checkpoint_load_ms = run.load_ms;
    er.timing.warmup_calls = run.warmup_calls;
    er.timing.warmup_ms = run.warmup_ms;
    std::array<CallFrames, 2> frames;
    auto prepare_call = [&](size_t i) {
        Observation obs = make_observation(ep, calls[i], frames[i % 2]);
        return engine.prepare(obs);
    };
    std::future<PreparedObservation> next;
    if (!calls.empty()) next = std::async(std::launch::async, prepare_call, size_t(0));
    Timer episode_timer;
    for (size_t i = 0; i < calls.size(); ++i) {
        const ScheduledCall& call = calls[i];
        PreparedObservation prepared = next.get();
        if (interrupt_flag().load()) {
            er.interrupted = true;
            break;
        }
        if (i + 1 < calls.size()) next = std::async(std::launch::async, prepare_call, i + 1);
        PolicyCallResult r = session.step(prepared);
        engine.recycle(std::move(prepared));
        run.sample_memory();
        if (opt.save_video) {
            const Tensor latent = session.video_prediction();  // [z, 2 or 3, h, w]
            const bool with_reference = latent.shape()[1] > engine.model().dit.num_frame_per_block;
            const auto next_frames = next_call_frames(schedule, calls, i, ep.num_frames);
            const auto observed = observed_frame_indices(er.video.empty(), with_reference, call.frames.back(),
                                                         next_frames, engine.model().dit.num_frame_per_block);
            er.video.add(latent, observed);
        }
        er.chunks.append(call.anchor, r.actions);
        er.timing.calls.push_back(to_call_timing(call, r));
        summary.call_ms.push_back(r.times.total);
        const CallTiming& ct = er.timing.calls.back();
        for (int p = 0; p < kNumPhases; ++p) summary.phase_ms[size_t(p)].push_back(ct.phase_ms[size_t(p)]);
        summary.host_prepare_ms.push_back(ct.host_prepare_ms);
        if (!opt.quiet) {
            const double per_call = episode_timer.seconds() / double(call.index + 1);
            progress.update(progress_prefix + format_progress(episode_number, num_episodes, summary.name,
                                                              call.index + 1, int64_t(calls.size()), per_call));
        }
    }
    if (next.valid()) next.wait();
    return er;
}

/// --dry-run: what validation found, nothing run.
RolloutResult dry_run_result(const std::vector<std::string>& names, const ValidatedRun& checked) {
    RolloutResult result;
    for (size_t e = 0; e < names.size(); ++e) {
        EpisodeSummary s = checked.episodes[e].valid ? EpisodeSummary{} : checked.invalid_summary(e, names[e]);
        s.name = names[e];
        if (checked.episodes[e].valid) s.status = checked.finished[e] ? "skipped" : "valid";
        s.num_frames = checked.episodes[e].num_frames;
        result.episodes.push_back(std::move(s));
    }
    return result;
}

/// --profile: every profiled backend's JSON (keyed by device) into `path`, their tables on stderr.
void write_profile(const std::filesystem::path& path, const Engine& engine, bool quiet) {
    std::string table;
    io::write_file_atomic(path, engine.profile_json(&table).dump(1) + "\n");
    if (!quiet) std::fprintf(stderr, "%s", table.c_str());
    dzr::log()->info("profile: {}", path.string());
}


/// The episodes this process runs, validated: everything checkable without the weights (validate.h).
struct PreparedRun {
    Embodiment embodiment;
    io::EpisodeLayout layout;
    EpisodePlan plan;  ///< this rank's episodes (all of them when unsharded)
    FrameSchedule schedule;
    std::optional<ShardRun> shard;
    std::optional<ValidatedRun> checked;
};

/// Step 1: the embodiment, this rank's share of the episodes, and the validation of everything before any weight.
void prepare_run(const RolloutOptions& opt, PreparedRun& p) {
    p.layout = episode_layout(p.embodiment);
    p.plan = plan_episodes(opt, p.layout);
    io::EpisodeOptions count_options;
    count_options.layout = p.layout;
    count_options.allow_truncate = opt.allow_truncate;
    count_options.open_video = opt.open_video;
    std::string devices;
    for (const Device& d : opt.devices) {
        if (!devices.empty()) devices += ',';
        devices += d.str();
    }
    if (!opt.dry_run) {
        p.shard.emplace(opt.shard, opt.out_dir, p.plan.refs, p.plan.names, p.schedule, count_options, opt.resume,
                        devices);
        EpisodePlan mine;
        for (size_t e : p.shard->episodes()) {
            mine.refs.push_back(p.plan.refs[e]);
            mine.names.push_back(p.plan.names[e]);
        }
        p.plan = std::move(mine);
    }
    // NOTE: before the --resume shortcut, so that it refuses the finished episodes of another run
    p.checked.emplace(validate_run(opt, p.embodiment, p.plan.refs, p.plan.names, p.schedule));
    if (p.shard) p.shard->check_run_fingerprint(p.checked->fingerprint, opt.force);
}

/// The one-screen summary of what was loaded (stderr).
void print_banner(const RolloutOptions& opt, const LoadedRun& run, const PreparedRun& p) {
    if (opt.quiet) return;
    const Engine& engine = *run.engine;
    std::fprintf(stderr,
                 "dzr rollout\n"
                 "  checkpoint  %s (%zu shards, %s)%s\n"
                 "  model       %s\n"
                 "  embodiment  %s (%s)\n"
                 "  device      %s (%s)\n"
                 "  schedule    %s\n"
                 "  episodes    %zu -> %s\n"
                 "  load        %.1f s\n",
                 opt.checkpoint.string().c_str(), engine.checkpoint()->shards().size(),
                 config::format_bytes(engine.checkpoint()->tensor_bytes()).c_str(), random_note(engine).c_str(),
                 engine.describe().c_str(), engine.embodiment().tag.c_str(), engine.embodiment().source.c_str(),
                 engine.devices().c_str(), engine.backend().name().c_str(), p.schedule.describe().c_str(),
                 p.plan.refs.size(), opt.out_dir.string().c_str(), run.load_ms / 1e3);
}

/// Step 3: the warm-up (every forward shape, CUDA graphs captured), when asked.
void warm_up(const RolloutOptions& opt, LoadedRun& run) {
    if (!opt.warmup) return;
    run.warmup_ms = run_warmup(*run.engine, *run.session, run.warmup_calls);
    run.sample_memory();
    run.engine->reset_profiles();  // NOTE: --profile covers the episodes' calls only
    if (opt.quiet) return;
    const ForwardGraphStats g = run.session->graph_stats();
    const std::string graphs =
        g.enabled ? fmt::format(", {} CUDA graphs captured in {:.1f} s{}", g.captured, g.capture_ms / 1e3,
                                g.failed ? fmt::format(" ({} shapes run op by op)", g.failed) : "")
                  : "";
    std::fprintf(stderr, "  warm-up     %d calls, %.1f s, KV pool whole%s\n", run.warmup_calls, run.warmup_ms / 1e3,
                 graphs.c_str());
}

/// What the episode loop shares between episodes.
struct EpisodeLoop {
    const RolloutOptions& opt;
    const PreparedRun& prepared;
    LoadedRun& run;
    ProgressLine& progress;
    std::chrono::system_clock::time_point run_start;
};

/// Step 4b: an episode's files, whole files only, the done marker last. An interrupted episode keeps the actions,
/// timing and manifest of the calls it finished and gets no done marker (--resume redoes it).
void write_episode_outputs(const EpisodeLoop& loop, size_t e, const io::Episode& ep, const std::string& inputs_sha256,
                           EpisodeRun& er, EpisodeSummary& summary) {
    const RolloutOptions& opt = loop.opt;
    const ValidatedRun& checked = *loop.prepared.checked;
    const bool partial = er.interrupted;
    io::ResultWriter writer(opt.out_dir / loop.prepared.plan.names[e]);
    writer.clear_done();
    // NOTE: the video first: a decoder that fails (a non-finite frame) then leaves no actions behind
    if (!partial && opt.save_video && !er.video.empty()) {
        er.timing.video = write_predicted_video(*loop.run.engine, er.video, ep, opt, writer);
        loop.run.sample_memory();
    }
    writer.write_actions(er.chunks);
    er.timing.peak_gpu_memory_bytes = loop.run.peak_memory;
    if (checked.memory_plan) er.timing.memory_plan = memory_plan_summary(*checked.memory_plan);
    writer.write_json("timing.json", er.timing.to_json());
    RunManifest manifest = make_manifest(opt, loop.run, loop.prepared.schedule, loop.prepared.plan.refs[e].location(), ep,
                                         loop.run_start, checked.memory_plan);
    if (opt.shard.sharded()) manifest.extra["shard"] = opt.shard.to_json();
    if (partial)
        manifest.extra["interrupted"] = {{"calls_done", er.chunks.num_calls()}, {"calls_scheduled", er.calls.size()}};
    writer.write_json("manifest.json", manifest.to_json());
    if (partial) return;
    if (ep.has_actions())
        summary.metrics = write_metrics(writer, er.chunks, ep.actions, ep.num_frames, opt.metrics, opt.plot_png,
                                        action_keys(loop.run.engine->embodiment()));
    writer.mark_done(Json{{"num_frames", ep.num_frames},
                          {"num_calls", er.chunks.num_calls()},
                          {"fingerprint", checked.episode_fingerprint(e, inputs_sha256)}});
    summary.status = "ok";
}

/// An episode read for its calls, and the content hash its done marker records.
struct ReadEpisode {
    io::Episode ep;
    std::string inputs_sha256;
};

/// Reads planned episode `e` as validated (its warnings were logged then); hashes it on the same thread unless the
/// validation read its frames and did.
ReadEpisode read_planned_episode(const RolloutOptions& opt, const PreparedRun& p, size_t e) {
    io::EpisodeOptions eo;
    eo.layout = p.layout;
    eo.allow_truncate = opt.allow_truncate;
    eo.min_frames = p.schedule.min_frames();
    eo.prompt = opt.prompt;
    eo.open_video = opt.open_video;
    eo.log_warnings = false;
    ReadEpisode r{p.plan.refs[e].source->read(p.plan.refs[e], eo), p.checked->episodes[e].inputs_sha256};
    if (r.inputs_sha256.empty()) r.inputs_sha256 = episode_inputs_sha256(r.ep);
    return r;
}

/// Step 4a: one episode read (`episode`: maybe decoding on another thread already), its calls run and its files
/// written, filling `summary` as it goes (a failure keeps what was known). Sets `interrupted` when Ctrl-C stopped it.
void run_one_episode(const EpisodeLoop& loop, size_t e, std::future<ReadEpisode> episode, EpisodeSummary& summary,
                     bool& interrupted) {
    const RolloutOptions& opt = loop.opt;
    const PreparedRun& p = loop.prepared;
    const std::string& name = p.plan.names[e];
    ReadEpisode read = episode.get();
    io::Episode& ep = read.ep;
    const auto& warnings = p.checked->episodes[e].warnings;
    ep.warnings.insert(ep.warnings.end(), warnings.begin(), warnings.end());
    summary.num_frames = ep.num_frames;
    summary.num_calls = int64_t(p.schedule.calls(ep.num_frames).size());

    // NOTE: sampled on a thread of its own while the calls run (NVML; nothing on the CPU)
    GpuTelemetry telemetry(loop.run.engine->pci_bus_ids());
    telemetry.start();
    EpisodeRun er = run_episode_calls(opt, loop.run, p.schedule, ep, summary, loop.progress,
                                      p.shard->progress_prefix(), int64_t(e) + 1, int64_t(p.plan.refs.size()));
    const int64_t calls_run = int64_t(er.timing.calls.size());
    for (const GpuTelemetrySummary& g : telemetry.stop()) er.timing.gpu_telemetry.push_back(g.to_json(calls_run));
    set_gpu_energy(er.timing.gpu_telemetry, calls_run, summary);
    interrupted = er.interrupted;
    if (er.interrupted) {
        loop.progress.finish();
        summary.status = "interrupted";
        summary.num_calls = er.chunks.num_calls();
        log()->warn("interrupted: episode {} stopped after {} of {} calls; {}", name, er.chunks.num_calls(),
                    er.calls.size(),
                    er.chunks.num_calls() > 0 ? "actions, timing and manifest cover those calls; no done marker"
                                              : "nothing written for it");
        if (er.chunks.num_calls() == 0) return;
    }
    write_episode_outputs(loop, e, ep, read.inputs_sha256, er, summary);
    if (er.interrupted) return;
    loop.progress.finish();
    if (!opt.quiet)
        std::fprintf(stderr, "episode %s: %lld calls, median %.1f ms/call -> %s\n", name.c_str(),
                     (long long)er.chunks.num_calls(), er.timing.total_stats().median,
                     (opt.out_dir / name).string().c_str());
}

/// Step 4: every episode of this process; a failed one is recorded and the run goes on, Ctrl-C stops it.
void run_episodes(const RolloutOptions& opt, PreparedRun& p, LoadedRun& run, RolloutResult& result) {
    std::filesystem::create_directories(opt.out_dir);
    ProgressLine progress(stderr, opt.quiet ? ProgressLine::Mode::Plain : ProgressLine::Mode::Auto);
    const EpisodeLoop loop{opt, p, run, progress, std::chrono::system_clock::now()};
    const ValidatedRun& checked = *p.checked;
    // NOTE: the next episode to run is read (its videos decoded) on a host thread while this one's calls run, so a
    // dataset's decoding does not sit between episodes; two episodes' frames are in host memory at a time
    const size_t n = p.plan.refs.size();
    std::future<ReadEpisode> next;
    size_t next_e = n;
    const auto prefetch_after = [&](size_t e) {
        next_e = n;
        for (size_t k = e + 1; k < n; ++k)
            if (checked.episodes[k].valid && !checked.finished[k]) {
                next_e = k;
                next = std::async(std::launch::async, [&opt, &p, k] { return read_planned_episode(opt, p, k); });
                return;
            }
    };
    for (size_t e = 0; e < n && !result.interrupted; ++e) {
        const std::string& name = p.plan.names[e];
        const std::filesystem::path out = opt.out_dir / name;
        if (!checked.episodes[e].valid) {
            result.episodes.push_back(checked.invalid_summary(e, name));
            p.shard->note(result.episodes.back());
            continue;
        }
        if (checked.finished[e]) {
            result.episodes.push_back(summary_from_outputs(out, name));
            log()->info("episode {}: finished by an earlier run, skipped (--resume)", name);
            continue;
        }
        EpisodeSummary summary;
        summary.name = name;
        try {
            io::ResultWriter::clear_failed(out);
            // NOTE: a stale marker (--resume found an output gone) must not outlive an interrupted rerun
            if (e < checked.stale.size() && checked.stale[e]) std::filesystem::remove(out / std::string(io::kDoneMarker));
            std::future<ReadEpisode> episode =
                next_e == e ? std::move(next)
                            : std::async(std::launch::deferred, [&opt, &p, e] { return read_planned_episode(opt, p, e); });
            prefetch_after(e);
            run_one_episode(loop, e, std::move(episode), summary, result.interrupted);
        } catch (const Interrupted&) {
            throw;
        } catch (const Error& err) {
            progress.finish();
            summary.status = "failed";
            summary.error = err.what();
            ++result.failed;
            log()->error("episode {}: {}", name, err.what());
            record_failure(out, summary, opt.shard);
        }
        if (!result.interrupted) p.shard->note(summary);
        result.episodes.push_back(std::move(summary));
    }
}

/// Step 5: the profile, this rank's record and the merged summary, and (by the process that merged) the report.
void finish_run(const RolloutOptions& opt, PreparedRun& p, const LoadedRun& run, RolloutResult& result) {
    if (!opt.profile.empty()) write_profile(opt.profile, *run.engine, opt.quiet);
    result.shard = p.shard->finish(result.episodes, result.interrupted, opt.plot_png);
    // NOTE: the report covers the whole run, so the process that merged the summary writes it (the only process of
    // an unsharded run, the last rank of a sharded one)
    if (!opt.report || !result.shard.merged) return;
    // NOTE: every episode's files are complete by now; a report that cannot be written must not turn a finished
    // run into a failed one (`dzr report OUT` writes it again).
    try {
        write_report(opt.out_dir);
    } catch (const Error& err) {
        log()->warn("report: not written: {}", err.what());
    }
}

}  // namespace

RolloutResult run_rollout(const RolloutOptions& opt) {
    DZR_CHECK(!opt.episodes.empty(), "no episodes given");
    DZR_CHECK(!opt.out_dir.empty(), "no output directory given (--out)");
    RolloutResult result;
    PreparedRun p{rollout_embodiment(opt), {}, {}, make_frame_schedule(opt.run.rollout), {}, {}};
    prepare_run(opt, p);
    if (opt.dry_run) return dry_run_result(p.plan.names, *p.checked);
    p.shard->write_plan_first();
    // NOTE: finished as validated (a done marker whose outputs are gone is not), not merely marked done
    const auto& finished = p.checked->finished;
    const bool all_finished = std::all_of(finished.begin(), finished.end(), [](bool f) { return f; });
    if (auto done = p.shard->nothing_to_run(opt.resume && all_finished)) {
        result.episodes = std::move(*done);
        result.shard = p.shard->finish(result.episodes, false, opt.plot_png);
        return result;
    }
    LoadedRun run = load_run(opt, *p.checked);
    print_banner(opt, run, p);
    warm_up(opt, run);
    run_episodes(opt, p, run, result);
    finish_run(opt, p, run, result);
    return result;
}

}  // namespace dzr::rollout
