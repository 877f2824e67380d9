#include "support/test_support.h"

#include <cstdlib>
#include <filesystem>
#include <random>

#include "core/paths.h"

namespace hablar::test {

std::string testdata_dir() {
  if (const char* env = std::getenv("HABLAR_TESTDATA"); env && *env) return env;
  return HABLAR_TESTDATA_DEFAULT;
}

std::string source_dir() {
  // A copy of the tree elsewhere (a GPU machine running binaries built here) names its root.
  if (const char* env = std::getenv("HABLAR_SOURCE_DIR"); env && *env) return env;
  return HABLAR_SOURCE_DIR;
}

std::string cached_model_path_or_empty(const std::string& file_name) {
  const auto p = std::filesystem::path(model_cache_dir()) / file_name;
  std::error_code ec;
  return std::filesystem::is_regular_file(p, ec) ? p.string() : "";
}

std::string default_model_path_or_empty() {
  return cached_model_path_or_empty(std::string(kDefaultModelName));
}

std::string make_temp_dir(const std::string& prefix) {
  std::random_device rd;
  const auto dir = std::filesystem::temp_directory_path() /
                   (prefix + "-" + std::to_string(rd()) + std::to_string(rd()));
  std::filesystem::create_directories(dir);
  return dir.string();
}

}  // namespace hablar::test
