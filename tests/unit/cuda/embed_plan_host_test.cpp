// The host twin of the CUDA embedding step's bookkeeping (backend/cuda/embed_plan.h): how
// sequences pack into rows, attention's query tiles, and the pooling layout. The pooling
// kernel's indexing (pool_kernel in embed_kernels.cu) is replayed on the host over the same
// plans and compared with cpu::EmbedOps::pool, the layout the executors promise
// (EmbedOutput). Builds with g++ alone and runs everywhere.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "backend/cpu/embed_ops.h"
#include "backend/cuda/embed_plan.h"
#include "core/thread_pool.h"

namespace hablar::cuda {
namespace {

std::vector<std::vector<int32_t>> sequences_of(std::span<const int> lengths) {
  std::vector<std::vector<int32_t>> out;
  int32_t next = 0;
  for (int len : lengths) {
    std::vector<int32_t> s((size_t)len);
    for (int32_t& t : s) t = next++;
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<std::span<const int32_t>> spans_of(const std::vector<std::vector<int32_t>>& seqs) {
  return {seqs.begin(), seqs.end()};
}

// pool_kernel, thread by thread: (sequence s, column col).
void pool_on_host(const EmbedPlan& plan, const PoolPlan& pp, const std::vector<float>& hidden,
                  int64_t width, std::vector<float>& out, std::vector<float>& rank_rows) {
  out.assign((size_t)pp.total(), 0.0f);
  rank_rows.assign((size_t)(pp.n_rank * width), 0.0f);
  for (int64_t s = 0; s < plan.n_seqs(); ++s)
    for (int64_t col = 0; col < width; ++col) {
      const int32_t begin = plan.seq_begin[(size_t)s], end = plan.seq_begin[(size_t)s + 1];
      const int8_t p = pp.pooling[(size_t)s];
      float* dst = out.data() + pp.out_begin[(size_t)s];
      if (p == (int8_t)Pooling::kNone) {
        for (int32_t t = begin; t < end; ++t)
          dst[(t - begin) * width + col] = hidden[(size_t)(t * width + col)];
      } else if (p == (int8_t)Pooling::kMean) {
        const float inv = 1.0f / (float)(end - begin);
        float sum = 0.0f;
        for (int32_t t = begin; t < end; ++t) sum += hidden[(size_t)(t * width + col)] * inv;
        dst[col] = sum;
      } else {
        const float v = hidden[(size_t)(pooled_row(p, begin, end) * width + col)];
        if (p == (int8_t)Pooling::kRank) {
          rank_rows[(size_t)(pp.rank_slot[(size_t)s] * width + col)] = v;
        } else {
          dst[col] = v;
        }
      }
    }
}

TEST(EmbedPlanHost, RowsPositionsAndTilesCoverEverySequence) {
  const int lengths[] = {1, 64, 65, 200, 3, 128};
  const auto seqs = sequences_of(lengths);
  const EmbedPlan p = plan_embed_step(spans_of(seqs));
  ASSERT_EQ(p.n_seqs(), 6);
  EXPECT_EQ(p.max_len, 200);
  std::vector<int> covered((size_t)p.n_tokens(), 0);
  for (const EmbedTile& t : p.tiles) {
    EXPECT_EQ(t.q0 % kEmbedQueryTile, 0);
    EXPECT_LT(t.q0, t.len);
    for (int32_t q = t.q0; q < std::min(t.q0 + kEmbedQueryTile, t.len); ++q)
      covered[(size_t)(t.base + q)] += 1;
  }
  for (int c : covered) EXPECT_EQ(c, 1);  // every row in exactly one tile
  EXPECT_EQ(p.tiles.size(), 1u + 1u + 2u + 4u + 1u + 2u);
  for (int64_t s = 0; s < p.n_seqs(); ++s)
    for (int32_t r = p.seq_begin[(size_t)s]; r < p.seq_begin[(size_t)s + 1]; ++r) {
      EXPECT_EQ(p.positions[(size_t)r], r - p.seq_begin[(size_t)s]);
      EXPECT_EQ(p.tokens[(size_t)r], seqs[(size_t)s][(size_t)(r - p.seq_begin[(size_t)s])]);
    }
}

TEST(EmbedPlanHost, EmptySequenceIsRefused) {
  const std::vector<std::vector<int32_t>> seqs = {{1, 2}, {}};
  EXPECT_THROW(plan_embed_step(spans_of(seqs)), Error);
}

// Mixed poolings in one step: the replayed kernel's floats and offsets are the CPU's.
TEST(EmbedPlanHost, PoolingLayoutMatchesCpuEmbedOps) {
  const int lengths[] = {3, 1, 70, 5, 9, 2};
  const Pooling poolings[] = {Pooling::kNone, Pooling::kMean, Pooling::kCls,
                              Pooling::kLast, Pooling::kMean, Pooling::kNone};
  const auto seqs = sequences_of(lengths);
  const auto spans = spans_of(seqs);
  const ActivationDims dims{32, 2, 2, 16, 64, 1000};
  ThreadPool threads(2);
  cpu::EmbedOps cpu_ops(threads);
  cpu_ops.begin(spans, dims, {}, 1e-5f, 1e-12f, false);
  std::vector<float> hidden((size_t)(cpu_ops.n_tokens() * dims.n_embd));
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (float& h : hidden) h = u(rng);
  cpu_ops.set_hidden(hidden.data());
  std::vector<float> want;
  std::vector<int64_t> want_begin;
  cpu_ops.pool(poolings, cpu::ClassifierHead{}, want, want_begin);

  const EmbedPlan plan = plan_embed_step(spans);
  const PoolPlan pp = plan_pooling(plan.seq_begin, poolings, dims.n_embd, 1);
  EXPECT_EQ(pp.out_begin, want_begin);
  EXPECT_EQ(pp.n_rank, 0);
  std::vector<float> got, rank_rows;
  pool_on_host(plan, pp, hidden, dims.n_embd, got, rank_rows);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6f) << i;
}

// Rank sequences: their first rows go to the classifier's input in order, their outputs
// take rank_width floats each.
TEST(EmbedPlanHost, RankRowsAndWidths) {
  const int lengths[] = {4, 2, 6};
  const Pooling poolings[] = {Pooling::kRank, Pooling::kMean, Pooling::kRank};
  const auto seqs = sequences_of(lengths);
  const EmbedPlan plan = plan_embed_step(spans_of(seqs));
  const PoolPlan pp = plan_pooling(plan.seq_begin, poolings, 8, 3);
  EXPECT_EQ(pp.out_begin, (std::vector<int64_t>{0, 3, 11, 14}));
  EXPECT_EQ(pp.rank_slot, (std::vector<int32_t>{0, -1, 1}));
  std::vector<float> hidden((size_t)(plan.n_tokens() * 8));
  for (size_t i = 0; i < hidden.size(); ++i) hidden[i] = (float)i;
  std::vector<float> out, rank_rows;
  pool_on_host(plan, pp, hidden, 8, out, rank_rows);
  for (int c = 0; c < 8; ++c) {
    EXPECT_EQ(rank_rows[(size_t)c], hidden[(size_t)c]);                  // sequence 0, row 0
    EXPECT_EQ(rank_rows[(size_t)(8 + c)], hidden[(size_t)(6 * 8 + c)]);  // sequence 2, row 6
  }
}

}  // namespace
}  // namespace hablar::cuda
