// The decode-wiring test against the HOST twin of the CUDA decode step (same online-softmax
// code, same split / tile order). Builds and runs without nvcc or a GPU, so CI checks
// the algorithm; built a second time with HABLAR_ONLINE_SOFTMAX_BREAK_RESCALE, where it
// must fail (see CMakeLists.txt).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "backend/cuda/decode_attention_host.h"
#include "decode_split_case.h"
#include "decode_wiring_case.h"
#include "kv_q8_twins.h"

namespace hablar::test {
namespace {

class DecodeWiringHost : public ::testing::TestWithParam<KvDType> {};

void run_step(DecodeWiringCase& c, std::vector<uint8_t> active, std::vector<uint16_t>& cache,
              std::vector<int32_t>& lens, std::vector<float>& out) {
  cache = c.cache;
  lens = c.seq_lens;
  out = c.out;
  const auto p = c.params(cache.data(), c.block_tables.data(), lens.data(), active.data(),
                          c.q.data(), c.k_new.data(), c.v_new.data(), out.data());
  cuda::decode_attention_host(p);
}

TEST_P(DecodeWiringHost, ThreeLiveInEightSlots) {
  DecodeWiringCase c(GetParam());
  std::vector<uint16_t> cache;
  std::vector<int32_t> lens;
  std::vector<float> out;
  run_step(c, c.active, cache, lens, out);
  EXPECT_EQ(c.check(out, lens, cache, -1), "");
}

TEST_P(DecodeWiringHost, DoneSequenceIsNeitherAttendedNorAdvanced) {
  DecodeWiringCase c(GetParam());
  std::vector<uint8_t> active = c.active;
  const int done = c.live_slots[1];
  active[done] = 0;
  std::vector<uint16_t> cache;
  std::vector<int32_t> lens;
  std::vector<float> out;
  run_step(c, active, cache, lens, out);
  EXPECT_EQ(c.check(out, lens, cache, done), "");
}

TEST_P(DecodeWiringHost, SplitKLongContextMatchesOracle) {
  for (int dim : {64, 96, 128}) {
    DecodeSplitCase c(GetParam(), dim, 7u + (uint32_t)dim);
    std::vector<uint16_t> cache = c.cache;
    std::vector<int32_t> lens = c.lens;
    std::vector<float> out(c.q.size(), std::numeric_limits<float>::quiet_NaN());
    const auto p = c.params(cache.data(), c.tables.data(), lens.data(), c.active.data(), c.q.data(),
                            c.k_new.data(), c.v_new.data(), out.data());
    ASSERT_GT(cuda::decode_num_splits(p), 4) << "the case must span several splits";
    cuda::decode_attention_host(p);
    std::string fault;
    const double err = c.max_error(out, &fault);
    EXPECT_EQ(fault, "");
    EXPECT_LT(err, 2e-3) << "head_dim " << dim;
    for (int s = 0; s < c.slots; ++s) EXPECT_EQ(lens[s], c.lens[s] + (c.active[s] ? 1 : 0));
  }
}

// Splits of 32 positions over a 4,096-position capacity: 128 splits, so the reduce may merge
// in up to eight runs (decode_reduce_parts); the 1,500-position slot's 47 splits take three
// runs (16, 16, 15), the 700-position slot's 22 two; with a window of 300, one run each.
TEST_P(DecodeWiringHost, SplitReduceInRunsMatchesOracle) {
  for (int window : {0, 300}) {
    for (int dim : {64, 96, 128, 256}) {
      DecodeSplitCase c(GetParam(), dim, 13u + (uint32_t)dim, 256);
      c.fixed_split_len = 32;
      c.window = window;
      std::vector<uint16_t> cache = c.cache;
      std::vector<int32_t> lens = c.lens;
      std::vector<float> out(c.q.size(), std::numeric_limits<float>::quiet_NaN());
      const auto p = c.params(cache.data(), c.tables.data(), lens.data(), c.active.data(),
                              c.q.data(), c.k_new.data(), c.v_new.data(), out.data());
      ASSERT_EQ(cuda::decode_reduce_parts(p), dim == 256 ? 4 : 8);
      cuda::decode_attention_host(p);
      std::string fault;
      const double err = c.max_error(out, &fault);
      EXPECT_EQ(fault, "");
      EXPECT_LT(err, 2e-3) << "head_dim " << dim << " window " << window;
    }
  }
}

// The runs cover [first, n_valid) in order, contiguously, none past the end.
TEST(DecodeReduceRuns, RunsTileTheSplitsInOrder) {
  for (int parts : {1, 2, 4, 8})
    for (int first : {0, 3, 37})
      for (int n_valid : {0, 1, 5, 38, 47, 128}) {
        int next = first, covered = 0;
        for (int part = 0; part < parts; ++part) {
          const auto run = cuda::decode_reduce_run_range(first, n_valid, parts, part);
          if (run.begin >= run.end) continue;
          EXPECT_EQ(run.begin, next) << parts << " " << first << " " << n_valid;
          EXPECT_LE(run.end, n_valid);
          covered += run.end - run.begin;
          next = run.end;
        }
        EXPECT_EQ(covered, std::max(0, n_valid - first)) << parts << " " << first << " " << n_valid;
      }
}

// Few splits keep one run (the batched decode's usual case); many take up to eight, as the
// threads allow (head_dim 256: four runs of 256 threads).
TEST(DecodeReduceRuns, PartsFollowTheSplitCount) {
  cuda::DecodeAttentionParams p;
  p.layout.head_dim = 128;
  p.layout.block_size = 16;
  p.max_blocks_per_seq = 2048;  // 32,768 positions
  p.n_slots = 1;
  const std::vector<std::pair<int, int>> split_parts = {
      {4096, 1}, {1024, 2}, {512, 4}, {256, 8}, {32, 8}};
  for (auto [split, parts] : split_parts) {
    p.fixed_split_len = split;
    EXPECT_EQ(cuda::decode_reduce_parts(p), parts) << split;
  }
  p.layout.head_dim = 256;
  EXPECT_EQ(cuda::decode_reduce_parts(p), 4);
  // A slot's own split count picks its runs: a short context keeps one.
  for (auto [count, runs] : std::vector<std::pair<int, int>>{
           {0, 1}, {3, 1}, {16, 1}, {17, 2}, {47, 3}, {64, 4}, {256, 8}})
    EXPECT_EQ(cuda::decode_reduce_runs(8, count), runs) << count;
}

// Each slot sizes its splits from its own context, within the grid the call launches, for
// any slot count, KV heads, multiprocessors, capacity and context.
TEST(DecodeSplits, EverySlotFitsTheGrid) {
  cuda::DecodeAttentionParams p;
  p.layout.block_size = 16;
  for (int dim : {96, 128})  // the CUDA-core kernel's target, and the tensor-core kernel's
    for (int sms : {78, 132})
      for (int slots : {1, 3, 64, 256, 2048})
        for (int kv : {1, 2, 8})
          for (int capacity : {16, 1000, 4096, 32064, 131072}) {
            p.layout.head_dim = dim;
            p.layout.n_kv_heads = kv;
            p.multiprocessors = sms;
            p.n_slots = slots;
            p.max_blocks_per_seq = (capacity + 15) / 16;
            const cuda::DecodeSplits s = cuda::decode_splits(p);
            const auto where = [&](int context) {
              return "dim " + std::to_string(dim) + " sms " + std::to_string(sms) + " slots " +
                     std::to_string(slots) + " kv " + std::to_string(kv) + " capacity " +
                     std::to_string(capacity) + " context " + std::to_string(context);
            };
            int last_len = 0;
            for (int context = 1; context <= p.max_blocks_per_seq * 16;
                 context += context < 256 ? 1 : 37) {
              const int len = cuda::decode_slot_split_len(s, context);
              ASSERT_EQ(len % cuda::kDecodeMinSplit, 0) << where(context);
              ASSERT_GE(len, cuda::kDecodeMinSplit) << where(context);
              ASSERT_LE(len, cuda::kDecodeMaxSplit) << where(context);
              ASSERT_GE(len, last_len) << where(context);
              ASSERT_LE(cuda::decode_slot_splits(s, context), s.grid) << where(context);
              last_len = len;
            }
          }
}

// One wave of the tensor-core kernel (two blocks a multiprocessor) where the context allows:
// a long single context of few KV heads takes short splits, a short context of a graph
// captured for 32k positions takes splits of its own size, many slots take long ones.
TEST(DecodeSplits, OneWaveOfTheTensorCoreKernel) {
  cuda::DecodeAttentionParams p;
  p.layout.head_dim = 128;
  p.layout.block_size = 16;
  p.max_blocks_per_seq = 2004;  // 32,064 positions; max_context 0: a graph's capacity
  p.multiprocessors = 132;
  struct Case {
    int slots, kv, context, len;
  };
  for (const Case c : {Case{1, 2, 32001, 256}, Case{1, 8, 32001, 1024}, Case{1, 8, 4097, 128},
                       Case{1, 2, 4097, 64}, Case{1, 8, 40, 64}, Case{64, 2, 4097, 1024},
                       Case{256, 2, 600, 640}}) {
    p.n_slots = c.slots;
    p.layout.n_kv_heads = c.kv;
    const cuda::DecodeSplits s = cuda::decode_splits(p);
    const int len = cuda::decode_slot_split_len(s, c.context);
    EXPECT_EQ(len, c.len) << c.slots << " x " << c.context << ", " << c.kv << " KV heads";
    const int blocks = c.slots * c.kv * cuda::decode_slot_splits(s, c.context);
    if (len < cuda::kDecodeMaxSplit) {
      EXPECT_LE(blocks, std::max(2 * p.multiprocessors, c.slots * c.kv));
    }
  }
}

// A decode graph is sized for a bound of its step's contexts (1,024 x 4^k or the capacity):
// it holds every context of the step, and a step of short contexts launches the blocks of its
// own splits only, not those of a capacity-long context for every slot.
TEST(DecodeSplits, GraphContextBoundHoldsTheStep) {
  const int capacity = 32064;
  for (auto [context, bound] : std::vector<std::pair<int, int>>{{1, 1024},
                                                                {577, 1024},
                                                                {1024, 1024},
                                                                {1025, 4096},
                                                                {5000, 16384},
                                                                {16385, capacity},
                                                                {capacity, capacity}})
    EXPECT_EQ(cuda::decode_graph_context_bound(context, capacity), bound) << context;
  EXPECT_EQ(cuda::decode_graph_context_bound(700, 512), 512);  // never past the capacity
  cuda::DecodeAttentionParams p;
  p.layout.head_dim = 128;
  p.layout.block_size = 16;
  p.layout.n_kv_heads = 2;
  p.max_blocks_per_seq = capacity / 16;
  p.n_slots = 256;
  EXPECT_EQ(cuda::decode_num_splits(p), 32);  // sized for the capacity: 32 splits a slot
  p.max_context = cuda::decode_graph_context_bound(577, capacity);
  EXPECT_EQ(cuda::decode_num_splits(p), 1);  // 256 x 2 blocks, each attending
}

// A call sized for the block tables' capacity (a captured graph: max_context 0) gives every
// slot the splits, and the reduce the runs, of a call sized for the step: the same bits. On
// 132 multiprocessors the slots' split lengths differ; on a (hypothetical) 1,000 the two calls'
// grids and reduce groups differ (64 splits and 4 groups against 24 and 2).
TEST_P(DecodeWiringHost, CapacitySizedCallEqualsStepSizedCall) {
  for (int sms : {132, 1000})
    for (int dim : {64, 128}) {
      DecodeSplitCase c(GetParam(), dim, 17u + (uint32_t)dim, 256);  // capacity 4,096
      std::vector<float> outs[3];
      int parts[3];
      // The call's max_context: 0 sizes it for the capacity; 1,501 for the step (its longest
      // slot has 1,500 positions); 2,048 for a bound between, as a captured graph's.
      const int32_t max_contexts[3] = {0, 1501, 2048};
      for (int sizing = 0; sizing < 3; ++sizing) {
        std::vector<uint16_t> cache = c.cache;
        std::vector<int32_t> lens = c.lens;
        outs[sizing].assign(c.q.size(), std::numeric_limits<float>::quiet_NaN());
        auto p = c.params(cache.data(), c.tables.data(), lens.data(), c.active.data(), c.q.data(),
                          c.k_new.data(), c.v_new.data(), outs[sizing].data());
        p.multiprocessors = sms;
        p.max_context = max_contexts[sizing];
        const cuda::DecodeSplits s = cuda::decode_splits(p);
        if (sms == 132) {
          ASSERT_NE(cuda::decode_slot_split_len(s, 1501), cuda::decode_slot_split_len(s, 64));
        }
        parts[sizing] = cuda::decode_reduce_parts(p);
        cuda::decode_attention_host(p);
      }
      if (sms == 1000) {
        ASSERT_NE(parts[0], parts[1]);
      }
      for (int other : {1, 2})
        for (size_t i = 0; i < outs[0].size(); ++i)
          ASSERT_EQ(std::memcmp(&outs[0][i], &outs[other][i], sizeof(float)), 0)
              << "head_dim " << dim << " sms " << sms << " sizing " << other << " element " << i;
    }
}

// A sliding window of 300 (Gemma-style local layers): splits wholly before the window are
// skipped, the one it begins in starts mid-split; lengths 1500, 700, 63 and 1 cross it or not.
// With Gemma 2's soft-capped scores too (a cap of 2 bends most of these scores).
TEST_P(DecodeWiringHost, SlidingWindowMatchesOracle) {
  for (int dim : {64, 96, 128, 256}) {
    DecodeSplitCase c(GetParam(), dim, 11u + (uint32_t)dim);
    c.window = 300;
    c.softcap = dim == 128 ? 2.0f : 0.0f;
    std::vector<uint16_t> cache = c.cache;
    std::vector<int32_t> lens = c.lens;
    std::vector<float> out(c.q.size(), std::numeric_limits<float>::quiet_NaN());
    const auto p = c.params(cache.data(), c.tables.data(), lens.data(), c.active.data(), c.q.data(),
                            c.k_new.data(), c.v_new.data(), out.data());
    cuda::decode_attention_host(p);
    std::string fault;
    const double err = c.max_error(out, &fault);
    EXPECT_EQ(fault, "");
    EXPECT_LT(err, 2e-3) << "head_dim " << dim;
  }
}

// Q8_0 rows in the twin: the same step as over the F16 cache of the values it reads, the
// scatter writing the CPU backend's rows (kv_q8_twins.h; the GPU test runs the same scenario).
TEST(DecodeWiringHostQ8, Q8CacheEqualsF16CacheOfItsValues) {
  expect_q8_decode_equals_f16_of_its_values(
      [](const DecodeSplitCase& c, cuda::DecodeAttentionParams p, std::vector<uint16_t>& cache) {
        std::vector<float> out(p.out, p.out + c.q.size());
        p.kv_cache = cache.data();
        p.block_tables = c.tables.data();
        p.out = out.data();
        cuda::decode_attention_host(p);
        return out;
      });
}

INSTANTIATE_TEST_SUITE_P(KvTypes, DecodeWiringHost, ::testing::Values(KvDType::F16, KvDType::BF16),
                         [](const auto& info) {
                           return info.param == KvDType::F16 ? std::string("F16")
                                                             : std::string("BF16");
                         });

}  // namespace
}  // namespace hablar::test
