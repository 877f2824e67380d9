#include "cli/load_progress.h"

#include <unistd.h>

#include <cstdio>
#include <vector>

namespace hablar::cli {

void warm_file_with_progress(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return;
  std::fseek(f, 0, SEEK_END);
  const long total = std::ftell(f);
  std::fseek(f, 0, SEEK_SET);
  const bool tty = isatty(STDERR_FILENO);
  std::vector<char> buf(8u << 20);
  long done = 0;
  int shown = -1;
  for (size_t n; (n = std::fread(buf.data(), 1, buf.size(), f)) > 0;) {
    done += (long)n;
    const int pct = total > 0 ? (int)(100.0 * (double)done / (double)total) : 100;
    if (tty && pct != shown) {
      std::fprintf(stderr, "\rloading model %3d%% (%ld / %ld MiB)", pct, done >> 20, total >> 20);
      shown = pct;
    }
  }
  if (tty) std::fprintf(stderr, "\n");
  std::fclose(f);
}

}  // namespace hablar::cli
