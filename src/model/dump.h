// Debug dumps of a forward pass's intermediates, to compare op by op with a reference
// implementation (tools/llama_dump.py compare). Off unless the environment variable
// HABLAR_DUMP_DIR names a directory (read once); then every write() appends the rows of one
// intermediate to <dir>/<name>-<layer>.f32 (raw float32, [n_rows x width]).
#pragma once

#include <cstdint>
#include <string>

namespace hablar::model {

class ActivationDump {
 public:
  // The process-wide dump, or nullptr when HABLAR_DUMP_DIR is unset or empty.
  static ActivationDump* instance();

  // Appends rows [n_rows x width]; a layer < 0 is left out of the file name.
  void write(const char* name, int layer, const float* rows, int64_t n_rows, int64_t width);

 private:
  explicit ActivationDump(std::string dir) : dir_(std::move(dir)) {}
  std::string dir_;
};

}  // namespace hablar::model
