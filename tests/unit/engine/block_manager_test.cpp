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

// Token-granular reuse: past the whole blocks, a prompt takes the offered block that
// continues them with the longest run of its tokens.
TEST(BlockManager, TakesThePartOfABlockThatContinuesTheMatch) {
  BlockManager bm(16, 4);
  Sequence a = make_seq(10);
  compute_all(bm, a);  // blocks 0, 1 full; block 2 holds positions 8, 9
  const auto table = a.block_table;
  bm.free(a);
  Sequence b = make_seq(14);  // a's ten tokens, then four more
  EXPECT_EQ(bm.match_prefix(b), 10);
  ASSERT_EQ(b.block_table.size(), 3u);
  EXPECT_EQ(b.block_table[2], table[2]);
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(bm.allocate_slots(b, 4, copies));  // b alone holds block 2: written in place
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(b.block_table[2], table[2]);
}

// The run stops at the first different token; the block's K/V past it is then overwritten,
// so its offer is cut there and it leaves the full-block map.
TEST(BlockManager, PartialRunStopsAtTheFirstDifferentToken) {
  BlockManager bm(16, 4);
  Sequence a = make_seq(12);
  compute_all(bm, a);
  bm.free(a);
  EXPECT_EQ(bm.n_cached(), 3);
  Sequence b = make_seq(12);
  b.tokens[9] = 7;
  EXPECT_EQ(bm.match_prefix(b), 9);
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(bm.allocate_slots(b, 3, copies));
  EXPECT_EQ(bm.n_cached(), 2);  // block 2 now holds 108, 7, ...: no longer a's third block
  b.n_computed = 12;
  bm.free(b);
  Sequence c = make_seq(12);  // a's tokens again: only position 8 of block 2 is still a's
  EXPECT_EQ(bm.match_prefix(c), 9);
}

// The same prompt as a finished request's: every position but the last comes from the cache,
// the one after the last whole block from the block that held the request's later tokens.
TEST(BlockManager, SamePromptReusesAllButTheLastToken) {
  BlockManager bm(16, 4);
  Sequence a = make_seq(13);
  a.n_prompt = 10;  // ten prompt tokens, three generated; the last one not computed yet
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(bm.allocate_slots(a, 12, copies));
  a.n_computed = 12;
  bm.register_full_blocks(a);
  bm.free(a);
  Sequence b = make_seq(10);
  EXPECT_EQ(bm.match_prefix(b), 9);
}

// A partial block another sequence still holds and writes is shared until one writes: the
// writer gets a copy; the holder's offer stands.
TEST(BlockManager, SharedPartialBlockIsCopiedBeforeWriting) {
  BlockManager bm(16, 4);
  Sequence a = make_seq(10);
  compute_all(bm, a);  // a live, holding block 2 (positions 8, 9) alone: offered
  Sequence b = make_seq(12);
  EXPECT_EQ(bm.match_prefix(b), 10);
  EXPECT_EQ(b.block_table[2], a.block_table[2]);
  EXPECT_EQ(bm.ref_count(a.block_table[2]), 2);
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(bm.allocate_slots(b, 2, copies));
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].src, a.block_table[2]);
  EXPECT_EQ(copies[0].dst, b.block_table[2]);
  bm.free(b);
  Sequence c = make_seq(11);
  EXPECT_EQ(bm.match_prefix(c), 10);
  EXPECT_EQ(c.block_table[2], a.block_table[2]);
}

// A sequence's own partial block is offered as it grows; writes past the tokens a sequence
// knows (drafted ones) cut the offer of a block it took from the cache where they begin;
// evicting a block forgets its offer.
TEST(BlockManager, OffersFollowWhatTheBlockHolds) {
  BlockManager bm(16, 4);
  auto tokens_then = [](std::vector<int32_t> more) {
    Sequence s = make_seq(9);  // 100..108: position 8 opens block 2
    s.tokens.insert(s.tokens.end(), more.begin(), more.end());
    s.n_prompt = (int32_t)s.tokens.size();
    return s;
  };
  Sequence a = make_seq(9);
  compute_all(bm, a);  // block 2 offers 108
  a.tokens.push_back(500);
  a.tokens.push_back(501);
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(bm.allocate_slots(a, 2, copies));
  a.n_computed = 11;
  bm.register_full_blocks(a);  // block 2 offers 108, 500, 501
  bm.free(a);
  Sequence b = tokens_then({500, 501, 1});
  EXPECT_EQ(bm.match_prefix(b), 11);
  bm.free(b);
  Sequence d = tokens_then({500});
  EXPECT_EQ(bm.match_prefix(d), 9);              // one token left to compute
  ASSERT_TRUE(bm.allocate_slots(d, 3, copies));  // 500 at 9, then two drafted positions
  EXPECT_TRUE(copies.empty());
  bm.free(d);
  Sequence e = tokens_then({500, 501, 1});
  EXPECT_EQ(bm.match_prefix(e), 10);  // position 10 was overwritten by a draft
  bm.free(e);
  Sequence filler = make_seq(64, 7000);
  ASSERT_TRUE(bm.allocate_slots(filler, 64, copies));
  bm.free(filler);
  Sequence f = tokens_then({500, 501, 1});
  EXPECT_EQ(bm.match_prefix(f), 0);
}

TEST(BlockManager, RejectsEmptyCache) {
  EXPECT_THROW(BlockManager(0, 16), Error);
}

}  // namespace
}  // namespace hablar::engine
