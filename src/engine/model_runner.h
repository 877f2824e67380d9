// The CPU model runner: owns the paged KV cache memory and turns a planned step into one
// Model::forward over all of the step's sequences.
#pragma once

#include <memory>
#include <vector>

#include "engine/executor.h"
#include "model/model.h"

namespace hablar::engine {

class ModelRunner : public StepExecutor {
 public:
  // Allocates a cache of `n_blocks` blocks of `block_size` positions for this model.
  ModelRunner(model::Model& model, int32_t n_blocks, int32_t block_size);

  int32_t n_vocab() const override { return model_.config().n_vocab; }
  void execute(std::span<const BlockCopy> copies, std::span<const ExecChunk> chunks,
               std::vector<float>& logits) override;

  const KvCacheLayout& layout() const { return cache_.layout(); }

 private:
  void copy_block(const BlockCopy& copy);

  model::Model& model_;
  model::KvCache cache_;
  std::vector<model::SequenceChunk> chunks_;
};

}  // namespace hablar::engine
