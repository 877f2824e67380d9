// Model drafters: a forward of a (cheaper) model drafts greedily, batched over the sequences
// that draft in a step.
//
//   draft  a separate model with the target's vocabulary (--model-draft): checked at load,
//          token by token
//   self   the target itself with a subset of its layers (--spec-self-skip): a view of the
//          target's weights (LayerWeights copied as views, no weight data) and a config
//          with those layers, run by the same forward (model/forward.h)
//
// Each drafter owns its KV cache and its own BlockManager instance (rather than sharing the
// engine's): the draft's cache has another layer count and head shape, its blocks are never
// shared or hashed, and the engine's block accounting and preemption stay the target's
// alone. A sequence's draft-side state is the tokens whose K/V the draft cache holds; each
// step it is rolled back to the common prefix with the target's committed tokens (rejected
// draft tokens leave), then the missing tokens are run and k tokens drafted.
// CPU only (the draft runs on the host; a GPU target still verifies on its device).
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/cpu/forward_ops.h"
#include "core/thread_pool.h"
#include "engine/block_manager.h"
#include "engine/drafter.h"
#include "model/model.h"
#include "model/weights.h"

namespace hablar::engine {

struct ModelDrafterOptions {
  int n_threads = 0;           // for its own pool when `pool` is null (0: every core)
  ThreadPool* pool = nullptr;  // share the target executor's threads (they run in turn)
  int32_t kv_tokens = 8192;    // positions of the draft's KV cache
};

// Parses a layer list "3,5-9,12" (what to skip) for a model of n_layers; Error naming the bad
// item. Returns the layers to keep, ascending; at least one is kept and one skipped.
std::vector<int> kept_layers(const std::string& skip, int n_layers);
// The default skip list for self-speculation on a model of n_layers (as text).
std::string default_self_skip(int n_layers);

class ModelDrafter : public Drafter {
 public:
  // A separate draft model (`draft` must outlive nothing else: it is owned here). Throws
  // Error(kInvalidArgument) when its vocabulary differs from the target's.
  ModelDrafter(const model::Model& target, std::unique_ptr<model::Model> draft,
               const ModelDrafterOptions& o);
  // Self-speculation: the target's own weights, running only `layers` (ascending).
  ModelDrafter(const model::Model& target, const std::vector<int>& layers,
               const ModelDrafterOptions& o);
  ~ModelDrafter() override;

  SpecType type() const override { return type_; }
  void draft(std::span<DraftJob> jobs) override;
  void release(uint64_t seq_id) override;
  double ms_per_position() const override { return ms_per_position_; }
  std::string describe() const;

 private:
  struct Active {
    DraftJob* job;
    Sequence* state;
    size_t pending_from;  // index into job->seq->tokens of the first token not in the cache
    bool open = true;     // still drafting
  };
  void init(const ModelDrafterOptions& o);
  bool prepare(DraftJob& job, std::vector<Active>& active);
  void catch_up(std::vector<Active>& active, size_t max_chunk);
  void forward(std::span<const SequenceChunk> chunks);

  SpecType type_;
  std::unique_ptr<model::Model> owned_;  // the draft model (kDraft)
  const model::Model& source_;           // whose weights are run
  model::ModelConfig config_;
  model::Weights weights_;  // views into source_'s
  KvCacheLayout layout_;
  std::vector<uint16_t> cache_;  // [layer][K|V][block][kv_head][slot][dim] F16
  std::unique_ptr<ThreadPool> own_pool_;
  std::unique_ptr<cpu::ForwardOps> ops_;
  std::unique_ptr<BlockManager> blocks_;
  std::unordered_map<uint64_t, std::unique_ptr<Sequence>> states_;
  std::vector<SequenceChunk> chunks_;
  std::vector<float> logits_;
  std::vector<BlockCopy> copies_;
  double ms_per_position_ = 0;
};

}  // namespace hablar::engine
