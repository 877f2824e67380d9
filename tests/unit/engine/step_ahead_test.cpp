// Stepping ahead (engine_step.cpp): with an executor that feeds a step's pending tokens from
// the step before (the fake one does it as the CUDA executor does), step N + 1 is launched
// before N's tokens are collected. Every output must still be its solo run's, through
// end-of-generation, preemption, the prefix cache and cancellation; requests whose sampling
// reads their history are never fed.
#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "engine/engine.h"
#include "engine/request_sampler.h"
#include "engine_test_util.h"
#include "fake_executor.h"
#include "pending_mask_sampler.h"

namespace hablar::engine {
namespace {

using namespace test_util;

constexpr int32_t kEndToken = 5;  // the end-of-generation token of these tests

// The solo output up to max_tokens, ending after the end token when it comes.
std::vector<int32_t> reference_until_end(std::vector<int32_t> prompt, int32_t max_tokens) {
  std::vector<int32_t> out;
  while ((int32_t)out.size() < max_tokens) {
    const int32_t t = test::reference_next(prompt, kVocab);
    out.push_back(t);
    prompt.push_back(t);
    if (t == kEndToken) break;
  }
  return out;
}

// A device-sampling executor that feeds tokens; steps take time, so submissions overlap.
struct FeedingExecutor : test::FakeExecutor {
  FeedingExecutor(int32_t n_blocks, int32_t block_size)
      : test::FakeExecutor(kVocab, n_blocks, block_size) {
    device_sampling = true;
    feeds = true;
    step_delay_us = 200;
  }
};

EngineConfig ending_config(int32_t max_running) {
  EngineConfig c = config(0, 0, max_running);
  c.is_eog = [](int32_t t) { return t == kEndToken; };
  return c;
}

TEST(StepAhead, EveryRequestGetsItsSoloOutput) {
  FeedingExecutor exec(256, 8);
  Engine engine(ending_config(8), exec);
  std::mt19937 rng(11);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int32_t> lengths;
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (int i = 0; i < 24; ++i) {
    prompts.push_back(random_prompt(rng, 3 + 5 * (i % 9)));
    lengths.push_back(1 + (i * 7) % 23);  // one token only, up to 23
    handles.push_back(engine.submit(request(prompts.back(), lengths.back())));
  }
  int ended = 0;
  for (size_t i = 0; i < handles.size(); ++i) {
    const Result r = collect(*handles[i]);
    const std::vector<int32_t> want = reference_until_end(prompts[i], lengths[i]);
    EXPECT_EQ(r.tokens, want) << "request " << i;
    EXPECT_EQ(r.final.n_generated, (int32_t)want.size()) << "request " << i;
    const bool stop = want.back() == kEndToken;
    ended += stop ? 1 : 0;
    EXPECT_EQ(r.final.finish_reason, stop ? FinishReason::kStop : FinishReason::kLength);
  }
  EXPECT_GT(ended, 0);  // some ended on the end token while a next step was launched
  EXPECT_GT(exec.fed_chunks, 0);
  EXPECT_EQ(exec.most_outstanding, 2);
  EXPECT_TRUE(eventually(engine, [](const MetricsSnapshot& m) { return m.kv_blocks_used == 0; }));
  const MetricsSnapshot m = engine.metrics().snapshot();
  EXPECT_GT(m.steps_launched_ahead_total, 0u);
  EXPECT_LT(m.steps_launched_ahead_total, m.steps_total);  // the first step had none before it
}

// 12 blocks of 4 positions for 6 sequences growing to about 20 tokens each: preemptions come
// while steps are in flight; then prompts that share a prefix with finished ones take it from
// the cache (a block registered with a token not yet known would serve a wrong one).
TEST(StepAhead, PreemptionAndThePrefixCacheKeepOutputsIntact) {
  FeedingExecutor exec(12, 4);
  Engine engine(config(12, 4, 6), exec);
  std::mt19937 rng(3);
  std::vector<std::vector<int32_t>> prompts;
  const auto handles = submit_random(
      engine, rng, 6, [](int i) { return 6 + i; }, 14, prompts);
  std::vector<Result> results;
  for (size_t i = 0; i < handles.size(); ++i) {
    results.push_back(collect(*handles[i]));
    EXPECT_EQ(results.back().tokens, reference_generation(prompts[i], 14)) << "request " << i;
  }
  EXPECT_GT(engine.metrics().snapshot().preemptions_total, 0u);
  // Prompt and output of the last request to finish (its blocks are the freshest in the
  // cache) as the prefix of a new one.
  std::vector<int32_t> again = prompts[5];
  again.insert(again.end(), results[5].tokens.begin(), results[5].tokens.end());
  again.push_back(1);
  const Result r = collect(*engine.submit(request(again, 6)));
  EXPECT_EQ(r.tokens, reference_generation(again, 6));
  EXPECT_GT(r.final.n_cached_prompt, 0);
  EXPECT_GT(exec.fed_chunks, 0);
  EXPECT_TRUE(eventually(engine, [](const MetricsSnapshot& m) { return m.kv_blocks_used == 0; }));
}

TEST(StepAhead, CancelledRequestsLeaveNothingBehind) {
  FeedingExecutor exec(64, 8);
  Engine engine(config(64, 8, 4), exec);
  std::mt19937 rng(4);
  auto long_h = engine.submit(request(random_prompt(rng, 30), 4000));
  const std::vector<int32_t> p = random_prompt(rng, 12);
  auto short_h = engine.submit(request(p, 40));
  std::vector<StreamItem> items;
  ASSERT_TRUE(long_h->wait(items, milliseconds(5000)));  // generating
  long_h->cancel();
  const Result cancelled = collect(*long_h, items);
  EXPECT_EQ(cancelled.final.finish_reason, FinishReason::kCancelled);
  EXPECT_EQ(collect(*short_h).tokens, reference_generation(p, 40));
  EXPECT_TRUE(eventually(engine, [](const MetricsSnapshot& m) { return m.kv_blocks_used == 0; }));
}

// Penalties read the tokens so far: a request's next step is fed its last token and the
// history its penalties read ends with that token, both filled in by the executor (the fake
// applies the repetition penalty as the samplers do). The outputs are the penalized ones.
// The greedy output under a repetition penalty over the last `window` tokens (ending after
// the end token when `until_end`).
std::vector<int32_t> reference_penalized(std::vector<int32_t> tokens, int32_t n, float penalty,
                                         size_t window, bool until_end = false) {
  std::vector<int32_t> out;
  std::vector<float> row((size_t)kVocab);
  for (int32_t i = 0; i < n; ++i) {
    test::reference_logits(tokens, kVocab, row.data());
    const size_t w = std::min(window, tokens.size());
    test::apply_repetition_penalty(std::span<const int32_t>(tokens).last(w), penalty, row);
    const int32_t t = (int32_t)(std::max_element(row.begin(), row.end()) - row.begin());
    out.push_back(t);
    tokens.push_back(t);
    if (until_end && t == kEndToken) break;
  }
  return out;
}

TEST(StepAhead, PenaltiesAreFedTheirPendingToken) {
  FeedingExecutor exec(64, 8);
  Engine engine(config(64, 8, 4), exec);
  std::mt19937 rng(6);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (int i = 0; i < 3; ++i) {
    prompts.push_back(random_prompt(rng, 4 + 3 * i));
    GenerateRequest g = request(prompts.back(), 24);
    SamplingParams params;
    params.temperature = 0.0f;
    params.repeat_penalty = 8.0f;  // strong: the fake's argmax row (4.0) falls below the rest
    params.repeat_last_n = 64;
    g.sampler = std::make_unique<ParamsSampler>(params, kVocab);
    handles.push_back(engine.submit(std::move(g)));
  }
  int penalized = 0;
  for (size_t i = 0; i < handles.size(); ++i) {
    const std::vector<int32_t> want = reference_penalized(prompts[i], 24, 8.0f, 64);
    EXPECT_EQ(collect(*handles[i]).tokens, want) << i;
    penalized += want != reference_generation(prompts[i], 24) ? 1 : 0;
  }
  EXPECT_GT(penalized, 0);  // the penalty changed some output
  EXPECT_GT(exec.fed_histories, 0);
  EXPECT_EQ(exec.device_sampled, 3 * 24);
}

// The greedy choice under PendingMaskSampler's rules (its mask, its refusals), until the end.
std::vector<int32_t> reference_pending_mask(std::vector<int32_t> tokens, int32_t max_tokens) {
  std::vector<int32_t> out;
  std::vector<float> row(kVocab);
  while ((int32_t)out.size() < max_tokens) {
    test::reference_logits(tokens, kVocab, row.data());
    for (int32_t t = 0; t < kVocab; ++t)
      if (!test_sampling::PendingMaskSampler::allowed(t, tokens.back()) ||
          test_sampling::PendingMaskSampler::refused(t))
        row[(size_t)t] = -std::numeric_limits<float>::infinity();
    const auto t = (int32_t)(std::max_element(row.begin(), row.end()) - row.begin());
    out.push_back(t);
    tokens.push_back(t);
    if (t == kEndToken) break;
  }
  return out;
}

// Masks computed from the token before (a grammar's) launch ahead: the executor gives the
// mask source the step before's sample. A device sample refused when collected voids the
// step launched on it, whose cache writes the recomputation of that position overwrites;
// under preemption and beside plain requests every output is still its solo run's.
TEST(StepAhead, MasksOfPendingTokensAndRefusedSamplesKeepEveryOutput) {
  for (const bool ahead : {true, false}) {
    FeedingExecutor exec(24, 4);  // 96 positions for 6 sequences of up to about 36
    Engine engine(ending_config(6), exec);
    std::mt19937 rng(17);
    auto counts = std::make_shared<test_sampling::PendingMaskSampler::Counts>();
    std::vector<std::vector<int32_t>> prompts;
    std::vector<int32_t> lengths;
    std::vector<std::shared_ptr<RequestHandle>> handles;
    for (int i = 0; i < 18; ++i) {
      prompts.push_back(random_prompt(rng, 3 + (int32_t)(rng() % 14)));
      lengths.push_back(4 + (int32_t)(rng() % 20));
      GenerateRequest g = request(prompts.back(), lengths.back());
      if (i % 3 != 2)
        g.sampler = std::make_unique<test_sampling::PendingMaskSampler>(counts, ahead);
      handles.push_back(engine.submit(std::move(g)));
    }
    for (size_t i = 0; i < handles.size(); ++i) {
      const Result r = collect(*handles[i]);
      const std::vector<int32_t> want = i % 3 != 2 ? reference_pending_mask(prompts[i], lengths[i])
                                                   : reference_until_end(prompts[i], lengths[i]);
      EXPECT_EQ(r.tokens, want) << "request " << i << (ahead ? ", ahead" : ", one at a time");
    }
    EXPECT_GT(counts->refused, 0);
    EXPECT_EQ(counts->host_samples, counts->refused);  // each refusal sampled once on the host
    const MetricsSnapshot m = engine.metrics().snapshot();
    EXPECT_EQ(m.device_samples_refused_total, (uint64_t)counts->refused);
    if (ahead) {
      EXPECT_GT(counts->masks_of_pending, 0);
      EXPECT_EQ(exec.most_outstanding, 2);
      EXPECT_GT(m.steps_voided_total, 0u);
    } else {
      EXPECT_EQ(counts->masks_of_pending, 0);
      EXPECT_EQ(m.steps_voided_total, 0u);
    }
    EXPECT_GT(engine.metrics().snapshot().preemptions_total, 0u);
    EXPECT_TRUE(eventually(engine, [](const MetricsSnapshot& m) { return m.kv_blocks_used == 0; }));
  }
}

// Requests of every kind in one stream of steps: plain ones (fed), ones whose sampling reads
// their history (penalties: fed, the history completed by the executor), with the
// log-probabilities of their tokens (host rows) or of their prompts (a row per prompt
// token), ending on the end token, at max_tokens, or cancelled after their first token, all
// under preemption (few blocks). Each output is its solo run's (a cancelled one's a prefix
// of it), each prompt token's log-probability comes once, and the cache is empty at the end.
TEST(StepAhead, MixturesOfRequestKindsKeepEveryOutput) {
  FeedingExecutor exec(16, 4);  // 64 positions for 6 sequences of up to 40
  Engine engine(ending_config(6), exec);
  std::mt19937 rng(21);
  struct Sent {
    std::vector<int32_t> prompt;
    int32_t max_tokens = 0;
    int kind = 0;  // 0 plain, 1 penalties, 2 token log-probabilities, 3 prompt ones, 4 cancel
    std::shared_ptr<RequestHandle> handle;
  };
  std::vector<Sent> sent;
  for (int i = 0; i < 40; ++i) {
    Sent s;
    s.prompt = random_prompt(rng, 3 + (int32_t)(rng() % 18));
    s.max_tokens = 1 + (int32_t)(rng() % 20);
    s.kind = i % 5;
    GenerateRequest g = request(s.prompt, s.max_tokens);
    if (s.kind == 1) {
      SamplingParams params;
      params.temperature = 0.0f;
      params.repeat_penalty = 1.2f;  // (over the default window of 64 tokens)
      g.sampler = std::make_unique<ParamsSampler>(params, kVocab);
    }
    if (s.kind == 2) g.n_logprobs = 2;
    if (s.kind == 3) g.n_prompt_logprobs = 0;
    s.handle = engine.submit(std::move(g));
    sent.push_back(std::move(s));
    if (i % 8 == 7) std::this_thread::sleep_for(milliseconds(1));  // arrivals in waves
  }
  for (size_t i = 0; i < sent.size(); ++i) {
    const Sent& s = sent[i];
    std::vector<int32_t> tokens;
    int32_t prompt_items = 0;
    StreamItem final;
    for (bool done = false; !done;) {
      std::vector<StreamItem> items;
      ASSERT_TRUE(s.handle->wait(items, milliseconds(10000))) << "engine stalled";
      for (const StreamItem& it : items) {
        if (it.kind == StreamItem::Kind::kFinal) final = it, done = true;
        if (it.kind == StreamItem::Kind::kPrompt) prompt_items += 1;
        if (it.kind == StreamItem::Kind::kToken) tokens.push_back(it.token);
      }
      if (s.kind == 4 && !tokens.empty()) s.handle->cancel();
    }
    const std::vector<int32_t> want =
        s.kind == 1 ? reference_penalized(s.prompt, s.max_tokens, 1.2f, 64, /*until_end=*/true)
                    : reference_until_end(s.prompt, s.max_tokens);
    if (s.kind == 4) {
      ASSERT_LE(tokens.size(), want.size()) << "request " << i;
      EXPECT_EQ(tokens, std::vector<int32_t>(want.begin(), want.begin() + (ptrdiff_t)tokens.size()))
          << "request " << i;
    } else {
      EXPECT_EQ(tokens, want) << "request " << i;
      EXPECT_NE(final.finish_reason, FinishReason::kCancelled) << "request " << i;
    }
    if (s.kind == 3) {
      EXPECT_EQ(prompt_items, (int32_t)s.prompt.size()) << "request " << i;
    }
  }
  EXPECT_GT(exec.fed_chunks, 0);
  EXPECT_GT(engine.metrics().snapshot().preemptions_total, 0u);
  EXPECT_TRUE(eventually(engine, [](const MetricsSnapshot& m) { return m.kv_blocks_used == 0; }));
}

// Token log-probabilities come from the executor's sampling (the raw row's log_softmax and its
// top n, as the host reports them), so requests that ask for them launch ahead like any
// other; more than kMaxDeviceTopLogprobs are sampled on the host, one step at a time.
TEST(StepAhead, TokenLogprobsComeWithTheDevicesSamples) {
  FeedingExecutor exec(256, 8);
  Engine engine(ending_config(8), exec);
  std::mt19937 rng(31);
  const int32_t asked[] = {0, 3, kMaxDeviceTopLogprobs, kMaxDeviceTopLogprobs + 1};
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (int i = 0; i < 16; ++i) {
    prompts.push_back(random_prompt(rng, 4 + 3 * (i % 5)));
    GenerateRequest g = request(prompts.back(), 6 + i % 7);
    g.n_logprobs = asked[i % 4];
    handles.push_back(engine.submit(std::move(g)));
  }
  for (size_t i = 0; i < handles.size(); ++i) {
    std::vector<int32_t> history = prompts[i];
    for (bool done = false; !done;) {
      std::vector<StreamItem> items;
      ASSERT_TRUE(handles[i]->wait(items, milliseconds(10000))) << "engine stalled";
      for (const StreamItem& it : items) {
        if (it.kind == StreamItem::Kind::kFinal) done = true;
        if (it.kind != StreamItem::Kind::kToken) continue;
        std::vector<float> row(kVocab), logp(kVocab);
        test::reference_logits(history, kVocab, row.data());
        log_softmax(row, logp);
        EXPECT_EQ(it.token, test::reference_next(history, kVocab)) << "request " << i;
        EXPECT_FLOAT_EQ(it.logprob, logp[(size_t)it.token]) << "request " << i;
        const std::vector<TokenLogprob> top = top_logprobs(row, asked[i % 4]);
        ASSERT_EQ(it.top_logprobs.size(), top.size()) << "request " << i;
        for (size_t k = 0; k < top.size(); ++k) {
          EXPECT_EQ(it.top_logprobs[k].token, top[k].token) << "request " << i;
          EXPECT_FLOAT_EQ(it.top_logprobs[k].logprob, top[k].logprob) << "request " << i;
        }
        history.push_back(it.token);
      }
    }
  }
  EXPECT_GT(exec.device_logprobs, 0);
  EXPECT_GT(exec.fed_chunks, 0);  // requests with log-probabilities launched ahead
}

// Prompt log-probabilities: a device executor scores the prompt rows itself (the target's
// log-probability and the top n) and returns logits only for the rows it does not score, so
// preempted and chunked prompts still give each prompt token once, the host's figures.
TEST(StepAhead, PromptLogprobsAreScoredOnTheDevice) {
  FeedingExecutor exec(12, 4);  // 48 positions: sequences are preempted
  EngineConfig c = ending_config(4);
  c.scheduler.max_prefill_chunk = 7;
  Engine engine(c, exec);
  std::mt19937 rng(41);
  const int32_t asked[] = {0, 2, kMaxDeviceTopLogprobs, kMaxDeviceTopLogprobs + 1};
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::shared_ptr<RequestHandle>> handles;
  for (int i = 0; i < 12; ++i) {
    prompts.push_back(random_prompt(rng, 5 + 2 * i));
    GenerateRequest g = request(prompts.back(), i % 3);  // 0 tokens: the prompt's scores alone
    g.n_prompt_logprobs = asked[i % 4];
    handles.push_back(engine.submit(std::move(g)));
  }
  for (size_t i = 0; i < handles.size(); ++i) {
    std::vector<StreamItem> got;
    std::vector<int32_t> tokens;
    for (bool done = false; !done;) {
      std::vector<StreamItem> items;
      ASSERT_TRUE(handles[i]->wait(items, milliseconds(10000))) << "engine stalled";
      for (StreamItem& it : items) {
        if (it.kind == StreamItem::Kind::kFinal) done = true;
        if (it.kind == StreamItem::Kind::kPrompt) got.push_back(std::move(it));
        if (it.kind == StreamItem::Kind::kToken) tokens.push_back(it.token);
      }
    }
    const std::vector<int32_t>& p = prompts[i];
    ASSERT_EQ(got.size(), p.size()) << "request " << i;
    EXPECT_FALSE(got[0].has_logprob);
    for (size_t t = 1; t < p.size(); ++t) {
      std::vector<float> row(kVocab), logp(kVocab);
      test::reference_logits(std::span<const int32_t>(p).first(t), kVocab, row.data());
      log_softmax(row, logp);
      EXPECT_EQ(got[t].token, p[t]);
      EXPECT_FLOAT_EQ(got[t].logprob, logp[(size_t)p[t]]) << "request " << i << " pos " << t;
      const std::vector<TokenLogprob> top = top_logprobs(row, asked[i % 4]);
      ASSERT_EQ(got[t].top_logprobs.size(), top.size()) << "request " << i;
      for (size_t k = 0; k < top.size(); ++k)
        EXPECT_EQ(got[t].top_logprobs[k].token, top[k].token) << "request " << i;
    }
    EXPECT_EQ(tokens, reference_until_end(p, (int32_t)(i % 3))) << "request " << i;
  }
  EXPECT_GT(exec.scored_rows, 0);
  EXPECT_GT(engine.metrics().snapshot().preemptions_total, 0u);
}

// The step cost model learns what a step adds between two tokens of a stream. A step that
// stayed in flight while the next one launched costs its device span (simulated here): the
// wall time until its collection holds the next step's launch, so a decode-only step before
// a step with prompt tokens would be priced as that step, and the step with prompt tokens
// before a decode-only one as a decode-only step (its prompt tokens free).
TEST(StepAhead, AStepInFlightCostsItsOwnSpan) {
  FeedingExecutor exec(256, 8);
  exec.sim_base_ms = 2, exec.sim_decode_ms = 0.01;
  exec.sim_prompt_ms = 0.02, exec.sim_prompt_step_ms = 4;  // GPU-like: no graph with prompts
  EngineConfig c = config(256, 8, 4);
  c.now_ms = [&exec] { return exec.sim_now_ms; };
  Engine engine(c, exec);
  std::mt19937 rng(8);
  std::vector<int32_t> first = random_prompt(rng, 8);
  auto decoding = engine.submit(request(first, 120));
  std::vector<std::vector<int32_t>> prompts;
  auto handles = submit_random(
      engine, rng, 3, [](int) { return 120; }, 2, prompts);
  for (size_t i = 0; i < handles.size(); ++i)
    EXPECT_EQ(collect(*handles[i]).tokens, reference_generation(prompts[i], 2)) << i;
  EXPECT_EQ(collect(*decoding).tokens, reference_generation(first, 120));
  ASSERT_GT(exec.most_outstanding, 1);
  const StepCostModel& costs = engine.step_costs();
  ASSERT_TRUE(costs.ready());
  EXPECT_NEAR(costs.decode_ms(1), 2.01, 0.05);
  // Steps of 32-63 prompt tokens beside a decode: 4 ms + 0.02 ms a token beyond it, between
  // 0.083 and 0.145 ms a token.
  EXPECT_GT(costs.per_prompt_ms(48), 0.08);
  EXPECT_LT(costs.per_prompt_ms(48), 0.15);
}

}  // namespace
}  // namespace hablar::engine
