// The sampling chain: each stage against a hand computation, seeded reproducibility, the
// distribution drawn at temperature 1 against softmax, and parameter validation.
#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <set>

#include "core/error.h"

namespace hablar::engine {
namespace {

// Logits with a clear order: token i has logit log(weights[i]) so probabilities are known.
std::vector<float> logits_from_probs(const std::vector<double>& p) {
  std::vector<float> l;
  for (double v : p) l.push_back((float)std::log(v));
  return l;
}

SamplingParams plain(float temp) {
  SamplingParams p;
  p.temperature = temp;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  return p;
}

// Frequencies of n draws.
std::map<int32_t, int> histogram(Sampler& s, const std::vector<float>& logits, int n) {
  std::map<int32_t, int> h;
  for (int i = 0; i < n; ++i) ++h[s.sample(logits).token];
  return h;
}

TEST(Sampler, GreedyIsArgmaxWhateverTheSeed) {
  const std::vector<float> logits{0.1f, 2.5f, -1.0f, 2.4f};
  for (uint64_t seed : {1ull, 2ull, 99ull}) {
    SamplingParams p = SamplingParams::greedy();
    p.seed = seed;
    Sampler s(p, 4);
    EXPECT_EQ(s.sample(logits).token, 1);
  }
  EXPECT_EQ(argmax(logits), 1);
}

TEST(Sampler, SameSeedSameTokensDifferentSeedDifferent) {
  const std::vector<float> logits = logits_from_probs({0.2, 0.2, 0.2, 0.2, 0.2});
  auto draw = [&](uint64_t seed) {
    SamplingParams p = plain(1.0f);
    p.seed = seed;
    Sampler s(p, 5);
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(s.sample(logits).token);
    return out;
  };
  EXPECT_EQ(draw(123), draw(123));
  EXPECT_NE(draw(123), draw(124));
}

TEST(Sampler, TemperatureOneDrawsTheSoftmaxDistribution) {
  const std::vector<double> probs{0.5, 0.25, 0.125, 0.125};
  Sampler s(plain(1.0f), 4);
  const int n = 40000;
  const auto h = histogram(s, logits_from_probs(probs), n);
  for (int i = 0; i < 4; ++i) {
    const double freq = (double)(h.count(i) ? h.at(i) : 0) / n;
    const double sd = std::sqrt(probs[(size_t)i] * (1 - probs[(size_t)i]) / n);
    EXPECT_NEAR(freq, probs[(size_t)i], 5 * sd) << "token " << i;
  }
}

TEST(Sampler, LowTemperatureSharpens) {
  // At T = 0.5 probabilities become p^2 / sum(p^2): 0.5^2 / (0.25 + 0.0625 + 2 * 0.015625).
  const std::vector<double> probs{0.5, 0.25, 0.125, 0.125};
  Sampler s(plain(0.5f), 4);
  const int n = 40000;
  const auto h = histogram(s, logits_from_probs(probs), n);
  const double want = 0.25 / (0.25 + 0.0625 + 0.015625 * 2);
  EXPECT_NEAR((double)h.at(0) / n, want, 5 * std::sqrt(want * (1 - want) / n));
}

TEST(Sampler, TopKKeepsOnlyTheKBest) {
  SamplingParams p = plain(1.0f);
  p.top_k = 2;
  Sampler s(p, 5);
  const auto h = histogram(s, logits_from_probs({0.1, 0.3, 0.05, 0.25, 0.3}), 2000);
  const std::set<int32_t> seen = [&] {
    std::set<int32_t> out;
    for (auto& [t, c] : h) out.insert(t);
    return out;
  }();
  EXPECT_EQ(seen, (std::set<int32_t>{1, 4}));
}

TEST(Sampler, TopPKeepsSmallestPrefixReachingMass) {
  SamplingParams p = plain(1.0f);
  p.top_p = 0.6f;  // 0.4 + 0.3 >= 0.6: tokens 2 and 0
  Sampler s(p, 4);
  const auto h = histogram(s, logits_from_probs({0.3, 0.2, 0.4, 0.1}), 3000);
  EXPECT_EQ(h.size(), 2u);
  EXPECT_TRUE(h.count(0) && h.count(2));
  // Renormalized: 0.4 / 0.7 for token 2.
  EXPECT_NEAR((double)h.at(2) / 3000, 0.4 / 0.7, 0.05);
}

TEST(Sampler, MinPDropsTokensFarBelowTheBest) {
  SamplingParams p = plain(1.0f);
  p.min_p = 0.3f;  // keep p >= 0.3 * 0.5 = 0.15
  Sampler s(p, 4);
  const auto h = histogram(s, logits_from_probs({0.5, 0.2, 0.14, 0.16}), 3000);
  EXPECT_FALSE(h.count(2));
  EXPECT_TRUE(h.count(0) && h.count(1) && h.count(3));
}

TEST(Sampler, TypicalPKeepsTokensNearTheEntropy) {
  // Entropy of {0.7, 0.1, 0.1, 0.1} is ~0.94 nats; surprises: 0.36 (token 0) and 2.30 (others):
  // |0.36 - 0.94| = 0.58 < |2.30 - 0.94| = 1.36, so token 0 ranks first and mass 0.7 >= 0.5.
  SamplingParams p = plain(1.0f);
  p.typical_p = 0.5f;
  Sampler s(p, 4);
  const auto h = histogram(s, logits_from_probs({0.7, 0.1, 0.1, 0.1}), 500);
  EXPECT_EQ(h.size(), 1u);
  EXPECT_TRUE(h.count(0));
}

// The chain's survivors and their probabilities (post-chain, at temperature 1).
std::map<int32_t, float> survivors(SamplingParams p, const std::vector<double>& probs) {
  Sampler s(p, (int32_t)probs.size());
  s.keep_candidates((int)probs.size());
  std::map<int32_t, float> out;
  for (const TokenProb& t : s.sample(logits_from_probs(probs)).post_top) out[t.token] = t.prob;
  return out;
}

void expect_distribution(const std::map<int32_t, float>& got,
                         const std::map<int32_t, float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [token, prob] : want) {
    ASSERT_TRUE(got.count(token)) << token;
    EXPECT_NEAR(got.at(token), prob, 1e-5) << token;
  }
}

TEST(Sampler, TopNSigmaKeepsLogitsNearTheBest) {
  // Logits log(0.1..0.4): mean -1.53, population sd 0.53; one sd below the best keeps 0.3, 0.4.
  SamplingParams p = plain(1.0f);
  p.top_n_sigma = 1.0f;
  expect_distribution(survivors(p, {0.1, 0.2, 0.3, 0.4}), {{2, 3.0f / 7}, {3, 4.0f / 7}});
  p.top_n_sigma = 3.0f;
  expect_distribution(survivors(p, {0.1, 0.2, 0.3, 0.4}),
                      {{0, 0.1f}, {1, 0.2f}, {2, 0.3f}, {3, 0.4f}});
  p.top_n_sigma = 0.0f;  // off
  expect_distribution(survivors(p, {0.1, 0.2, 0.3, 0.4}),
                      {{0, 0.1f}, {1, 0.2f}, {2, 0.3f}, {3, 0.4f}});
}

TEST(Sampler, XtcDropsTheTopChoicesButTheLeastLikelyOfThem) {
  SamplingParams p = plain(1.0f);
  p.xtc_probability = 1.0f;
  p.xtc_threshold = 0.09f;  // all four reach it: only the least likely stays
  expect_distribution(survivors(p, {0.4, 0.3, 0.2, 0.1}), {{3, 1.0f}});
  p.xtc_threshold = 0.19f;
  expect_distribution(survivors(p, {0.4, 0.3, 0.2, 0.1}), {{2, 2.0f / 3}, {3, 1.0f / 3}});
  p.xtc_threshold = 0.29f;
  expect_distribution(survivors(p, {0.4, 0.3, 0.2, 0.1}),
                      {{1, 0.5f}, {2, 1.0f / 3}, {3, 1.0f / 6}});
  p.xtc_threshold = 0.39f;  // one token reaches it: nothing to exclude
  expect_distribution(survivors(p, {0.4, 0.3, 0.2, 0.1}),
                      {{0, 0.4f}, {1, 0.3f}, {2, 0.2f}, {3, 0.1f}});
  p.xtc_threshold = 0.6f;  // above 0.5: off
  p.xtc_probability = 1.0f;
  EXPECT_EQ(survivors(p, {0.4, 0.3, 0.2, 0.1}).size(), 4u);
  // With probability 0 it never acts, and it draws no random number: the same tokens come
  // from the same seed as without it.
  SamplingParams off = plain(1.0f), zero = plain(1.0f);
  zero.xtc_probability = 0.0f;
  const std::vector<float> logits = logits_from_probs({0.4, 0.3, 0.2, 0.1});
  Sampler a(off, 4), b(zero, 4);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(a.sample(logits).token, b.sample(logits).token);
}

// DRY over a history: the survivors' probabilities at temperature 1 after the penalty.
std::map<int32_t, float> after_dry(DryParams dry, const std::vector<double>& probs,
                                   const std::vector<int32_t>& history) {
  SamplingParams p = plain(1.0f);
  p.dry = std::move(dry);
  Sampler s(p, (int32_t)probs.size());
  s.accept(history);
  s.keep_candidates((int)probs.size());
  std::map<int32_t, float> out;
  for (const TokenProb& t : s.sample(logits_from_probs(probs)).post_top) out[t.token] = t.prob;
  return out;
}

DryParams dry(float multiplier, float base, int32_t allowed, int32_t last_n,
              std::vector<std::vector<int32_t>> breakers = {}) {
  DryParams d;
  d.multiplier = multiplier;
  d.base = base;
  d.allowed_length = allowed;
  d.penalty_last_n = last_n;
  auto b = std::make_shared<DryBreakers>();
  for (auto& seq : breakers)
    b->heads.emplace(seq[0], std::vector<int32_t>(seq.begin() + 1, seq.end()));
  d.breakers = std::move(b);
  return d;
}

TEST(Sampler, DryPenalizesTheTokenThatWouldExtendARepeat) {
  // 0 1 2 0 1: "0 1" was followed by 2, and is the end again: 2 loses 1 * 1.1^(2 - 2).
  const float e = std::exp(-1.0f);
  expect_distribution(after_dry(dry(1.0f, 1.1f, 2, 5), {0.25, 0.25, 0.25, 0.25}, {0, 1, 2, 0, 1}),
                      {{0, 1 / (3 + e)}, {1, 1 / (3 + e)}, {2, e / (3 + e)}, {3, 1 / (3 + e)}});
  const float e2 = std::exp(-2.0f);  // multiplier 2
  expect_distribution(after_dry(dry(2.0f, 1.1f, 2, 5), {0.2, 0.2, 0.2, 0.2, 0.2}, {0, 1, 2, 0, 1}),
                      {{0, 1 / (4 + e2)},
                       {1, 1 / (4 + e2)},
                       {2, e2 / (4 + e2)},
                       {3, 1 / (4 + e2)},
                       {4, 1 / (4 + e2)}});
  // Longer repeats grow the penalty by the base per token beyond the allowed length:
  // 5 6 7 8 0 5 6 7: "5 6 7" (3 tokens) was followed by 8: 1 * 2^(3 - 2) = 2.
  const auto longer =
      after_dry(dry(1.0f, 2.0f, 2, -1), std::vector<double>(9, 1.0 / 9), {5, 6, 7, 8, 0, 5, 6, 7});
  EXPECT_NEAR(std::log(longer.at(8) / longer.at(0)), -2.0, 1e-4);
}

TEST(Sampler, DryLeavesShortRepeatsBreakersAndOldHistoryAlone) {
  const std::map<int32_t, float> even4 = {{0, 0.25f}, {1, 0.25f}, {2, 0.25f}, {3, 0.25f}};
  // Too short a history to hold a repeat.
  expect_distribution(after_dry(dry(1.0f, 1.1f, 2, 4), {0.25, 0.25, 0.25, 0.25}, {0, 1}), even4);
  // A breaker (token 3) between the repeat and the end cuts the match.
  const std::map<int32_t, float> even5 = {{0, 0.2f}, {1, 0.2f}, {2, 0.2f}, {3, 0.2f}, {4, 0.2f}};
  expect_distribution(
      after_dry(dry(1.0f, 1.1f, 2, 6, {{3}}), {0.2, 0.2, 0.2, 0.2, 0.2}, {0, 1, 3, 4, 0, 1}),
      even5);
  // Allowed length 4: a 2-token repeat goes unpunished.
  expect_distribution(
      after_dry(dry(1.0f, 1.1f, 4, 7), {0.2, 0.2, 0.2, 0.2, 0.2}, {0, 1, 2, 3, 4, 0, 1}), even5);
  // Outside the scanned window: 0 1 2 ... 0 1 with a window of 3 sees only "4 0 1".
  expect_distribution(
      after_dry(dry(1.0f, 1.1f, 2, 3), {0.2, 0.2, 0.2, 0.2, 0.2}, {0, 1, 2, 4, 0, 1}), even5);
  // A multi-token breaker (4 then 3) counts only when complete.
  const auto partial =
      after_dry(dry(1.0f, 1.1f, 2, -1, {{4, 3}}), {0.2, 0.2, 0.2, 0.2, 0.2}, {0, 1, 2, 4, 0, 1});
  EXPECT_LT(partial.at(2), 0.1f);
}

TEST(Sampler, MirostatV2KeepsTokensWithinTheSurpriseBound) {
  // Surprises 1, 2, 3, 3 bits; tau 1 starts mu at 2: tokens 0 and 1 stay, renormalized.
  SamplingParams p = plain(1.0f);
  p.mirostat = 2;
  p.mirostat_tau = 1.0f;
  p.mirostat_eta = 0.0f;  // mu stays put
  p.top_k = 1;            // ignored under mirostat
  expect_distribution(survivors(p, {0.5, 0.25, 0.125, 0.125}), {{0, 2.0f / 3}, {1, 1.0f / 3}});
  p.mirostat_tau = 10.0f;  // mu 20: everything stays
  EXPECT_EQ(survivors(p, {0.5, 0.25, 0.125, 0.125}).size(), 4u);
}

TEST(Sampler, MirostatLearnsTowardsTau) {
  // Mirostat steers the surprise of what it draws: a lower tau draws less surprising tokens
  // (measured here under the model's own distribution), and both draw less surprising
  // tokens than plain sampling from the same Zipf-like distribution.
  std::vector<double> probs(64);
  double sum = 0.0;
  for (size_t i = 0; i < probs.size(); ++i) sum += (probs[i] = 1.0 / (double)(i + 1));
  for (double& v : probs) v /= sum;
  const std::vector<float> logits = logits_from_probs(probs);
  auto mean_surprise = [&](int version, float tau) {
    SamplingParams p = plain(1.0f);
    p.mirostat = version;
    p.mirostat_tau = tau;
    p.mirostat_eta = 0.5f;
    Sampler s(p, (int32_t)probs.size());
    double surprise = 0.0;
    for (int i = 0; i < 4000; ++i) surprise += -std::log2(probs[(size_t)s.sample(logits).token]);
    return surprise / 4000;
  };
  const double plain_mean = mean_surprise(0, 0.0f);
  for (int version : {1, 2}) {
    const double low = mean_surprise(version, 2.0f), high = mean_surprise(version, 4.0f);
    EXPECT_LT(low + 0.5, high) << "mirostat " << version;
    EXPECT_LT(high, plain_mean) << "mirostat " << version;
  }
  // Version 1 keeps a prefix of the most likely tokens.
  SamplingParams p1 = plain(1.0f);
  p1.mirostat = 1;
  p1.mirostat_tau = 0.01f;  // mu tiny: k = 1
  EXPECT_EQ(survivors(p1, {0.1, 0.6, 0.3}), (std::map<int32_t, float>{{1, 1.0f}}));
}

TEST(Sampler, RepetitionPenaltyFollowsLlamaCppRule) {
  // Token 0 (logit 2.0) seen: 2.0 / 2 = 1.0 < token 1's 1.5. Token 2 (logit -1) seen: -2.
  SamplingParams p = SamplingParams::greedy();
  p.repeat_penalty = 2.0f;
  Sampler s(p, 3);
  s.accept(std::vector<int32_t>{0, 2});
  EXPECT_EQ(s.sample(std::vector<float>{2.0f, 1.5f, -1.0f}).token, 1);
  // Outside the window the penalty no longer applies.
  SamplingParams q = p;
  q.repeat_last_n = 1;
  Sampler s2(q, 3);
  s2.accept(std::vector<int32_t>{0, 2});
  EXPECT_EQ(s2.sample(std::vector<float>{2.0f, 1.5f, -1.0f}).token, 0);
}

TEST(Sampler, PresenceAndFrequencyPenalties) {
  // Token 0 seen 3 times: 3.0 - 3 * 0.4 - 0.5 = 1.3 < 1.4 (token 1).
  SamplingParams p = SamplingParams::greedy();
  p.frequency_penalty = 0.4f;
  p.presence_penalty = 0.5f;
  Sampler s(p, 2);
  s.accept(std::vector<int32_t>{0, 0, 0});
  EXPECT_EQ(s.sample(std::vector<float>{3.0f, 1.4f}).token, 1);
  // Two occurrences only: 3.0 - 0.8 - 0.5 = 1.7 > 1.4.
  s.reset_history();
  s.accept(std::vector<int32_t>{0, 0});
  EXPECT_EQ(s.sample(std::vector<float>{3.0f, 1.4f}).token, 0);
}

TEST(Sampler, LogitBiasBansAndBoosts) {
  SamplingParams p = plain(1.0f);
  p.logit_bias = {{0, -std::numeric_limits<float>::infinity()}, {2, 5.0f}};
  Sampler s(p, 3);
  const auto h = histogram(s, std::vector<float>{3.0f, 0.0f, 0.0f}, 2000);
  EXPECT_FALSE(h.count(0));
  EXPECT_GT(h.at(2), 1900);  // e^5 / (e^5 + 1)
}

// top_logprobs keeps its best n in one pass: the same ids, order (value descending, the
// lowest id among equals) and figures as sorting the whole row, ties and -inf included.
TEST(Sampler, TopLogprobsAreTheRowsSortedHead) {
  std::mt19937 rng(9);
  std::vector<float> row(5000);
  for (float& v : row) v = (float)(rng() % 40) * 0.25f;  // many ties
  row[17] = -std::numeric_limits<float>::infinity();
  row[4000] = 20.0f;
  const double lse = log_sum_exp(row);
  for (int n : {1, 2, 7, 20, 100, 5000, 6000}) {
    std::vector<int32_t> ids(row.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = (int32_t)i;
    std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
    const std::vector<TokenLogprob> top = top_logprobs(row, n);
    ASSERT_EQ(top.size(), (size_t)std::min<int>(n, (int)row.size()));
    for (size_t k = 0; k < top.size(); ++k) {
      ASSERT_EQ(top[k].token, ids[k]) << "n " << n << " rank " << k;
      EXPECT_EQ(top[k].logprob, (float)((double)row[(size_t)ids[k]] - lse));
    }
  }
  EXPECT_TRUE(top_logprobs(row, 0).empty());
}

TEST(Sampler, LogprobsAreRawLogSoftmax) {
  SamplingParams p = SamplingParams::greedy();
  p.n_probs = 2;
  Sampler s(p, 3);
  const std::vector<float> logits = logits_from_probs({0.6, 0.3, 0.1});
  const SampleResult r = s.sample(logits);
  EXPECT_EQ(r.token, 0);
  EXPECT_NEAR(r.logprob, std::log(0.6), 1e-6);
  ASSERT_EQ(r.top.size(), 2u);
  EXPECT_EQ(r.top[0].token, 0);
  EXPECT_EQ(r.top[1].token, 1);
  EXPECT_NEAR(r.top[1].logprob, std::log(0.3), 1e-6);
  std::vector<float> lsm(3);
  log_softmax(logits, lsm);
  EXPECT_NEAR(lsm[2], std::log(0.1), 1e-6);
}

TEST(SamplerParams, InvalidValuesAreClearErrors) {
  auto expect_bad = [](SamplingParams p, const std::string& needle) {
    try {
      p.validate();
      ADD_FAILURE() << "expected an error about " << needle;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  SamplingParams p;
  p.temperature = std::nanf("");
  expect_bad(p, "temperature");
  p = {};
  p.temperature = -0.5f;
  expect_bad(p, "temperature");
  for (float top_p : {0.0f, -0.1f, 1.5f, std::nanf("")}) {
    p = {};
    p.top_p = top_p;
    expect_bad(p, "top_p");
  }
  p = {};
  p.min_p = 1.5f;
  expect_bad(p, "min_p");
  p = {};
  p.repeat_penalty = 0.0f;
  expect_bad(p, "repeat_penalty");
  p = {};
  p.n_probs = -1;
  expect_bad(p, "n_probs");
  p = {};
  p.xtc_probability = 1.5f;
  expect_bad(p, "xtc_probability");
  p = {};
  p.xtc_threshold = -0.1f;
  expect_bad(p, "xtc_threshold");
  p = {};
  p.top_n_sigma = std::numeric_limits<float>::infinity();
  expect_bad(p, "top_n_sigma");
  p = {};
  p.mirostat = 3;
  expect_bad(p, "mirostat");
  p = {};
  p.logit_bias = {{7, 1.0f}};
  EXPECT_THROW(Sampler(p, 5), Error);  // token outside the vocabulary
  EXPECT_NO_THROW(SamplingParams{}.validate());
}

TEST(Rng, DeterministicAndUniform) {
  Rng a(5), b(5);
  double sum = 0;
  for (int i = 0; i < 10000; ++i) {
    const double u = a.uniform();
    EXPECT_EQ(u, b.uniform());
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
  }
  EXPECT_NEAR(sum / 10000, 0.5, 0.02);
}

}  // namespace
}  // namespace hablar::engine
