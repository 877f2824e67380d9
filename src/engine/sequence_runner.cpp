#include "engine/sequence_runner.h"

#include <algorithm>
#include <cmath>
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

namespace {

// -log p(target) under softmax(row), in double.
double nll_of(const float* row, int n_vocab, int32_t target) {
  float max_logit = row[0];
  for (int i = 1; i < n_vocab; ++i) max_logit = std::max(max_logit, row[i]);
  double sum = 0.0;
  for (int i = 0; i < n_vocab; ++i) sum += std::exp((double)(row[i] - max_logit));
  return std::log(sum) - (double)(row[target] - max_logit);
}

}  // namespace

void SequenceRunner::append(std::span<const int32_t> tokens, bool all_logits,
                            std::span<const int32_t> targets,
                            const std::function<void(size_t, size_t)>& on_step) {
  if (tokens.empty()) throw_error(ErrorKind::kInvalidArgument, "no tokens to evaluate");
  if ((int64_t)n_past_ + (int64_t)tokens.size() > n_ctx_)
    throw_error(ErrorKind::kResource, std::to_string(n_past_) + " tokens in context + " +
                                          std::to_string(tokens.size()) +
                                          " new exceed the context size " + std::to_string(n_ctx_));
  for (size_t done = 0; done < tokens.size();) {
    const size_t n = std::min(tokens.size() - done, (size_t)n_batch_);
    ExecChunk chunk;
    chunk.tokens = tokens.subspan(done, n);
    chunk.start_pos = n_past_;
    chunk.block_table = block_table_;
    chunk.all_logits = all_logits;
    if (!targets.empty()) chunk.row_targets = targets.subspan(done, n);
    executor_.execute({}, std::span(&chunk, 1), step_);
    on_step(done, n);
    n_past_ += (int)n;
    done += n;
  }
}

std::span<const float> SequenceRunner::eval(std::span<const int32_t> tokens, bool all_logits) {
  const size_t n_vocab = (size_t)executor_.n_vocab();
  logits_.clear();
  append(tokens, all_logits, {}, [&](size_t done, size_t n) {
    const std::vector<float>& rows = step_.logits;
    if (all_logits)
      logits_.insert(logits_.end(), rows.begin(), rows.begin() + (ptrdiff_t)(n * n_vocab));
    else if (done + n == tokens.size())
      logits_.assign(rows.begin(), rows.begin() + (ptrdiff_t)n_vocab);
  });
  return logits_;
}

std::vector<double> SequenceRunner::next_token_nll(std::span<const int32_t> tokens, int first) {
  const int n_vocab = executor_.n_vocab();
  std::vector<double> out;
  if (!executor_.samples_on_device()) {
    const std::span<const float> rows = eval(tokens, true);
    for (size_t j = (size_t)std::max(first, 0); j + 1 < tokens.size(); ++j)
      out.push_back(nll_of(rows.data() + j * (size_t)n_vocab, n_vocab, tokens[j + 1]));
    return out;
  }
  // Every row but the last has a target (rows without one come back as logits rows).
  targets_.assign(tokens.begin() + 1, tokens.end());
  targets_.push_back(-1);
  append(tokens, true, targets_, [&](size_t done, size_t n) {
    HABLAR_CHECK(step_.row_logprobs.size() == n - (done + n == tokens.size() ? 1 : 0),
                 "executor scored the wrong number of rows");
    for (size_t k = 0; k < step_.row_logprobs.size(); ++k)
      if ((int64_t)(done + k) >= first) out.push_back(-(double)step_.row_logprobs[k].logprob);
  });
  return out;
}

}  // namespace hablar::engine
