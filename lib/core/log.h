#pragma once
/// The one named logger ("dzr"). Library code logs through dzr::log(); apps set the level.
#include <spdlog/spdlog.h>

#include <memory>
#include <string_view>

namespace dzr {

std::shared_ptr<spdlog::logger> log();

/// "trace", "debug", "info", "warn", "error", "off". Throws dzr::Error for other names.
void set_log_level(std::string_view level);

}  // namespace dzr
