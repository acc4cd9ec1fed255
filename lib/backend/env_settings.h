#pragma once
/// Every DZR_* environment variable dzr reads, in one list, and the one place they are read. Each entry says what it
/// picks, its values and default, and whether it can change the numbers: those are part of the run fingerprint
/// (docs/FORMATS.md, done.json), and every set one is recorded by `dzr bench rollout`. docs/CLI.md's table of
/// environment variables is printed from this list (`dzr info --env`).
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dzr {

struct EnvSetting {
    const char* name;           ///< "DZR_ATTENTION"
    const char* values;         ///< what it accepts
    const char* default_value;  ///< the behaviour when unset
    bool changes_numbers;       ///< can change an output's bits (then it is in the run fingerprint)
    const char* what;           ///< what it picks, in a line
};

std::span<const EnvSetting> env_settings();

/// The value of a registered variable: nullopt when unset or empty. Throws dzr::Error for a name not in the list
/// (a variable read without being registered is a bug).
std::optional<std::string> env_value(std::string_view name);

/// The registered variables that are set (an empty value counts), in the list's order, as (name, value); with
/// `numbers_only`, those that can change the numbers.
std::vector<std::pair<std::string, std::string>> env_values_set(bool numbers_only);

/// The list as a Markdown table (name, values, default, changes the numbers, what).
std::string env_settings_table();

}  // namespace dzr
