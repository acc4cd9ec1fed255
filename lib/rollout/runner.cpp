#include "rollout/runner.h"

#include <cstdio>
#include <cstring>
#include <future>

#include "backend/backend.h"
#include "config/model_fields.h"
#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "io/episode.h"
#include "io/result_writer.h"
#include "policy/step_plan.h"
#include "rollout/frame_schedule.h"
#include "rollout/predicted_video.h"
#include "rollout/progress.h"
#include "rollout/validate.h"
#include "weights/checkpoint.h"
#include "weights/inventory.h"

namespace dzr::rollout {

std::atomic<bool>& interrupt_flag() {
    static std::atomic<bool> flag{false};
    return flag;
}

namespace {

/// Frames of one camera for a call, copied into a contiguous uint8 [T, H, W, 3] buffer.
struct CallFrames {
    std::array<std::vector<uint8_t>, io::kNumCameras> data;
    std::array<TensorView, io::kNumCameras> views;
};

void gather_frames(const io::Episode& ep, const std::vector<int64_t>& frames, CallFrames& out) {
    for (int c = 0; c < io::kNumCameras; ++c) {
        const Tensor& all = ep.cameras[size_t(c)].frames;
        const int64_t H = all.shape()[1], W = all.shape()[2];
        const size_t frame_bytes = size_t(H * W * 3);
        out.data[size_t(c)].resize(frames.size() * frame_bytes);
        for (size_t i = 0; i < frames.size(); ++i)
            std::memcpy(out.data[size_t(c)].data() + i * frame_bytes,
                        all.ptr<uint8_t>() + size_t(frames[i]) * frame_bytes, frame_bytes);
        out.views[size_t(c)] = TensorView(out.data[size_t(c)].data(), DType::U8,
                                          Shape{int64_t(frames.size()), H, W, 3});
    }
}

Observation make_observation(const io::Episode& ep, const ScheduledCall& call, CallFrames& frames) {
    gather_frames(ep, call.frames, frames);
    Observation obs;
    // Camera order of io::kCameraNames: exterior 1, exterior 2, wrist.
    obs.exterior_1 = frames.views[0];
    obs.exterior_2 = frames.views[1];
    obs.wrist = frames.views[2];
    const auto state = ep.state_at(call.anchor);
    for (int j = 0; j < 7; ++j) obs.joint_position[size_t(j)] = state[size_t(j)];
    obs.gripper_position = state[7];
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

/// Synthetic calls that walk every forward shape of a window: prefill (1 frame), commits at start
/// frames 1, 3, 5 (denoising reads 880 · {1, 3, 5, 7} tokens), and the window reset of a 4-frame call.
double run_warmup(DreamZeroPolicy& policy, int& calls) {
    Timer t;
    std::vector<uint8_t> buf(size_t(4) * 180 * 320 * 3);
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = uint8_t((i * 2654435761u) >> 24);
    Observation obs;
    obs.prompt = "warm up";
    const int window_calls = policy.model().dit.max_chunk_size + 1;
    for (int c = 0; c < window_calls + 1; ++c) {
        const int T = c == 0 ? 1 : 4;
        TensorView v(buf.data(), DType::U8, Shape{T, 180, 320, 3});
        obs.exterior_1 = obs.exterior_2 = obs.wrist = v;
        policy.step(obs);
        ++calls;
    }
    // NOTE: the rollout prepares call i + 1 while call i steps, so it holds two sets of host buffers; the
    // sequential warm-up left one. A second set now keeps the first timed 4-frame call from allocating
    // (and page-faulting) ~3 MB of fresh memory.
    {
        TensorView v(buf.data(), DType::U8, Shape{4, 180, 320, 3});
        obs.exterior_1 = obs.exterior_2 = obs.wrist = v;
        PreparedObservation a = policy.prepare(obs), b = policy.prepare(obs);
        policy.recycle(std::move(a));
        policy.recycle(std::move(b));
    }
    policy.reset();
    if (const KvCacheManager* m = policy.kv_manager()) {
        DZR_CHECK(m->pool().num_free() == m->plan().num_blocks,
                  "warm-up left the KV pool with {} of {} blocks free (a leak)", m->pool().num_free(),
                  m->plan().num_blocks);
    }
    return t.ms();
}

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
VideoTiming write_predicted_video(DreamZeroPolicy& policy, const VideoAccumulator& acc, const io::Episode& ep,
                                  const RolloutOptions& opt, io::ResultWriter& writer) {
    VideoTiming vt;
    vt.fps = kVideoFps;
    vt.latent_frames = acc.latent_frames();
    Timer timer;
    const Tensor predicted = policy.decode_video(acc.joined());
    vt.decode_ms = timer.ms();
    vt.frames = predicted.shape()[0];
    timer.reset();
    const ModelConfig& m = policy.model();
    const Tensor observed = observed_canvases(ep, acc.observed(), ViewSize{m.canvas_height / 2, m.canvas_width / 2});
    DZR_CHECK(observed.shape() == predicted.shape(), "video: {} predicted frames but {} observed ones",
              predicted.view().str(), observed.view().str());
    if (opt.write_video) {
        for (const auto& [name, frames] : {std::pair{"predicted_video.mp4", &predicted}, std::pair{"observed_video.mp4", &observed}}) {
            const Tensor* video = frames;  // NOTE: clang before 16 cannot capture a structured binding
            writer.write_with(name, [&](const std::filesystem::path& p) { opt.write_video(p, video->view(), vt.fps); });
        }
    } else {
        log()->info("video: this build has no video encoder; writing predicted_video.npy and observed_video.npy "
                    "(uint8 [T, H, W, 3]) in {} instead of MP4s", writer.dir().string());
        writer.write_npy("predicted_video.npy", predicted.view());
        writer.write_npy("observed_video.npy", observed.view());
    }
    vt.write_ms = timer.ms();
    return vt;
}

/// --save-video needs the VAE decoder: a checkpoint whose config says it has none may still hold the
/// weights; otherwise the error names the missing keys.
void require_decoder(ModelConfig& model, const Checkpoint& ckpt, const std::filesystem::path& path) {
    if (model.vae.has_decoder) return;
    ModelConfig with = model;
    with.vae.has_decoder = true;
    std::vector<std::string> missing;
    for (const auto& w : expected_weights(with))
        if (w.key.find("vae.model.decoder.") != std::string::npos && !ckpt.find(w.key)) missing.push_back(w.key);
    if (missing.empty()) {
        model.vae.has_decoder = true;
        return;
    }
    std::string list;
    for (size_t i = 0; i < std::min<size_t>(3, missing.size()); ++i) list += (i ? ", " : "") + missing[i];
    DZR_THROW("--save-video: checkpoint {} has no VAE decoder ({} decoder tensors missing: {}{}); write one with "
              "model.vae.has_decoder: true (`dzr ckpt make`) or convert the full checkpoint",
              path.string(), missing.size(), list, missing.size() > 3 ? ", ..." : "");
}

/// The episodes of a run, resolved from the given paths, with their output names.
struct EpisodePlan {
    std::vector<std::filesystem::path> dirs;
    std::vector<std::string> names;
};

EpisodePlan plan_episodes(const RolloutOptions& opt) {
    EpisodePlan plan;
    for (const auto& e : opt.episodes) {
        auto found = io::list_episodes(e);
        plan.dirs.insert(plan.dirs.end(), found.begin(), found.end());
    }
    DZR_CHECK(!plan.dirs.empty(), "no episode directories found in the given paths");
    plan.names = io::unique_episode_names(plan.dirs);
    return plan;
}

FrameSchedule make_frame_schedule(const config::RolloutConfig& r) {
    FrameScheduleConfig sc;
    sc.start_frame = r.start_frame;
    sc.stride = r.stride;
    sc.offsets.assign(r.offsets.begin(), r.offsets.end());
    sc.max_chunks = r.max_chunks > 0 ? r.max_chunks : -1;
    return FrameSchedule(sc);
}

/// What the run loaded once: the checkpoint, the backend and the policy, and what the reports say of them.
struct LoadedRun {
    std::unique_ptr<Checkpoint> ckpt;
    std::filesystem::path tokenizer;
    std::unique_ptr<Backend> backend;
    std::unique_ptr<DreamZeroPolicy> policy;
    double load_ms = 0;
    int warmup_calls = 0;
    double warmup_ms = 0;
    /// Device-wide memory in use, sampled between calls only (after the load, the warm-up, each call and
    /// the video decode); the maximum so far goes into each episode's timing.json.
    std::optional<int64_t> peak_memory;

    void sample_memory() {
        if (const auto m = backend->device_memory_in_use()) peak_memory = std::max(peak_memory.value_or(0), *m);
    }
};

/// Opens and checks the checkpoint against the run's geometry and builds the policy on the run's device.
LoadedRun load_run(const RolloutOptions& opt) {
    LoadedRun run;
    Timer load_timer;
    run.ckpt = std::make_unique<Checkpoint>(opt.checkpoint);
    const Checkpoint& ckpt = *run.ckpt;
    ModelConfig model = ckpt.model_config();
    if (opt.save_video) require_decoder(model, ckpt, opt.checkpoint);
    if (opt.have_config_model) {
        const auto diffs = config::diff_model_configs(opt.run.model, model);
        if (!diffs.empty()) {
            std::string msg = fmt::format("checkpoint {} does not have the geometry of {} ({} difference{}):",
                                          opt.checkpoint.string(), opt.run.source.string(), diffs.size(),
                                          diffs.size() == 1 ? "" : "s");
            for (const auto& d : diffs) msg += "\n  " + d;
            DZR_THROW("{}", msg);
        }
    }
    const WeightCheckReport check = check_weights(ckpt, expected_weights(model));
    DZR_CHECK(check.ok(), "{}", check.message("checkpoint " + opt.checkpoint.string()));
    DZR_CHECK(ckpt.has_metadata(), "checkpoint {}: experiment_cfg/metadata.json is missing (q01/q99 statistics)",
              opt.checkpoint.string());
    const EmbodimentStatistics& stats = ckpt.statistics(opt.run.embodiment);
    if (!opt.tokenizer.empty()) {
        run.tokenizer = resolve_tokenizer_path(opt.tokenizer);
    } else {
        DZR_CHECK(ckpt.tokenizer_path().has_value(),
                  "checkpoint {} has no umT5 tokenizer (spiece.model); give one with --tokenizer",
                  opt.checkpoint.string());
        run.tokenizer = *ckpt.tokenizer_path();
    }

    run.backend = make_backend(opt.device);
    PolicyOptions po;
    po.sampling = opt.run.sampling;
    po.kv = opt.run.kv;
    po.kv_mode = opt.kv_mode;
    po.embodiment = opt.run.embodiment;
    po.check_finite = opt.check_finite;
    po.video_decode = opt.save_video;
    if (!opt.noise_video.empty() || !opt.noise_action.empty()) {
        DZR_CHECK(!opt.noise_video.empty() && !opt.noise_action.empty(),
                  "--noise-video and --noise-action go together");
        po.noise = load_noise_npy(opt.noise_video, opt.noise_action);
    }
    run.policy = std::make_unique<DreamZeroPolicy>(model, ckpt, stats, run.tokenizer, po, *run.backend);
    run.load_ms = load_timer.ms();
    run.sample_memory();
    return run;
}

/// The manifest.json of one episode: what ran, with which settings.
RunManifest make_manifest(const RolloutOptions& opt, const LoadedRun& run, const FrameSchedule& schedule,
                          const std::filesystem::path& episode_dir, const io::Episode& ep,
                          std::chrono::system_clock::time_point run_start) {
    RunManifest manifest;
    manifest.episode = episode_dir.string();
    manifest.checkpoint = opt.checkpoint.string();
    manifest.overrides = opt.overrides;
    manifest.seed = opt.run.sampling.seed;
    manifest.device = opt.device.str();
    manifest.command_line = opt.command_line;
    manifest.start_time = iso8601_utc(run_start);
    const StepSchedule steps = make_step_schedule(opt.run.sampling);
    manifest.config = Json{{"sampling",
                            {{"num_inference_steps", opt.run.sampling.num_inference_steps},
                             {"sigma_shift", opt.run.sampling.sigma_shift},
                             {"cfg_scale", opt.run.sampling.cfg_scale},
                             {"num_dit_steps", steps.is_dynamic() ? Json(nullptr) : Json(steps.num_network_steps())},
                             {"dit_steps", steps.describe()},
                             {"dynamic_schedule", opt.run.sampling.dynamic_schedule},
                             {"seed", opt.run.sampling.seed}}},
                           {"kv",
                            {{"mode", opt.kv_mode == KvMode::Paged ? "paged" : "dense"},
                             {"window_frames", opt.run.kv.window_frames},
                             {"sink_frames", opt.run.kv.sink_frames},
                             {"frames_per_block", opt.run.kv.frames_per_block},
                             {"reset_at_boundary", opt.run.kv.reset_at_boundary}}},
                           {"rollout", {{"schedule", schedule.describe()}}},
                           {"embodiment", opt.run.embodiment},
                           {"config_file", opt.run.source.string()}};
    manifest.extra = Json{{"policy", run.policy->describe()},
                          {"prompt", ep.prompt},
                          {"tokenizer", run.tokenizer.string()},
                          {"warnings", ep.warnings}};
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
                             int64_t episode_number, int64_t num_episodes) {
    DreamZeroPolicy& policy = *run.policy;
    EpisodeRun er;
    er.calls = schedule.calls(ep.num_frames);
    const std::vector<ScheduledCall>& calls = er.calls;
    policy.reset();
    er.timing.device = opt.device.str();
    er.timing.checkpoint_load_ms = run.load_ms;
    er.timing.warmup_calls = run.warmup_calls;
    er.timing.warmup_ms = run.warmup_ms;
    std::array<CallFrames, 2> frames;
    auto prepare_call = [&](size_t i) {
        Observation obs = make_observation(ep, calls[i], frames[i % 2]);
        return policy.prepare(obs);
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
        PolicyCallResult r = policy.step(prepared);
        policy.recycle(std::move(prepared));
        run.sample_memory();
        if (opt.save_video) {
            const Tensor latent = policy.video_prediction();  // [z, 2 or 3, h, w]
            const bool with_reference = latent.shape()[1] > policy.model().dit.num_frame_per_block;
            const auto next_frames = next_call_frames(schedule, calls, i, ep.num_frames);
            const auto observed = observed_frame_indices(er.video.empty(), with_reference, call.frames.back(),
                                                         next_frames, policy.model().dit.num_frame_per_block);
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
            progress.update(format_progress(episode_number, num_episodes, summary.name, call.index + 1,
                                            int64_t(calls.size()), per_call));
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

}  // namespace

RolloutResult run_rollout(const RolloutOptions& opt) {
    RolloutResult result;
    auto& log = *dzr::log();
    DZR_CHECK(!opt.episodes.empty(), "no episodes given");
    DZR_CHECK(!opt.out_dir.empty(), "no output directory given (--out)");

    // ---- everything that can be checked without the weights (validate.h) ------------------------------
    const EpisodePlan plan = plan_episodes(opt);
    const FrameSchedule schedule = make_frame_schedule(opt.run.rollout);
    const ValidatedRun checked = validate_run(opt, plan.dirs, plan.names, schedule);
    if (opt.dry_run) return dry_run_result(plan.names, checked);

    // ---- checkpoint and policy ------------------------------------------------------------------------
    LoadedRun run = load_run(opt);
    DreamZeroPolicy& policy = *run.policy;
    if (!opt.quiet) {
        std::fprintf(stderr,
                     "dzr rollout\n"
                     "  checkpoint  %s (%zu shards, %s)\n"
                     "  model       %s\n"
                     "  device      %s (%s)\n"
                     "  schedule    %s\n"
                     "  episodes    %zu -> %s\n"
                     "  load        %.1f s\n",
                     opt.checkpoint.string().c_str(), run.ckpt->shards().size(),
                     config::format_bytes(run.ckpt->tensor_bytes()).c_str(), policy.describe().c_str(),
                     opt.device.str().c_str(), run.backend->name().c_str(), schedule.describe().c_str(),
                     plan.dirs.size(), opt.out_dir.string().c_str(), run.load_ms / 1e3);
    }

    // ---- warm-up ------------------------------------------------------------------------------------------
    if (opt.warmup) {
        run.warmup_ms = run_warmup(policy, run.warmup_calls);
        run.sample_memory();
        if (!opt.quiet)
            std::fprintf(stderr, "  warm-up     %d calls, %.1f s, KV pool whole\n", run.warmup_calls, run.warmup_ms / 1e3);
    }

    // ---- episodes ---------------------------------------------------------------------------------------
    std::filesystem::create_directories(opt.out_dir);
    ProgressLine progress(stderr, opt.quiet ? ProgressLine::Mode::Plain : ProgressLine::Mode::Auto);
    const auto run_start = std::chrono::system_clock::now();
    const int64_t num_episodes = int64_t(plan.dirs.size());
    for (size_t e = 0; e < plan.dirs.size() && !result.interrupted; ++e) {
        const std::string& name = plan.names[e];
        const std::filesystem::path out = opt.out_dir / name;
        if (!checked.episodes[e].valid) {
            result.episodes.push_back(checked.invalid_summary(e, name));
            continue;
        }
        if (checked.finished[e]) {
            result.episodes.push_back(summary_from_outputs(out, name));
            log.info("episode {}: finished by an earlier run, skipped (--resume)", name);
            continue;
        }
        EpisodeSummary summary;
        summary.name = name;
        try {
            io::EpisodeOptions eo;
            eo.allow_truncate = opt.allow_truncate;
            eo.min_frames = schedule.min_frames();
            eo.prompt = opt.prompt;
            eo.open_video = opt.open_video;
            eo.log_warnings = false;  // logged when validated
            io::Episode ep = io::read_episode(plan.dirs[e], eo);
            ep.warnings.insert(ep.warnings.end(), checked.episodes[e].warnings.begin(), checked.episodes[e].warnings.end());
            summary.num_frames = ep.num_frames;
            summary.num_calls = int64_t(schedule.calls(ep.num_frames).size());

            EpisodeRun er = run_episode_calls(opt, run, schedule, ep, summary, progress, int64_t(e) + 1, num_episodes);
            result.interrupted = er.interrupted;
            // Outputs: whole files only, the done marker last. An interrupted episode keeps the actions,
            // timing and manifest of the calls it finished and gets no done marker (--resume redoes it).
            const bool partial = er.interrupted;
            if (partial) {
                progress.finish();
                summary.status = "interrupted";
                summary.num_calls = er.chunks.num_calls();
                log.warn("interrupted: episode {} stopped after {} of {} calls; {}", name, er.chunks.num_calls(),
                         er.calls.size(),
                         er.chunks.num_calls() > 0 ? "actions, timing and manifest cover those calls; no done marker"
                                                   : "nothing written for it");
                if (er.chunks.num_calls() == 0) {
                    result.episodes.push_back(std::move(summary));
                    break;
                }
            }
            io::ResultWriter writer(out);
            writer.clear_done();
            writer.write_actions(er.chunks);
            if (!partial && opt.save_video && !er.video.empty()) {
                er.timing.video = write_predicted_video(policy, er.video, ep, opt, writer);
                run.sample_memory();
            }
            er.timing.peak_gpu_memory_bytes = run.peak_memory;
            writer.write_json("timing.json", er.timing.to_json());
            RunManifest manifest = make_manifest(opt, run, schedule, plan.dirs[e], ep, run_start);
            if (partial)
                manifest.extra["interrupted"] = {{"calls_done", er.chunks.num_calls()}, {"calls_scheduled", er.calls.size()}};
            writer.write_json("manifest.json", manifest.to_json());
            if (partial) {
                result.episodes.push_back(std::move(summary));
                break;
            }
            if (ep.has_actions()) {
                summary.metrics = write_metrics(writer, er.chunks, ep.actions, ep.num_frames, opt.metrics, opt.plots);
            }
            writer.mark_done(Json{{"num_frames", ep.num_frames},
                                  {"num_calls", er.chunks.num_calls()},
                                  {"fingerprint", checked.episode_fingerprint(e)}});
            summary.status = "ok";
            progress.finish();
            if (!opt.quiet) {
                const TimingStats s = er.timing.total_stats();
                std::fprintf(stderr, "episode %s: %lld calls, median %.1f ms/call -> %s\n", name.c_str(),
                             (long long)er.chunks.num_calls(), s.median, out.string().c_str());
            }
        } catch (const Interrupted&) {
            throw;
        } catch (const Error& err) {
            progress.finish();
            summary.status = "failed";
            summary.error = err.what();
            ++result.failed;
            log.error("episode {}: {}", name, err.what());
        }
        result.episodes.push_back(std::move(summary));
    }
    if (!result.episodes.empty()) write_summary(opt.out_dir, result.episodes);
    return result;
}

}  // namespace dzr::rollout
