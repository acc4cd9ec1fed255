#include "rollout/validate.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "backend/backend.h"
#include "config/model_fields.h"
#include "core/error.h"
#include "core/json_text.h"
#include "core/log.h"
#include "io/atomic_file.h"
#include "io/episode.h"
#include "io/output_guard.h"
#include "io/result_writer.h"
#include "model/inventory.h"
#include "policy/normalization.h"
#include "policy/postprocess.h"
#include "policy/tokenizer.h"
#include "rollout/episode_layout.h"
#include "rollout/fingerprint.h"
#include "rollout/run_memory.h"
#include "weights/checkpoint.h"

namespace dzr::rollout {

namespace fs = std::filesystem;

namespace {

// NOTE: every file a rollout writes, so the input guard can tell whether one would replace an input.
constexpr const char* kEpisodeOutputs[] = {
    "actions.npy",         "actions.csv",          "timing.json",         "manifest.json",      "metrics.json",
    "mse.csv",             "gt_actions.npy",       "all_action_dims.png", "predicted_video.mp4", "observed_video.mp4",
    "predicted_video.webm", "observed_video.webm", "predicted_video.npy", "observed_video.npy", "done.json",
    "failed.json"};
constexpr const char* kRunOutputs[] = {"summary.json", "summary.csv", "report.html", "plan.json",
                                       "summary_mse_per_dim.png", "summary_call_seconds.png", kRunLockFile};

/// Problems in the order they are reported.
struct Problems {
    std::vector<std::string> options, device, episodes, output, checkpoint, statistics, memory, resume;

    size_t count() const {
        return options.size() + device.size() + episodes.size() + output.size() + checkpoint.size() +
               statistics.size() + memory.size() + resume.size();
    }
    [[noreturn]] void raise(bool hint_skip_invalid) const {
        std::string msg = fmt::format(
            "{} problem{} found before loading the checkpoint's weights; nothing was run:", count(),
            count() == 1 ? "" : "s");
        for (const auto* group : {&options, &device, &episodes, &output, &checkpoint, &statistics, &memory, &resume})
            for (const auto& p : *group) msg += "\n  " + p;
        if (hint_skip_invalid)
            msg += "\n(--skip-invalid runs the valid episodes and records the others in the summary)";
        throw Error(msg);
    }
};

/// The run's GPUs: built for and present. A missing one is one problem line, listed with the others, and no
/// memory plan is then attempted (it would fail for the same cause).
std::vector<std::string> check_devices(const RolloutOptions& opt) {
    std::vector<std::string> p;
    for (const Device& d : opt.devices) {
        if (!d.is_cuda()) continue;
        if (!cuda_backend_built())
            p.push_back(fmt::format("--device {}: this dzr was built without CUDA (-DDZR_CUDA=OFF); use --device cpu",
                                    d.str()));
        else if (d.index >= cuda_device_count())
            p.push_back(fmt::format("--device {}: no such GPU ({} visible)", d.str(), cuda_device_count()));
    }
    return p;
}

/// The episodes an earlier run finished or failed in `out_dir`, as one problem line; nullopt when there are none.
/// NOTE: rerunning into them would silently replace results, or mix two checkpoints' episodes in one report
std::optional<std::string> earlier_results(const fs::path& out_dir) {
    std::error_code ec;
    std::vector<std::string> names;
    for (const auto& entry : fs::directory_iterator(out_dir, ec)) {
        std::error_code e2;
        if (!entry.is_directory(e2)) continue;
        if (fs::is_regular_file(entry.path() / std::string(io::kDoneMarker), e2) ||
            fs::is_regular_file(entry.path() / std::string(io::kFailedMarker), e2))
            names.push_back(entry.path().filename().string());
    }
    if (names.empty()) return std::nullopt;
    std::sort(names.begin(), names.end());
    std::string list;
    for (size_t i = 0; i < names.size() && i < 5; ++i) list += (i ? ", " : "") + names[i];
    if (names.size() > 5) list += fmt::format(", ... ({} in all)", names.size());
    return fmt::format("{} holds the results of an earlier run ({}): --resume finishes that run, --force reruns into "
                       "it (replacing the episodes this run has), or give a new --out",
                       out_dir.string(), list);
}

/// Runs `check`, turning its dzr::Error into a problem line.
template <class F>
bool collect(std::vector<std::string>& into, F&& check) {
    try {
        check();
        return true;
    } catch (const Interrupted&) {
        throw;
    } catch (const Error& e) {
        into.push_back(e.what());
        return false;
    }
}

/// The checkpoint and what the run needs of it: geometry, expected weights, statistics, tokenizer.
struct CheckpointFacts {
    std::unique_ptr<Checkpoint> ckpt;
    const Embodiment* embodiment = nullptr;
    bool stats_ok = false;  // the embodiment's statistics are usable
    fs::path tokenizer;
    std::unique_ptr<Umt5Tokenizer> tok;
};

CheckpointFacts check_checkpoint(const RolloutOptions& opt, const Embodiment& embodiment, Problems& problems) {
    CheckpointFacts f;
    f.embodiment = &embodiment;
    if (!collect(problems.checkpoint, [&] { f.ckpt = std::make_unique<Checkpoint>(opt.checkpoint); }))
        return f;
    const Checkpoint& ck = *f.ckpt;
    const ModelConfig& model = ck.model_config();
    collect(problems.checkpoint, [&] {
        if (!opt.have_config_model) return;
        const auto diffs = config::diff_model_configs(opt.run.model, model);
        if (diffs.empty()) return;
        std::string msg = fmt::format(
            "checkpoint {} does not have the geometry of {} ({} difference{}):", opt.checkpoint.string(),
            opt.run.source.string(), diffs.size(), diffs.size() == 1 ? "" : "s");
        for (const auto& d : diffs) msg += "\n    " + d;
        throw Error(msg);
    });
    collect(problems.checkpoint, [&] {
        const WeightCheckReport check = check_weights(ck, expected_weights(model));
        DZR_CHECK(check.ok(), "{}", check.message("checkpoint " + opt.checkpoint.string()));
    });
    collect(problems.checkpoint, [&] {
        f.tokenizer = !opt.tokenizer.empty() ? resolve_tokenizer_path(opt.tokenizer) : fs::path();
        if (f.tokenizer.empty()) {
            DZR_CHECK(ck.tokenizer_path().has_value(),
                      "checkpoint {} has no umT5 tokenizer (spiece.model); give one with --tokenizer",
                      opt.checkpoint.string());
            f.tokenizer = *ck.tokenizer_path();
        }
        f.tok = std::make_unique<Umt5Tokenizer>(f.tokenizer);
        DZR_CHECK(
            f.tok->vocab_size() <= model.t5.vocab,
            "tokenizer {} has {} pieces but the text encoder's vocabulary is {}: wrong tokenizer for this "
            "checkpoint",
            f.tokenizer.string(), f.tok->vocab_size(), model.t5.vocab);
    });
    const std::string metadata = (opt.checkpoint / "experiment_cfg" / "metadata.json").string();
    collect(problems.statistics, [&] {
        const auto bad = check_policy_statistics(embodiment, metadata);
        problems.statistics.insert(problems.statistics.end(), bad.begin(), bad.end());
        f.stats_ok = bad.empty();
    });
    return f;
}

/// Reads one episode as the run will, and checks its prompt tokenizes and its state against the statistics.
/// A dataset's videos are checked without decoding (the run decodes each episode when it runs it) unless
/// `need_inputs_hash` (--resume verifies a finished episode's inputs by their content).
EpisodeCheck check_episode(const RolloutOptions& opt, const io::EpisodeRef& ref, const FrameSchedule& schedule,
                           const CheckpointFacts& facts, io::InputSet& inputs, bool need_inputs_hash) {
    EpisodeCheck c;
    io::EpisodeOptions eo;
    eo.layout = episode_layout(*facts.embodiment);
    eo.allow_truncate = opt.allow_truncate;
    eo.min_frames = schedule.min_frames();
    eo.prompt = opt.prompt;
    eo.open_video = opt.open_video;
    eo.decode_frames = need_inputs_hash;
    try {
        // NOTE: the layout first (file headers only): its messages name the key and the embodiment
        const std::vector<std::string> layout_problems = ref.source->check(ref, eo.layout);
        if (!layout_problems.empty()) {
            std::string all;
            for (const auto& p : layout_problems) all += (all.empty() ? "" : "; ") + p;
            throw Error(all);
        }
        const io::Episode ep = ref.source->read(ref, eo);
        c.num_frames = ep.num_frames;
        c.prompt = ep.prompt;
        if (std::all_of(ep.cameras.begin(), ep.cameras.end(), [](const auto& cam) { return cam.frames.defined(); }))
            c.inputs_sha256 = episode_inputs_sha256(ep);
        for (const auto& cam : ep.cameras) inputs.add_file(cam.file, "camera file of episode " + ep.name);
        const Embodiment& e = *facts.embodiment;
        if (facts.tok && e.prompt)
            tokenize_prompts(*facts.tok, *e.prompt, ep.prompt, facts.ckpt->model_config().t5.text_len);
        if (facts.stats_ok) {
            // NOTE: the q01..q99 range tells "far outside" for the quantile-normalized keys
            for (const ArraySpec& k : e.state) {
                if (k.norm != NormMode::Q99) continue;
                for (const io::StateArray& a : ep.state) {
                    if (a.name != k.key || !a.present) continue;
                    const std::string w = check_state_range(k.key, a.values, a.dim, k.stats);
                    if (!w.empty()) c.warnings.push_back(w);
                }
            }
            for (const auto& w : c.warnings) log()->warn("episode {}: {}", ep.name, w);
        }
        c.valid = true;
    } catch (const Interrupted&) {
        throw;
    } catch (const Error& e) {
        c.error = e.what();
    }
    return c;
}

/// --resume: which done episodes this run may skip; a done episode of another run is a problem.
void check_resume(const RolloutOptions& opt, const std::vector<std::string>& names, ValidatedRun& run,
                  Problems& problems) {
    for (size_t e = 0; e < names.size(); ++e) {
        const fs::path out = opt.out_dir / names[e];
        if (!run.episodes[e].valid || !io::ResultWriter::is_done(out)) continue;
        const fs::path done = out / std::string(io::kDoneMarker);
        Json recorded;
        if (!collect(problems.resume, [&] {
                try {
                    recorded = parse_json_strict<Json>(io::read_file(done), done.string());
                } catch (const Json::exception& ex) {
                    DZR_THROW("{}: invalid JSON: {}", done.string(), ex.what());
                }
            }))
            continue;
        if (!recorded.is_object() || !recorded.contains("fingerprint")) {
            problems.resume.push_back(
                fmt::format("episode {}: {} has no run fingerprint (an older dzr wrote it), so --resume "
                            "cannot tell whether this run "
                            "would produce the same outputs; remove {} to run it again",
                            names[e], done.string(), out.string()));
            continue;
        }
        const auto diffs = fingerprint_differences(recorded["fingerprint"], run.episode_fingerprint(e));
        if (diffs.empty()) {
            // NOTE: the marker lists what was written; a file deleted since makes the episode unfinished
            std::string gone;
            if (recorded.contains("files") && recorded["files"].is_array())
                for (const auto& f : recorded["files"])
                    if (!f.is_string() || !io::is_plain_name(f.get<std::string>()) ||
                        !io::input_file_present(out / f.get<std::string>()))
                        gone += (gone.empty() ? "" : ", ") + (f.is_string() ? f.get<std::string>() : f.dump());
            if (gone.empty()) {
                run.finished[e] = true;
            } else {
                run.stale[e] = true;
                log()->warn("episode {}: finished by an earlier run, but {} of its outputs {} missing: it runs again",
                            names[e], gone, gone.find(',') == std::string::npos ? "is" : "are");
            }
            continue;
        }
        std::string msg = fmt::format(
            "episode {}: {} was produced by another run; --resume would mix its outputs "
            "with this run's (use another --out, or remove {} to run it again):",
            names[e], out.string(), out.string());
        for (const auto& d : diffs) msg += "\n    " + d;
        problems.resume.push_back(msg);
    }
}

/// The run's memory plan, checked against its budget: a plan that does not fit is a problem; without a budget, a
/// plan that cannot be made is only a warning (the run does not need it).
void check_memory(const RolloutOptions& opt, const Checkpoint& ckpt, const Embodiment& embodiment,
                  const FrameSchedule& schedule, ValidatedRun& run, Problems& problems) {
    int64_t video_frames = 0;
    if (opt.save_video)
        for (const EpisodeCheck& c : run.episodes)
            // NOTE: a call adds 2 latent frames, 3 on a window's first call: 3 per call bounds the joined video
            if (c.valid) video_frames = std::max(video_frames, 3 * schedule.num_calls(c.num_frames));
    const EngineOptions eo = rollout_engine_options(opt, run.prompts);
    if (const std::optional<int> n = config::parse_offload_layers(opt.run.offload_layers, "offload_layers");
        n && *n > ckpt.model_config().dit.num_layers)
    {
        problems.memory.push_back(fmt::format("offload_layers {}: the checkpoint's DiT has {} layers", *n,
                                              ckpt.model_config().dit.num_layers));
        return;  // no plan of it can be made
    }
    const std::optional<uint64_t> budget = rollout_memory_budget(opt);
    if (!budget) {
        if (eo.devices.size() != 1) return;  // a plan covers one device
        try {
            run.memory_plan = plan_rollout_memory(ckpt.model_config(), embodiment, eo, video_frames);
        } catch (const Interrupted&) {
            throw;
        } catch (const Error& e) {
            log()->warn("memory plan: not made ({})", e.what());
            return;
        }
        // NOTE: without a budget a GPU's free memory is one: the same settings fit the run to it, so a 48 GB card
        // needs no flag; a run that fits nothing is only warned about (the plan's context allowance is cautious)
        const std::optional<uint64_t> free = run.memory_plan->device_free_bytes;
        if (!free || run.memory_plan->peak_bytes() <= *free) return;
        try {
            BudgetFit fit = plan_within_budget(ckpt.model_config(), embodiment, eo, video_frames, *free,
                                               fmt::format("the free memory of {} ({})", eo.devices[0].str(), gib(*free)));
            run.memory_choices = fit.choices;
            run.memory_plan = std::move(fit.plan);
        } catch (const Interrupted&) {
            throw;
        } catch (const Error& e) {
            log()->warn("memory plan: {} (the run goes on, and may run out of device memory)", e.what());
        }
        return;
    }
    collect(problems.memory, [&] {
        const std::string what = fmt::format("GPU memory budget {} ({})", opt.run.gpu_memory_budget, gib(*budget));
        BudgetFit fit = plan_within_budget(ckpt.model_config(), embodiment, eo, video_frames, *budget, what);
        run.memory_choices = fit.choices;
        run.memory_plan = std::move(fit.plan);
    });
}

std::string joined(const std::vector<std::string>& words) {
    std::string s;
    for (const auto& w : words) s += (s.empty() ? "" : " ") + w;
    return s;
}

}  // namespace

Json ValidatedRun::episode_fingerprint(size_t e) const {
    return episode_fingerprint(e, episodes[e].inputs_sha256);
}

Json ValidatedRun::episode_fingerprint(size_t e, const std::string& inputs_sha256) const {
    return rollout::episode_fingerprint(fingerprint, episodes[e].num_frames, episodes[e].prompt, inputs_sha256);
}

EpisodeSummary ValidatedRun::invalid_summary(size_t e, const std::string& name) const {
    EpisodeSummary s;
    s.name = name;
    s.status = "invalid";
    s.error = episodes[e].error;
    return s;
}

std::vector<std::string> check_rollout_options(const RolloutOptions& opt) {
    std::vector<std::string> p;
    if (opt.episodes.empty()) p.push_back("no episodes given");
    if (opt.out_dir.empty()) p.push_back("no output directory given (--out)");
    std::error_code ec;
    if (!opt.out_dir.empty() && fs::weakly_canonical(opt.out_dir, ec) == fs::path("/"))
        p.push_back(fmt::format("--out {}: the file system's root is never an output directory", opt.out_dir.string()));
    if (opt.checkpoint.empty()) p.push_back("no checkpoint given (--ckpt)");
    const int64_t horizon = opt.run.model.dit.num_action_per_block;
    if (!(opt.metrics.steps == -1 || (opt.metrics.steps >= 1 && opt.metrics.steps <= horizon)))
        p.push_back(fmt::format("--metric-steps must be -1 (all) or in [1, {}] (the action horizon), got {}",
                                horizon, opt.metrics.steps));
    if (opt.metrics.gt_offset < -kMaxMetricOffset || opt.metrics.gt_offset > kMaxMetricOffset)
        p.push_back(fmt::format("--metric-offset must be in [-{}, {}], got {}", kMaxMetricOffset,
                                kMaxMetricOffset, opt.metrics.gt_offset));
    if (opt.noise_video.empty() != opt.noise_action.empty())
        p.push_back("--noise-video and --noise-action go together");
    return p;
}

ValidatedRun validate_run(const RolloutOptions& opt, const Embodiment& embodiment, const std::vector<io::EpisodeRef>& refs,
                          const std::vector<std::string>& names, const FrameSchedule& schedule) {
    Problems problems;
    problems.options = check_rollout_options(opt);
    if (!problems.options.empty()) problems.raise(false);

    ValidatedRun run;
    problems.device = check_devices(opt);
    CheckpointFacts facts = check_checkpoint(opt, embodiment, problems);
    // NOTE: the KV settings against the checkpoint's geometry here, not first by the engine after the weights load
    if (facts.ckpt)
        collect(problems.options, [&] {
            opt.run.kv.validate(KvGeometry::from_model(facts.ckpt->model_config(), DType::BF16, 2));
        });

    // Inputs: what this run reads. Outputs must neither land inside an input directory nor replace an input
    // file.
    io::InputSet inputs;
    for (size_t e = 0; e < refs.size(); ++e)
        for (const fs::path& in : refs[e].source->inputs(refs[e]))
            inputs.add_dir(in, "episode " + names[e]);
    for (const auto& given : opt.episodes) {
        std::error_code ec;
        if (fs::is_regular_file(given, ec)) inputs.add_file(given, "episode list");
    }
    inputs.add_dir(opt.checkpoint, "checkpoint");
    if (!opt.run.source.empty()) inputs.add_file(opt.run.source, "config");
    if (!facts.tokenizer.empty()) inputs.add_file(facts.tokenizer, "tokenizer");
    if (!opt.noise_video.empty()) inputs.add_file(opt.noise_video, "noise file");
    if (!opt.noise_action.empty()) inputs.add_file(opt.noise_action, "noise file");

    run.episodes.reserve(refs.size());
    size_t invalid = 0;
    for (size_t e = 0; e < refs.size(); ++e) {
        const bool finished_before = opt.resume && io::ResultWriter::is_done(opt.out_dir / names[e]);
        run.episodes.push_back(check_episode(opt, refs[e], schedule, facts, inputs, finished_before));
        if (!run.episodes.back().valid) {
            ++invalid;
            const std::string line = fmt::format("episode {}: {}", names[e], run.episodes.back().error);
            if (opt.skip_invalid)
                log()->info("{} (not run: --skip-invalid)", line);
            else
                problems.episodes.push_back(line);
        }
    }
    if (opt.skip_invalid && invalid == refs.size())
        problems.episodes.push_back(
            fmt::format("none of the {} episodes is valid (see the warnings above)", refs.size()));
    for (const EpisodeCheck& c : run.episodes)
        if (c.valid && std::find(run.prompts.begin(), run.prompts.end(), c.prompt) == run.prompts.end())
            run.prompts.push_back(c.prompt);
    // NOTE: the plan runs the engine's calls on measuring backends, which needs a sound checkpoint and statistics
    if (facts.ckpt && problems.device.empty() && problems.checkpoint.empty() && problems.statistics.empty() &&
        invalid < refs.size())
        check_memory(opt, *facts.ckpt, embodiment, schedule, run, problems);

    collect(problems.output, [&] {
        inputs.check_output_dir(opt.out_dir);
        for (const char* f : kRunOutputs) inputs.check_output_file(opt.out_dir / f);
        for (const auto& name : names) {
            const fs::path out = opt.out_dir / name;
            inputs.check_output_dir(out);
            for (const char* f : kEpisodeOutputs) inputs.check_output_file(out / f);
            for (int d = 0; d < embodiment.action_dim(); ++d)
                inputs.check_output_file(out / fmt::format("action_dim_{}.png", d));
        }
    });
    if (!opt.resume && !opt.force && !opt.shard.sharded())
        if (auto line = earlier_results(opt.out_dir)) problems.output.push_back(*line);
    if (problems.count() > 0) problems.raise(!opt.skip_invalid && invalid > 0);

    // The output directory: writable, and ours alone for the run. A dry run creates nothing.
    if (opt.dry_run) {
        fs::path probe = fs::absolute(opt.out_dir);
        std::error_code ec;
        while (!fs::exists(probe, ec) && probe.has_parent_path() && probe.parent_path() != probe)
            probe = probe.parent_path();
        collect(problems.output, [&] {
            DZR_CHECK(fs::is_directory(probe, ec),
                      "cannot create the output directory {}: {} is not a directory", opt.out_dir.string(),
                      probe.string());
            io::probe_writable_dir(probe);
        });
    } else {
        collect(problems.output, [&] {
            io::probe_writable_dir(opt.out_dir);
            // NOTE: one lock file for every kind of run: an unsharded run holds it alone, the ranks of a sharded run
            // share it (so neither runs beside the other) and each also holds its own rank lock
            run.lock = std::make_unique<io::RunLock>(opt.out_dir, std::string(kRunLockFile), joined(opt.command_line),
                                                     opt.shard.sharded());
            if (opt.shard.sharded()) {
                fs::create_directories(opt.out_dir / "ranks");
                run.rank_lock = std::make_unique<io::RunLock>(opt.out_dir, fmt::format("ranks/.rank-{}.lock", opt.shard.rank),
                                                              joined(opt.command_line));
            }
        });
    }
    if (problems.count() > 0) problems.raise(false);

    run.tokenizer = facts.tokenizer;
    run.fingerprint = run_fingerprint(opt, *facts.ckpt, facts.tokenizer);
    run.finished.assign(refs.size(), false);
    run.stale.assign(refs.size(), false);
    if (opt.resume) check_resume(opt, names, run, problems);
    if (problems.count() > 0) problems.raise(false);
    return run;
}

}  // namespace dzr::rollout
