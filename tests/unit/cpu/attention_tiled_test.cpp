// The tiled attention (attention_batch) against the scalar one-head form
// (attention_batch_scalar): the same bits for F16, BF16, Q8_0 and Q4_0 caches, GQA groups,
// sliding windows, soft-caps, partial blocks, many query tiles, long sequences whose keys are
// split over threads, and any thread count. Plus the quantized cache's round trips and the
// quantized attention's distance from the F16 one.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cpu/ops_x86.h"
#include "core/cpu_features.h"
#include "core/fp16.h"
#include "core/kv_layout.h"
#include "core/quant.h"
#include "core/quant_blocks.h"
#include "core/thread_pool.h"

namespace hablar::cpu {
namespace {

struct Shape {
  int n_heads, n_kv_heads, head_dim;
  KvDType k_type, v_type;
};

// A cache of n positions over a shuffled block table, K/V stored through kv_store.
struct Fixture {
  KvCacheLayout layout;
  std::vector<uint16_t> cache;
  std::vector<int32_t> table;
  Fixture(const Shape& s, int n, int n_layers = 2, uint32_t seed = 3) {
    layout.n_layers = n_layers, layout.n_kv_heads = s.n_kv_heads, layout.head_dim = s.head_dim;
    layout.block_size = kDefaultKvBlockSize;
    layout.n_blocks = (n + layout.block_size - 1) / layout.block_size + 3;
    layout.dtype = s.k_type;
    if (s.v_type != s.k_type) layout.v_type = (int8_t)s.v_type;
    cache.assign(layout.total_elems(), 0);
    table.resize((size_t)layout.n_blocks);
    for (int b = 0; b < layout.n_blocks; ++b) table[(size_t)b] = (b * 5 + 2) % layout.n_blocks;
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.5f);
    std::vector<float> k((size_t)s.n_kv_heads * s.head_dim), v(k.size());
    for (int layer = 0; layer < n_layers; ++layer)
      for (int p = 0; p < n; ++p) {
        for (float& x : k) x = dist(rng);
        for (float& x : v) x = dist(rng);
        kv_store(cache.data(), layout, layer, table.data(), p, k.data(), v.data());
      }
  }
};

std::vector<float> random_q(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> q(n);
  for (float& x : q) x = dist(rng);
  return q;
}

struct Run {
  int first_pos, n_tokens;  // queries at [first_pos, first_pos + n_tokens)
  SumOrder order;
  int window = 0;  // > 0: each query sees its last `window` positions
};

// attention_batch and attention_batch_scalar over the same queries; outputs compared bitwise.
void expect_tiled_equals_scalar(const Shape& s, const std::vector<Run>& runs, float softcap,
                                int n_threads, int n_positions) {
  const Fixture f(s, n_positions);
  const size_t width = (size_t)s.n_heads * s.head_dim;
  size_t total = 0;
  for (const Run& r : runs) total += (size_t)r.n_tokens;
  const std::vector<float> q = random_q(total * width, 11);
  std::vector<float> tiled(total * width, -1.0f), scalar(total * width, -2.0f);
  std::vector<AttentionQuery> qt, qs;
  size_t row = 0;
  for (const Run& r : runs)
    for (int i = 0; i < r.n_tokens; ++i, ++row) {
      const int pos = r.first_pos + i;
      const int first = r.window > 0 && pos >= r.window ? pos - r.window + 1 : 0;
      qt.push_back({f.table.data(), pos, q.data() + row * width, tiled.data() + row * width,
                    r.order, first});
      qs.push_back(qt.back());
      qs.back().out = scalar.data() + row * width;
    }
  ThreadPool pool(n_threads);
  const float scale = 1.0f / std::sqrt((float)s.head_dim);
  attention_batch(f.cache.data(), f.layout, 1, qt, s.n_heads, scale, softcap, pool);
  attention_batch_scalar(f.cache.data(), f.layout, 1, qs, s.n_heads, scale, softcap, pool);
  for (size_t i = 0; i < tiled.size(); ++i) {
    ASSERT_TRUE(std::isfinite(tiled[i])) << i;
    ASSERT_EQ(0, std::memcmp(&tiled[i], &scalar[i], sizeof(float)))
        << "value " << i << " (token " << i / width << ", head " << i % width / s.head_dim
        << "): tiled " << tiled[i] << " scalar " << scalar[i];
  }
}

const KvDType kAllTypes[] = {KvDType::F16, KvDType::BF16, KvDType::Q8_0, KvDType::Q4_0};

TEST(TiledAttention, PromptTilesEqualTheScalarFormForEveryCacheType) {
  for (KvDType t : kAllTypes) {
    SCOPED_TRACE(kv_dtype_name(t));
    // 7 query heads per kv head (Qwen2.5-0.5B's group), 40 prompt tokens at depth 300: three
    // query tiles, the first starting mid-block.
    expect_tiled_equals_scalar({14, 2, 64, t, t}, {{300, 40, SumOrder::kLanes16}}, 0.0f, 2, 340);
  }
}

TEST(TiledAttention, DecodeOrderAndMixedBatches) {
  for (KvDType t : kAllTypes) {
    SCOPED_TRACE(kv_dtype_name(t));
    // Two sequences' decode tokens and a prompt chunk in one call (same table: distinct
    // positions of one cache, as the engine's sequences share the pool).
    expect_tiled_equals_scalar(
        {8, 2, 128, t, t},
        {{77, 1, SumOrder::kLanes64}, {5, 12, SumOrder::kLanes16}, {130, 1, SumOrder::kLanes64}},
        0.0f, 3, 140);
  }
}

TEST(TiledAttention, WindowsSoftcapsAndPartialBlocks) {
  for (KvDType t : {KvDType::F16, KvDType::Q8_0}) {
    SCOPED_TRACE(kv_dtype_name(t));
    // Windows of 37 and 5 positions (the first position inside a block), a soft-cap of 20.
    expect_tiled_equals_scalar({4, 1, 32, t, t},
                               {{90, 21, SumOrder::kLanes16, 37}, {150, 1, SumOrder::kLanes64, 5}},
                               20.0f, 2, 160);
  }
}

TEST(TiledAttention, HeadDimsWithoutSixteenLanesAndMha) {
  // head_dim 40 (not a multiple of 16: q·k takes the 64-lane order), heads without grouping.
  expect_tiled_equals_scalar({3, 3, 40, KvDType::F16, KvDType::F16},
                             {{0, 19, SumOrder::kLanes16}, {19, 1, SumOrder::kLanes64}}, 0.0f, 2,
                             20);
  expect_tiled_equals_scalar({6, 3, 96, KvDType::BF16, KvDType::BF16},
                             {{33, 17, SumOrder::kLanes16}}, 0.0f, 1, 50);
}

TEST(TiledAttention, MixedKAndVTypes) {
  expect_tiled_equals_scalar({8, 4, 64, KvDType::Q8_0, KvDType::Q4_0},
                             {{64, 18, SumOrder::kLanes16}, {100, 1, SumOrder::kLanes64}}, 0.0f, 2,
                             101);
  expect_tiled_equals_scalar({8, 4, 64, KvDType::F16, KvDType::Q8_0},
                             {{64, 18, SumOrder::kLanes16}}, 0.0f, 2, 82);
}

TEST(TiledAttention, LongSequencesSplitOverThreadsKeepTheBits) {
  // One decoding sequence at 5000 positions: the keys of each tile are split over the threads
  // (scores by position range, values by dimension range); the scalar form is one thread per
  // head. 1, 2 and 5 threads all give the scalar bits.
  for (int threads : {1, 2, 5})
    for (KvDType t : {KvDType::F16, KvDType::Q4_0}) {
      SCOPED_TRACE(std::string(kv_dtype_name(t)) + ", threads " + std::to_string(threads));
      expect_tiled_equals_scalar({14, 2, 64, t, t}, {{4999, 1, SumOrder::kLanes64}}, 0.0f, threads,
                                 5000);
    }
}

TEST(TiledAttention, VerificationChunksInTheDecodeOrder) {
  // A speculative verification chunk: consecutive tokens of one sequence, each in the one-token
  // order (its scores eight positions at a time when head_dim is a multiple of 64). Head dims
  // 64, 128 and 256 (and 96, the per-position form), chunk starts and ends off the groups of
  // eight, windows and a soft-cap, beside a plain decode token of another part of the cache.
  for (bool wide : {true, false}) {
    set_avx512_attention(wide);
    for (int hd : {64, 96, 128, 256})
      for (KvDType t : {KvDType::F16, KvDType::BF16, KvDType::Q8_0}) {
        SCOPED_TRACE(std::string(kv_dtype_name(t)) + " hd " + std::to_string(hd) +
                     (wide ? " AVX-512" : " AVX2"));
        expect_tiled_equals_scalar({9, 3, hd, t, t},
                                   {{1203, 9, SumOrder::kLanes64}, {37, 1, SumOrder::kLanes64}},
                                   0.0f, 2, 1212);
        expect_tiled_equals_scalar({4, 2, hd, t, t},
                                   {{301, 5, SumOrder::kLanes64, 53}, {99, 1, SumOrder::kLanes64}},
                                   30.0f, 3, 306);
      }
  }
  set_avx512_attention(true);
}

TEST(TiledAttention, IntegerScoresOfAQuantizedKAtEveryHeadDim) {
  // A Q8_0 / Q4_0 K: scores by the integer q·k (attention_int.h), 16 keys at a time on
  // AVX-512. Head dims of 1 to 8 blocks (an odd count included), GQA groups of 1, 4 and 7
  // (rows of a tile not a multiple of 4), decode and prompt tiles, positions not a multiple
  // of 16, with F16 or the other quantized V.
  struct Case {
    Shape shape;
    int n_positions;
  };
  const Case cases[] = {{{7, 1, 32, KvDType::Q8_0, KvDType::Q8_0}, 45},
                        {{8, 2, 96, KvDType::Q8_0, KvDType::F16}, 70},
                        {{4, 4, 128, KvDType::Q4_0, KvDType::Q8_0}, 33},
                        {{8, 2, 256, KvDType::Q8_0, KvDType::Q4_0}, 51},
                        {{14, 2, 64, KvDType::Q4_0, KvDType::Q4_0}, 99}};
  for (bool wide : {true, false}) {
    set_avx512_attention(wide);
    for (const Case& c : cases) {
      SCOPED_TRACE(std::string(kv_dtype_name(c.shape.k_type)) + " hd " +
                   std::to_string(c.shape.head_dim) + (wide ? " AVX-512" : " AVX2"));
      const int n = c.n_positions;
      expect_tiled_equals_scalar(
          c.shape, {{n - 1, 1, SumOrder::kLanes64}, {n - 20, 19, SumOrder::kLanes16}}, 0.0f, 2, n);
    }
  }
  set_avx512_attention(true);
}

TEST(TiledAttention, PromptsAtDepthSplitIntoManyTiles) {
  // 48 tokens at depth 3000: tiles of fewer queries (the strip limit), several per thread.
  expect_tiled_equals_scalar({14, 2, 64, KvDType::F16, KvDType::F16},
                             {{3000, 48, SumOrder::kLanes16}}, 0.0f, 2, 3048);
}

TEST(TiledAttention, AvxTwoStagesWhereAvx512IsTheDefault) {
  // On an AVX-512 CPU the tests above run the AVX-512 stages; these cases run the AVX2 ones
  // (prompt tiles, decode order, long split sequences, head_dim 40 and 96) the same way.
  if (!cpu_features().has_avx2_kernels()) GTEST_SKIP() << "no AVX2";
  set_avx512_attention(false);
  struct Restore {
    ~Restore() { set_avx512_attention(true); }
  } restore;
  for (KvDType t : kAllTypes) {
    SCOPED_TRACE(kv_dtype_name(t));
    expect_tiled_equals_scalar({14, 2, 64, t, t}, {{300, 40, SumOrder::kLanes16}}, 0.0f, 2, 340);
    expect_tiled_equals_scalar(
        {8, 2, 128, t, t}, {{77, 1, SumOrder::kLanes64}, {5, 12, SumOrder::kLanes16}}, 0.0f, 3, 90);
  }
  expect_tiled_equals_scalar({14, 2, 64, KvDType::F16, KvDType::F16},
                             {{4999, 1, SumOrder::kLanes64}}, 0.0f, 2, 5000);
  expect_tiled_equals_scalar({6, 3, 96, KvDType::BF16, KvDType::BF16},
                             {{33, 17, SumOrder::kLanes16}}, 0.0f, 1, 50);
}

TEST(QuantizedKvCache, LayoutSizesAndOffsets) {
  KvCacheLayout l;
  l.n_layers = 3, l.n_kv_heads = 2, l.head_dim = 64, l.n_blocks = 5;
  EXPECT_EQ(l.bytes_per_token(), 3u * 2 * (64 + 64) * 2);  // F16: 2 bytes per value
  l.dtype = KvDType::Q8_0;
  EXPECT_EQ(l.row_units(), 2u * 17);  // two 34-byte blocks
  EXPECT_EQ(l.bytes_per_token(), 3u * 2 * 2 * 68);
  l.v_type = (int8_t)KvDType::Q4_0;
  EXPECT_EQ(l.row_units(1), 2u * 9);  // two 18-byte blocks
  EXPECT_EQ(l.bytes_per_token(), 3u * 2 * (68 + 36));
  // V's pool follows K's within a layer; the next layer follows both.
  EXPECT_EQ(l.offset(0, 1, 0, 0, 0, 0), l.pool_elems(0));
  EXPECT_EQ(l.offset(1, 0, 0, 0, 0, 0), l.pool_elems(0) + l.pool_elems(1));
  EXPECT_EQ(l.offset(2, 1, 4, 1, 15, 0) + l.row_units(1), l.total_elems());
}

TEST(QuantizedKvCache, RowsRoundTripWithinTheirStep) {
  const Shape s{2, 1, 64, KvDType::Q8_0, KvDType::Q4_0};
  Fixture f(s, 1, 1);
  const std::vector<float> k = random_q(64, 5), v = random_q(64, 6);
  kv_store(f.cache.data(), f.layout, 0, f.table.data(), 0, k.data(), v.data());
  std::vector<float> k2(64), v2(64);
  kv_row_to_f32(f.cache.data() + f.layout.position_offset(f.table.data(), 0, 0, 0, 0),
                KvDType::Q8_0, 64, k2.data());
  kv_row_to_f32(f.cache.data() + f.layout.position_offset(f.table.data(), 0, 1, 0, 0),
                KvDType::Q4_0, 64, v2.data());
  for (int b = 0; b < 2; ++b) {
    float kmax = 0, vmax = 0;
    for (int j = 0; j < 32; ++j) {
      kmax = std::max(kmax, std::fabs(k[(size_t)(b * 32 + j)]));
      vmax = std::max(vmax, std::fabs(v[(size_t)(b * 32 + j)]));
    }
    for (int j = b * 32; j < b * 32 + 32; ++j) {
      EXPECT_LE(std::fabs(k2[(size_t)j] - k[(size_t)j]), kmax / 127 * 0.51f + 1e-3f * kmax) << j;
      EXPECT_LE(std::fabs(v2[(size_t)j] - v[(size_t)j]), vmax / 8 * 1.01f) << j;  // 4-bit step
    }
  }
  // Q4_0 rows are llama.cpp's reference quantizer's bytes.
  std::vector<BlockQ4_0> want(2);
  qref::quantize_q4_0(v.data(), want.data(), 2);
  EXPECT_EQ(0, std::memcmp(want.data(),
                           f.cache.data() + f.layout.position_offset(f.table.data(), 0, 1, 0, 0),
                           sizeof(BlockQ4_0) * 2));
}

TEST(QuantizedKvCache, AttentionStaysCloseToF16) {
  // The same K/V in F16, Q8_0 and Q4_0 caches: outputs differ by the quantization only.
  const int n = 200, heads = 4, hd = 64;
  const std::vector<float> q = random_q((size_t)heads * hd, 9);
  std::vector<float> out[3];
  const KvDType types[] = {KvDType::F16, KvDType::Q8_0, KvDType::Q4_0};
  ThreadPool pool(2);
  for (int i = 0; i < 3; ++i) {
    const Fixture f({heads, 2, hd, types[i], types[i]}, n, 1, 21);
    out[i].assign((size_t)heads * hd, 0.0f);
    const AttentionQuery query{f.table.data(),     n - 1, q.data(), out[i].data(),
                               SumOrder::kLanes64, 0};
    attention_batch(f.cache.data(), f.layout, 0, std::span(&query, 1), heads, pool);
  }
  const auto rms_diff = [&](int i) {
    double d = 0, ref = 0;
    for (size_t j = 0; j < out[0].size(); ++j) {
      d += (out[i][j] - out[0][j]) * (out[i][j] - out[0][j]);
      ref += out[0][j] * out[0][j];
    }
    return std::sqrt(d / ref);
  };
  EXPECT_LT(rms_diff(1), 0.02);  // Q8_0
  EXPECT_LT(rms_diff(2), 0.25);  // Q4_0
  EXPECT_GT(rms_diff(2), rms_diff(1));
}

}  // namespace
}  // namespace hablar::cpu
