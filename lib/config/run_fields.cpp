#include "config/run_fields.h"

#include <fmt/format.h>

#include <array>
#include <type_traits>
#include <vector>

#include "core/error.h"

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
    } else if constexpr (std::is_same_v<T, KvMode>) {
        return Json(kv_mode_name(v));
    } else if constexpr (std::is_same_v<T, KvInPlace>) {
        return Json(kv_in_place_name(v));
    } else if constexpr (std::is_same_v<T, Numerics>) {
        return Json(numerics_name(v));
    } else if constexpr (std::is_same_v<T, std::vector<bool>>) {
        Json a = Json::array();
        for (bool b : v) a.push_back(b);
        return a;
    } else {
        return Json(v);
    }
}

void add_settings(Json& j, const RunConfig& r, bool numbers_only) {
    for_each_run_field(r, [&](const Setting& s, const auto& v) {
        if (!numbers_only || s.changes_numbers) slot(j, s.key) = value_json(v);
    });
}

}  // namespace

nlohmann::ordered_json run_config_json(const RunConfig& r) {
    Json j = Json::object();
    for_each_model_field(r.model, [&](const ModelField& f, const auto& v) {
        slot(j, std::string("model.") + std::string(f.yaml)) = value_json(v);
    });
    add_settings(j, r, false);
    return j;
}

nlohmann::ordered_json run_settings_json(const RunConfig& r, bool numbers_only) {
    Json j = Json::object();
    add_settings(j, r, numbers_only);
    return j;
}

void check_setting_value(const RunConfig& r, const Setting& s, const std::string& where) {
    if (&s == &setting::kGpuMemoryBudget && !r.gpu_memory_budget.empty())
        parse_memory_budget(r.gpu_memory_budget, where);
    if (&s == &setting::kOffloadLayers) parse_offload_layers(r.offload_layers, where);
}

std::string setting_text(const RunConfig& run, const Setting& s) {
    std::string text;
    bool found = false;
    for_each_run_field(run, [&](const Setting& f, const auto& v) {
        if (f.key != s.key) return;
        const Json j = value_json(v);
        text = j.is_string() ? j.get<std::string>() : j.dump();
        found = true;
    });
    DZR_CHECK(found, "no run setting {}", s.key);
    return text;
}

std::string setting_default(const Setting& s) { return setting_text(RunConfig{}, s); }

}  // namespace dzr::config
