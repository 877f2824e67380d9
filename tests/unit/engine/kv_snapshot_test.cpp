// K/V snapshots without a model (engine/kv_snapshot.h, block_manager.h): the block manager's
// cached-prefix lookup, adoption (restore) and forgetting (erase); the copy order every
// executor uses between its cache and host bytes (the host twin of the CUDA executor's
// copies); slot files written and read back, and every malformed or foreign file refused
// with Error(kFormat / kInvalidArgument); run_between_steps at shutdown.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <sstream>

#include "core/error.h"
#include "engine/block_manager.h"
#include "engine/engine.h"
#include "engine/kv_snapshot.h"
#include "fake_executor.h"

namespace hablar::engine {
namespace {

std::vector<int32_t> iota_tokens(int32_t n, int32_t first = 100) {
  std::vector<int32_t> t((size_t)n);
  std::iota(t.begin(), t.end(), first);
  return t;
}

// A sequence over `tokens`, run through allocation and "computation", then freed: its blocks
// stay cached (full ones hashed, the partial tail offered).
void compute_and_free(BlockManager& bm, const std::vector<int32_t>& tokens) {
  Sequence s;
  s.tokens = tokens;
  s.n_prompt = (int32_t)tokens.size();
  std::vector<BlockCopy> copies;
  bm.match_prefix(s);
  ASSERT_TRUE(bm.allocate_slots(s, s.n_pending(), copies));
  s.n_computed = (int32_t)tokens.size();
  bm.register_full_blocks(s);
  bm.free(s);
}

// The tokens a new sequence over `tokens` takes from the cache.
int32_t reused(BlockManager& bm, const std::vector<int32_t>& tokens) {
  Sequence s;
  s.tokens = tokens;
  s.n_prompt = (int32_t)tokens.size();
  const int32_t n = bm.match_prefix(s);
  bm.free(s);
  return n;
}

TEST(KvSnapshotBlocks, CachedPrefixTakesFullBlocksThenThePartialTail) {
  BlockManager bm(16, 4);
  const auto t = iota_tokens(10);
  compute_and_free(bm, t);
  const auto p = bm.cached_prefix(t);
  EXPECT_EQ(p.n_tokens, 10);
  EXPECT_EQ(p.blocks.size(), 3u);
  EXPECT_EQ(p.hashes.size(), 2u);
  // A longer list finds the same 10; one that differs at 6 finds 6 (block 0 and 2 of 1).
  auto longer = t;
  longer.push_back(5);
  EXPECT_EQ(bm.cached_prefix(longer).n_tokens, 10);
  auto other = t;
  other[6] = 7;
  EXPECT_EQ(bm.cached_prefix(other).n_tokens, 6);
  EXPECT_EQ(bm.cached_prefix(iota_tokens(5, 900)).n_tokens, 0);
}

TEST(KvSnapshotBlocks, AdoptionRegistersAsComputedAndReusesCachedBlocks) {
  BlockManager bm(16, 4);
  const auto t = iota_tokens(10);
  BlockManager::Adoption a;
  int32_t needed = -1;
  ASSERT_TRUE(bm.begin_adoption(t, a, needed));
  EXPECT_EQ(needed, 3);
  EXPECT_EQ(a.blocks.size(), 3u);
  EXPECT_EQ(bm.n_free(), 13);
  bm.end_adoption(a, /*written=*/true);
  EXPECT_EQ(bm.n_free(), 16);
  EXPECT_EQ(bm.n_cached(), 2);
  // A prompt that continues the tokens takes all 10 from the cache.
  auto prompt = t;
  prompt.push_back(1);
  EXPECT_EQ(reused(bm, prompt), 10);
  // Adopting them again writes nothing: every block is cached already.
  ASSERT_TRUE(bm.begin_adoption(t, a, needed));
  EXPECT_EQ(needed, 0);
  EXPECT_TRUE(std::none_of(a.fresh.begin(), a.fresh.end(), [](bool f) { return f; }));
  bm.end_adoption(a, true);
  EXPECT_EQ(bm.n_cached(), 2);
  EXPECT_EQ(bm.n_free(), 16);
}

TEST(KvSnapshotBlocks, AdoptionThatDoesNotFitChangesNothing) {
  BlockManager bm(2, 4);
  BlockManager::Adoption a;
  int32_t needed = 0;
  EXPECT_FALSE(bm.begin_adoption(iota_tokens(10), a, needed));
  EXPECT_EQ(needed, 3);
  EXPECT_EQ(bm.n_free(), 2);
  EXPECT_EQ(bm.n_cached(), 0);
  // Cached blocks the adoption reuses count against the free ones they leave.
  BlockManager small(3, 4);
  compute_and_free(small, iota_tokens(8));  // blocks 0 and 1 of the prefix, cached and free
  EXPECT_FALSE(small.begin_adoption(iota_tokens(20), a, needed));
  EXPECT_EQ(needed, 3);
  EXPECT_EQ(small.n_cached(), 2);
  EXPECT_EQ(small.n_free(), 3);
}

TEST(KvSnapshotBlocks, FailedWritesRegisterNothing) {
  BlockManager bm(8, 4);
  BlockManager::Adoption a;
  int32_t needed = 0;
  ASSERT_TRUE(bm.begin_adoption(iota_tokens(10), a, needed));
  bm.end_adoption(a, /*written=*/false);
  EXPECT_EQ(bm.n_free(), 8);
  EXPECT_EQ(bm.n_cached(), 0);
  EXPECT_EQ(reused(bm, iota_tokens(11)), 0);
}

TEST(KvSnapshotBlocks, ForgetTakesEveryEntryOfThePrefixOut) {
  BlockManager bm(32, 4);
  const auto t = iota_tokens(10);
  // While a sequence holds t's blocks, another prompt that shares its first 6 tokens copies
  // t's block 1 and offers its copy at the same place (holding 2 of t's tokens there).
  Sequence held;
  held.tokens = t;
  held.n_prompt = 10;
  std::vector<BlockCopy> copies;
  bm.match_prefix(held);
  ASSERT_TRUE(bm.allocate_slots(held, held.n_pending(), copies));
  held.n_computed = 10;
  bm.register_full_blocks(held);
  auto other = t;
  other[6] = 3;
  other.push_back(4);
  compute_and_free(bm, other);
  bm.free(held);
  auto prompt = t;
  prompt.push_back(1);
  ASSERT_EQ(reused(bm, prompt), 10);
  EXPECT_EQ(bm.forget_prefix(t), 10);
  EXPECT_EQ(reused(bm, prompt), 0);  // not even the tokens the other prompt's copy holds
  EXPECT_EQ(bm.cached_prefix(t).n_tokens, 0);
  EXPECT_EQ(bm.forget_prefix(t), 0);
  EXPECT_EQ(bm.n_free(), 32);
}

TEST(KvSnapshotBlocks, ForgetLeavesRunningSequencesTheirBlocks) {
  BlockManager bm(16, 4);
  Sequence s;
  s.tokens = iota_tokens(8);
  s.n_prompt = 8;
  std::vector<BlockCopy> copies;
  bm.match_prefix(s);
  ASSERT_TRUE(bm.allocate_slots(s, s.n_pending(), copies));
  s.n_computed = 8;
  bm.register_full_blocks(s);
  const auto table = s.block_table;
  EXPECT_EQ(bm.forget_prefix(s.tokens), 8);
  EXPECT_EQ(s.block_table, table);
  for (int32_t b : table) EXPECT_EQ(bm.ref_count(b), 1);
  EXPECT_EQ(bm.n_cached(), 0);
  bm.free(s);
  EXPECT_EQ(bm.n_free(), 16);
}

KvCacheLayout test_layout(int32_t n_blocks) {
  KvCacheLayout l;
  l.n_layers = 3;
  l.n_kv_heads = 2;
  l.head_dim = 8;
  l.block_size = 4;
  l.n_blocks = n_blocks;
  return l;
}

// The host twin of the executors' block copies: for_each_kv_copy reads each block's K and V
// of every layer, as KvCacheLayout::offset places them, in snapshot order.
TEST(KvSnapshotCopies, CopyOrderMatchesTheLayout) {
  const KvCacheLayout l = test_layout(5);
  std::vector<uint16_t> cache(l.total_elems());
  std::iota(cache.begin(), cache.end(), 0);
  const std::vector<int32_t> blocks = {3, 0};
  std::vector<uint8_t> host(blocks.size() * l.block_bytes());
  for_each_kv_copy(l, blocks, host.size(), [&](size_t units, size_t at, size_t bytes) {
    std::memcpy(host.data() + at, cache.data() + units, bytes);
  });
  const auto* got = reinterpret_cast<const uint16_t*>(host.data());
  size_t i = 0;
  for (int32_t b : blocks)
    for (int layer = 0; layer < l.n_layers; ++layer)
      for (int kv = 0; kv < 2; ++kv)
        for (int h = 0; h < l.n_kv_heads; ++h)
          for (int slot = 0; slot < l.block_size; ++slot)
            for (int d = 0; d < l.head_dim; ++d, ++i)
              ASSERT_EQ(got[i], cache[l.offset(layer, kv, b, h, slot, d)]) << i;
  EXPECT_EQ(i * 2, host.size());
  EXPECT_THROW(for_each_kv_copy(l, blocks, host.size() - 2, [](size_t, size_t, size_t) {}), Error);
  const std::vector<int32_t> outside = {5};
  EXPECT_THROW(for_each_kv_copy(l, outside, l.block_bytes(), [](size_t, size_t, size_t) {}), Error);
}

KvSnapshot test_snapshot(const KvCacheLayout& l, int32_t n_tokens) {
  KvSnapshot s;
  s.tokens = iota_tokens(n_tokens, 1);
  s.kv.resize((size_t)((n_tokens + l.block_size - 1) / l.block_size) * l.block_bytes());
  for (size_t i = 0; i < s.kv.size(); ++i) s.kv[i] = (uint8_t)(i * 7 + 3);
  return s;
}

KvIdentity test_identity() {
  return {"llama", 0x1234, test_layout(8)};
}

std::string file_of(const KvSnapshot& s, const KvIdentity& id) {
  std::ostringstream out;
  const uint64_t n = write_slot_file(out, s, id);
  EXPECT_EQ(n, out.str().size());
  return out.str();
}

KvSnapshot read_back(const std::string& bytes, const KvIdentity& here, int32_t n_vocab = 1000) {
  std::istringstream in(bytes);
  return read_slot_file(in, bytes.size(), here, n_vocab);
}

ErrorKind failure_of(const std::string& bytes, const KvIdentity& here, int32_t n_vocab = 1000) {
  try {
    read_back(bytes, here, n_vocab);
  } catch (const Error& e) {
    return e.kind();
  }
  ADD_FAILURE() << "a bad slot file was read";
  return ErrorKind::kInternal;
}

TEST(SlotFile, WritesAndReadsBackPackedAndPlainTokens) {
  const KvIdentity id = test_identity();
  const KvSnapshot s = test_snapshot(id.layout, 10);
  std::string bytes = file_of(s, id);
  KvSnapshot back = read_back(bytes, id);
  EXPECT_EQ(back.tokens, s.tokens);
  EXPECT_EQ(back.kv, s.kv);
  // The outer header as llama-server lays it out: payload words = 3 + n (packed).
  uint32_t words = 0;
  std::memcpy(&words, bytes.data() + 8, 4);
  EXPECT_EQ(words, 13u);
  // The plain form (a list of ids, as older llama-servers wrote it) reads the same.
  std::string plain = bytes.substr(0, 12) + bytes.substr(24, 40) + bytes.substr(64);
  words = 10;
  std::memcpy(plain.data() + 8, &words, 4);
  back = read_back(plain, id);
  EXPECT_EQ(back.tokens, s.tokens);
  EXPECT_EQ(back.kv, s.kv);
}

TEST(SlotFile, RefusesMalformedFiles) {
  const KvIdentity id = test_identity();
  const std::string bytes = file_of(test_snapshot(id.layout, 10), id);
  for (size_t n : {0ul, 5ul, 12ul, 30ul, 64ul, 70ul, 100ul, bytes.size() - 1})
    EXPECT_EQ(failure_of(bytes.substr(0, n), id), ErrorKind::kFormat) << "truncated to " << n;
  EXPECT_EQ(failure_of(bytes + "x", id), ErrorKind::kFormat);
  std::string bad = bytes;
  bad[0] = 'X';  // magic
  EXPECT_EQ(failure_of(bad, id), ErrorKind::kFormat);
  bad = bytes;
  bad[bytes.size() - 5] ^= 0x40;  // a K/V byte: the checksum
  EXPECT_EQ(failure_of(bad, id), ErrorKind::kFormat);
  bad = bytes;
  const uint32_t huge = 0x7fffffff;
  std::memcpy(bad.data() + 8, &huge, 4);  // a token list longer than the cache
  EXPECT_EQ(failure_of(bad, id), ErrorKind::kFormat);
  bad = bytes;
  bad[20] = 9;  // the packed count disagrees
  EXPECT_EQ(failure_of(bad, id), ErrorKind::kFormat);
  // Tokens only, no K/V section.
  std::string tokens_only = bytes.substr(0, 12 + 13 * 4);
  EXPECT_EQ(failure_of(tokens_only, id), ErrorKind::kFormat);
}

TEST(SlotFile, RefusesFilesOfAnotherModelOrCache) {
  const KvIdentity id = test_identity();
  const std::string bytes = file_of(test_snapshot(id.layout, 10), id);
  KvIdentity other = id;
  other.model_fingerprint = 0x9999;
  EXPECT_EQ(failure_of(bytes, other), ErrorKind::kInvalidArgument);
  other = id;
  other.arch = "qwen2";
  EXPECT_EQ(failure_of(bytes, other), ErrorKind::kInvalidArgument);
  other = id;
  other.layout.dtype = KvDType::Q8_0;
  EXPECT_EQ(failure_of(bytes, other), ErrorKind::kInvalidArgument);
  other = id;
  other.layout.block_size = 8;
  EXPECT_EQ(failure_of(bytes, other), ErrorKind::kInvalidArgument);
  other = id;
  other.layout.n_blocks = 2;  // the file holds 3 blocks: more than this whole cache
  EXPECT_EQ(failure_of(bytes, other), ErrorKind::kInvalidArgument);
  EXPECT_EQ(failure_of(bytes, id, /*n_vocab=*/5), ErrorKind::kInvalidArgument);
  try {
    read_back(bytes, other);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KV cache holds 8 positions"), std::string::npos)
        << e.what();
  }
}

TEST(RunBetweenSteps, RunsOnTheStepThreadAndRefusesAfterShutdown) {
  test::FakeExecutor fake(97, 16, 4);
  EngineConfig c;
  c.n_ctx = 64;
  Engine engine(c, fake);
  int32_t blocks = 0;
  engine.run_between_steps([&](BlockManager& b, StepExecutor&) { blocks = b.n_blocks(); });
  EXPECT_EQ(blocks, 16);
  EXPECT_THROW(engine.run_between_steps([](BlockManager&, StepExecutor&) {
    throw_error(ErrorKind::kFormat, "from the task");
  }),
               Error);
  // The fake executor cannot copy its cache: a save says so.
  try {
    save_prefix(engine, iota_tokens(5));
    ADD_FAILURE() << "saved through an executor that cannot";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
  }
  engine.shutdown(std::chrono::milliseconds(0));
  try {
    engine.run_between_steps([](BlockManager&, StepExecutor&) {});
    ADD_FAILURE() << "a task ran after shutdown";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kResource);
  }
}

}  // namespace
}  // namespace hablar::engine
