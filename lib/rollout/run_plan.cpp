#include "rollout/run_plan.h"

#include "core/error.h"
#include "core/json_text.h"
#include "io/atomic_file.h"
#include "io/output_guard.h"

namespace dzr::rollout {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

namespace {

Json optional_number(const std::optional<int64_t>& v) { return v ? Json(*v) : Json(nullptr); }

std::optional<int64_t> optional_number_from(const Json& j, const char* key) {
    const auto it = j.find(key);
    if (it == j.end() || it->is_null()) return std::nullopt;
    return it->get<int64_t>();
}

}  // namespace

bool RunPlan::same_episodes(const RunPlan& other) const {
    if (episodes.size() != other.episodes.size()) return false;
    for (size_t i = 0; i < episodes.size(); ++i)
        if (episodes[i].name != other.episodes[i].name || episodes[i].dir != other.episodes[i].dir) return false;
    return true;
}

Json RunPlan::to_json() const {
    Json j;
    j["run_id"] = run_id;
    j["world_size"] = world_size;
    j["launcher"] = launcher;
    j["created"] = created;
    j["resume"] = resume;
    Json eps = Json::array();
    for (const auto& e : episodes)
        eps.push_back({{"name", e.name}, {"dir", e.dir}, {"frames", optional_number(e.frames)},
                       {"calls", optional_number(e.calls)}});
    j["episodes"] = eps;
    Json ranks = Json::array();
    for (size_t r = 0; r < assignment.size(); ++r) {
        int64_t calls = 0;
        bool known = true;
        for (size_t e : assignment[r]) {
            DZR_ASSERT(e < episodes.size());
            if (!episodes[e].calls) known = false;
            calls += episodes[e].calls.value_or(0);
        }
        ranks.push_back({{"rank", r}, {"calls", known ? Json(calls) : Json(nullptr)}, {"episodes", assignment[r]}});
    }
    j["ranks"] = ranks;
    return j;
}

RunPlan RunPlan::from_json(const Json& j, const std::string& source) {
    RunPlan p;
    try {
        p.run_id = j.at("run_id").get<std::string>();
        p.world_size = j.at("world_size").get<int>();
        p.launcher = j.at("launcher").get<std::string>();
        p.created = j.at("created").get<std::string>();
        p.resume = j.at("resume").get<bool>();
        for (const auto& e : j.at("episodes")) {
            p.episodes.push_back({e.at("name").get<std::string>(), e.at("dir").get<std::string>(),
                                  optional_number_from(e, "frames"), optional_number_from(e, "calls")});
            // NOTE: the name becomes OUT/<name>: one that climbs out of OUT would read or write elsewhere
            DZR_CHECK(io::is_plain_name(p.episodes.back().name), "{}: episode name '{}' is not a plain directory name",
                      source, p.episodes.back().name);
        }
        for (const auto& r : j.at("ranks")) {
            p.assignment.push_back(r.at("episodes").get<std::vector<size_t>>());
            for (size_t e : p.assignment.back())
                DZR_CHECK(e < p.episodes.size(), "{}: rank {} runs episode {}, but the plan lists {}", source,
                          p.assignment.size() - 1, e, p.episodes.size());
        }
    } catch (const Json::exception& ex) {
        DZR_THROW("{}: not a dzr run plan: {}", source, ex.what());
    }
    DZR_CHECK(p.world_size >= 1 && p.assignment.size() == size_t(p.world_size),
              "{}: world_size {} but {} ranks listed", source, p.world_size, p.assignment.size());
    return p;
}

std::optional<RunPlan> read_run_plan(const fs::path& out_dir) {
    const fs::path path = out_dir / std::string(kPlanFile);
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) return std::nullopt;
    Json j;
    try {
        j = parse_json_strict<Json>(io::read_file(path), path.string());
    } catch (const Json::exception& ex) {
        DZR_THROW("{}: invalid JSON: {}", path.string(), ex.what());
    }
    return RunPlan::from_json(j, path.string());
}

void write_run_plan(const fs::path& out_dir, const RunPlan& plan) {
    io::write_file_atomic(out_dir / std::string(kPlanFile), dump_json(plan.to_json()) + "\n");
}

}  // namespace dzr::rollout
