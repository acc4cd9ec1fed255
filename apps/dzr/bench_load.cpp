#include "apps/dzr/bench_load.h"

#include <cstdio>
#include <fstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "core/error.h"
#include "core/timer.h"
#include "model/causal_dit.h"
#include "model/clip_vision.h"
#include "model/umt5.h"
#include "model/wan_vae.h"
#include "weights/checkpoint.h"

namespace dzr::app {

namespace {

struct LoadRun {
    double open_s = 0;   // Checkpoint: headers, index, config
    double build_s = 0;  // the networks' constructors: allocations (and the old path's uploads)
    double total_s = 0;  // open + build + the bulk read + the final synchronize
    uint64_t bytes = 0;  // stored bytes of the weights the networks loaded
    size_t weights = 0;
    BulkLoadStats bulk;  // the new path's read
};

/// One load as Engine does it: the checkpoint opened, the four networks built over one WeightLoader, every
/// weight on the device. The networks are freed after the clock stops.
LoadRun load_once(const LoadBenchOptions& o, Backend& be) {
    LoadRun run;
    const Timer total;
    const Checkpoint ck(o.checkpoint);
    run.open_s = total.seconds();
    const ModelConfig& m = ck.model_config();
    WeightLoader loader(ck, be);
    if (o.path == "new") loader.defer(o.bulk);
    const Timer build;
    Umt5Encoder t5(loader, m.t5);
    ClipVision clip(loader, m.clip, m.canvas_height, m.canvas_width);
    WanVae vae(loader, m.vae);
    CausalDit dit(m.dit, m.canvas_height / 8, m.canvas_width / 8, loader);
    run.build_s = build.seconds();
    run.bulk = loader.finish();
    be.synchronize();
    run.total_s = total.seconds();
    for (const auto& key : loader.used()) {
        if (const SafetensorsEntry* e = ck.entry(key)) run.bytes += e->nbytes();
        ++run.weights;
    }
    return run;
}

}  // namespace

int run_load_bench(const LoadBenchOptions& o) {
    DZR_CHECK(o.path == "new" || o.path == "old", "bench load: --path must be new or old, got '{}'", o.path);
    DZR_CHECK(o.repeat >= 1, "bench load: --repeat must be at least 1, got {}", o.repeat);
    const Timer init;
    BackendOptions bo = apply_env_overrides({});
    bo.workspace_bytes = size_t(64) << 20;  // NOTE: no forward runs; the workspace is not used
    auto be = make_backend(parse_device(o.device), bo);
    be->synchronize();
    const double init_s = init.seconds();
    uint64_t stored = 0;
    size_t shards = 0;
    {
        const Checkpoint ck(o.checkpoint);
        stored = ck.tensor_bytes();
        shards = ck.shards().size();
    }
    std::printf("dzr bench load: %s (%zu shard%s, %.2f GB of tensors) onto %s (backend made in %.2f s)\n",
                o.checkpoint.c_str(), shards, shards == 1 ? "" : "s", double(stored) / 1e9,
                be->name().c_str(), init_s);
    if (o.path == "new")
        std::printf("path new: bulk_load, %d reader threads, %zu MiB reads, %s staging slots, %s\n",
                    bulk_load_threads(o.bulk), o.bulk.chunk_bytes >> 20,
                    o.bulk.slots > 0 ? std::to_string(o.bulk.slots).c_str() : "threads + 2",
                    o.bulk.direct ? "O_DIRECT" : "buffered");
    else
        std::printf("path old: one upload per required weight, from the memory mapping\n");
    nlohmann::json runs = nlohmann::json::array();
    for (int r = 1; r <= o.repeat; ++r) {
        const LoadRun run = load_once(o, *be);
        const double gb = double(run.bytes) / 1e9;
        std::printf("run %d: %zu weights, %.2f GB in %.2f s = %.2f GB/s (open %.2f s, networks %.2f s", r,
                    run.weights, gb, run.total_s, gb / run.total_s, run.open_s, run.build_s);
        if (run.bulk.tensors > 0)
            std::printf(", bulk read %.2f s: %s", run.bulk.seconds, run.bulk.summary().c_str());
        std::printf(")\n");
        std::printf("result path=%s run=%d seconds=%.3f gb=%.3f gb_per_s=%.3f\n", o.path.c_str(), r,
                    run.total_s, gb, gb / run.total_s);
        std::fflush(stdout);
        runs.push_back({{"run", r},
                        {"seconds", run.total_s},
                        {"open_seconds", run.open_s},
                        {"networks_seconds", run.build_s},
                        {"bulk_seconds", run.bulk.seconds},
                        {"bytes", run.bytes},
                        {"weights", run.weights},
                        {"gb_per_s", gb / run.total_s},
                        {"bulk", run.bulk.tensors > 0 ? run.bulk.summary() : ""}});
    }
    if (!o.json.empty()) {
        const nlohmann::json j = {{"checkpoint", o.checkpoint},
                                  {"device", be->name()},
                                  {"path", o.path},
                                  {"threads", o.path == "new" ? bulk_load_threads(o.bulk) : 1},
                                  {"chunk_bytes", o.bulk.chunk_bytes},
                                  {"slots", o.bulk.slots},
                                  {"direct", o.bulk.direct},
                                  {"stored_bytes", stored},
                                  {"runs", runs}};
        std::ofstream f(o.json);
        DZR_CHECK(f.good(), "bench load: cannot write {}", o.json);
        f << j.dump(2) << "\n";
    }
    return 0;
}

}  // namespace dzr::app
