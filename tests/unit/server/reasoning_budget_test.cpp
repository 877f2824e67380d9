// The thinking budget: tokens inside the reasoning block are counted, and at the budget the
// closing tag is forced token by token; the model's own closing tag ends the budget.
#include "server/reasoning_budget.h"

#include <gtest/gtest.h>

namespace hablar::server {
namespace {

// Always answers `token` (stands for the request's own sampler).
class Constant : public engine::NextTokenSampler {
 public:
  explicit Constant(int32_t token) : token_(token) {}
  int32_t sample(std::span<float>, std::span<const int32_t>) override { return token_; }

 private:
  int32_t token_;
};

// Runs n steps, appending each sampled token to the history; returns the generated tokens.
std::vector<int32_t> run(engine::NextTokenSampler& s, std::vector<int32_t> history, int n,
                         const std::vector<int32_t>& inject = {}) {
  std::vector<float> logits(4, 0.0f);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    int32_t t = s.sample(logits, history);
    if ((size_t)i < inject.size() && inject[(size_t)i] >= 0) t = inject[(size_t)i];
    history.push_back(t);
    out.push_back(t);
  }
  return out;
}

constexpr int32_t kOpen = 90, kClose1 = 91, kClose2 = 92, kWord = 7;

TEST(ReasoningBudget, ForcesTheCloseAfterBudgetTokensWhenThePromptOpened) {
  ReasoningBudgetSampler s(std::make_unique<Constant>(kWord), 3, {kOpen}, {kClose1, kClose2}, true);
  const auto out = run(s, {1, 2, kOpen}, 8);
  EXPECT_EQ(out,
            (std::vector<int32_t>{kWord, kWord, kWord, kClose1, kClose2, kWord, kWord, kWord}));
  EXPECT_FALSE(s.inside());
}

TEST(ReasoningBudget, CountsFromTheModelsOwnOpeningTag) {
  ReasoningBudgetSampler s(std::make_unique<Constant>(kWord), 2, {kOpen}, {kClose1}, false);
  // Two words outside, then the model opens the block (injected), two words, forced close.
  const auto out = run(s, {1}, 7, {-1, -1, kOpen});
  EXPECT_EQ(out, (std::vector<int32_t>{kWord, kWord, kOpen, kWord, kWord, kClose1, kWord}));
}

TEST(ReasoningBudget, TheModelsOwnCloseEndsItAndZeroClosesAtOnce) {
  ReasoningBudgetSampler s(std::make_unique<Constant>(kWord), 5, {kOpen}, {kClose1}, true);
  const auto out = run(s, {kOpen}, 8, {-1, kClose1});
  EXPECT_EQ(out, (std::vector<int32_t>{kWord, kClose1, kWord, kWord, kWord, kWord, kWord, kWord}));
  ReasoningBudgetSampler zero(std::make_unique<Constant>(kWord), 0, {kOpen}, {kClose1}, true);
  EXPECT_EQ(run(zero, {kOpen}, 2), (std::vector<int32_t>{kClose1, kWord}));
}

TEST(ReasoningBudget, TagsFollowThePrompt) {
  EXPECT_EQ(reasoning_tags("<|im_start|>assistant\n<think>\n").close, "</think>");
  EXPECT_EQ(reasoning_tags("...<|START_THINKING|>").close, "<|END_THINKING|>");
  EXPECT_EQ(reasoning_tags("[THINK] ").close, "[/THINK]");
  EXPECT_EQ(reasoning_tags("no block").open, "<think>");
}

TEST(ReasoningBudget, NoBudgetLeavesTheSamplerAlone) {
  auto inner = std::make_unique<Constant>(kWord);
  engine::NextTokenSampler* raw = inner.get();
  EXPECT_EQ(with_reasoning_budget(std::move(inner), -1, true, {kOpen}, {kClose1}).get(), raw);
}

}  // namespace
}  // namespace hablar::server
