// Speculative decoding in the engine, against the fake model (fake_executor.h), whose "KV
// cache" holds token ids read back through the block tables: a rejected draft token left in
// a block the sequence (or, through the prefix cache, a later request) reads changes the
// next token, so outputs equal to plain decoding mean the rollback is exact.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>

#include "engine/drafter_ngram.h"
#include "engine/engine.h"
#include "engine/request_sampler.h"
#include "engine/speculation.h"
#include "fake_executor.h"

namespace hablar::engine {
namespace {

using std::chrono::milliseconds;
constexpr int32_t kVocab = 32;

// Drafts the fake model's own greedy continuation, with some tokens made wrong on purpose
// (which ones depends on the sequence length and the draft position), so rounds accept a
// prefix, reject in the middle, or accept everything.
class OracleDrafter : public Drafter {
 public:
  explicit OracleDrafter(int wrong_every) : wrong_every_(wrong_every) {}
  SpecType type() const override { return SpecType::kDraft; }
  void draft(std::span<DraftJob> jobs) override {
    for (DraftJob& j : jobs) {
      std::vector<int32_t> h = j.seq->tokens;
      for (int32_t i = 0; i < j.n_max; ++i) {
        int32_t t = test::reference_next(h, kVocab);
        if (wrong_every_ > 0 && (h.size() * 7 + (size_t)i) % (size_t)wrong_every_ == 0)
          t = (t + 1) % kVocab;
        j.draft.push_back(t);
        h.push_back(t);
      }
      calls += 1;
    }
  }
  void release(uint64_t) override { released += 1; }
  int wrong_every_;
  int calls = 0;
  int released = 0;
};

struct Run {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  StreamItem final;
};

Run collect(RequestHandle& h) {
  Run r;
  std::vector<StreamItem> items;
  for (;;) {
    items.clear();
    if (!h.wait(items, milliseconds(10000))) {
      ADD_FAILURE() << "engine stalled";
      return r;
    }
    for (auto& it : items) {
      if (it.kind == StreamItem::Kind::kFinal) {
        r.final = it;
        return r;
      }
      r.tokens.push_back(it.token);
      r.logprobs.push_back(it.logprob);
    }
  }
}

std::vector<int32_t> random_prompt(std::mt19937& rng, int32_t n) {
  std::vector<int32_t> p((size_t)n);
  for (auto& t : p) t = (int32_t)(rng() % kVocab);
  return p;
}

struct EngineSetup {
  int32_t block_size = 4;
  int32_t n_blocks = 256;
  int32_t max_running = 4;
  std::shared_ptr<Drafter> drafter;
  DraftParams draft;
  std::function<bool(int32_t)> is_eog;
};

// Runs the requests concurrently (all submitted at once); returns each one's output.
std::vector<Run> run_all(const EngineSetup& s, std::vector<GenerateRequest> reqs,
                         MetricsSnapshot* metrics = nullptr) {
  test::FakeExecutor ex(kVocab, s.n_blocks, s.block_size);
  // Simulated step costs (a step 10 ms, a decode 1 ms, an extra row 0.2 ms): what the
  // engine's cost model learns, so that drafting pays, deterministically.
  ex.sim_base_ms = 10;
  ex.sim_decode_ms = 1;
  ex.sim_prompt_ms = 0.2;
  EngineConfig c;
  c.now_ms = [&ex] { return ex.sim_now_ms; };
  c.n_ctx = 1024;
  c.scheduler = {.max_running = s.max_running, .max_step_tokens = 64, .max_prefill_chunk = 16};
  c.max_queue = 1 << 14;
  c.drafter = s.drafter;
  c.draft = s.draft;
  c.is_eog = s.is_eog;
  Engine e(c, ex);
  std::vector<std::shared_ptr<RequestHandle>> hs;
  for (auto& r : reqs) hs.push_back(e.submit(std::move(r)));
  std::vector<Run> out;
  for (auto& h : hs) out.push_back(collect(*h));
  e.shutdown(milliseconds(1000));
  if (metrics) *metrics = e.metrics().snapshot();
  return out;
}

GenerateRequest greedy(std::vector<int32_t> prompt, int32_t max_tokens, int32_t n_logprobs = -1) {
  GenerateRequest g;
  g.prompt = std::move(prompt);
  g.max_tokens = max_tokens;
  g.n_logprobs = n_logprobs;
  return g;
}

TEST(NgramDrafter, ProposesWhatFollowedTheLongestMostRecentMatch) {
  NgramDrafter d({.size_n_max = 3, .size_n_min = 1});
  // ... 5 6 7 8 9 ... 1 5 6 7 : the 3-gram "5 6 7" matched, "8 9 1 5" follows.
  std::vector<int32_t> t = {4, 5, 6, 7, 8, 9, 1, 5, 6, 7};
  EXPECT_EQ(d.lookup(t, 4), (std::vector<int32_t>{8, 9, 1, 5}));
  EXPECT_EQ(d.lookup(t, 2), (std::vector<int32_t>{8, 9}));
  // The most recent occurrence wins: "1 2" followed by 3 earlier and by 9 later.
  std::vector<int32_t> u = {1, 2, 3, 0, 1, 2, 9, 0, 1, 2};
  NgramDrafter d2({.size_n_max = 2, .size_n_min = 2});
  EXPECT_EQ(d2.lookup(u, 3), (std::vector<int32_t>{9, 0, 1}));
  // No match of n >= size_n_min: nothing.
  EXPECT_TRUE(d2.lookup(std::vector<int32_t>{1, 2, 3, 4}, 3).empty());
  EXPECT_TRUE(d.lookup(t, 0).empty());
  EXPECT_THROW(NgramDrafter({.size_n_max = 1, .size_n_min = 2}), Error);
}

TEST(Speculation, ExpectedTokensAndAcceptanceRate) {
  EXPECT_DOUBLE_EQ(expected_tokens(0.5, 0), 1.0);
  EXPECT_DOUBLE_EQ(expected_tokens(0.5, 2), 1.75);
  EXPECT_DOUBLE_EQ(expected_tokens(1.0, 4), 5.0);
  SpecStats s;
  EXPECT_DOUBLE_EQ(s.rate(), 0.5);
  for (int i = 0; i < 30; ++i) s.record(4, 4);
  EXPECT_GT(s.rate(), 0.9);
  for (int i = 0; i < 30; ++i) s.record(4, 0);
  EXPECT_LT(s.rate(), 0.25);  // the old rounds fade (0.9 per round)
  EXPECT_EQ(s.drafted, 240);
  EXPECT_EQ(s.accepted, 120);
}

TEST(Speculation, LengthFollowsTheMeasuredCosts) {
  auto drafter = std::make_shared<NgramDrafter>();
  Speculation spec(drafter);
  Sequence seq;
  SpecStats good;
  for (int i = 0; i < 20; ++i) good.record(8, 8);
  SpecCandidate c{&seq, {.n_max = 8}, &good};
  StepCostModel costs;
  // Unmeasured: the full length.
  EXPECT_EQ(spec.choose_length(std::span(&c, 1), 1, costs), 8);
  // A step costs 10 ms + 1 ms per decode, extra rows 0.2 ms: long drafts pay.
  for (int i = 0; i < 20; ++i) {
    costs.observe(0, 1, 11);
    costs.observe(0, 2, 12);
    costs.observe(8, 1, 11 + 8 * 0.2);
  }
  EXPECT_EQ(spec.choose_length(std::span(&c, 1), 1, costs), 8);
  // Compute-bound: every extra row costs as much as a whole step; never worth it.
  StepCostModel bound;
  for (int i = 0; i < 20; ++i) {
    bound.observe(0, 1, 1);
    bound.observe(0, 2, 2);
    bound.observe(8, 1, 1 + 8 * 1.5);
  }
  EXPECT_EQ(spec.choose_length(std::span(&c, 1), 1, bound), 0);
  // Poor acceptance (~8%) where an extra row costs a tenth of a step: not worth it.
  StepCostModel moderate;
  for (int i = 0; i < 20; ++i) {
    moderate.observe(0, 1, 11);
    moderate.observe(0, 2, 12);
    moderate.observe(8, 1, 11 + 8 * 1.0);
  }
  SpecStats poor;
  for (int i = 0; i < 20; ++i) poor.record(8, 0);
  SpecCandidate p{&seq, {.n_max = 8}, &poor};
  EXPECT_EQ(spec.choose_length(std::span(&p, 1), 1, moderate), 0);
  EXPECT_EQ(spec.choose_length(std::span(&c, 1), 1, moderate), 8);
}

// Proposes n_max tokens (all zeros) for every job, and remembers the lengths asked for.
class FixedDrafter : public Drafter {
 public:
  SpecType type() const override { return SpecType::kNgram; }
  void draft(std::span<DraftJob> jobs) override {
    for (DraftJob& j : jobs) {
      asked.push_back(j.n_max);
      j.draft.assign((size_t)j.n_max, 0);
    }
  }
  std::vector<int32_t> asked;
};

TEST(Speculation, WholeRoundsAcceptedDoubleTheNextDraft) {
  auto drafter = std::make_shared<FixedDrafter>();
  Speculation spec(drafter);
  // Extra rows cost 4 ms beside a 10 ms decode: at a modest rate the model picks a short k.
  StepCostModel costs;
  for (int i = 0; i < 20; ++i) {
    costs.observe(0, 1, 10);
    costs.observe(0, 2, 11);
  }
  costs.observe(512, 0, 10 + 512 * 1.0);
  for (int i = 0; i < 5; ++i) costs.observe(0, 1, 10 + 2 * 4.0, 2);
  Sequence seq;
  SpecStats stats;
  for (int i = 0; i < 10; ++i) stats.record(4, 2);  // rate ~0.6
  SpecCandidate c{&seq, {.n_max = 16}, &stats};
  const int32_t k_model = spec.choose_length(std::span(&c, 1), 1, costs);
  ASSERT_GT(k_model, 0);
  ASSERT_LT(k_model, 4);
  // Three steps (the engine's first two plan no drafts): the model's k, until a round is
  // accepted whole; then twice that round, and twice again, up to n_max.
  const auto propose = [&] {
    seq.draft.clear();
    spec.propose(std::span(&c, 1), 1, costs);
    return (int32_t)seq.draft.size();
  };
  propose(), propose();
  EXPECT_EQ(propose(), k_model);
  stats.record(k_model, k_model);
  EXPECT_EQ(propose(), 2 * k_model);
  stats.record(2 * k_model, 2 * k_model);
  EXPECT_EQ(propose(), std::min(16, 4 * k_model));
  stats.record(8, 8);
  EXPECT_EQ(propose(), 16);
  // A rejection: back to what the model says at the new rate.
  stats.record(16, 3);
  EXPECT_EQ(propose(), spec.choose_length(std::span(&c, 1), 1, costs));
  // Where speculation does not pay (every row as dear as a step), no growth either.
  StepCostModel bound;
  for (int i = 0; i < 20; ++i) {
    bound.observe(0, 1, 1);
    bound.observe(0, 2, 2);
  }
  bound.observe(512, 0, 1 + 512 * 1.0);
  for (int i = 0; i < 5; ++i) bound.observe(0, 1, 1 + 8 * 1.5, 8);
  stats.record(4, 4);
  ASSERT_EQ(spec.choose_length(std::span(&c, 1), 1, bound), 0);
  seq.draft.clear();
  Speculation bound_spec(drafter);
  for (int i = 0; i < 3; ++i) {  // past the plain first steps and the probe of step 1
    seq.draft.clear();
    bound_spec.propose(std::span(&c, 1), 1, bound);
  }
  EXPECT_TRUE(seq.draft.empty());
}

TEST(EngineSpeculation, GreedyOutputsAndLogprobsEqualPlainDecoding) {
  std::mt19937 rng(7);
  for (int wrong_every : {0, 2, 3, 5, 11}) {
    for (int32_t block_size : {1, 4, 16}) {
      std::vector<GenerateRequest> plain, spec;
      for (int i = 0; i < 6; ++i) {
        auto p = random_prompt(rng, 3 + (int32_t)(rng() % 30));
        const int32_t n = 5 + (int32_t)(rng() % 40);
        plain.push_back(greedy(p, n, 2));
        spec.push_back(greedy(p, n, 2));
      }
      spec[1].speculative = DraftParams{.n_max = 0};  // one plain sequence in the batch
      spec[2].speculative = DraftParams{.n_max = 3};
      EngineSetup s;
      s.block_size = block_size;
      const auto want = run_all(s, std::move(plain));
      s.drafter = std::make_shared<OracleDrafter>(wrong_every);
      s.draft.n_max = 7;
      MetricsSnapshot m;
      const auto got = run_all(s, std::move(spec), &m);
      for (size_t i = 0; i < want.size(); ++i) {
        SCOPED_TRACE("request " + std::to_string(i) + " wrong_every " +
                     std::to_string(wrong_every) + " block " + std::to_string(block_size));
        EXPECT_EQ(got[i].tokens, want[i].tokens);
        EXPECT_EQ(got[i].logprobs, want[i].logprobs);
        EXPECT_EQ(got[i].final.finish_reason, want[i].final.finish_reason);
      }
      EXPECT_EQ(got[1].final.n_drafted, 0);
      EXPECT_GT(m.draft_tokens_total, 0u);
      if (wrong_every == 0) {
        EXPECT_EQ(m.draft_accepted_total, m.draft_tokens_total);
      }
      if (wrong_every == 2) {
        EXPECT_LT(m.draft_accepted_total, m.draft_tokens_total);
      }
      EXPECT_EQ(m.kv_blocks_used, 0) << "blocks leaked";
    }
  }
}

// A later request whose prompt is an earlier one's prompt + output reuses its blocks from
// the prefix cache; had a rejected draft token entered a hashed block, its output would
// differ from plain decoding.
TEST(EngineSpeculation, RejectedTokensNeverReachThePrefixCache) {
  std::mt19937 rng(11);
  const auto prompt = random_prompt(rng, 9);
  EngineSetup s;
  s.block_size = 4;
  s.max_running = 1;  // one after the other: the second finds the first's blocks cached
  s.drafter = std::make_shared<OracleDrafter>(2);  // many rejections
  s.draft.n_max = 6;
  std::vector<GenerateRequest> first;
  first.push_back(greedy(prompt, 40));
  const auto a = run_all(s, std::move(first));
  std::vector<int32_t> longer = prompt;
  longer.insert(longer.end(), a[0].tokens.begin(), a[0].tokens.begin() + 30);

  std::vector<GenerateRequest> both, plain;
  both.push_back(greedy(prompt, 40));
  both.push_back(greedy(longer, 20));
  plain.push_back(greedy(longer, 20));
  MetricsSnapshot m;
  const auto got = run_all(s, std::move(both), &m);
  EngineSetup none = s;
  none.drafter = nullptr;
  const auto want = run_all(none, std::move(plain));
  EXPECT_EQ(got[0].tokens, a[0].tokens);
  EXPECT_EQ(got[1].tokens, want[0].tokens);
  EXPECT_GE(got[1].final.n_cached_prompt, 32) << "the shared prefix was not reused";
  EXPECT_LT(m.draft_accepted_total, m.draft_tokens_total);
}

TEST(EngineSpeculation, EndOfGenerationAndMaxTokensInsideAnAcceptedRun) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 8; ++trial) {
    const auto prompt = random_prompt(rng, 5 + trial);
    const int32_t eog = (int32_t)(rng() % kVocab);
    EngineSetup s;
    s.is_eog = [eog](int32_t t) { return t == eog; };
    std::vector<GenerateRequest> plain, spec;
    for (int32_t n : {1, 2, 7, 30}) {
      plain.push_back(greedy(prompt, n));
      spec.push_back(greedy(prompt, n));
    }
    const auto want = run_all(s, std::move(plain));
    s.drafter = std::make_shared<OracleDrafter>(0);  // every draft right: long accepted runs
    s.draft.n_max = 12;
    const auto got = run_all(s, std::move(spec));
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i].tokens, want[i].tokens);
      EXPECT_EQ(got[i].final.finish_reason, want[i].final.finish_reason);
      EXPECT_EQ(got[i].final.n_generated, want[i].final.n_generated);
    }
  }
}

GenerateRequest sampled(std::vector<int32_t> prompt, int32_t n, uint64_t seed) {
  GenerateRequest g = greedy(std::move(prompt), n);
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.seed = seed;
  g.sampler = std::make_unique<ParamsSampler>(p, kVocab);
  return g;
}

// Sampling: the emitted tokens follow the target sampler's distribution. Checked two ways
// over many seeds: the same seed gives the same tokens as plain sampling (each emitted token
// is one draw from its row, as without speculation), and the second token's frequencies
// match the exact distribution (total variation distance).
TEST(EngineSpeculation, SamplingKeepsTheTargetDistribution) {
  std::mt19937 rng(5);
  const auto prompt = random_prompt(rng, 6);
  constexpr int kSeeds = 3000;
  std::vector<GenerateRequest> plain, spec;
  for (int s = 0; s < kSeeds; ++s) {
    plain.push_back(sampled(prompt, 3, (uint64_t)s));
    spec.push_back(sampled(prompt, 3, (uint64_t)s));
  }
  EngineSetup none;
  none.max_running = 64;
  none.n_blocks = 4096;
  const auto want = run_all(none, std::move(plain));
  EngineSetup s = none;
  s.drafter = std::make_shared<OracleDrafter>(3);
  s.draft.n_max = 2;
  MetricsSnapshot m;
  const auto got = run_all(s, std::move(spec), &m);
  int same = 0;
  std::map<int32_t, std::map<int32_t, int>> second;  // first token -> second token counts
  std::map<int32_t, int> first_count;
  for (int i = 0; i < kSeeds; ++i) {
    same += got[(size_t)i].tokens == want[(size_t)i].tokens ? 1 : 0;
    ASSERT_EQ(got[(size_t)i].tokens.size(), 3u);
    first_count[got[(size_t)i].tokens[0]] += 1;
    second[got[(size_t)i].tokens[0]][got[(size_t)i].tokens[1]] += 1;
  }
  EXPECT_EQ(same, kSeeds);
  EXPECT_GT(m.spec_rounds_total, 0u) << m.draft_tokens_total << " " << m.generated_tokens_total;
  EXPECT_GT(m.draft_accepted_total, 0u);
  EXPECT_LT(m.draft_accepted_total, m.draft_tokens_total);
  // The most frequent first token: its successor's empirical distribution against softmax.
  int32_t top = first_count.begin()->first;
  for (auto& [t, n] : first_count)
    if (n > first_count[top]) top = t;
  std::vector<int32_t> h = prompt;
  h.push_back(top);
  std::vector<float> row(kVocab);
  test::reference_logits(h, kVocab, row.data());
  std::vector<float> logp(kVocab);
  log_softmax(row, logp);
  double tv = 0;
  const int n = first_count[top];
  for (int32_t v = 0; v < kVocab; ++v)
    tv += std::fabs(std::exp((double)logp[(size_t)v]) - (double)second[top][v] / n);
  tv /= 2;
  // With n ~ 1500 draws over 32 outcomes the expected TV is ~0.05; a biased acceptance rule
  // (e.g. always keeping a drafted token) moves it far beyond.
  EXPECT_LT(tv, 0.1) << "n = " << n;
}

}  // namespace
}  // namespace hablar::engine
