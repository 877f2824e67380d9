// Continuous batching: every step mixes the running sequences' decodes with chunks of
// prompts being prefilled, within a per-step budget of tokens and, when a cost model is
// attached, of time.
//
// One step's plan:
//   0. Priority (lower value first, as vLLM's `priority`): when every running slot is taken
//      and a waiting request outranks the lowest-ranked running one, that one is preempted.
//   1. The step's budget. With nobody decoding, max_step_tokens (prefill runs at full width:
//      no stream is waiting on this step). With wave_prefill, alike prompts prefilled while
//      nobody decodes form a wave that ends together: each keeps its last token back until
//      the wave's remaining prompt tokens are no more than one per member plus
//      min_step_prompt_tokens, so every member's first token comes from one step and no
//      stream ever decodes beside the rest of the wave's prefill. With streams decoding,
//      the step is a stall for each of them, so it is bounded in time through the executor's
//      measured costs (StepCostModel): by max_step_ms, and by max_decode_slowdown times what
//      its decodes alone cost, the smaller holding; until the costs are learned (or with
//      neither set), by max_step_tokens_decoding. Decoders always get their token; the
//      prompt tokens that fit beside them (at least min_step_prompt_tokens, so prompts always
//      progress) are the prefill budget.
//   2. The prefill budget is shared among the prompts being prefilled (running, and waiting
//      ones that a free slot could take): by priority, then fewest tokens left first (a short
//      chat is not stuck behind a long prompt), the oldest of the best priority guaranteed a
//      quarter (a long prompt is never starved by a stream of short ones). Equal prompts are
//      served first come first served.
//   3. Running sequences in rank order take their token or their share. When the cache has
//      no block for one, the lowest-ranked running sequence is preempted: its blocks are
//      freed and it goes back to the waiting queue, to be recomputed later (its prefix blocks
//      usually survive in the prefix cache).
//   4. Waiting sequences in rank order are admitted with their share while there is a slot
//      and cache room.
// Rank = (priority, arrival). A token's logits do not depend on how its prompt was chunked
// or what else is in the step (on the CPU), so none of this changes any output.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "engine/block_manager.h"
#include "engine/sequence.h"
#include "engine/step_cost.h"

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
  // The time a step may take while any sequence decodes, in ms (0: no time bound). Each
  // decoder waits for the whole step, so this bounds every stream's inter-token latency;
  // prompt chunks fill what the decodes leave, priced by the attached StepCostModel. Until
  // the model has seen enough steps, max_step_tokens_decoding applies.
  double max_step_ms = 0;
  // The time bound relative to the decodes: a step with decodes takes at most this many times
  // what its decodes alone would (0: no relative bound). 2 keeps every stream at no less
  // than half its unloaded pace while prompts prefill, on any device, at any batch size.
  // With max_step_ms too, the smaller bound holds.
  double max_decode_slowdown = 0;
  // The fewest prompt tokens a step offers waiting prompts while streams decode, however
  // little time the decodes leave: prefill always progresses.
  int32_t min_step_prompt_tokens = 8;
  // Waves: while no stream decodes, the prompts being prefilled (running, and waiting ones a
  // free slot takes) finish together, their last tokens held back until they all fit in one
  // short step; prompts that arrive meanwhile join. A lone request pays one extra step of
  // one token; the first members of a wave wait for the last (TTFT), but no stream stalls
  // for the prefill of prompts that arrived with it (llama-server batches simultaneous
  // prompts the same way). Only among alike prompts (the most tokens any has left at most
  // twice the shortest one's prompt: a short chat goes first, as without waves), and only when
  // the cache has room for every member's whole prompt.
  bool wave_prefill = false;
  // Sliding windows (StepExecutor::kv_window, set by the engine): > 0 when no query reads a
  // position more than kv_window - 1 before its own; each running sequence's blocks wholly
  // before its next token's window are then given back before its step is planned, so a
  // long generation holds about window + one step's tokens of cache. 0: keep every block.
  int32_t kv_window = 0;
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
  // Its tokens changed (a context shift): frees its blocks and puts it back in the waiting
  // queue at its rank, to compute them again (with whatever prefix the cache still holds).
  void restart(Sequence* seq);
  StepPlan schedule();

  bool empty() const { return running_.empty() && waiting_.empty(); }
  int32_t n_running() const { return (int32_t)running_.size(); }
  int32_t n_waiting() const { return (int32_t)waiting_.size(); }
  const std::vector<Sequence*>& running() const { return running_; }
  const SchedulerConfig& config() const { return config_; }
  // The executor's measured step costs, for max_step_ms (null: token budgets only). Owned by
  // the caller; read at each schedule().
  void set_cost_model(const StepCostModel* cost) { cost_ = cost; }
  // The token budget the next step gets with `decoders` decoding sequences.
  int32_t step_budget(int32_t decoders) const;
  double step_target_ms(int32_t decoders) const;  // needs the cost model

 private:
  // A sequence's share of this step's prompt tokens.
  struct Share {
    Sequence* seq;
    int32_t n;
  };
  void preempt(Sequence* seq, StepPlan& plan);
  void preempt_for_priority(StepPlan& plan);
  std::vector<Sequence*> prefill_candidates(bool wave) const;
  bool wave_holds(const std::vector<Sequence*>& cands) const;
  std::vector<Share> prefill_shares(int32_t budget, bool wave) const;
  bool schedule_running(size_t index, const std::vector<Share>& shares, bool wave, StepPlan& plan);
  void admit_waiting(const std::vector<Share>& shares, StepPlan& plan);
  void insert_running(Sequence* seq);

  SchedulerConfig config_;
  BlockManager& blocks_;
  const StepCostModel* cost_ = nullptr;
  std::vector<Sequence*> running_;  // sorted by rank (priority, arrival), best first
  std::deque<Sequence*> waiting_;   // sorted by rank, best first
};

}  // namespace hablar::engine
