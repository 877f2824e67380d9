#include "model/dump.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include "core/error.h"

namespace hablar::model {

ActivationDump* ActivationDump::instance() {
  static const std::unique_ptr<ActivationDump> dump = []() -> std::unique_ptr<ActivationDump> {
    const char* dir = std::getenv("HABLAR_DUMP_DIR");
    if (dir == nullptr || *dir == '\0') return nullptr;
    std::filesystem::create_directories(dir);
    return std::unique_ptr<ActivationDump>(new ActivationDump(dir));
  }();
  return dump.get();
}

void ActivationDump::write(const char* name, int layer, const float* rows, int64_t n_rows,
                           int64_t width) {
  char file[256];
  if (layer >= 0)
    std::snprintf(file, sizeof file, "/%s-%d.f32", name, layer);
  else
    std::snprintf(file, sizeof file, "/%s.f32", name);
  const std::string path = dir_ + file;
  std::FILE* f = std::fopen(path.c_str(), "ab");
  if (f == nullptr) throw_error(ErrorKind::kIo, "dump: cannot open " + path);
  const size_t n = (size_t)(n_rows * width);
  const size_t written = std::fwrite(rows, sizeof(float), n, f);
  std::fclose(f);
  if (written != n) throw_error(ErrorKind::kIo, "dump: short write to " + path);
}

}  // namespace hablar::model
