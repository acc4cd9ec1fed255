#include "apps/dzr/run_flags.h"

#include <fmt/format.h>

#include "core/error.h"

namespace dzr::app {
namespace {

/// The help line of a setting's flag, from the registry alone (every command prints the same one).
std::string flag_help(const config::Setting& s) {
    if (s.negative_flag()) {
        const std::string env = s.env.empty() ? "" : fmt::format(", or {}=0", s.env);
        return fmt::format("Turns {} off ({}; also the config's {}: false{})", s.key, s.what, s.key, env);
    }
    const std::string def = config::setting_default(s);
    return fmt::format("{} (default: the config's {}, else {})", s.what, s.key, def.empty() ? "none" : def);
}

}  // namespace

void RunFlags::add(CLI::App* cmd, std::initializer_list<std::string_view> keys) {
    for (const std::string_view key : keys) {
        const config::Setting* s = config::find_setting(key);
        DZR_CHECK(s != nullptr && !s->flag.empty(), "no run setting with a flag: {}", key);
        auto& f = *flags_.emplace_back(std::make_unique<Flag>());
        f.setting = s;
        const std::string name(s->flag);
        f.option = s->negative_flag() ? cmd->add_flag(name, f.off, flag_help(*s))
                                      : cmd->add_option(name, f.value, flag_help(*s));
    }
}

void RunFlags::apply(config::RunConfig& run) const {
    for (const auto& f : flags_) {
        if (f->option->count() == 0) continue;
        const std::string flag(f->setting->flag);
        if (f->setting->negative_flag()) {
            if (f->off) config::set_setting(run, *f->setting, "false", flag);
        } else {
            config::set_setting(run, *f->setting, f->value, flag);
        }
    }
}

}  // namespace dzr::app
