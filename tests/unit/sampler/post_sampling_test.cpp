// The post-chain distribution a sample reports (llama-server's post_sampling_probs): the
// survivors of top-k / top-p / min-p with their probabilities after temperature, against a
// hand computation; and PostSamplingLog indexing samples by generated token.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/request_sampler.h"
#include "engine/sampler.h"

namespace hablar::engine {
namespace {

std::vector<float> logits_from_probs(const std::vector<double>& p) {
  std::vector<float> l;
  for (double v : p) l.push_back((float)std::log(v));
  return l;
}

TEST(PostSampling, TopKSurvivorsRenormalizedAfterTemperature) {
  SamplingParams p;
  p.temperature = 0.5f;
  p.top_k = 3;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  Sampler s(p, 5);
  s.keep_candidates(10);
  const std::vector<double> probs = {0.1, 0.4, 0.05, 0.3, 0.15};
  const SampleResult r = s.sample(logits_from_probs(probs));
  // Tokens 1, 3, 4 survive; at temperature 0.5 each weighs p^2.
  const double z = 0.4 * 0.4 + 0.3 * 0.3 + 0.15 * 0.15;
  ASSERT_EQ(r.post_top.size(), 3u);
  EXPECT_EQ(r.post_top[0].token, 1);
  EXPECT_EQ(r.post_top[1].token, 3);
  EXPECT_EQ(r.post_top[2].token, 4);
  EXPECT_NEAR(r.post_top[0].prob, 0.16 / z, 1e-5);
  EXPECT_NEAR(r.post_top[1].prob, 0.09 / z, 1e-5);
  EXPECT_NEAR(r.post_top[2].prob, 0.0225 / z, 1e-5);
  bool found = false;
  for (const TokenProb& c : r.post_top)
    if (c.token == r.token) {
      EXPECT_FLOAT_EQ(r.post_prob, c.prob);
      found = true;
    }
  EXPECT_TRUE(found);
}

TEST(PostSampling, CappedAtNAndOffByDefault) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  Sampler s(p, 4);
  const auto logits = logits_from_probs({0.1, 0.2, 0.3, 0.4});
  EXPECT_TRUE(s.sample(logits).post_top.empty());
  s.keep_candidates(2);
  const SampleResult r = s.sample(logits);
  ASSERT_EQ(r.post_top.size(), 2u);
  EXPECT_EQ(r.post_top[0].token, 3);
  EXPECT_NEAR(r.post_top[0].prob, 0.4, 1e-5);
  EXPECT_NEAR(r.post_top[1].prob, 0.3, 1e-5);
}

TEST(PostSampling, GreedyKeepsTheChosenTokenAlone) {
  Sampler s(SamplingParams::greedy(), 4);
  s.keep_candidates(3);
  const SampleResult r = s.sample(logits_from_probs({0.1, 0.6, 0.2, 0.1}));
  EXPECT_EQ(r.token, 1);
  EXPECT_EQ(r.post_prob, 1.0f);
  ASSERT_EQ(r.post_top.size(), 1u);
  EXPECT_EQ(r.post_top[0].token, 1);
}

TEST(PostSampling, LogIndexesByGeneratedToken) {
  SamplingParams p = SamplingParams::greedy();
  auto log = std::make_shared<PostSamplingLog>();
  ParamsSampler s(p, 3);
  s.report_post_sampling(log, 2);
  std::vector<int32_t> history = {0, 0, 0, 0};  // a 4-token prompt
  std::vector<float> logits = {0.0f, 1.0f, 0.5f};
  for (int i = 0; i < 3; ++i) history.push_back(s.sample(logits, history));
  // A recomputed step at the same position replaces its entry.
  history.pop_back();
  logits = {0.0f, 0.5f, 1.0f};
  history.push_back(s.sample(logits, history));
  for (size_t i = 0; i < 3; ++i) {
    auto e = log->take(i);
    ASSERT_TRUE(e.has_value()) << i;
    EXPECT_EQ(e->token, i < 2 ? 1 : 2);
    EXPECT_EQ(e->prob, 1.0f);
  }
  EXPECT_FALSE(log->take(0).has_value());  // taken
  EXPECT_FALSE(log->take(3).has_value());
}

// A speculative step's rejected drafts leave the sequence: the penalties must forget them.
TEST(ParamsSamplerHistory, FollowsTheSequenceBackWhenItsTailIsReplaced) {
  SamplingParams p = SamplingParams::greedy();
  p.repeat_penalty = 4.0f;  // a token seen in the window loses three quarters of its logit
  ParamsSampler s(p, 3);
  const std::vector<float> base = {0.0f, 2.0f, 1.9f};
  std::vector<float> logits = base;
  std::vector<int32_t> history = {0, 0};
  EXPECT_EQ(s.sample(logits, history), 1);  // nothing seen: the best
  history.push_back(1);                     // a draft...
  logits = base;
  EXPECT_EQ(s.sample(logits, history), 2);  // ...penalizes 1
  history.pop_back();                       // rejected
  logits = base;
  EXPECT_EQ(s.sample(logits, history), 1);  // 1 is unseen again
  history.push_back(2);                     // replaced by another token of the same length
  logits = base;
  EXPECT_EQ(s.sample(logits, history), 1);  // 2 is penalized now, 1 is not
}

}  // namespace
}  // namespace hablar::engine
