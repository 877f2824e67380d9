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
  EXPECT_EQ(Fixture::tokens_of(p, b), 6);  // b recomputes its prompt and its token, before plain
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

}  // namespace
}  // namespace hablar::engine
