#include "config/run_fields.h"

#include <fmt/format.h>

#include <array>
#include <type_traits>
#include <vector>

namespace dzr::config {

namespace {

using Json = nlohmann::ordered_json;

/// The object at the dotted path's parent, created on the way; returns the last segment's slot.
Json& slot(Json& root, std::string_view path) {
    Json* node = &root;
    size_t start = 0;
    while (true) {
        const size_t dot = path.find('.', start);
        const std::string key(path.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start));
        node = &(*node)[key];
        if (dot == std::string_view::npos) return *node;
        start = dot + 1;
    }
}

template <class T>
Json value_json(const T& v) {
    if constexpr (std::is_same_v<T, KvBudget>) {
        // NOTE: the form parse_kv_budget reads back: "auto", a byte count, or a percentage of free memory
        if (v.kind == KvBudgetKind::Bytes) return Json(v.bytes);
        if (v.kind == KvBudgetKind::Fraction) return Json(fmt::format("{}%", v.fraction * 100.0));
        return Json("auto");
    } else if constexpr (std::is_same_v<T, Precision>) {
        return Json(precision_name(v));
    } else if constexpr (std::is_same_v<T, std::vector<bool>>) {
        Json a = Json::array();
        for (bool b : v) a.push_back(b);
        return a;
    } else {
        return Json(v);
    }
}

}  // namespace

nlohmann::ordered_json run_config_json(const RunConfig& r) {
    Json j = Json::object();
    for_each_model_field(r.model, [&](const ModelField& f, const auto& v) {
        slot(j, std::string("model.") + std::string(f.yaml)) = value_json(v);
    });
    for_each_run_field(r, [&](const RunField& f, const auto& v) {
        (f.section.empty() ? j : j[std::string(f.section)])[std::string(f.name)] = value_json(v);
    });
    return j;
}

}  // namespace dzr::config
