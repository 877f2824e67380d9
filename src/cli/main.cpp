// hablar: one binary, many subcommands (see command.h). Errors are reported on stderr with
// exit code 1; nothing escapes as an uncaught exception.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <map>
#include <memory>

#include "cli/command.h"
#include "core/error.h"
#include "core/log.h"

namespace hablar::cli {

std::vector<CommandSpec>& command_registry() {
  static std::vector<CommandSpec> registry;
  return registry;
}

namespace {

int run_main(int argc, char** argv) {
  CLI::App app{"hablar: LLM inference engine and OpenAI-compatible server"};
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off")
      ->capture_default_str();
  app.set_version_flag("--version", std::string("hablar ") + HABLAR_VERSION_STRING);

  auto& registry = command_registry();
  std::sort(registry.begin(), registry.end(),
            [](const CommandSpec& a, const CommandSpec& b) { return a.name < b.name; });
  std::map<CLI::App*, std::function<int()>> actions;
  for (const CommandSpec& spec : registry) {
    CLI::App* sub = app.add_subcommand(spec.name, spec.description);
    actions[sub] = spec.setup(*sub);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  log::init_stderr();
  log::set_level(log_level);
  for (auto& [sub, action] : actions)
    if (sub->parsed()) return action();
  return 2;
}

}  // namespace
}  // namespace hablar::cli

int main(int argc, char** argv) {
  try {
    return hablar::cli::run_main(argc, argv);
  } catch (const hablar::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
