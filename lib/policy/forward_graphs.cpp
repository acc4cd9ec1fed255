#include "policy/forward_graphs.h"

#include <atomic>
#include <cstdlib>

#include "backend/env_settings.h"
#include "backend/options.h"
#include "backend/profiler.h"
#include "core/error.h"
#include "core/log.h"
#include "core/timer.h"
#include "policy/branch_runner.h"

namespace dzr {

std::string ForwardGraphKey::describe() const {
    return fmt::format("{}.{} {} frame{} at {}, history {} tokens{}", forward_kind_name(ForwardKind(kind)),
                       branch >= 0 && branch < 2 ? kBranchNames[branch] : branch == kBothBranches ? "both" : "?", frames, frames == 1 ? "" : "s",
                       start_frame, history_tokens, committing ? ", committing" : "");
}

ForwardGraphStats& ForwardGraphStats::operator+=(const ForwardGraphStats& o) {
    enabled = enabled || o.enabled;
    captured += o.captured;
    failed += o.failed;
    capture_ms += o.capture_ms;
    replays += o.replays;
    eager += o.eager;
    if (first_failure.empty()) first_failure = o.first_failure;
    return *this;
}

ForwardGraphs::ForwardGraphs(Stream& stream, std::string owner) : stream_(stream), owner_(std::move(owner)) {
    stats_.enabled = true;
}

ForwardGraphs::~ForwardGraphs() = default;

bool ForwardGraphs::has_graph(const ForwardGraphKey& key) const {
    const auto it = entries_.find(key);
    return it != entries_.end() && it->second.graph != nullptr;
}

void ForwardGraphs::clear() { entries_.clear(); }

void ForwardGraphs::run(const ForwardGraphKey& key, const std::function<void()>& forward) {
    if (const auto it = entries_.find(key); it != entries_.end()) {
        if (it->second.graph) {
            it->second.graph->launch();
            ++stats_.replays;
        } else {
            forward();
            ++stats_.eager;
        }
        return;
    }
    // NOTE: eager first: the library plans of every shape are built outside the capture, and this call's result
    // does not depend on the capture succeeding
    forward();
    ++stats_.eager;
    Timer t;
    Entry entry;
    try {
        stream_.begin_capture();
        forward();
        entry.graph = stream_.end_capture();
        ++stats_.captured;
        log()->debug("cuda graphs ({}): captured {} in {:.1f} ms", owner_, key.describe(), t.ms());
    } catch (const std::exception& e) {
        stream_.abort_capture();
        ++stats_.failed;
        if (stats_.first_failure.empty()) stats_.first_failure = fmt::format("{}: {}", key.describe(), e.what());
        // NOTE: one warning per process: the other shapes usually fail for the same reason
        static std::atomic<bool> warned{false};
        if (!warned.exchange(true))
            log()->warn("cuda graphs: capturing {} failed, it runs eagerly ({}); --no-cuda-graphs or "
                        "DZR_CUDA_GRAPHS=0 turns graphs off",
                        key.describe(), e.what());
        else
            log()->debug("cuda graphs ({}): capturing {} failed: {}", owner_, key.describe(), e.what());
    }
    stats_.capture_ms += t.ms();
    entries_.emplace(key, std::move(entry));
}

bool graphs_supported(Backend& be) {
    const Capabilities caps = be.capabilities();
    // NOTE: a profiler that times every op needs the forwards op by op; one that only traces kernels does not
    return caps.graphs && !caps.measuring && (be.profiler() == nullptr || !be.profiler()->ops_timed());
}

bool graphs_env_override(bool configured, const char* value) {
    return env_switch_off("DZR_CUDA_GRAPHS", configured, value);
}

bool graphs_env_override(bool configured) {
    return graphs_env_override(configured, env_value("DZR_CUDA_GRAPHS").value_or("").c_str());
}

}  // namespace dzr
