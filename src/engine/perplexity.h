// Perplexity as llama.cpp's perplexity tool computes it (so the figures compare): tokens of
// the text (BOS first when the vocabulary adds one) in chunks of n_ctx; each chunk's first
// token replaced by BOS, evaluated from an empty cache, and positions [n_ctx/2, n_ctx - 1)
// scored by the log-probability they give the next token.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string_view>

#include "engine/executor.h"
#include "model/model.h"

namespace hablar::engine {

struct PerplexityResult {
  double ppl = 0.0;
  double ppl_stderr = 0.0;  // delta-method estimate from the per-token NLL spread
  int n_chunks = 0;
  int64_t n_scored = 0;
  double mean_nll = 0.0;
};

// Throws Error(kInvalidArgument) when the text has fewer than n_ctx tokens (one chunk). max_chunks
// = 0 scores every chunk. on_chunk(i, running ppl).
PerplexityResult perplexity(const model::Model& model, StepExecutor& executor,
                            std::string_view text, int n_ctx, int n_batch, int max_chunks,
                            const std::function<void(int, double)>& on_chunk = {});
// The same over given token ids; each chunk's first token becomes bos_id when bos_id >= 0.
PerplexityResult perplexity_of_tokens(StepExecutor& executor, std::span<const int32_t> tokens,
                                      int n_ctx, int n_batch, int max_chunks, int32_t bos_id,
                                      const std::function<void(int, double)>& on_chunk = {});

}  // namespace hablar::engine
