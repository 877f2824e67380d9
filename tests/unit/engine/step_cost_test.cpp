#include "engine/step_cost.h"

#include <gtest/gtest.h>

namespace hablar::engine {
namespace {

TEST(StepCostModel, FitsTheDecodeLineAndPricesPromptTokensPerWidth) {
  StepCostModel m;
  EXPECT_FALSE(m.ready());
  for (int i = 0; i < 4; ++i)
    for (int32_t d = 1; d <= 4; ++d) m.observe(0, d, 5.0 + 2.0 * d);  // base 5, 2 per decode
  EXPECT_FALSE(m.ready());                                            // no prompt tokens seen yet
  EXPECT_NEAR(m.base_ms(), 5.0, 1e-3);
  EXPECT_NEAR(m.per_decode_ms(), 2.0, 1e-3);
  // Narrow chunks cost 3 ms per token, wide ones 1 ms, beyond the decodes beside them.
  m.observe(8, 2, 9.0 + 8 * 3.0);
  m.observe(256, 0, 5.0 + 256 * 1.0);
  ASSERT_TRUE(m.ready());
  EXPECT_NEAR(m.per_prompt_ms(8), 3.0, 1e-3);
  EXPECT_NEAR(m.per_prompt_ms(300), 1.0, 1e-3);
  EXPECT_NEAR(m.per_prompt_ms(12), 3.0, 1e-3);  // unseen class: the nearest narrower one
  EXPECT_NEAR(m.predict_ms(8, 2), 33.0, 1e-3);
  EXPECT_NEAR(m.decode_ms(3), 11.0, 1e-3);
}

TEST(StepCostModel, VerificationRowsArePricedApartFromPromptTokens) {
  StepCostModel m;
  for (int32_t d = 1; d <= 4; ++d) m.observe(0, d, 10.0 + 1.0 * d);
  m.observe(512, 0, 10.0 + 512 * 1.5);  // prompt tokens: 1.5 ms each in wide chunks
  // Before any verification step, a drafted row is priced as a prompt token of its width.
  EXPECT_NEAR(m.per_verify_ms(8), 1.5, 1e-3);
  // Verification steps (one decode + k drafted rows at 5 ms each) teach their own price
  // whatever their width, and leave the prompt prices and the decode line alone.
  for (int32_t k : {1, 2, 3, 13}) m.observe(0, 1, 11.0 + k * 5.0, k);
  EXPECT_NEAR(m.per_verify_ms(2), 5.0, 1e-3);
  EXPECT_NEAR(m.per_verify_ms(16), 5.0, 1e-3);  // a width never verified: the same price
  EXPECT_NEAR(m.per_prompt_ms(512), 1.5, 1e-3);
  EXPECT_NEAR(m.decode_ms(1), 11.0, 1e-3);
  EXPECT_NEAR(m.predict_ms(0, 1, 8), 11.0 + 8 * 5.0, 1e-3);
  // One slow verification step moves the price a fifth of the way, not all of it.
  m.observe(0, 1, 11.0 + 2 * 10.0, 2);
  EXPECT_NEAR(m.per_verify_ms(2), 6.0, 1e-3);
  // A step with a prompt chunk beside a verification chunk: the drafted rows are taken off at
  // their price, the rest teaches the prompt price (64-token class: 2 ms each).
  m.observe(64, 1, 11.0 + 4 * 6.0 + 64 * 2.0, 4);
  EXPECT_NEAR(m.per_prompt_ms(64), 2.0, 1e-3);
  EXPECT_NEAR(m.per_verify_ms(4), 6.0, 1e-3);
}

TEST(StepCostModel, PromptTokensWithinATargetUseTheirWidthsPrice) {
  StepCostModel m;
  for (int32_t d = 1; d <= 4; ++d) m.observe(0, d, 4.0 + 1.0 * d);
  m.observe(8, 0, 4.0 + 8 * 2.0);      // 2 ms per token in chunks of 8-15
  m.observe(128, 0, 4.0 + 128 * 0.5);  // 0.5 ms per token in chunks of 128-255
  // Two decodes cost 6 ms; 20 ms leaves 14. At the wide price 28 tokens would fit, but a
  // chunk of 28 is priced as the nearest narrower class measured (2 ms): 7 tokens.
  EXPECT_EQ(m.prompt_tokens_within(20.0, 2, 512), 7);
  // 100 ms leaves 94: 188 tokens at 0.5 ms (a 128-255 chunk).
  EXPECT_EQ(m.prompt_tokens_within(100.0, 2, 512), 188);
  EXPECT_EQ(m.prompt_tokens_within(100.0, 2, 150), 150);  // the cap binds
  EXPECT_EQ(m.prompt_tokens_within(5.0, 2, 512), 0);      // the decodes alone exceed it
}

TEST(StepCostModel, FitsTheOverheadOfStepsWithPromptTokens) {
  StepCostModel gpu;
  for (int32_t d = 1; d <= 8; ++d) gpu.observe(0, d, 2.0 + 0.01 * d);  // graph replays
  // Steps with prompt tokens: 4 ms more whatever their width, 0.02 ms per token.
  for (int32_t p : {2048, 32, 64, 512, 32, 300})
    gpu.observe(p, p == 2048 ? 0 : 4, 2.0 + (p == 2048 ? 0 : 0.04) + 4.0 + 0.02 * p);
  EXPECT_NEAR(gpu.mixed_overhead_ms(), 4.0, 1e-6);
  EXPECT_NEAR(gpu.marginal_prompt_ms(), 0.02, 1e-9);
  EXPECT_EQ(gpu.efficient_prompt_tokens(2048), 200);
  EXPECT_EQ(gpu.efficient_prompt_tokens(100), 100);  // the cap binds
  // No overhead (a CPU streaming its weights whatever the width): no such floor.
  StepCostModel cpu;
  for (int32_t d = 1; d <= 4; ++d) cpu.observe(0, d, 30.0 + 1.0 * d);
  for (int32_t p : {512, 32, 128}) cpu.observe(p, 2, 32.0 + 1.2 * p);
  EXPECT_EQ(cpu.efficient_prompt_tokens(512), 0);
  // One width only: the line is unknown, and so is the floor.
  StepCostModel one;
  for (int32_t d = 1; d <= 4; ++d) one.observe(0, d, 2.0 + d);
  for (int i = 0; i < 5; ++i) one.observe(32, 2, 4.0 + 4.0 + 0.02 * 32);
  EXPECT_EQ(one.efficient_prompt_tokens(512), 0);
}

TEST(StepCostModel, FollowsAChangeInCost) {
  StepCostModel m(0.8);
  for (int i = 0; i < 50; ++i) m.observe(0, 1 + i % 3, 10.0 + 1.0 * (1 + i % 3));
  for (int i = 0; i < 50; ++i) m.observe(0, 1 + i % 3, 20.0 + 2.0 * (1 + i % 3));  // twice as slow
  EXPECT_NEAR(m.decode_ms(2), 24.0, 0.5);
}

TEST(StepCostModel, AWidthsFirstStepsArePricedAtTheirCheapest) {
  StepCostModel m;
  for (int32_t d = 1; d <= 4; ++d) m.observe(0, d, 2.0 + 0.01 * d);
  // The first step of 32 prompt tokens loaded its kernels (30 ms); the next ones cost 0.1 ms
  // per token. An average would price the width at ~0.9 ms a token for ~50 steps, and a
  // scheduler holding a step to a target would then avoid the width (never seeing it again).
  m.observe(32, 0, 2.0 + 30.0);
  EXPECT_NEAR(m.per_prompt_ms(32), 30.0 / 32, 1e-6);
  m.observe(32, 0, 2.0 + 32 * 0.1);
  EXPECT_NEAR(m.per_prompt_ms(32), 0.1, 1e-6);
  // Past its first steps a width's price is averaged again: a slower step moves it a little.
  for (int i = 0; i < 3; ++i) m.observe(40, 0, 2.0 + 40 * 0.1);
  m.observe(32, 0, 2.0 + 32 * 0.2);
  EXPECT_GT(m.per_prompt_ms(32), 0.1);
  EXPECT_LT(m.per_prompt_ms(32), 0.11);
}

}  // namespace
}  // namespace hablar::engine
