// What the engine needs from a device: run one planned step. The CPU ModelRunner
// (model_runner.h) implements it over model::Model; tests implement it with a fake model
// that reads the paged cache through the same block tables, so wiring faults show up.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/block_manager.h"

namespace hablar::engine {

// One sequence's share of a step (mirrors model::SequenceChunk).
struct ExecChunk {
  std::span<const int32_t> tokens;       // tokens to process now
  int32_t start_pos = 0;                 // position of tokens[0]; the cache holds [0, start_pos)
  std::span<const int32_t> block_table;  // blocks covering [0, start_pos + tokens.size())
  int32_t generated_from = -1;           // positions >= this hold sampled tokens (-1: unknown)
  bool all_logits = false;               // a logits row for every token, not just the last
};

class StepExecutor {
 public:
  virtual ~StepExecutor() = default;
  virtual int32_t n_vocab() const = 0;
  // Performs the block copies (copy-on-write) first, then the forward; writes rows of
  // n_vocab logits into `logits` in chunk order: one per token of an all_logits chunk, else
  // one (for its last token).
  virtual void execute(std::span<const BlockCopy> copies, std::span<const ExecChunk> chunks,
                       std::vector<float>& logits) = 0;
};

}  // namespace hablar::engine
