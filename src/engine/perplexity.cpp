#include "engine/perplexity.h"

#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/sequence_runner.h"

namespace hablar::engine {

PerplexityResult perplexity(const model::Model& model, StepExecutor& executor,
                            std::string_view text, int n_ctx, int n_batch, int max_chunks,
                            const std::function<void(int, double)>& on_chunk) {
  const tokenizer::Tokenizer& tok = model.tokenizer();
  const bool add_bos = tok.add_bos() && tok.bos_id() >= 0;
  const std::vector<int32_t> tokens = tok.encode(text, add_bos, false);
  return perplexity_of_tokens(executor, tokens, n_ctx, n_batch, max_chunks,
                              add_bos ? tok.bos_id() : -1, on_chunk);
}

PerplexityResult perplexity_of_tokens(StepExecutor& executor, std::span<const int32_t> tokens,
                                      int n_ctx, int n_batch, int max_chunks, int32_t bos_id,
                                      const std::function<void(int, double)>& on_chunk) {
  if (n_ctx < 4) throw_error(ErrorKind::kInvalidArgument, "perplexity needs n_ctx >= 4");
  int n_chunks = (int)(tokens.size() / (size_t)n_ctx);
  if (n_chunks == 0)
    throw_error(ErrorKind::kInvalidArgument, "text has " + std::to_string(tokens.size()) +
                                                 " tokens, fewer than one chunk of " +
                                                 std::to_string(n_ctx));
  if (max_chunks > 0) n_chunks = std::min(n_chunks, max_chunks);
  const int first = n_ctx / 2;
  SequenceRunner seq(executor, n_ctx, n_batch);
  double sum = 0.0, sum_sq = 0.0;
  int64_t count = 0;
  PerplexityResult r;
  for (int c = 0; c < n_chunks; ++c) {
    std::vector<int32_t> chunk(tokens.begin() + (ptrdiff_t)c * n_ctx,
                               tokens.begin() + (ptrdiff_t)(c + 1) * n_ctx);
    if (bos_id >= 0) chunk[0] = bos_id;
    seq.reset();
    for (const double nll : seq.next_token_nll(chunk, first)) {
      sum += nll;
      sum_sq += nll * nll;
      ++count;
    }
    if (on_chunk) on_chunk(c, std::exp(sum / (double)count));
  }
  r.n_chunks = n_chunks;
  r.n_scored = count;
  r.mean_nll = sum / (double)count;
  r.ppl = std::exp(r.mean_nll);
  const double var = sum_sq / (double)count - r.mean_nll * r.mean_nll;
  r.ppl_stderr = count > 1 ? r.ppl * std::sqrt(std::max(var, 0.0) / (double)(count - 1)) : 0.0;
  return r;
}

}  // namespace hablar::engine
