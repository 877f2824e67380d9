// One sequence over its own contiguous KV cache: the simple driver `hablar run`, `bench`,
// `perplexity` and the tests use (the server schedules many sequences over a shared cache
// with Model::forward directly).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/model.h"

namespace hablar::model {

class SequenceRunner {
 public:
  // A cache for n_ctx positions; prompts are processed n_batch tokens per forward call.
  SequenceRunner(Model& model, int n_ctx, int n_batch = 512);

  // Appends tokens at the end of the sequence. Returns the logits of the last token
  // ([n_vocab]), or of every token when all_logits ([tokens.size() x n_vocab]). Throws
  // Error(kResource) when the tokens do not fit in the context (nothing is evaluated).
  std::span<const float> eval(std::span<const int32_t> tokens, bool all_logits = false);

  int n_past() const { return n_past_; }
  int n_ctx() const { return n_ctx_; }
  void reset() { n_past_ = 0; }  // forget the sequence (the cache is overwritten)
  const KvCache& cache() const { return cache_; }

 private:
  Model& model_;
  int n_ctx_;
  int n_batch_;
  int n_past_ = 0;
  KvCache cache_;
  std::vector<int32_t> block_table_;
  std::vector<float> step_logits_;
  std::vector<float> logits_;
};

}  // namespace hablar::model
