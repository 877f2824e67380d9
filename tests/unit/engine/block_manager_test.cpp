#include "engine/block_manager.h"

#include <gtest/gtest.h>

#include <numeric>

#include "core/error.h"

namespace hablar::engine {
namespace {

Sequence make_seq(int32_t n_tokens, int32_t first = 100) {
  Sequence s;
  s.tokens.resize((size_t)n_tokens);
  std::iota(s.tokens.begin(), s.tokens.end(), first);
  s.n_prompt = n_tokens;
  return s;
}

// Runs a whole prompt through allocation and "computation".
void compute_all(BlockManager& bm, Sequence& s) {
  std::vector<BlockCopy> copies;
  bm.match_prefix(s);
  ASSERT_TRUE(bm.allocate_slots(s, s.n_pending(), copies));
  s.n_computed = (int32_t)s.tokens.size();
  bm.register_full_blocks(s);
}

TEST(BlockManager, AllocatesAndFreesWithRefCounts) {
  BlockManager bm(8, 4);
  Sequence s = make_seq(10);
  std::vector<BlockCopy> copies;
  EXPECT_EQ(bm.blocks_needed(s, 10), 3);
  ASSERT_TRUE(bm.allocate_slots(s, 10, copies));
  EXPECT_EQ(s.block_table.size(), 3u);
  EXPECT_EQ(bm.n_free(), 5);
  for (int32_t b : s.block_table) EXPECT_EQ(bm.ref_count(b), 1);
  bm.free(s);
  EXPECT_EQ(bm.n_free(), 8);
  EXPECT_TRUE(s.block_table.empty());
  EXPECT_TRUE(copies.empty());
}

TEST(BlockManager, RefusesWhenFullAndChangesNothing) {
  BlockManager bm(2, 4);
  Sequence s = make_seq(12);
  std::vector<BlockCopy> copies;
  EXPECT_FALSE(bm.allocate_slots(s, 12, copies));
  EXPECT_TRUE(s.block_table.empty());
  EXPECT_EQ(bm.n_free(), 2);
}

TEST(BlockManager, SharesFullPrefixBlocks) {
  BlockManager bm(16, 4);
  Sequence a = make_seq(10);
  compute_all(bm, a);
  EXPECT_EQ(bm.n_cached(), 2);  // two full blocks of 4; the third is partial
  Sequence b = make_seq(9);     // same first 9 tokens
  EXPECT_EQ(bm.match_prefix(b), 8);
  EXPECT_EQ(b.block_table[0], a.block_table[0]);
  EXPECT_EQ(b.block_table[1], a.block_table[1]);
  EXPECT_EQ(bm.ref_count(a.block_table[0]), 2);
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(bm.allocate_slots(b, 1, copies));
  EXPECT_TRUE(copies.empty());
  EXPECT_NE(b.block_table[2], a.block_table[2]);
}

TEST(BlockManager, ChainedHashNeedsTheWholePrefix) {
  BlockManager bm(16, 4);
  Sequence a = make_seq(8);
  compute_all(bm, a);
  Sequence b = make_seq(8);
  b.tokens[0] = 7;  // same second block, different first block
  EXPECT_EQ(bm.match_prefix(b), 0);
  EXPECT_TRUE(b.block_table.empty());
}

TEST(BlockManager, FullyCachedPromptRecomputesLastTokenWithCopyOnWrite) {
  BlockManager bm(16, 4);
  Sequence a = make_seq(8);
  compute_all(bm, a);
  Sequence b = make_seq(8);
  EXPECT_EQ(bm.match_prefix(b), 7);  // one token left to compute
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(bm.allocate_slots(b, 1, copies));
  ASSERT_EQ(copies.size(), 1u);  // its last block is shared with a: copied before writing
  EXPECT_EQ(copies[0].src, a.block_table[1]);
  EXPECT_EQ(copies[0].dst, b.block_table[1]);
  EXPECT_EQ(bm.ref_count(a.block_table[1]), 1);
  EXPECT_EQ(b.block_table[0], a.block_table[0]);
}

TEST(BlockManager, FreedBlocksStayCachedUntilReused) {
  BlockManager bm(4, 4);
  Sequence a = make_seq(8);
  compute_all(bm, a);
  const auto table = a.block_table;
  bm.free(a);
  EXPECT_EQ(bm.n_free(), 4);
  EXPECT_EQ(bm.n_cached(), 2);
  Sequence b = make_seq(9);
  EXPECT_EQ(bm.match_prefix(b), 8);  // revived from the free list
  EXPECT_EQ(b.block_table, table);
  EXPECT_EQ(bm.n_free(), 2);
  bm.free(b);
  // Filling the cache with other tokens evicts them (least recently freed first).
  Sequence c = make_seq(16, 5000);
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(bm.allocate_slots(c, 16, copies));
  EXPECT_EQ(bm.n_cached(), 0);
  bm.free(c);
  Sequence d = make_seq(8);
  EXPECT_EQ(bm.match_prefix(d), 0);
}

TEST(BlockManager, ForkSharesAndCopiesOnFirstWrite) {
  BlockManager bm(8, 4);
  Sequence parent = make_seq(6);
  compute_all(bm, parent);
  Sequence child;
  child.tokens = parent.tokens;
  child.n_prompt = parent.n_prompt;
  bm.fork(parent, child);
  EXPECT_EQ(bm.ref_count(parent.block_table[1]), 2);
  child.tokens.push_back(1);
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(bm.allocate_slots(child, 1, copies));  // writes position 6, in shared block 1
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].src, parent.block_table[1]);
  EXPECT_EQ(bm.ref_count(parent.block_table[1]), 1);
  EXPECT_EQ(bm.ref_count(parent.block_table[0]), 2);  // still shared: nobody writes there
  bm.free(parent);
  bm.free(child);
  EXPECT_EQ(bm.n_free(), 8);
}

// Sliding windows: blocks wholly before the window go back to the free list, their entries
// become kReleased (the rest of the table keeps its positions), their prefix hashes are
// forgotten, and free / fork / register skip them.
TEST(BlockManager, ReleaseBeforeGivesBackBlocksBehindTheWindow) {
  BlockManager bm(8, 4);
  Sequence a = make_seq(14);
  compute_all(bm, a);  // blocks 0..3, three of them full and hashed
  EXPECT_EQ(bm.n_cached(), 3);
  const auto table = a.block_table;
  // The next token (position 14) with a window of 6 sees [9, 14]: blocks 0 and 1 go.
  EXPECT_EQ(bm.release_before(a, 14 - 6 + 1), 2);
  EXPECT_EQ(a.block_table[0], BlockManager::kReleased);
  EXPECT_EQ(a.block_table[1], BlockManager::kReleased);
  EXPECT_EQ(a.block_table[2], table[2]);
  EXPECT_EQ(a.block_table[3], table[3]);
  EXPECT_EQ(bm.n_free(), 6);
  EXPECT_EQ(bm.n_cached(), 1);               // block 2 keeps its hash
  EXPECT_EQ(bm.release_before(a, 9), 0);     // idempotent
  EXPECT_EQ(bm.release_before(a, 1000), 1);  // never the block being written (position 14)
  EXPECT_EQ(a.block_table[3], table[3]);
  // A new sequence with the same prompt is offered no released block.
  Sequence b = make_seq(14);
  EXPECT_EQ(bm.match_prefix(b), 0);
  bm.free(b);
  // Growing on: the released entries stay, new blocks append, hashing chains through.
  for (int i = 0; i < 6; ++i) a.tokens.push_back(7 + i);
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(bm.allocate_slots(a, 6, copies));
  a.n_computed = 20;
  bm.register_full_blocks(a);
  EXPECT_EQ(a.block_hashes.size(), 5u);
  Sequence child;
  child.tokens = a.tokens;
  bm.fork(a, child);
  EXPECT_EQ(child.n_released_blocks, 3);
  EXPECT_EQ(bm.ref_count(a.block_table[4]), 2);
  bm.free(child);
  bm.free(a);
  EXPECT_EQ(bm.n_free(), 8);
  EXPECT_EQ(a.n_released_blocks, 0);
}

// A block another sequence still holds keeps its prefix-cache entry when one releases it.
TEST(BlockManager, ReleaseBeforeKeepsSharedBlocksForTheirOtherHolders) {
  BlockManager bm(8, 4);
  Sequence a = make_seq(9), b = make_seq(9);
  compute_all(bm, a);
  compute_all(bm, b);  // shares a's two full blocks
  EXPECT_EQ(bm.ref_count(a.block_table[0]), 2);
  EXPECT_EQ(bm.release_before(a, 8), 2);
  EXPECT_EQ(bm.ref_count(b.block_table[0]), 1);
  Sequence c = make_seq(9);
  EXPECT_EQ(bm.match_prefix(c), 8);  // b's blocks, still valid and cached
  bm.free(c);
  bm.free(b);
  bm.free(a);
  EXPECT_EQ(bm.n_free(), 8);
}

TEST(BlockManager, RejectsEmptyCache) {
  EXPECT_THROW(BlockManager(0, 16), Error);
}

}  // namespace
}  // namespace hablar::engine
