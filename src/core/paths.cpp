#include "core/paths.h"

#include <cstdlib>
#include <filesystem>

#include "core/error.h"

namespace hablar {

namespace fs = std::filesystem;

std::string model_cache_dir() {
  if (const char* home = std::getenv("HABLAR_HOME"); home && *home)
    return (fs::path(home) / "models").string();
  const char* user_home = std::getenv("HOME");
  return (fs::path(user_home && *user_home ? user_home : "/tmp") / ".cache" / "hablar" / "models")
      .string();
}

std::string resolve_model_path(std::string_view name_or_path) {
  const std::string arg(name_or_path.empty() ? kDefaultModelName : name_or_path);
  std::error_code ec;
  if (fs::is_regular_file(arg, ec)) return arg;
  if (fs::is_directory(arg, ec) && (fs::is_regular_file(fs::path(arg) / "config.json", ec) ||
                                    fs::is_regular_file(fs::path(arg) / "tokenizer.json", ec)))
    return arg;  // a Hugging Face model directory (or a tokenizer alone)
  const fs::path cache(model_cache_dir());
  for (const std::string& candidate : {arg, arg + ".gguf"}) {
    const fs::path p = cache / candidate;
    if (fs::is_regular_file(p, ec)) return p.string();
  }
  std::string msg =
      "model '" + arg + "' not found (looked for the path and in " + cache.string() + ")";
  if (arg == kDefaultModelName)
    msg += "; fetch the default model with: " + std::string(kFetchModelCommand);
  throw_error(ErrorKind::kNotFound, msg);
}

}  // namespace hablar
