#include "model/sequence_runner.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "core/error.h"

namespace hablar::model {
namespace {

int blocks_for(int n_ctx) {
  if (n_ctx <= 0)
    throw_error(ErrorKind::kInvalidArgument,
                "context size must be > 0, got " + std::to_string(n_ctx));
  return (n_ctx + kDefaultKvBlockSize - 1) / kDefaultKvBlockSize;
}

}  // namespace

SequenceRunner::SequenceRunner(Model& model, int n_ctx, int n_batch)
    : model_(model),
      n_ctx_(n_ctx),
      n_batch_(n_batch),
      cache_(model.kv_layout_for(blocks_for(n_ctx))) {
  if (n_batch <= 0)
    throw_error(ErrorKind::kInvalidArgument,
                "batch size must be > 0, got " + std::to_string(n_batch));
  block_table_.resize((size_t)cache_.layout().n_blocks);
  std::iota(block_table_.begin(), block_table_.end(), 0);
}

std::span<const float> SequenceRunner::eval(std::span<const int32_t> tokens, bool all_logits) {
  if (tokens.empty()) throw_error(ErrorKind::kInvalidArgument, "no tokens to evaluate");
  if ((int64_t)n_past_ + (int64_t)tokens.size() > n_ctx_)
    throw_error(ErrorKind::kResource, std::to_string(n_past_) + " tokens in context + " +
                                          std::to_string(tokens.size()) +
                                          " new exceed the context size " + std::to_string(n_ctx_));
  const size_t n_vocab = (size_t)model_.config().n_vocab;
  logits_.clear();
  for (size_t done = 0; done < tokens.size();) {
    const size_t n = std::min(tokens.size() - done, (size_t)n_batch_);
    const bool last_batch = done + n == tokens.size();
    SequenceChunk chunk;
    chunk.tokens = tokens.subspan(done, n);
    chunk.start_pos = n_past_;
    chunk.block_table = block_table_;
    chunk.all_logits = all_logits;
    model_.forward(std::span(&chunk, 1), cache_, step_logits_);
    if (all_logits)
      logits_.insert(logits_.end(), step_logits_.begin(), step_logits_.end());
    else if (last_batch)
      logits_.assign(step_logits_.end() - (ptrdiff_t)n_vocab, step_logits_.end());
    n_past_ += (int)n;
    done += n;
  }
  return logits_;
}

}  // namespace hablar::model
