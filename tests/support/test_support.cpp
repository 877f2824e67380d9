#include "support/test_support.h"

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <random>
#include <vector>

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

namespace {

// The directories make_temp_dir handed out, removed when the test process exits (ctest runs
// each test in a process of its own, so nothing piles up in /tmp across runs).
class TempDirRegistry {
 public:
  void add(const std::filesystem::path& dir) {
    std::lock_guard lock(mutex_);
    dirs_.push_back(dir);
  }
  ~TempDirRegistry() {
    std::error_code ec;
    for (const auto& dir : dirs_) std::filesystem::remove_all(dir, ec);
  }

 private:
  std::mutex mutex_;
  std::vector<std::filesystem::path> dirs_;
};

TempDirRegistry& temp_dirs() {
  static TempDirRegistry registry;
  return registry;
}

}  // namespace

std::string make_temp_dir(const std::string& prefix) {
  std::random_device rd;
  const auto dir = std::filesystem::temp_directory_path() /
                   (prefix + "-" + std::to_string(rd()) + std::to_string(rd()));
  std::filesystem::create_directories(dir);
  temp_dirs().add(dir);
  return dir.string();
}

}  // namespace hablar::test
