#include "rollout/runner.h"

#include <cstdio>
#include <cstring>
#include <future>

#include "backend/backend.h"
#include "config/embodiment.h"
#include "config/model_fields.h"
#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "io/episode.h"
#include "io/result_writer.h"
#include "rollout/episode_layout.h"
#include "rollout/frame_schedule.h"
#include "rollout/predicted_video.h"
#include "rollout/progress.h"
#include "weights/checkpoint.h"
#include "weights/inventory.h"

namespace dzr::rollout {

std::atomic<bool>& interrupt_flag() {
    static std::atomic<bool> flag{false};
    return flag;
}

namespace {

/// Frames of every camera for a call, each copied into a contiguous uint8 [T, H, W, 3] buffer.
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
    // Frames at the recorded size (DROID's when the embodiment leaves it open).
    const Embodiment& e = policy.embodiment();
    const int fh = e.cameras[0].height > 0 ? e.cameras[0].height : io::kDroidHeight;
    const int fw = e.cameras[0].width > 0 ? e.cameras[0].width : io::kDroidWidth;
    std::vector<uint8_t> buf(size_t(4) * size_t(fh) * size_t(fw) * 3);
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = uint8_t((i * 2654435761u) >> 24);
    Observation obs;
    obs.prompt = "warm up";
    obs.state.assign(size_t(e.state_dim()), 0.0);
    const int window_calls = policy.model().dit.max_chunk_size + 1;
    for (int c = 0; c < window_calls + 1; ++c) {
        const int T = c == 0 ? 1 : 4;
        obs.views.assign(e.cameras.size(), TensorView(buf.data(), DType::U8, Shape{T, fh, fw, 3}));
        policy.step(obs);
        ++calls;
    }
    // NOTE: the rollout prepares call i + 1 while call i steps, so it holds two sets of host buffers; the
    // sequential warm-up left one. A second set now keeps the first timed 4-frame call from allocating
    // (and page-faulting) ~3 MB of fresh memory.
    {
        obs.views.assign(e.cameras.size(), TensorView(buf.data(), DType::U8, Shape{4, fh, fw, 3}));
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
    const Tensor observed = observed_canvases(ep, acc.observed(), canvas_spec(policy.embodiment(), m));
    DZR_CHECK(observed.shape() == predicted.shape(), "video: {} predicted frames but {} observed ones",
              predicted.view().str(), observed.view().str());
    if (opt.write_video) {
        for (const auto& [name, frames] : {std::pair{"predicted_video.mp4", &predicted}, std::pair{"observed_video.mp4", &observed}})
            writer.write_with(name, [&](const std::filesystem::path& p) { opt.write_video(p, frames->view(), vt.fps); });
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

}  // namespace

RolloutResult run_rollout(const RolloutOptions& opt) {
    RolloutResult result;
    auto& log = *dzr::log();
    DZR_CHECK(!opt.episodes.empty(), "no episodes given");
    DZR_CHECK(!opt.out_dir.empty(), "no output directory given (--out)");

    // ---- checkpoint geometry and embodiment (no weights read yet) ------------------------------------------
    Timer load_timer;
    Checkpoint ckpt(opt.checkpoint);
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
    const std::string tag = !opt.embodiment.empty() ? opt.embodiment : opt.run.embodiment;
    const Embodiment embodiment = select_embodiment(load_checkpoint_embodiments(opt.checkpoint), tag, model);
    const io::EpisodeLayout layout = episode_layout(embodiment);

    // ---- episodes: listed and checked against the embodiment before any compute --------------------------
    std::vector<std::filesystem::path> dirs;
    for (const auto& e : opt.episodes) {
        auto found = io::list_episodes(e, layout);
        dirs.insert(dirs.end(), found.begin(), found.end());
    }
    DZR_CHECK(!dirs.empty(), "no episode directories found in the given paths");
    const std::vector<std::string> names = io::unique_episode_names(dirs);
    std::vector<std::string> layout_errors(dirs.size());
    size_t usable = 0;
    for (size_t e = 0; e < dirs.size(); ++e) {
        const std::vector<std::string> problems = io::check_episode_layout(dirs[e], layout);
        for (size_t i = 0; i < problems.size(); ++i) layout_errors[e] += (i ? "; " : "") + problems[i];
        if (problems.empty()) ++usable;
        else log.error("episode {}: {}", names[e], layout_errors[e]);
    }

    FrameScheduleConfig sc;
    sc.start_frame = opt.run.rollout.start_frame;
    sc.stride = opt.run.rollout.stride;
    sc.offsets.assign(opt.run.rollout.offsets.begin(), opt.run.rollout.offsets.end());
    sc.max_chunks = opt.run.rollout.max_chunks > 0 ? opt.run.rollout.max_chunks : -1;
    const FrameSchedule schedule(sc);

    if (usable == 0) {
        // NOTE: nothing to run: the weights are not loaded.
        for (size_t e = 0; e < dirs.size(); ++e) {
            EpisodeSummary summary;
            summary.name = names[e];
            summary.status = "failed";
            summary.error = layout_errors[e];
            result.episodes.push_back(std::move(summary));
            ++result.failed;
        }
        std::filesystem::create_directories(opt.out_dir);
        write_summary(opt.out_dir, result.episodes);
        return result;
    }

    // ---- weights and policy ---------------------------------------------------------------------------
    const WeightCheckReport check = check_weights(ckpt, expected_weights(model));
    DZR_CHECK(check.ok(), "{}", check.message("checkpoint " + opt.checkpoint.string()));
    std::filesystem::path tokenizer;
    if (!opt.tokenizer.empty()) {
        tokenizer = resolve_tokenizer_path(opt.tokenizer);
    } else {
        DZR_CHECK(ckpt.tokenizer_path().has_value(),
                  "checkpoint {} has no umT5 tokenizer (spiece.model); give one with --tokenizer",
                  opt.checkpoint.string());
        tokenizer = *ckpt.tokenizer_path();
    }

    std::unique_ptr<Backend> be = make_backend(opt.device);
    PolicyOptions po;
    po.sampling = opt.run.sampling;
    po.kv = opt.run.kv;
    po.kv_mode = opt.kv_mode;
    po.check_finite = opt.check_finite;
    po.video_decode = opt.save_video;
    if (!opt.noise_video.empty() || !opt.noise_action.empty()) {
        DZR_CHECK(!opt.noise_video.empty() && !opt.noise_action.empty(),
                  "--noise-video and --noise-action go together");
        po.noise = load_noise_npy(opt.noise_video, opt.noise_action);
    }
    DreamZeroPolicy policy(model, ckpt, embodiment, tokenizer, po, *be);
    const double load_ms = load_timer.ms();
    // Device-wide memory in use, sampled between calls only (after the load, the warm-up, each call
    // and the video decode); the maximum so far goes into each episode's timing.json.
    std::optional<int64_t> peak_memory;
    auto sample_memory = [&] {
        if (const auto m = be->device_memory_in_use()) peak_memory = std::max(peak_memory.value_or(0), *m);
    };
    sample_memory();

    if (!opt.quiet) {
        std::fprintf(stderr,
                     "dzr rollout\n"
                     "  checkpoint  %s (%zu shards, %s)\n"
                     "  model       %s\n"
                     "  embodiment  %s (%s)\n"
                     "  device      %s (%s)\n"
                     "  schedule    %s\n"
                     "  episodes    %zu -> %s\n"
                     "  load        %.1f s\n",
                     opt.checkpoint.string().c_str(), ckpt.shards().size(),
                     config::format_bytes(ckpt.tensor_bytes()).c_str(), policy.describe().c_str(), embodiment.tag.c_str(),
                     embodiment.source.c_str(),
                     opt.device.str().c_str(), be->name().c_str(), schedule.describe().c_str(), dirs.size(),
                     opt.out_dir.string().c_str(), load_ms / 1e3);
    }

    // ---- warm-up ------------------------------------------------------------------------------------------
    int warmup_calls = 0;
    double warmup_ms = 0;
    if (opt.warmup) {
        warmup_ms = run_warmup(policy, warmup_calls);
        sample_memory();
        if (!opt.quiet) std::fprintf(stderr, "  warm-up     %d calls, %.1f s, KV pool whole\n", warmup_calls, warmup_ms / 1e3);
    }

    // ---- episodes ---------------------------------------------------------------------------------------
    std::filesystem::create_directories(opt.out_dir);
    ProgressLine progress(stderr, opt.quiet ? ProgressLine::Mode::Plain : ProgressLine::Mode::Auto);
    const auto run_start = std::chrono::system_clock::now();
    for (size_t e = 0; e < dirs.size() && !result.interrupted; ++e) {
        const std::filesystem::path out = opt.out_dir / names[e];
        if (opt.resume && io::ResultWriter::is_done(out)) {
            result.episodes.push_back(summary_from_outputs(out, names[e]));
            log.info("episode {}: finished by an earlier run, skipped (--resume)", names[e]);
            continue;
        }
        EpisodeSummary summary;
        summary.name = names[e];
        if (!layout_errors[e].empty()) {
            summary.status = "failed";
            summary.error = layout_errors[e];
            ++result.failed;
            result.episodes.push_back(std::move(summary));
            continue;
        }
        try {
            io::EpisodeOptions eo;
            eo.layout = layout;
            eo.allow_truncate = opt.allow_truncate;
            eo.min_frames = schedule.min_frames();
            eo.prompt = opt.prompt;
            eo.open_video = opt.open_video;
            const io::Episode ep = io::read_episode(dirs[e], eo);
            const std::vector<ScheduledCall> calls = schedule.calls(ep.num_frames);
            summary.num_frames = ep.num_frames;
            summary.num_calls = int64_t(calls.size());

            policy.reset();
            io::ActionChunks chunks;
            chunks.horizon = model.dit.num_action_per_block;
            chunks.dims = embodiment.action_dim();
            chunks.columns = action_column_names(embodiment);
            TimingReport timing;
            timing.device = opt.device.str();
            timing.checkpoint_load_ms = load_ms;
            timing.warmup_calls = warmup_calls;
            timing.warmup_ms = warmup_ms;
            // NOTE: the host side of call i+1 (frame gathering, preprocessing, tokenization) runs on a
            // second thread while call i runs, so it overlaps the device work.
            VideoAccumulator video;
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
                    result.interrupted = true;
                    break;
                }
                if (i + 1 < calls.size()) next = std::async(std::launch::async, prepare_call, i + 1);
                PolicyCallResult r = policy.step(prepared);
                policy.recycle(std::move(prepared));
                sample_memory();
                if (opt.save_video) {
                    const Tensor latent = policy.video_prediction();  // [z, 2 or 3, h, w]
                    const bool with_reference = latent.shape()[1] > policy.model().dit.num_frame_per_block;
                    const auto next = next_call_frames(schedule, calls, i, ep.num_frames);
                    const auto observed = observed_frame_indices(video.empty(), with_reference, call.frames.back(), next,
                                                                 policy.model().dit.num_frame_per_block);
                    video.add(latent, observed);
                }
                chunks.append(call.anchor, r.actions);
                timing.calls.push_back(to_call_timing(call, r));
                summary.call_ms.push_back(r.times.total);
                {
                    const CallTiming& ct = timing.calls.back();
                    for (int p = 0; p < kNumPhases; ++p) summary.phase_ms[size_t(p)].push_back(ct.phase_ms[size_t(p)]);
                    summary.host_prepare_ms.push_back(ct.host_prepare_ms);
                }
                if (!opt.quiet) {
                    const double per_call = episode_timer.seconds() / double(call.index + 1);
                    progress.update(format_progress(int64_t(e) + 1, int64_t(dirs.size()), names[e], call.index + 1,
                                                    int64_t(calls.size()), per_call));
                }
            }
            if (next.valid()) next.wait();
            // Outputs: whole files only, the done marker last. An interrupted episode keeps the actions,
            // timing and manifest of the calls it finished and gets no done marker (--resume redoes it).
            const bool partial = result.interrupted;
            if (partial) {
                progress.finish();
                summary.status = "interrupted";
                summary.num_calls = chunks.num_calls();
                log.warn("interrupted: episode {} stopped after {} of {} calls; {}", names[e], chunks.num_calls(),
                         calls.size(),
                         chunks.num_calls() > 0 ? "actions, timing and manifest cover those calls; no done marker"
                                                : "nothing written for it");
                if (chunks.num_calls() == 0) {
                    result.episodes.push_back(std::move(summary));
                    break;
                }
            }
            io::ResultWriter writer(out);
            writer.clear_done();
            writer.write_actions(chunks);
            if (!partial && opt.save_video && !video.empty()) {
                timing.video = write_predicted_video(policy, video, ep, opt, writer);
                sample_memory();
            }
            timing.peak_gpu_memory_bytes = peak_memory;
            writer.write_json("timing.json", timing.to_json());
            RunManifest manifest;
            manifest.episode = dirs[e].string();
            manifest.checkpoint = opt.checkpoint.string();
            manifest.overrides = opt.overrides;
            manifest.seed = opt.run.sampling.seed;
            manifest.device = opt.device.str();
            manifest.command_line = opt.command_line;
            manifest.start_time = iso8601_utc(run_start);
            manifest.config = Json{{"sampling",
                                    {{"num_inference_steps", opt.run.sampling.num_inference_steps},
                                     {"sigma_shift", opt.run.sampling.sigma_shift},
                                     {"cfg_scale", opt.run.sampling.cfg_scale},
                                     {"num_dit_steps", opt.run.sampling.num_dit_steps},
                                     {"dynamic_schedule", opt.run.sampling.dynamic_schedule},
                                     {"seed", opt.run.sampling.seed}}},
                                   {"kv",
                                    {{"mode", opt.kv_mode == KvMode::Paged ? "paged" : "dense"},
                                     {"window_frames", opt.run.kv.window_frames},
                                     {"sink_frames", opt.run.kv.sink_frames},
                                     {"frames_per_block", opt.run.kv.frames_per_block},
                                     {"reset_at_boundary", opt.run.kv.reset_at_boundary}}},
                                   {"rollout", {{"schedule", schedule.describe()}}},
                                   {"embodiment", embodiment.tag},
                                   {"config_file", opt.run.source.string()}};
            manifest.extra = Json{{"policy", policy.describe()},
                                  {"embodiment_source", embodiment.source},
                                  {"prompt", ep.prompt},
                                  {"tokenizer", tokenizer.string()},
                                  {"warnings", ep.warnings}};
            if (partial) manifest.extra["interrupted"] = {{"calls_done", chunks.num_calls()}, {"calls_scheduled", calls.size()}};
            writer.write_json("manifest.json", manifest.to_json());
            if (partial) {
                result.episodes.push_back(std::move(summary));
                break;
            }
            if (ep.has_actions()) {
                summary.metrics = write_metrics(writer, chunks, ep.actions, ep.num_frames, opt.metrics, opt.plots,
                                                action_keys(embodiment));
            }
            writer.mark_done(Json{{"num_frames", ep.num_frames}, {"num_calls", chunks.num_calls()}});
            summary.status = "ok";
            progress.finish();
            if (!opt.quiet) {
                const TimingStats s = timing.total_stats();
                std::fprintf(stderr, "episode %s: %lld calls, median %.1f ms/call -> %s\n", names[e].c_str(),
                             (long long)chunks.num_calls(), s.median, out.string().c_str());
            }
        } catch (const Interrupted&) {
            throw;
        } catch (const Error& err) {
            progress.finish();
            summary.status = "failed";
            summary.error = err.what();
            ++result.failed;
            log.error("episode {}: {}", names[e], err.what());
        }
        result.episodes.push_back(std::move(summary));
    }
    if (!result.episodes.empty()) write_summary(opt.out_dir, result.episodes);
    return result;
}

}  // namespace dzr::rollout
