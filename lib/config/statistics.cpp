#include "config/statistics.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json_text.h"

namespace dzr {

using nlohmann::json;

namespace {

std::vector<float> number_list(const json& v, const std::string& source, const std::string& path) {
    DZR_CHECK(v.is_array() && !v.empty(), "{}: {} must be a non-empty list of numbers, got {}", source, path,
              v.is_array() ? "an empty list" : v.type_name());
    std::vector<float> out;
    out.reserve(v.size());
    for (const auto& x : v) {
        DZR_CHECK(x.is_number(), "{}: {} must be a list of numbers, found {}", source, path, x.dump());
        out.push_back(x.get<float>());
    }
    return out;
}

std::map<std::string, KeyStatistics> parse_group(const json& group, const std::string& source,
                                                 const std::string& path) {
    DZR_CHECK(group.is_object(), "{}: {} must be an object, got {}", source, path, group.type_name());
    std::map<std::string, KeyStatistics> out;
    for (const auto& [key, st] : group.items()) {
        const std::string kp = path + "." + key;
        DZR_CHECK(st.is_object(), "{}: {} must be an object of statistics, got {}", source, kp,
                  st.type_name());
        KeyStatistics ks;
        DZR_CHECK(st.contains("q01") && st.contains("q99"), "{}: {} needs q01 and q99", source, kp);
        ks.q01 = number_list(st["q01"], source, kp + ".q01");
        ks.q99 = number_list(st["q99"], source, kp + ".q99");
        DZR_CHECK(ks.q01.size() == ks.q99.size(), "{}: {}: q01 has {} values but q99 has {}", source, kp,
                  ks.q01.size(), ks.q99.size());
        const std::pair<const char*, std::vector<float>*> optional[] = {
            {"min", &ks.min}, {"max", &ks.max}, {"mean", &ks.mean}, {"std", &ks.std}};
        for (const auto& [name, dst] : optional) {
            if (!st.contains(name)) continue;
            *dst = number_list(st[name], source, kp + "." + name);
            DZR_CHECK(dst->size() == ks.q01.size(), "{}: {}.{} has {} values, expected {} (as q01)", source,
                      kp, name, dst->size(), ks.q01.size());
        }
        out.emplace(key, std::move(ks));
    }
    return out;
}

}  // namespace

const KeyStatistics& EmbodimentStatistics::get(const std::string& group, const std::string& key) const {
    const std::map<std::string, KeyStatistics>* g = group == "state"    ? &state
                                                    : group == "action" ? &action
                                                                        : nullptr;
    DZR_CHECK(g != nullptr, "statistics group must be 'state' or 'action', got '{}'", group);
    auto it = g->find(key);
    DZR_CHECK(it != g->end(), "metadata.json: embodiment {} has no statistics for {}.{}", tag, group, key);
    return it->second;
}

std::map<std::string, EmbodimentStatistics> parse_metadata_json(const std::string& text,
                                                                const std::string& source) {
    json j;
    try {
        j = parse_json_strict<json>(text, source);
    } catch (const json::exception& e) {
        DZR_THROW("{}: not valid JSON: {}", source, e.what());
    }
    DZR_CHECK(j.is_object(), "{}: expected an object of embodiments at the top level, got {}", source,
              j.type_name());
    DZR_CHECK(!j.empty(), "{}: no embodiments", source);
    std::map<std::string, EmbodimentStatistics> out;
    for (const auto& [name, emb] : j.items()) {
        DZR_CHECK(emb.is_object(), "{}: {} must be an object, got {}", source, name, emb.type_name());
        EmbodimentStatistics es;
        es.tag = name;
        if (emb.contains("embodiment_tag")) {
            DZR_CHECK(emb["embodiment_tag"].is_string(), "{}: {}.embodiment_tag must be a string", source,
                      name);
            es.tag = emb["embodiment_tag"].get<std::string>();
        }
        DZR_CHECK(emb.contains("statistics"), "{}: {} has no statistics", source, name);
        const json& st = emb["statistics"];
        DZR_CHECK(st.is_object(), "{}: {}.statistics must be an object, got {}", source, name,
                  st.type_name());
        DZR_CHECK(st.contains("state") && st.contains("action"), "{}: {}.statistics needs state and action",
                  source, name);
        es.state = parse_group(st["state"], source, name + ".statistics.state");
        es.action = parse_group(st["action"], source, name + ".statistics.action");
        out.emplace(name, std::move(es));
    }
    return out;
}

}  // namespace dzr
