// Subcommand registry of the hablar binary. Each cmd_*.cpp defines one subcommand and
// registers it with a static CommandRegistration, so adding a command touches one file:
//
//   static CommandRegistration reg{"info", "Describe a GGUF model", [](CLI::App& app) {
//     auto opts = std::make_shared<InfoOptions>();
//     app.add_option("file", opts->path, "...");
//     return [opts] { return run_info(*opts); };   // runs when the subcommand is chosen
//   }};
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace hablar::cli {

// Configures the subcommand's options and returns the action that runs it (exit code).
using CommandSetup = std::function<std::function<int()>(CLI::App&)>;

// Spellings a subcommand accepts besides its own flags, e.g. {"-np", "--parallel"}: the
// option parser takes one-letter short flags only, while llama-server users type -np, -ngl.
// main() rewrites them to the long form for arguments after the subcommand's name.
using FlagAliases = std::vector<std::pair<std::string, std::string>>;

struct CommandSpec {
  std::string name;
  std::string description;
  CommandSetup setup;
  FlagAliases flag_aliases;
};

std::vector<CommandSpec>& command_registry();

struct CommandRegistration {
  CommandRegistration(std::string name, std::string description, CommandSetup setup,
                      FlagAliases flag_aliases = {}) {
    command_registry().push_back(
        {std::move(name), std::move(description), std::move(setup), std::move(flag_aliases)});
  }
};

}  // namespace hablar::cli
