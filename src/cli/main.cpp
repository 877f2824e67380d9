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

// A long option's name with '_' written as '-' (--backend_sampling is --backend-sampling, as
// llama.cpp's tools read it); a value after '=' stays as it is.
std::string dashed_long_option(std::string arg) {
  if (!arg.starts_with("--")) return arg;
  const size_t end = std::min(arg.find('='), arg.size());
  std::replace(arg.begin() + 2, arg.begin() + (std::ptrdiff_t)end, '_', '-');
  return arg;
}

// Arguments with each subcommand's flag aliases rewritten (only after the subcommand's
// name, so nothing before it is touched). `value_options` are the top-level options that
// take a value, whose value must not be mistaken for a subcommand's name.
std::vector<std::string> apply_flag_aliases(int argc, char** argv,
                                            const std::vector<CommandSpec>& registry,
                                            const std::vector<std::string>& value_options) {
  std::vector<std::string> args(argv, argv + argc);
  const CommandSpec* command = nullptr;
  for (size_t i = 1; i < args.size(); ++i) {
    std::string& arg = args[i];
    if (arg == "--") break;  // the rest are positional arguments
    if (command) {
      arg = dashed_long_option(std::move(arg));
      for (const auto& [alias, flag] : command->flag_aliases)
        if (arg == alias) arg = flag;
      continue;
    }
    if (std::find(value_options.begin(), value_options.end(), arg) != value_options.end()) {
      ++i;  // skip the option's value
      continue;
    }
    for (const CommandSpec& spec : registry)
      if (arg == spec.name) command = &spec;
  }
  return args;
}

// The first argument that is not an option, when it names no subcommand ("" otherwise).
std::string unknown_command(const std::vector<std::string>& args,
                            const std::vector<CommandSpec>& registry) {
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--log-level") {
      ++i;
      continue;
    }
    if (arg.empty() || arg[0] == '-') continue;
    for (const CommandSpec& spec : registry)
      if (arg == spec.name) return "";
    return arg;
  }
  return "";
}

int run_main(int argc, char** argv) {
  CLI::App app{"hablar: LLM inference engine and OpenAI-compatible server"};
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off")
      ->capture_default_str();
  app.set_version_flag("--version", std::string("hablar ") + HABLAR_VERSION_STRING);

  // Options a subcommand does not know go up to this level: `hablar run --log-level warn`
  // works as well as `hablar --log-level warn run`. Subcommands inherit this setting.
  app.fallthrough();

  auto& registry = command_registry();
  std::sort(registry.begin(), registry.end(),
            [](const CommandSpec& a, const CommandSpec& b) { return a.name < b.name; });
  std::map<CLI::App*, std::function<int()>> actions;
  for (const CommandSpec& spec : registry) {
    CLI::App* sub = app.add_subcommand(spec.name, spec.description);
    actions[sub] = spec.setup(*sub);
  }
  std::vector<std::string> args = apply_flag_aliases(argc, argv, registry, {"--log-level"});
  if (const std::string unknown = unknown_command(args, registry); !unknown.empty()) {
    std::string names;
    for (const CommandSpec& spec : registry) names += (names.empty() ? "" : ", ") + spec.name;
    std::fprintf(stderr, "error: unknown command '%s' (commands: %s; see hablar --help)\n",
                 unknown.c_str(), names.c_str());
    return 2;
  }
  std::vector<char*> arg_ptrs;
  for (std::string& a : args) arg_ptrs.push_back(a.data());
  try {
    app.parse((int)arg_ptrs.size(), arg_ptrs.data());
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
