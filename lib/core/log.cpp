#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include "core/error.h"

namespace dzr {

std::shared_ptr<spdlog::logger> log() {
    static std::shared_ptr<spdlog::logger> logger = [] {
        auto l = spdlog::stderr_color_mt("dzr");
        l->set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
        l->set_level(spdlog::level::info);
        return l;
    }();
    return logger;
}

void set_log_level(std::string_view level) {
    auto lvl = spdlog::level::from_str(std::string(level));
    // from_str maps unknown names to "off"; only accept "off" when asked for explicitly
    DZR_CHECK(lvl != spdlog::level::off || level == "off",
              "unknown log level '{}' (use trace, debug, info, warn, error or off)", level);
    log()->set_level(lvl);
}

}  // namespace dzr
