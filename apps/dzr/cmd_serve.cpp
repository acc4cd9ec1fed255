// `dzr serve`: the policy behind a websocket, speaking the official DreamZero server's protocol (RoboArena,
// DROID), so that an existing client drives dzr instead of the official PyTorch server.
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "apps/dzr/command.h"
#include "apps/dzr/run_flags.h"
#include "backend/options.h"
#include "config/embodiment.h"
#include "config/run_config.h"
#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "policy/engine.h"
#include "policy/memory_plan.h"
#include "rollout/progress.h"
#include "rollout/reports.h"
#include "rollout/run_memory.h"
#include "rollout/runner.h"
#include "serve/policy_handler.h"
#include "serve/server.h"
#include "weights/checkpoint.h"

namespace dzr::app {
namespace {

struct ServeArgs {
    std::string ckpt;
    std::string config;
    std::vector<std::string> sets;
    RunFlags run_flags;  // --embodiment, --numerics, --gpu-memory-budget (config/settings.h), as `dzr rollout`
    std::string device = "cpu";
    std::string tokenizer;
    std::string host = "127.0.0.1";
    int port = 8000;
    std::string record;
    double max_message_mb = 64;
    bool no_warmup = false;
    int max_sessions = 1;
};

bool is_loopback(const std::string& host) {
    return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

/// The timing summary on exit: per request group, from the request's last byte to the reply's last byte.
void print_summary(const serve::ServeReport& r) {
    std::map<std::string, std::vector<double>> groups;
    for (const auto& t : r.requests) groups[t.category].push_back(t.ms);
    std::vector<std::vector<std::string>> rows;
    for (const auto& [name, ms] : groups) {
        const auto s = rollout::compute_stats(ms);
        rows.push_back({name, std::to_string(ms.size()), fmt::format("{:.1f}", s.median),
                        fmt::format("{:.1f}", s.p90), fmt::format("{:.1f}", s.max)});
    }
    std::printf("served %llu clients (%llu refused), %zu requests, %llu replies dropped (client gone)\n",
                (unsigned long long)r.clients, (unsigned long long)r.refused, r.requests.size(),
                (unsigned long long)r.dropped_replies);
    if (!rows.empty())
        std::printf(
            "%s(request received -> reply sent)\n",
            rollout::format_table({"request", "count", "median ms", "p90 ms", "max ms"}, rows).c_str());
}

/// The served engine's memory plan (its sessions, umT5 resident) against --gpu-memory-budget or the config's
/// gpu_memory_budget, else a GPU's free memory, before any weight is read (as a rollout checks its budget).
void check_serve_memory(EngineOptions& eo, const ModelConfig& model, const Embodiment& embodiment) {
    if (eo.devices.size() != 1) return;  // a plan covers one device
    std::optional<uint64_t> budget;
    std::string what;
    if (!eo.run.gpu_memory_budget.empty()) {
        budget = config::parse_memory_budget(eo.run.gpu_memory_budget, "gpu_memory_budget");
        what = fmt::format("GPU memory budget {} ({})", eo.run.gpu_memory_budget, gib(*budget));
    } else if (eo.devices[0].is_cuda() &&
               (budget = rollout::plan_rollout_memory(model, embodiment, eo, 0).device_free_bytes)) {
        what = fmt::format("the free memory of {} ({})", eo.devices[0].str(), gib(*budget));
    }
    if (!budget) return;
    const BudgetFit fit = rollout::plan_within_budget(model, embodiment, eo, 0, *budget, what);
    fit.choices.apply(eo.run);
    log()->info("serve: memory plan {} ({} session{}) fits the {}", gib(fit.plan.peak_bytes()), eo.max_sessions,
                eo.max_sessions == 1 ? "" : "s", what);
}

/// The engine's sessions, each warmed up (its CUDA graphs captured) before the server listens.
/// NOTE: warm before listening: a cold session's first calls capture graphs (seconds on a GPU) while every other
/// client's calls wait behind them on the one worker
std::vector<std::unique_ptr<Session>> open_sessions(Engine& engine, int count, bool warm, int& calls, double& ms) {
    std::vector<std::unique_ptr<Session>> sessions;
    for (int i = 0; i < count; ++i) {
        sessions.push_back(engine.open_session());
        if (warm) ms += rollout::run_warmup(engine, *sessions.back(), calls);
    }
    return sessions;
}

int run(const ServeArgs& a) {
    DZR_CHECK(a.port >= 0 && a.port <= 65535, "--port must be in 0..65535, got {}", a.port);
    DZR_CHECK(a.max_sessions >= 1 && a.max_sessions <= 64, "--max-sessions must be in 1..64, got {}",
              a.max_sessions);
    DZR_CHECK(a.max_message_mb > 0 && a.max_message_mb <= 4096,
              "--max-message-mb must be in (0, 4096], got {}", a.max_message_mb);
    EngineOptions eo;
    eo.checkpoint = a.ckpt;
    std::vector<config::Override> overrides;
    for (const auto& s : a.sets) overrides.push_back(config::parse_override(s));
    if (!a.config.empty()) {
        eo.run = config::load_run_config(a.config, overrides);
        eo.check_config_model = true;
    } else {
        DZR_CHECK(overrides.empty(),
                  "--set needs --config (the settings it overrides come from a config file)");
    }
    a.run_flags.apply(eo.run);
    eo.devices = parse_device_list(a.device);
    eo.backend = apply_env_overrides({});
    eo.backend.numerics = eo.run.numerics;
    eo.tokenizer = a.tokenizer;
    // NOTE: a server does not know its prompts in advance: umT5 stays resident and encodes each new prompt
    eo.text_prepass = false;
    eo.max_sessions = a.max_sessions;

    // The protocol's embodiment and the memory plan first, before any weight is read.
    {
        const Checkpoint ckpt(eo.checkpoint);
        const std::string& tag = eo.run.embodiment;
        const Embodiment embodiment =
            select_embodiment(load_checkpoint_embodiments(eo.checkpoint), tag, ckpt.model_config());
        serve::bind_droid_protocol(embodiment);
        check_serve_memory(eo, ckpt.model_config(), embodiment);
    }
    Timer timer;
    const std::unique_ptr<Engine> engine = Engine::load(eo);
    const double load_s = timer.seconds();
    const std::string sessions_note =
        a.max_sessions > 1 ? fmt::format(" ({} sessions, one per client served at once)", a.max_sessions) : "";
    int warmup_calls = 0;
    double warmup_ms = 0;
    const auto sessions = open_sessions(*engine, a.max_sessions, !a.no_warmup, warmup_calls, warmup_ms);

    serve::PolicyHandlerOptions ho;
    ho.record_dir = a.record;
    const config::RolloutConfig& rc = eo.run.rollout;
    ho.schedule.start_frame = rc.start_frame;
    ho.schedule.stride = rc.stride;
    ho.schedule.offsets.assign(rc.offsets.begin(), rc.offsets.end());
    ho.schedule.max_chunks = rc.max_chunks > 0 ? rc.max_chunks : -1;
    std::vector<Session*> handler_sessions;
    for (const auto& s : sessions) handler_sessions.push_back(s.get());
    serve::PolicyHandler handler(*engine, handler_sessions, ho);

    serve::ServerOptions so;
    so.max_sessions = size_t(a.max_sessions);
    so.host = a.host;
    so.port = uint16_t(a.port);
    so.max_message_bytes = size_t(a.max_message_mb * double(1 << 20));
    const serve::ServerConfig& sc = handler.server_config();
    std::fprintf(
        stderr,
        "dzr serve\n"
        "  checkpoint  %s\n"
        "  model       %s\n"
        "  embodiment  %s\n"
        "  device      %s (%s, %s numerics)\n"
        "  load        %.1f s; warm-up %d calls, %.1f s%s\n"
        "  protocol    the official DreamZero server's (RoboArena, DROID): %dx%d frames, 1 frame on a "
        "session's first call then 4; float32 [%d, %d] actions; messages up to %.0f MiB\n"
        "  record      %s\n",
        a.ckpt.c_str(), engine->describe().c_str(), engine->embodiment().tag.c_str(),
        engine->devices().c_str(), engine->backend().name().c_str(), numerics_name(eo.run.numerics), load_s, warmup_calls,
        warmup_ms / 1e3, sessions_note.c_str(), sc.image_width, sc.image_height, engine->model().dit.num_action_per_block,
        engine->embodiment().action_dim(), a.max_message_mb,
        a.record.empty()
            ? "off"
            : fmt::format("{} (replay: dzr rollout {}/<session> with this --config; schedule {})", a.record,
                          a.record, rollout::FrameSchedule(ho.schedule).describe())
                  .c_str());
    if (!is_loopback(a.host))
        log()->warn(
            "serve: listening on {}, not loopback: anyone who reaches it drives the policy (no "
            "authentication, no encryption)",
            a.host);
    so.on_listening = [](const std::string& host, uint16_t port) {
        std::printf("dzr serve: listening on ws://%s:%u (Ctrl-C stops)\n",
                    host.find(':') != std::string::npos ? ("[" + host + "]").c_str() : host.c_str(),
                    unsigned(port));
        std::fflush(stdout);
    };
    serve::Server server(handler, so);
    const serve::ServeReport report = server.run();
    print_summary(report);
    return 0;
}

CommandRegistrar reg([](CLI::App& app, std::function<int()>& run_fn) {
    auto args = std::make_shared<ServeArgs>();
    auto* cmd =
        app.add_subcommand("serve",
                           "Serve the policy over a websocket with the official DreamZero server's protocol "
                           "(RoboArena clients, DROID)");
    cmd->add_option("--ckpt", args->ckpt, "Checkpoint directory")->required();
    cmd->add_option(
        "--config", args->config,
        "Run config (configs/*.yaml): sampling and kv settings, and the frame schedule recorded sessions "
        "follow (--record)");
    cmd->add_option("--set", args->sets, "Override a key of the --config file (needs --config)");
    args->run_flags.add(cmd, {"embodiment"});
    cmd->add_option(
           "--device", args->device,
           "cpu, cuda or cuda:N; two devices (cuda:0,cuda:1) run the unconditional CFG branch on the second")
        ->capture_default_str();
    args->run_flags.add(cmd, {"numerics"});
    cmd->add_option("--tokenizer", args->tokenizer, "umT5 spiece.model (or a directory holding it)");
    cmd->add_option("--host", args->host,
                    "Address to listen on (loopback by default; the server has no authentication)")
        ->capture_default_str();
    cmd->add_option("--port", args->port, "Port to listen on (0: a free one, printed)")
        ->capture_default_str();
    cmd->add_option(
        "--record", args->record,
        "Write every served session as an episode directory DIR/<session> that `dzr rollout` replays "
        "into the same actions (plus served_actions.npy and serve.json)");
    cmd->add_option(
           "--max-message-mb", args->max_message_mb,
           "Largest request accepted, in MiB (larger ones get a text error and the connection closes)")
        ->capture_default_str();
    cmd->add_flag("--no-warmup", args->no_warmup,
                  "Skip the warm-up (the first calls then pay first-call costs)");
    cmd->add_option("--max-sessions", args->max_sessions,
                    "Clients served at once, each with its own engine session (their calls interleave, one at a "
                    "time); more clients wait in a queue. The KV cache and the memory plan hold this many sessions")
        ->capture_default_str();
    // NOTE: without a budget the served sessions' plan is fitted to a GPU's free memory (check_serve_memory)
    args->run_flags.add(cmd, {"gpu_memory_budget"});
    cmd->callback([args, &run_fn] { run_fn = [args] { return run(*args); }; });
});

}  // namespace
}  // namespace dzr::app
