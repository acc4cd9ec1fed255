#pragma once
/// Subcommand registration: each apps/dzr/cmd_*.cpp adds its CLI11 subcommand through a static
/// registrar, so main.cpp needs no edit when a command is added.
#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace dzr::app {

/// Adds a subcommand to `app`. The callback it installs must set `run` to the action to execute.
using CommandSetup = std::function<void(CLI::App& app, std::function<int()>& run)>;

std::vector<CommandSetup>& command_registry();

/// The process's command line, as given (for run manifests).
std::vector<std::string>& command_line();

struct CommandRegistrar {
    explicit CommandRegistrar(CommandSetup setup) { command_registry().push_back(std::move(setup)); }
};

}  // namespace dzr::app
