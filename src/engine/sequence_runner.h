// One sequence over an executor's cache, blocks 0 .. n_ctx / block_size in order: the
// simple driver for `hablar perplexity` and the model tests (`run`, `bench` and `serve` go
// through the engine). Any executor works, so the CPU and the GPU are measured the same way.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "engine/executor.h"

namespace hablar::engine {

class SequenceRunner {
 public:
  // n_ctx positions (the executor must hold that many blocks); prompts are processed n_batch
  // tokens per step.
  SequenceRunner(StepExecutor& executor, int n_ctx, int n_batch = 512);

  // Appends tokens at the end of the sequence. Returns the logits of the last token
  // ([n_vocab]), or of every token when all_logits ([tokens.size() x n_vocab]). Throws
  // Error(kResource) when the tokens do not fit in the context (nothing is evaluated).
  std::span<const float> eval(std::span<const int32_t> tokens, bool all_logits = false);

  int n_past() const { return n_past_; }
  int n_ctx() const { return n_ctx_; }
  void reset() { n_past_ = 0; }  // forget the sequence (the cache is overwritten)
  // Keeps the first n tokens (0 <= n <= n_past()); later ones are forgotten.
  void truncate(int n) { n_past_ = std::clamp(n, 0, n_past_); }

 private:
  StepExecutor& executor_;
  int n_ctx_;
  int n_batch_;
  int n_past_ = 0;
  std::vector<int32_t> block_table_;
  StepOutput step_;
  std::vector<float> logits_;
};

}  // namespace hablar::engine
