// The CPU executor: the model's forward (model/forward.h) over the CPU backend's ops, with
// the paged KV cache in host memory (F16, or Q8_0 / Q4_0 rows). The engine samples its logits on
// the host.
#pragma once

#include <memory>
#include <vector>

#include "backend/cpu/embed_ops.h"
#include "backend/cpu/forward_ops.h"
#include "core/thread_pool.h"
#include "engine/executor.h"
#include "model/model.h"

namespace hablar::engine {

class CpuExecutor : public StepExecutor {
 public:
  // A cache of `n_blocks` blocks of `block_size` positions; n_threads 0 = every core.
  // Throws Error(kUnsupported) naming a tensor whose type has no CPU kernel.
  // cache_type_k / _v: F16 (the default), Q8_0 or Q4_0.
  CpuExecutor(const model::Model& model, int32_t n_blocks, int32_t block_size = kDefaultKvBlockSize,
              int n_threads = 0, KvDType cache_type_k = KvDType::F16,
              KvDType cache_type_v = KvDType::F16);

  int32_t n_vocab() const override { return model_.config().n_vocab; }
  int32_t n_kv_blocks() const override { return layout_.n_blocks; }
  int32_t kv_block_size() const override { return layout_.block_size; }
  void execute(std::span<const BlockCopy> copies, std::span<const ExecChunk> chunks,
               StepOutput& out) override;
  std::string describe() const override;
  int32_t kv_window() const override { return model::kv_window(model_.config()); }
  bool kv_snapshot_layout(KvCacheLayout* layout, std::string* why) const override;
  void read_kv_blocks(std::span<const int32_t> blocks, std::span<uint8_t> out) override;
  void write_kv_blocks(std::span<const int32_t> blocks, std::span<const uint8_t> in) override;
  bool can_embed(std::string* why) const override;
  void embed(std::span<const EmbedChunk> chunks,
             EmbedOutput& out) override;  // cpu_executor_embed.cpp

  // One forward over the chunks (checked first); logits rows as StepOutput::logits.
  void forward(std::span<const SequenceChunk> chunks, std::vector<float>& logits);
  void drop_unwanted_rows(std::span<const ExecChunk> chunks, std::vector<float>& logits);

  const KvCacheLayout& layout() const { return layout_; }
  const uint16_t* cache() const { return cache_.data(); }
  int n_threads() const { return pool_->size(); }
  // The executor's threads, for work that runs between its steps (a draft model's forward).
  ThreadPool& thread_pool() const { return *pool_; }
  // The rate (GB/s) at which the threads read the decode matrices with no arithmetic, in one
  // parallel pass over every matrix, best of `passes`: the memory bound on decode speed.
  double weight_read_gbs(int passes) const;

 private:
  void copy_block(const BlockCopy& copy);

  const model::Model& model_;
  KvCacheLayout layout_;
  std::vector<uint16_t> cache_;  // [layer][K|V][block][kv_head][slot][dim] F16
  std::unique_ptr<ThreadPool> pool_;
  cpu::ForwardOps ops_;
  cpu::EmbedOps embed_ops_;
  // The model's RoPE variants for this cache's context (LongRoPE's factor set).
  std::vector<RopeParams> ropes_;
  std::vector<SequenceChunk> chunks_;
};

}  // namespace hablar::engine
