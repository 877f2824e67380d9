// Continuous batching: every step mixes the running sequences' decodes with chunks of
// prompts being prefilled, within a per-step token budget.
//
// One step's plan, in order:
//   1. Running sequences, oldest first. A decoding sequence takes one token; a sequence in
//      the middle of its prefill takes the next chunk of its prompt, but never so much that
//      the younger decoders behind it lose their token (one token per decoder is reserved).
//      When the cache has no block for a sequence, the newest running sequence is
//      preempted: its blocks are freed and it goes back to the front of the waiting queue,
//      to be recomputed later (its prefix blocks usually survive in the prefix cache).
//   2. Waiting sequences, strictly first come first served (nothing jumps the queue, so
//      nothing starves), while there is budget, a free running slot and cache room.
// The budget is max_step_tokens, or max_step_tokens_decoding when some sequence decodes.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "engine/block_manager.h"
#include "engine/sequence.h"

namespace hablar::engine {

struct SchedulerConfig {
  int32_t max_running = 8;          // sequences in the running set at once
  int32_t max_step_tokens = 512;    // tokens processed in one forward step
  int32_t max_prefill_chunk = 512;  // the most prompt tokens of one sequence in one step
  // The step budget while any running sequence is decoding (0: max_step_tokens). A step's
  // time is every token's wait for its next one, so a smaller budget while streams are live
  // keeps their inter-token latency low; prompts then prefill in more, smaller chunks. Each
  // decoder still gets its token when there are more decoders than this.
  int32_t max_step_tokens_decoding = 0;
};

struct ScheduledChunk {
  Sequence* seq = nullptr;
  int32_t start_pos = 0;  // = seq->n_computed when planned
  int32_t n_tokens = 0;
};

struct StepPlan {
  std::vector<ScheduledChunk> chunks;
  std::vector<BlockCopy> copies;       // copy-on-write, done before the forward
  std::vector<Sequence*> preempted;    // sent back to waiting this step
  std::vector<Sequence*> out_of_room;  // alone and still without a block: finish as "length"
  int32_t n_tokens() const {
    int32_t n = 0;
    for (const auto& c : chunks) n += c.n_tokens;
    return n;
  }
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, BlockManager& blocks);

  void add(Sequence* seq);     // a new request: back of the waiting queue
  void remove(Sequence* seq);  // finished or cancelled: frees its blocks
  StepPlan schedule();

  bool empty() const { return running_.empty() && waiting_.empty(); }
  int32_t n_running() const { return (int32_t)running_.size(); }
  int32_t n_waiting() const { return (int32_t)waiting_.size(); }
  const std::vector<Sequence*>& running() const { return running_; }
  const SchedulerConfig& config() const { return config_; }

 private:
  void preempt(Sequence* seq, StepPlan& plan);
  bool schedule_running(size_t index, int32_t& budget, int32_t decoders_left, StepPlan& plan);
  void admit_waiting(int32_t& budget, StepPlan& plan);
  int32_t step_budget() const;
  void insert_running(Sequence* seq);

  SchedulerConfig config_;
  BlockManager& blocks_;
  std::vector<Sequence*> running_;  // sorted by arrival, oldest first
  std::deque<Sequence*> waiting_;   // sorted by arrival, oldest first
};

}  // namespace hablar::engine
