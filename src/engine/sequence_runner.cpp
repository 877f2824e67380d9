#include "engine/sequence_runner.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "core/error.h"

namespace hablar::engine {

SequenceRunner::SequenceRunner(StepExecutor& executor, int n_ctx, int n_batch)
    : executor_(executor), n_ctx_(n_ctx), n_batch_(n_batch) {
  if (n_ctx <= 0)
    throw_error(ErrorKind::kInvalidArgument,
                "context size must be > 0, got " + std::to_string(n_ctx));
  if (n_batch <= 0)
    throw_error(ErrorKind::kInvalidArgument,
                "batch size must be > 0, got " + std::to_string(n_batch));
  const int block = executor.kv_block_size();
  const int n_blocks = (n_ctx + block - 1) / block;
  if (n_blocks > executor.n_kv_blocks())
    throw_error(ErrorKind::kResource, "a context of " + std::to_string(n_ctx) +
                                          " positions needs " + std::to_string(n_blocks) +
                                          " KV blocks; the executor holds " +
                                          std::to_string(executor.n_kv_blocks()));
  block_table_.resize((size_t)n_blocks);
  std::iota(block_table_.begin(), block_table_.end(), 0);
}

std::span<const float> SequenceRunner::eval(std::span<const int32_t> tokens, bool all_logits) {
  if (tokens.empty()) throw_error(ErrorKind::kInvalidArgument, "no tokens to evaluate");
  if ((int64_t)n_past_ + (int64_t)tokens.size() > n_ctx_)
    throw_error(ErrorKind::kResource, std::to_string(n_past_) + " tokens in context + " +
                                          std::to_string(tokens.size()) +
                                          " new exceed the context size " + std::to_string(n_ctx_));
  const size_t n_vocab = (size_t)executor_.n_vocab();
  logits_.clear();
  for (size_t done = 0; done < tokens.size();) {
    const size_t n = std::min(tokens.size() - done, (size_t)n_batch_);
    const bool last_batch = done + n == tokens.size();
    ExecChunk chunk;
    chunk.tokens = tokens.subspan(done, n);
    chunk.start_pos = n_past_;
    chunk.block_table = block_table_;
    chunk.all_logits = all_logits;
    executor_.execute({}, std::span(&chunk, 1), step_);
    const std::vector<float>& rows = step_.logits;
    if (all_logits)
      logits_.insert(logits_.end(), rows.begin(), rows.begin() + (ptrdiff_t)(n * n_vocab));
    else if (last_batch)
      logits_.assign(rows.begin(), rows.begin() + (ptrdiff_t)n_vocab);
    n_past_ += (int)n;
    done += n;
  }
  return logits_;
}

}  // namespace hablar::engine
