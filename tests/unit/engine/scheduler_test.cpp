#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <numeric>

namespace hablar::engine {
namespace {

struct Fixture {
  Fixture(int32_t n_blocks, int32_t block_size, SchedulerConfig cfg)
      : blocks(n_blocks, block_size), sched(cfg, blocks) {}
  Sequence* add(int32_t n_prompt, int32_t first_token = 0) {
    auto s = std::make_unique<Sequence>();
    s->id = s->arrival = next++;
    s->tokens.resize((size_t)n_prompt);
    std::iota(s->tokens.begin(), s->tokens.end(), first_token + (int32_t)s->id * 1000);
    s->n_prompt = n_prompt;
    s->max_tokens = 1000;
    seqs.push_back(std::move(s));
    sched.add(seqs.back().get());
    return seqs.back().get();
  }
  // Pretends the plan ran: advances n_computed and appends a token where one is sampled.
  void run(const StepPlan& plan) {
    for (const ScheduledChunk& c : plan.chunks) {
      EXPECT_EQ(c.start_pos, c.seq->n_computed);
      c.seq->n_computed += c.n_tokens;
      blocks.register_full_blocks(*c.seq);
      if (c.seq->n_pending() == 0) c.seq->tokens.push_back(7);
    }
  }
  static int32_t tokens_of(const StepPlan& p, const Sequence* s) {
    for (const auto& c : p.chunks)
      if (c.seq == s) return c.n_tokens;
    return 0;
  }
  BlockManager blocks;
  Scheduler sched;
  std::vector<std::unique_ptr<Sequence>> seqs;
  uint64_t next = 1;
};

TEST(Scheduler, ChunksLongPromptsWithinTheStepBudget) {
  Fixture f(64, 16, {.max_running = 4, .max_step_tokens = 64, .max_prefill_chunk = 48});
  Sequence* a = f.add(100);
  StepPlan p = f.sched.schedule();
  ASSERT_EQ(p.chunks.size(), 1u);
  EXPECT_EQ(p.chunks[0].n_tokens, 48);  // chunk limit
  f.run(p);
  p = f.sched.schedule();
  EXPECT_EQ(Fixture::tokens_of(p, a), 48);
  f.run(p);
  p = f.sched.schedule();
  EXPECT_EQ(Fixture::tokens_of(p, a), 4);  // the rest of the prompt
  f.run(p);
  EXPECT_EQ(a->n_generated(), 1);
}

TEST(Scheduler, DecodesFirstThenPrefillsWithWhatIsLeft) {
  Fixture f(64, 16, {.max_running = 4, .max_step_tokens = 32, .max_prefill_chunk = 512});
  Sequence* a = f.add(8);
  Sequence* b = f.add(8);
  f.run(f.sched.schedule());  // both prefilled in one step (16 tokens)
  ASSERT_EQ(a->n_generated(), 1);
  ASSERT_EQ(b->n_generated(), 1);
  Sequence* c = f.add(200);
  StepPlan p = f.sched.schedule();
  EXPECT_EQ(Fixture::tokens_of(p, a), 1);
  EXPECT_EQ(Fixture::tokens_of(p, b), 1);
  EXPECT_EQ(Fixture::tokens_of(p, c), 30);  // 32 - two decodes
  EXPECT_EQ(p.n_tokens(), 32);
}

TEST(Scheduler, SmallerBudgetWhileSequencesDecode) {
  Fixture f(64, 16,
            {.max_running = 4,
             .max_step_tokens = 64,
             .max_prefill_chunk = 512,
             .max_step_tokens_decoding = 16});
  Sequence* a = f.add(4);
  Sequence* c = f.add(200);
  StepPlan p = f.sched.schedule();
  EXPECT_EQ(p.n_tokens(), 64);  // nobody decodes yet: the full budget
  EXPECT_EQ(Fixture::tokens_of(p, a), 4);
  EXPECT_EQ(Fixture::tokens_of(p, c), 60);
  f.run(p);
  ASSERT_EQ(a->n_pending(), 1);
  p = f.sched.schedule();
  EXPECT_EQ(p.n_tokens(), 16);  // a decodes: the step shrinks
  EXPECT_EQ(Fixture::tokens_of(p, a), 1);
  EXPECT_EQ(Fixture::tokens_of(p, c), 15);
}

TEST(Scheduler, EveryDecoderKeepsItsTokenUnderTheDecodingBudget) {
  Fixture f(64, 16,
            {.max_running = 8,
             .max_step_tokens = 64,
             .max_prefill_chunk = 512,
             .max_step_tokens_decoding = 2});
  std::vector<Sequence*> s;
  for (int i = 0; i < 5; ++i) s.push_back(f.add(3));
  f.run(f.sched.schedule());  // all five prefilled in one step
  for (Sequence* q : s) ASSERT_EQ(q->n_pending(), 1);
  const StepPlan p = f.sched.schedule();
  EXPECT_EQ(p.n_tokens(), 5);  // five decoders, more than the budget of 2
  for (Sequence* q : s) EXPECT_EQ(Fixture::tokens_of(p, q), 1);
}

TEST(Scheduler, OlderPrefillLeavesATokenForEachYoungerDecoder) {
  Fixture f(64, 16, {.max_running = 4, .max_step_tokens = 16, .max_prefill_chunk = 512});
  Sequence* b = f.add(4);
  f.run(f.sched.schedule());
  ASSERT_EQ(b->n_generated(), 1);
  // An older sequence (e.g. one coming back after preemption) with a long prompt.
  Sequence* a = f.add(100);
  f.sched.remove(a);
  a->arrival = 0;
  a->status = SequenceStatus::kWaiting;
  f.sched.add(a);
  f.run(f.sched.schedule());
  StepPlan p = f.sched.schedule();
  ASSERT_EQ(f.sched.running().front(), a);
  EXPECT_EQ(Fixture::tokens_of(p, a), 15);  // budget 16 minus b's reserved token
  EXPECT_EQ(Fixture::tokens_of(p, b), 1);
}

TEST(Scheduler, RespectsMaxRunningAndServesInArrivalOrder) {
  Fixture f(64, 16, {.max_running = 2, .max_step_tokens = 256, .max_prefill_chunk = 256});
  Sequence* a = f.add(5);
  Sequence* b = f.add(5);
  Sequence* c = f.add(5);
  StepPlan p = f.sched.schedule();
  EXPECT_EQ(p.chunks.size(), 2u);
  EXPECT_EQ(Fixture::tokens_of(p, a), 5);
  EXPECT_EQ(Fixture::tokens_of(p, b), 5);
  EXPECT_EQ(Fixture::tokens_of(p, c), 0);
  EXPECT_EQ(f.sched.n_waiting(), 1);
  f.run(p);
  f.sched.remove(a);
  p = f.sched.schedule();
  EXPECT_EQ(Fixture::tokens_of(p, c), 5);
}

TEST(Scheduler, PreemptsTheNewestWhenBlocksRunOut) {
  // 4 blocks of 4 positions; three sequences of 4-token prompts fill 3 blocks, and the
  // second decode step needs new blocks for everyone.
  Fixture f(4, 4, {.max_running = 3, .max_step_tokens = 64, .max_prefill_chunk = 64});
  Sequence* a = f.add(4);
  Sequence* b = f.add(4);
  Sequence* c = f.add(4);
  f.run(f.sched.schedule());
  ASSERT_EQ(f.blocks.n_free(), 1);
  StepPlan p = f.sched.schedule();  // a takes the last block; b needs one: c is preempted
  ASSERT_EQ(p.preempted.size(), 1u);
  EXPECT_EQ(p.preempted[0], c);
  EXPECT_EQ(Fixture::tokens_of(p, a), 1);
  EXPECT_EQ(Fixture::tokens_of(p, b), 1);
  EXPECT_EQ(c->n_computed, 0);
  EXPECT_TRUE(c->block_table.empty());
  EXPECT_EQ(c->status, SequenceStatus::kWaiting);
  f.run(p);
  // Once a finishes, c comes back and recomputes its prompt and its generated token.
  f.sched.remove(a);
  p = f.sched.schedule();
  EXPECT_EQ(Fixture::tokens_of(p, c), 5);
  EXPECT_EQ(c->n_preemptions, 1);
}

TEST(Scheduler, ALoneSequenceWithoutRoomEndsInsteadOfLooping) {
  Fixture f(2, 4, {.max_running = 2, .max_step_tokens = 64, .max_prefill_chunk = 64});
  Sequence* a = f.add(8);
  f.run(f.sched.schedule());
  StepPlan p = f.sched.schedule();  // needs a third block; nothing to preempt
  ASSERT_EQ(p.out_of_room.size(), 1u);
  EXPECT_EQ(p.out_of_room[0], a);
  EXPECT_TRUE(f.sched.empty());
}

TEST(Scheduler, NoStarvationUnderSteadyArrivals) {
  Fixture f(32, 4, {.max_running = 2, .max_step_tokens = 16, .max_prefill_chunk = 16});
  Sequence* first = f.add(6);
  Sequence* second = f.add(6);
  Sequence* third = f.add(6);
  // Newer requests keep arriving while sequences finish after 3 tokens.
  for (int step = 0; step < 60 && third->n_generated() == 0; ++step) {
    f.run(f.sched.schedule());
    for (auto& s : f.seqs)
      if (s->status == SequenceStatus::kRunning && s->n_generated() >= 3) f.sched.remove(s.get());
    if (step % 2 == 0) f.add(6);
  }
  EXPECT_GE(first->n_generated(), 3);
  EXPECT_GE(second->n_generated(), 3);
  EXPECT_GE(third->n_generated(), 1);  // the third got its turn despite newer arrivals
}

}  // namespace
}  // namespace hablar::engine

namespace hablar::engine {
namespace {

// A cost model that has seen: decodes at 5 ms + 1 ms each, prompt tokens at 0.5 ms.
StepCostModel known_costs() {
  StepCostModel m;
  for (int32_t d = 1; d <= 4; ++d) m.observe(0, d, 5.0 + d);
  m.observe(64, 0, 5.0 + 64 * 0.5);
  return m;
}

TEST(SchedulerTime, PromptChunksFillWhatTheDecodesLeaveOfTheStepTime) {
  const StepCostModel costs = known_costs();
  Fixture f(128, 16,
            {.max_running = 4,
             .max_step_tokens = 512,
             .max_prefill_chunk = 512,
             .max_step_tokens_decoding = 64,
             .max_step_ms = 30});
  f.sched.set_cost_model(&costs);
  Sequence* a = f.add(4);
  Sequence* b = f.add(4);
  f.run(f.sched.schedule());
  Sequence* c = f.add(900);
  const StepPlan p = f.sched.schedule();
  // Two decodes cost 7 ms; 23 ms of prompt at 0.5 ms per token.
  EXPECT_EQ(Fixture::tokens_of(p, a), 1);
  EXPECT_EQ(Fixture::tokens_of(p, b), 1);
  EXPECT_EQ(Fixture::tokens_of(p, c), 46);
  EXPECT_LE(costs.predict_ms(46, 2), 30.0);
  // Without the cost model the token budget while decoding applies.
  f.sched.set_cost_model(nullptr);
  EXPECT_EQ(f.sched.step_budget(2), 64);
  // Nobody decoding: no stream waits on the step, the full width.
  f.sched.set_cost_model(&costs);
  EXPECT_EQ(f.sched.step_budget(0), 512);
}

TEST(SchedulerTime, SlowdownBoundsTheStepRelativeToItsDecodes) {
  const StepCostModel costs = known_costs();
  SchedulerConfig cfg{.max_running = 8, .max_step_tokens = 512, .max_prefill_chunk = 512};
  cfg.max_decode_slowdown = 2;
  BlockManager blocks(64, 16);
  Scheduler s(cfg, blocks);
  s.set_cost_model(&costs);
  // 4 decodes cost 9 ms: twice that leaves 9 ms, 18 prompt tokens.
  EXPECT_EQ(s.step_budget(4), 4 + 18);
  // 1 decode costs 6 ms: 6 ms of prompt would be 12 tokens, above the floor of 8.
  EXPECT_EQ(s.step_budget(1), 1 + 12);
  // With an absolute bound too, the smaller one holds: 8 ms leaves 2 ms (4 tokens), but
  // prompts always get the floor.
  cfg.max_step_ms = 8;
  Scheduler t(cfg, blocks);
  t.set_cost_model(&costs);
  EXPECT_EQ(t.step_budget(1), 1 + cfg.min_step_prompt_tokens);
}

TEST(SchedulerFair, AShortPromptIsNotStuckBehindALongOne) {
  Fixture f(256, 16, {.max_running = 4, .max_step_tokens = 64, .max_prefill_chunk = 64});
  Sequence* big = f.add(2000);
  f.run(f.sched.schedule());
  Sequence* chat = f.add(20);
  const StepPlan p = f.sched.schedule();
  // The short one finishes its prompt in this step; the long one keeps a quarter or more.
  EXPECT_EQ(Fixture::tokens_of(p, chat), 20);
  EXPECT_EQ(Fixture::tokens_of(p, big), 44);
  f.run(p);
  EXPECT_EQ(chat->n_generated(), 1);
}

TEST(SchedulerFair, TheOldestPromptKeepsAQuarterAmongManyShortOnes) {
  Fixture f(512, 16, {.max_running = 16, .max_step_tokens = 64, .max_prefill_chunk = 64});
  Sequence* big = f.add(1000);
  f.run(f.sched.schedule());
  for (int i = 0; i < 10; ++i) f.add(30);
  const StepPlan p = f.sched.schedule();
  EXPECT_EQ(Fixture::tokens_of(p, big), 16);  // 64 / 4
  EXPECT_EQ(p.n_tokens(), 64);
}

TEST(SchedulerPriority, LowerValueIsAdmittedFirstAndPreemptsTheLowestRank) {
  Fixture f(64, 16, {.max_running = 2, .max_step_tokens = 256, .max_prefill_chunk = 256});
  Sequence* a = f.add(5);
  Sequence* b = f.add(5);
  f.run(f.sched.schedule());
  ASSERT_EQ(f.sched.n_running(), 2);
  Sequence* plain = f.add(5);   // priority 0: waits for a slot
  Sequence* urgent = f.add(5);  // arrives later, ranks first
  urgent->priority = -1;
  f.sched.remove(urgent);
  urgent->status = SequenceStatus::kWaiting;
  f.sched.add(urgent);
  StepPlan p = f.sched.schedule();
  // Every slot taken by priority-0 sequences: the newest of them (b) makes room.
  ASSERT_EQ(p.preempted.size(), 1u);
  EXPECT_EQ(p.preempted[0], b);
  EXPECT_EQ(Fixture::tokens_of(p, urgent), 5);
  EXPECT_EQ(Fixture::tokens_of(p, a), 1);
  EXPECT_EQ(Fixture::tokens_of(p, plain), 0);
  EXPECT_EQ(b->status, SequenceStatus::kWaiting);
  // Equal priorities never preempt each other: plain and b wait for a to finish.
  f.run(p);
  p = f.sched.schedule();
  EXPECT_TRUE(p.preempted.empty());
  f.sched.remove(a);
  p = f.sched.schedule();
  // b goes before plain; its prompt and token come back from the cache (the partial block
  // it held is offered), so it computes its last token again alone.
  EXPECT_EQ(Fixture::tokens_of(p, b), 1);
  EXPECT_EQ(b->n_computed, 5);
  EXPECT_EQ(Fixture::tokens_of(p, plain), 0);
}

// Sliding windows: over a generation many windows long, each sequence holds about window +
// one step of cache (so a pool far smaller than the sequences runs them without preemption),
// and every table entry a step reads (the chunk's window onwards) is a live block.
TEST(Scheduler, SlidingWindowKeepsMemoryBounded) {
  constexpr int32_t kWindow = 10, kBlock = 4;
  Fixture f(
      12, kBlock,
      {.max_running = 2, .max_step_tokens = 16, .max_prefill_chunk = 8, .kv_window = kWindow});
  Sequence* a = f.add(30);
  Sequence* b = f.add(5);
  int32_t most_used = 0;
  for (int step = 0; step < 400; ++step) {
    StepPlan p = f.sched.schedule();
    ASSERT_TRUE(p.preempted.empty() && p.out_of_room.empty()) << "step " << step;
    for (const ScheduledChunk& c : p.chunks) {
      const int32_t first = std::max(0, c.start_pos - kWindow + 1);
      for (int32_t pos = first; pos < c.start_pos + c.n_tokens; ++pos)
        ASSERT_GE(c.seq->block_table[(size_t)(pos / kBlock)], 0) << "position " << pos;
    }
    most_used = std::max(most_used, f.blocks.n_used());
    f.run(p);
  }
  EXPECT_GT(a->n_generated(), 300);
  EXPECT_GT(b->n_generated(), 300);
  // Per sequence: ceil((window - 1 + chunk) / block) + 1 blocks at most.
  EXPECT_LE(most_used, 2 * ((kWindow - 1 + 8 + kBlock - 1) / kBlock + 1));
  EXPECT_GT(a->n_released_blocks, 70);
}

// Without the window every block stays: the same pool runs out.
TEST(Scheduler, WithoutSlidingWindowTheSamePoolRunsOut) {
  Fixture f(12, 4, {.max_running = 2, .max_step_tokens = 16, .max_prefill_chunk = 8});
  f.add(30);
  f.add(5);
  bool ran_out = false;
  for (int step = 0; step < 400 && !ran_out; ++step) {
    StepPlan p = f.sched.schedule();
    ran_out = !p.preempted.empty() || !p.out_of_room.empty();
    f.run(p);
  }
  EXPECT_TRUE(ran_out);
}

// Waves: prompts prefilled while nobody decodes finish together.
SchedulerConfig wave_config() {
  return {.max_running = 8,
          .max_step_tokens = 64,
          .max_prefill_chunk = 64,
          .min_step_prompt_tokens = 8,
          .wave_prefill = true};
}

// The step in which each sequence sampled its first token (-1: not yet).
std::vector<int> run_until_all_started(Fixture& f, const std::vector<Sequence*>& seqs,
                                       int max_steps) {
  std::vector<int> first(seqs.size(), -1);
  for (int step = 0; step < max_steps; ++step) {
    const StepPlan p = f.sched.schedule();
    int32_t streams = 0, prompt_tokens = 0;
    for (const ScheduledChunk& c : p.chunks)
      (c.seq->is_decoding() ? streams : prompt_tokens) += c.n_tokens;
    // A wave never makes a stream wait for prompt tokens beyond the short closing step.
    EXPECT_FALSE(streams > 0 && prompt_tokens > 0) << "step " << step;
    f.run(p);
    bool all = true;
    for (size_t i = 0; i < seqs.size(); ++i) {
      if (first[i] < 0 && seqs[i]->n_generated() > 0) first[i] = step;
      all = all && first[i] >= 0;
    }
    if (all) break;
  }
  return first;
}

TEST(SchedulerWave, PromptsArrivingDuringAPrefillGetTheirFirstTokensInOneStep) {
  Fixture f(256, 16, wave_config());
  Sequence* a = f.add(50);  // alone: it would fit the step whole
  StepPlan p = f.sched.schedule();
  EXPECT_EQ(Fixture::tokens_of(p, a), 49);  // its last token held: others may still come
  f.run(p);
  ASSERT_EQ(a->n_generated(), 0);
  std::vector<Sequence*> all{a, f.add(50), f.add(70), f.add(40)};  // arrived meanwhile
  const std::vector<int> first = run_until_all_started(f, all, 20);
  for (size_t i = 1; i < all.size(); ++i) EXPECT_EQ(first[i], first[0]) << "sequence " << i;
  EXPECT_GE(first[0], 0);
}

TEST(SchedulerWave, WithoutWavesTheFirstPromptDecodesBesideTheOthersPrefill) {
  SchedulerConfig cfg = wave_config();
  cfg.wave_prefill = false;
  Fixture f(256, 16, cfg);
  Sequence* a = f.add(50);
  f.run(f.sched.schedule());
  ASSERT_EQ(a->n_generated(), 1);  // started alone
  f.add(50);
  const StepPlan p = f.sched.schedule();
  EXPECT_EQ(Fixture::tokens_of(p, a), 1);
  EXPECT_GT(p.n_tokens(), 1);  // its next token waits for a prompt chunk
}

TEST(SchedulerWave, AShortChatIsNotHeldBehindALongPrompt) {
  Fixture f(256, 16, wave_config());
  Sequence* big = f.add(300);
  f.run(f.sched.schedule());
  Sequence* chat = f.add(20);  // 300 - 64 left: more than twice its prompt
  const StepPlan p = f.sched.schedule();
  EXPECT_EQ(Fixture::tokens_of(p, chat), 20);
  EXPECT_EQ(Fixture::tokens_of(p, big), 44);
  f.run(p);
  EXPECT_EQ(chat->n_generated(), 1);
}

TEST(SchedulerWave, AShortLonePromptFinishesInItsFirstStep) {
  Fixture f(256, 16, wave_config());
  Sequence* a = f.add(9);  // one token + the 8 of min_step_prompt_tokens: one short step
  f.run(f.sched.schedule());
  EXPECT_EQ(a->n_generated(), 1);
}

TEST(SchedulerWave, NoPromptIsHeldWhileStreamsDecode) {
  Fixture f(256, 16, wave_config());
  Sequence* a = f.add(5);
  f.run(f.sched.schedule());
  ASSERT_TRUE(a->is_decoding());
  Sequence* b = f.add(40);
  Sequence* c = f.add(20);
  f.run(f.sched.schedule());  // a decodes, b and c fit beside it whole
  EXPECT_EQ(b->n_generated(), 1);
  EXPECT_EQ(c->n_generated(), 1);
}

TEST(SchedulerWave, NoHoldWhenTheCacheCannotTakeTheWholeWave) {
  // 12 blocks of 16 positions; three prompts of 70 tokens need 15: holding them all back
  // until everyone's prompt is in would wait forever.
  Fixture f(12, 16, wave_config());
  std::vector<Sequence*> seqs{f.add(70), f.add(70), f.add(70)};
  for (int step = 0; step < 60; ++step) {
    f.run(f.sched.schedule());
    for (Sequence* s : seqs)
      if (s->status == SequenceStatus::kRunning && s->n_generated() >= 2) f.sched.remove(s);
  }
  for (Sequence* s : seqs) EXPECT_GE(s->n_generated(), 2);
}

// The time bound with a fake (fed) cost model, over arrivals that meet running streams: every
// stream gets its token in every step; a step's predicted time stays within the bound unless
// only the floor's prompt tokens are in it; while prompt work is waiting, each step carries at
// least the floor of it (no prompt starves), and every request starts.
void check_bounded_steps(SchedulerConfig cfg, const StepCostModel& costs) {
  Fixture f(1024, 16, cfg);
  f.sched.set_cost_model(&costs);
  const int32_t lens[] = {300, 20, 150, 600, 40, 90, 35, 250};
  int32_t prompt_steps_with_streams = 0;
  for (int step = 0; step < 400; ++step) {
    if (step % 25 == 5 && f.seqs.size() < 2 + std::size(lens))
      f.add(lens[f.seqs.size() % std::size(lens)]);
    if (step == 0) {
      f.add(30);
      f.add(30);
    }
    std::vector<Sequence*> streams;
    int64_t waiting_work = 0;
    for (auto& s : f.seqs) {
      if (s->status == SequenceStatus::kRunning && s->is_decoding()) streams.push_back(s.get());
      if (s->status != SequenceStatus::kFinished && !s->is_decoding())
        waiting_work += s->n_pending();
    }
    const StepPlan p = f.sched.schedule();
    int32_t prompt = 0;
    for (const ScheduledChunk& c : p.chunks)
      if (std::find(streams.begin(), streams.end(), c.seq) == streams.end()) prompt += c.n_tokens;
    for (Sequence* s : streams) ASSERT_EQ(Fixture::tokens_of(p, s), 1) << "step " << step;
    const int32_t d = (int32_t)streams.size();
    if (d > 0 && waiting_work > 0) {
      prompt_steps_with_streams += 1;
      const int64_t floor = std::min<int64_t>(cfg.min_step_prompt_tokens, waiting_work);
      EXPECT_GE(prompt, floor) << "step " << step << ": a prompt starved";
      if (prompt > floor) {
        EXPECT_LE(costs.predict_ms(prompt, d), f.sched.step_target_ms(d) + 1e-9)
            << "step " << step << ": " << d << " streams delayed by " << prompt << " prompt tokens";
      }
    }
    f.run(p);
    for (auto& s : f.seqs)
      if (s->status == SequenceStatus::kRunning && s->n_generated() >= 40) f.sched.remove(s.get());
  }
  EXPECT_GT(prompt_steps_with_streams, 20);  // the scenario did mix prompts with streams
  for (auto& s : f.seqs) EXPECT_GT(s->n_generated(), 0) << "request " << s->id << " never started";
}

TEST(SchedulerBound, StreamsAreNeverDelayedBeyondTheSlowdownAndPromptsProgress) {
  SchedulerConfig cfg = wave_config();
  cfg.max_step_tokens = 256;
  cfg.max_prefill_chunk = 256;
  cfg.max_decode_slowdown = 2;
  cfg.min_step_prompt_tokens = 4;
  check_bounded_steps(cfg, known_costs());
}

TEST(SchedulerBound, UnderATightBoundPromptsStillGetTheFloor) {
  SchedulerConfig cfg = wave_config();
  cfg.max_step_tokens = 256;
  cfg.max_prefill_chunk = 256;
  cfg.max_step_ms = 7;  // two streams alone cost 7 ms: only the floor is left for prompts
  cfg.min_step_prompt_tokens = 6;
  check_bounded_steps(cfg, known_costs());
}
}  // namespace
}  // namespace hablar::engine
