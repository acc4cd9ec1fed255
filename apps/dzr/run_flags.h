#pragma once
/// The run settings' command-line flags (config/settings.h) on a subcommand: added from the registry, so every command
/// that takes a setting names, explains and parses it the same way. Precedence: a flag wins over the config's --set
/// overrides, which win over the config file, which wins over the default.
#include <CLI/CLI.hpp>

#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "config/run_config.h"
#include "config/settings.h"

namespace dzr::app {

/// The flags one subcommand took; filled by CLI11 when it parses.
class RunFlags {
  public:
    /// Adds the flags of these settings (YAML keys: "numerics", "kv.dtype") to `cmd`, in this order.
    void add(CLI::App* cmd, std::initializer_list<std::string_view> keys);

    /// Sets each given flag's setting in `run` (call after the config file and its --set overrides). Throws
    /// dzr::Error naming the flag for a value its setting does not accept.
    void apply(config::RunConfig& run) const;

  private:
    struct Flag {
        const config::Setting* setting = nullptr;
        CLI::Option* option = nullptr;
        std::string value;
        bool off = false;
    };
    // NOTE: CLI11 keeps pointers to the values; a vector of unique_ptr keeps them in place as flags are added
    std::vector<std::unique_ptr<Flag>> flags_;
};

}  // namespace dzr::app
