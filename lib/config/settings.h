#pragma once
/// The run settings, one registry: each setting's YAML key, command-line flag, environment variable, accepted
/// values, whether it can change the numbers and what it does. The default is the RunConfig member's initializer
/// (one default per setting). The YAML reader, --set, the commands' flags (apps/dzr/run_flags.h), the manifest
/// (run_config_json), the resume fingerprint and the docs table (`dzr info --settings`) all walk it; run_fields.h gives
/// the typed walk over a RunConfig's fields.
#include <string>
#include <string_view>
#include <vector>

namespace dzr::config {

struct RunConfig;

struct Setting {
    std::string_view name;    ///< "kv_dtype": unique, what messages and the docs call it
    std::string_view key;     ///< the YAML key: "kv.dtype", "precision" (top level)
    /// The command-line flag ("--kv-dtype") or empty. A flag of a bool setting named "--no-..." turns it off.
    std::string_view flag;
    std::string_view env;     ///< the DZR_* variable that also sets it (backend/env_settings.h), or empty
    std::string_view values;  ///< what it accepts, for help and docs: "bf16 or fp8"
    bool changes_numbers;     ///< can change an output's bits (then it is part of the run fingerprint)
    std::string_view what;    ///< what it does, in a line

    /// The YAML section ("sampling", "kv", "rollout"; "" at the top level) and the key within it.
    std::string_view section() const;
    std::string_view field() const;
    /// A "--no-..." flag: given, it sets the bool setting to false.
    bool negative_flag() const { return flag.starts_with("--no-"); }
};

/// Every run setting, in the order of run_fields.h's walk (the manifest's order).
const std::vector<const Setting*>& run_settings();

/// The setting of a YAML key or name; nullptr when there is none.
const Setting* find_setting(std::string_view key_or_name);

/// The setting's value in `run`, as text that set_setting reads back ("fp8", "[-23, -16, -8, 0]", "auto").
std::string setting_text(const RunConfig& run, const Setting& s);

/// The default: the value of a default-constructed RunConfig.
std::string setting_default(const Setting& s);

/// Sets the setting from text (a YAML scalar or flow list). Throws dzr::Error naming `where` (the flag or the key,
/// with the file), what the setting accepts and the value.
void set_setting(RunConfig& run, const Setting& s, const std::string& text, const std::string& where);

/// The registry as a Markdown table (name, YAML key, flag, environment, default, changes the numbers, what).
std::string run_settings_table();

}  // namespace dzr::config
