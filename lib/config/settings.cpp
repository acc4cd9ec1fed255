#include "config/settings.h"

#include <fmt/format.h>

#include "config/run_fields.h"

namespace dzr::config {

std::string_view Setting::section() const {
    const size_t dot = key.find('.');
    return dot == std::string_view::npos ? std::string_view() : key.substr(0, dot);
}

std::string_view Setting::field() const {
    const size_t dot = key.find('.');
    return dot == std::string_view::npos ? key : key.substr(dot + 1);
}

const std::vector<const Setting*>& run_settings() {
    // NOTE: walked once over a default config, so the list is the walk's (run_fields.h), never a second copy
    static const std::vector<const Setting*> all = [] {
        std::vector<const Setting*> v;
        const RunConfig defaults;
        for_each_run_field(defaults, [&](const Setting& s, const auto&) { v.push_back(&s); });
        return v;
    }();
    return all;
}

const Setting* find_setting(std::string_view key_or_name) {
    for (const Setting* s : run_settings())
        if (s->key == key_or_name || s->name == key_or_name) return s;
    return nullptr;
}

std::string run_settings_table() {
    const auto cell = [](std::string_view text) { return text.empty() ? std::string("-") : fmt::format("`{}`", text); };
    std::string out =
        "| name | YAML key | flag | environment | default | changes the numbers | what |\n"
        "|---|---|---|---|---|---|---|\n";
    for (const Setting* s : run_settings()) {
        const std::string def = setting_default(*s);
        out += fmt::format("| {} | `{}` | {} | {} | {} | {} | {} |\n", s->name, s->key, cell(s->flag), cell(s->env),
                           def.empty() ? "(none)" : cell(def), s->changes_numbers ? "yes" : "no", s->what);
    }
    return out;
}

}  // namespace dzr::config
