// One sequence over an executor's cache, blocks 0 .. n_ctx / block_size in order: the
// simple driver for `hablar perplexity` and the model tests (`run`, `bench` and `serve` go
// through the engine). Any executor works, so the CPU and the GPU are measured the same way.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
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
  // Appends tokens and returns -log p(tokens[j + 1]) for j in [first, tokens.size() - 1),
  // each under softmax of row j (what eval(tokens, true) gives): an executor that samples on
  // its device scores the rows there (ExecChunk::row_targets, no logits rows copied back),
  // others return the rows, scored here in double.
  std::vector<double> next_token_nll(std::span<const int32_t> tokens, int first);

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
  std::vector<int32_t> targets_;
  // Steps of at most n_batch tokens appending `tokens` (with row targets when not empty); after
  // each, on_step(index of its first token, its token count) reads step_.
  void append(std::span<const int32_t> tokens, bool all_logits, std::span<const int32_t> targets,
              const std::function<void(size_t, size_t)>& on_step);
};

}  // namespace hablar::engine
