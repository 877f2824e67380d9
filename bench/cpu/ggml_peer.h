// The peer for the matmul benchmark: ggml's CPU matmul (llama.cpp's kernels), loaded at run
// time from a libggml build if one is present ($HABLAR_GGML_LIB_DIR, or the oracle venv of
// tools/). Nothing is linked at build time, so the benchmark builds without llama.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/tensor_view.h"

namespace hablar::bench {

class GgmlMatmul {
 public:
  // nullptr (with the reason in *why) when no libggml could be loaded.
  static std::unique_ptr<GgmlMatmul> create(const WeightView& w, int64_t n_tokens, int n_threads,
                                            std::string* why);
  ~GgmlMatmul();
  // Sets x ([n_tokens][cols]) once; run() computes W x; output() is [n_tokens][rows].
  void set_input(const float* x);
  void run();
  const float* output() const;

  struct Impl;

 private:
  explicit GgmlMatmul(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace hablar::bench
