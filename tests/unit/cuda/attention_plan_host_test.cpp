// The split of a step's rows between the flash prefill kernel and the decode kernel
// (attention_plan.h, as cuda::ForwardOps::stage uses it), on the host.
#include <gtest/gtest.h>

#include <vector>

#include "backend/cuda/attention_plan.h"

namespace hablar::test {
namespace {

using cuda::AttentionPlan;
using cuda::AttentionPlanLimits;
using cuda::StepChunkRows;

AttentionPlanLimits h200(int n_heads) {
  AttentionPlanLimits l;
  l.flash_allowed = true, l.n_heads = n_heads, l.multiprocessors = 132;
  return l;
}

// Rows of the decode kernel as a list, for readable failures.
std::vector<int> decode_rows(const AttentionPlan& plan) {
  std::vector<int> rows;
  for (size_t i = 0; i < plan.decode_rows.size(); ++i)
    if (plan.decode_rows[i]) rows.push_back((int)i);
  return rows;
}

TEST(AttentionPlanHost, LongChunkOnTheFlashKernelOtherRowsOnTheDecodeKernel) {
  // A decode token, a 600-token prompt chunk after a prefix of 100, a 3-token chunk: 10
  // query tiles x 32 heads = 320 blocks.
  const std::vector<StepChunkRows> chunks = {{0, 1, 57}, {1, 600, 100}, {601, 3, 0}};
  const AttentionPlan plan = cuda::plan_step_attention(chunks, 604, h200(32));
  ASSERT_EQ(plan.flash.size(), 1u);
  EXPECT_EQ(plan.flash[0].first_row, 1);
  EXPECT_EQ(plan.flash[0].count, 600);
  EXPECT_EQ(plan.flash[0].start_pos, 100);
  EXPECT_EQ(plan.max_flash_chunk, 600);
  EXPECT_EQ(plan.n_decode_rows, 4);
  EXPECT_EQ(decode_rows(plan), (std::vector<int>{0, 601, 602, 603}));
}

TEST(AttentionPlanHost, FewBlocksTakeTheFlashKernelOnlyWithinTheShortContext) {
  // One 512-token prompt of 12 heads: 8 tiles x 12 = 96 blocks, under 132, but it ends
  // within 2048 positions: flash.
  const std::vector<StepChunkRows> first = {{0, 512, 0}};
  const AttentionPlan short_one = cuda::plan_step_attention(first, 512, h200(12));
  EXPECT_EQ(short_one.flash.size(), 1u);
  EXPECT_EQ(short_one.n_decode_rows, 0);
  EXPECT_EQ(short_one.max_flash_chunk, 512);
  // The same chunk ending at 2048 still does; one position further, with 96 blocks, every
  // row goes to the decode kernel.
  const std::vector<StepChunkRows> at_limit = {{0, 512, 1536}};
  EXPECT_EQ(cuda::plan_step_attention(at_limit, 512, h200(12)).flash.size(), 1u);
  const std::vector<StepChunkRows> deep = {{0, 512, 1537}};
  const AttentionPlan few = cuda::plan_step_attention(deep, 512, h200(12));
  EXPECT_TRUE(few.flash.empty());
  EXPECT_EQ(few.n_decode_rows, 512);
  EXPECT_EQ(few.max_flash_chunk, 0);
  EXPECT_EQ(decode_rows(few).size(), 512u);
  // A deep chunk beside a short one: both on the decode kernel (one rule for the step's set).
  const std::vector<StepChunkRows> mixed = {{0, 64, 0}, {64, 512, 4000}};
  EXPECT_TRUE(cuda::plan_step_attention(mixed, 576, h200(12)).flash.empty());
  // Two deep ones: 192 blocks fill the GPU.
  const std::vector<StepChunkRows> two = {{0, 512, 4000}, {512, 512, 9000}};
  const AttentionPlan enough = cuda::plan_step_attention(two, 1024, h200(12));
  EXPECT_EQ(enough.flash.size(), 2u);
  EXPECT_EQ(enough.n_decode_rows, 0);
  EXPECT_TRUE(decode_rows(enough).empty());
  // The lab's forcing takes the deep single chunk too; graphs and deterministic mode never.
  AttentionPlanLimits forced = h200(12);
  forced.force_flash = true;
  EXPECT_EQ(cuda::plan_step_attention(deep, 512, forced).flash.size(), 1u);
  AttentionPlanLimits graph = h200(12);
  graph.flash_allowed = false, graph.force_flash = true;
  EXPECT_TRUE(cuda::plan_step_attention(two, 1024, graph).flash.empty());
}

TEST(AttentionPlanHost, ShortChunksEmptyChunksAndPaddingRows) {
  // 31 tokens stay on the decode kernel, 32 may leave it; an empty chunk at the same row as
  // a long one takes nothing; rows past the chunks (graph padding) go to neither kernel.
  const std::vector<StepChunkRows> chunks = {{0, 31, 0}, {31, 0, 9}, {31, 32, 0}};
  AttentionPlanLimits l = h200(8);
  l.multiprocessors = 1;
  const AttentionPlan plan = cuda::plan_step_attention(chunks, 70, l);
  ASSERT_EQ(plan.flash.size(), 1u);
  EXPECT_EQ(plan.flash[0].first_row, 31);
  EXPECT_EQ(plan.flash[0].count, 32);
  EXPECT_EQ(plan.n_decode_rows, 31);
  std::vector<int> want;
  for (int i = 0; i < 31; ++i) want.push_back(i);
  EXPECT_EQ(decode_rows(plan), want);
  EXPECT_EQ(plan.decode_rows.size(), 70u);
}

}  // namespace
}  // namespace hablar::test
