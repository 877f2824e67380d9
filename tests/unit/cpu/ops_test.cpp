// The non-matmul ops against straightforward double-precision oracles written here, the KV
// cache store and attention against a softmax over K/V the test placed itself, and the
// thread pool.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <stdexcept>
#include <vector>

#include "backend/cpu/ops.h"
#include "core/error.h"
#include "core/fp16.h"
#include "core/quant.h"

namespace hablar::cpu {
namespace {

std::vector<float> random_values(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

TEST(Ops, RmsNormMatchesDoubleFormula) {
  const int64_t n = 579;
  const auto x = random_values(n, 1, 3.0f), w = random_values(n, 2);
  std::vector<float> y(n);
  rmsnorm(x.data(), w.data(), y.data(), n, 1e-5f);
  double ss = 0;
  for (float v : x) ss += (double)v * v;
  const double inv = 1.0 / std::sqrt(ss / n + 1e-5);
  for (int64_t i = 0; i < n; ++i)
    EXPECT_NEAR(y[i], x[i] * inv * w[i], 1e-5 * std::fabs(x[i] * inv * w[i]) + 1e-7);
  // In place gives the same.
  std::vector<float> z = x;
  rmsnorm(z.data(), w.data(), z.data(), n, 1e-5f);
  EXPECT_EQ(0, std::memcmp(z.data(), y.data(), n * sizeof(float)));
}

TEST(Ops, SwigluMatchesDoubleFormula) {
  const int64_t n = 1003;
  auto g = random_values(n, 3, 4.0f);
  g[0] = -100.0f;  // exp overflow territory
  g[1] = 100.0f;
  g[2] = 0.0f;
  const auto u = random_values(n, 4);
  std::vector<float> out(n);
  swiglu(g.data(), u.data(), out.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const double want = g[i] / (1.0 + std::exp(-(double)g[i])) * u[i];
    EXPECT_NEAR(out[i], want, 2e-6 * std::fabs(want) + 1e-30) << "i=" << i << " g=" << g[i];
  }
}

// exp_approx is within 2 ulp of e^x over the normal range, saturates like expf, and the
// SIMD swiglu (which uses its vector form) equals the scalar one bit for bit.
TEST(Ops, ExpApproxAccuracyAndSimdSwigluBitExact) {
  for (float x = -87.0f; x < 88.5f; x += 0.0137f) {
    const double want = std::exp((double)x);
    EXPECT_NEAR(exp_approx(x), want, 2.5e-7 * want) << "x=" << x;
  }
  EXPECT_EQ(exp_approx(0.0f), 1.0f);
  EXPECT_EQ(exp_approx(-INFINITY), 0.0f);
  EXPECT_EQ(exp_approx(-200.0f), 0.0f);
  EXPECT_EQ(exp_approx(200.0f), INFINITY);
  EXPECT_TRUE(std::isnan(exp_approx(NAN)));
  EXPECT_GT(exp_approx(-100.0f), 0.0f);  // subnormal results survive
  const int64_t n = 4099;
  auto g = random_values(n, 9, 6.0f);
  const float extremes[] = {-150.0f, -104.0f, -90.0f, -88.7f, 88.5f, 89.0f, 150.0f, 0.0f, -0.0f};
  for (size_t i = 0; i < std::size(extremes); ++i) g[i * 7] = extremes[i];
  const auto u = random_values(n, 10);
  std::vector<float> simd(n), scalar(n);
  swiglu(g.data(), u.data(), simd.data(), n);
  swiglu_scalar(g.data(), u.data(), scalar.data(), n);
  EXPECT_EQ(0, std::memcmp(simd.data(), scalar.data(), n * sizeof(float)));
}

TEST(Ops, AddInplace) {
  std::vector<float> y = {1, 2, 3}, x = {0.5f, -2, 4};
  add_inplace(y.data(), x.data(), 3);
  EXPECT_EQ(y, (std::vector<float>{1.5f, 0, 7}));
}

// Oracle: rotation of pair i by pos * freq_i, freq_i = base^(-2i/n_dims) after scaling.
double oracle_freq(int i, const RopeParams& p) {
  double freq = std::pow((double)p.freq_base, -2.0 * i / p.n_dims);
  if (p.scaling == RopeParams::Scaling::kLinear) return freq / p.factor;
  if (p.scaling == RopeParams::Scaling::kLlama3) {
    const double wavelen = 2 * M_PI / freq;
    const double low = p.original_context / p.low_freq_factor;
    const double high = p.original_context / p.high_freq_factor;
    if (wavelen < high) return freq;
    if (wavelen > low) return freq / p.factor;
    const double smooth = (p.original_context / wavelen - p.low_freq_factor) /
                          (p.high_freq_factor - p.low_freq_factor);
    return (1 - smooth) * freq / p.factor + smooth * freq;
  }
  return freq;
}
// LongRoPE divides pair i's frequency by its factor before any other scaling.
double oracle_freq_with_factors(int i, const RopeParams& p) {
  const double ff = p.freq_factors.empty() ? 1.0 : (double)p.freq_factors[(size_t)i];
  return oracle_freq(i, p) / ff;
}

void check_rope(const RopeParams& p, int head_dim, int pos, double mscale = 1.0) {
  const int n_heads = 3;
  const auto x = random_values((size_t)n_heads * head_dim, 7);
  std::vector<float> y = x;
  rope(y.data(), n_heads, head_dim, pos, p);
  const int half = p.n_dims / 2;
  for (int h = 0; h < n_heads; ++h) {
    const float* a = x.data() + h * head_dim;
    const float* b = y.data() + h * head_dim;
    for (int i = 0; i < half; ++i) {
      const int i0 = p.neox ? i : 2 * i, i1 = p.neox ? i + half : 2 * i + 1;
      const double th = pos * oracle_freq_with_factors(i, p);
      const double c = mscale * std::cos(th), sn = mscale * std::sin(th);
      EXPECT_NEAR(b[i0], a[i0] * c - a[i1] * sn, 2e-4) << "pair " << i;
      EXPECT_NEAR(b[i1], a[i0] * sn + a[i1] * c, 2e-4) << "pair " << i;
    }
    for (int d = p.n_dims; d < head_dim; ++d) EXPECT_EQ(b[d], a[d]) << "pass-through dim " << d;
  }
}

TEST(Ops, ReadThroughXorsEveryWord) {
  std::vector<uint64_t> words(64 * 8 + 8);  // a 64-byte line per 8 words; one extra line
  std::mt19937_64 rng(5);
  for (uint64_t& w : words) w = rng();
  uint64_t want = 0;
  for (size_t i = 0; i < 64 * 8; ++i) want ^= words[i];
  const auto* bytes = reinterpret_cast<const uint8_t*>(words.data());
  EXPECT_EQ(read_through(bytes, 64 * 64), want);
  EXPECT_EQ(read_through_scalar(bytes, 64 * 64), want);
  EXPECT_EQ(read_through(bytes, 64 * 63), read_through_scalar(bytes, 64 * 63));  // odd lines
  // Each word counts: flipping one bit anywhere in the range changes the result.
  words[123] ^= 1u << 7;
  EXPECT_EQ(read_through(bytes, 64 * 64), want ^ (1u << 7));
  EXPECT_EQ(read_through(bytes, 0), 0u);
}

TEST(Ops, RopeNormalAndNeox) {
  RopeParams p;
  p.n_dims = 64;
  p.freq_base = 10000.0f;
  for (bool neox : {false, true}) {
    p.neox = neox;
    for (int pos : {0, 1, 17, 100}) check_rope(p, 64, pos);
  }
  // Partial rotation: only the first n_dims dimensions move.
  p.n_dims = 32;
  check_rope(p, 64, 9);
}

TEST(Ops, RopeScaling) {
  RopeParams p;
  p.n_dims = 128;
  p.freq_base = 500000.0f;
  p.scaling = RopeParams::Scaling::kLinear;
  p.factor = 4.0f;
  check_rope(p, 128, 77);
  p.scaling = RopeParams::Scaling::kLlama3;
  p.factor = 8.0f;
  p.low_freq_factor = 1.0f;
  p.high_freq_factor = 4.0f;
  p.original_context = 8192;
  for (int pos : {3, 90}) check_rope(p, 128, pos);
}

// LongRoPE: per-pair divisors and the attention factor on cos and sin; a factor list of the
// wrong length is refused.
TEST(Ops, RopeLongRopeFactors) {
  RopeParams p;
  p.n_dims = 96;
  p.neox = true;
  for (int i = 0; i < 48; ++i) p.freq_factors.push_back(1.0f + 0.75f * (float)(i * i) / 47.0f);
  p.attn_factor = 1.19f;
  for (int pos : {0, 5, 63, 200}) check_rope(p, 96, pos, 1.19);
  // Factors of 1 give exactly the plain angles.
  RopeParams plain = p;
  plain.freq_factors.clear();
  plain.attn_factor = 1.0f;
  RopeParams ones = plain;
  ones.freq_factors.assign(48, 1.0f);
  float c0[48], s0[48], c1[48], s1[48];
  rope_angles(77, plain, c0, s0);
  rope_angles(77, ones, c1, s1);
  for (int i = 0; i < 48; ++i) {
    EXPECT_EQ(c0[i], c1[i]);
    EXPECT_EQ(s0[i], s1[i]);
  }
  p.freq_factors.pop_back();
  EXPECT_THROW(rope_angles(1, p, c0, s0), Error);
}

// rope_apply's SIMD form equals the scalar one bit for bit (NeoX pairs 8 at a time plus a
// tail; normal pairs; partial rotation), and rope is rope_angles then rope_apply.
TEST(Ops, RopeApplySimdMatchesScalar) {
  for (bool neox : {false, true})
    for (int n_dims : {64, 40, 22}) {
      RopeParams p;
      p.n_dims = n_dims;
      p.freq_base = 1000000.0f;
      p.neox = neox;
      float cos_t[kMaxRopePairs], sin_t[kMaxRopePairs];
      rope_angles(1234, p, cos_t, sin_t);
      const auto x = random_values(5 * 64, 11, 20.0f);
      std::vector<float> simd = x, scalar = x, whole = x;
      rope_apply(simd.data(), 5, 64, p, cos_t, sin_t);
      rope_apply_scalar(scalar.data(), 5, 64, p, cos_t, sin_t);
      rope(whole.data(), 5, 64, 1234, p);
      EXPECT_EQ(0, std::memcmp(simd.data(), scalar.data(), x.size() * sizeof(float)))
          << "neox " << neox << " n_dims " << n_dims;
      EXPECT_EQ(0, std::memcmp(whole.data(), scalar.data(), x.size() * sizeof(float)));
    }
}

TEST(Ops, RopeRejectsBadParams) {
  std::vector<float> x(64);
  RopeParams p;
  p.n_dims = 65;
  EXPECT_THROW(rope(x.data(), 1, 64, 0, p), Error);
  p.n_dims = 0;
  EXPECT_THROW(rope(x.data(), 1, 64, 0, p), Error);
}

TEST(Ops, EmbeddingRowDequantizes) {
  const int64_t rows = 5, cols = 256;
  for (DType type : {DType::Q4_K, DType::Q8_0, DType::F16, DType::F32}) {
    const size_t rb = dtype_row_bytes(type, cols);
    std::vector<uint8_t> bytes(rb * rows);
    const auto src = random_values((size_t)(rows * cols), 5);
    for (int64_t r = 0; r < rows; ++r)
      quantize_row(type, src.data() + r * cols, bytes.data() + r * rb, cols);
    const WeightView table{type, rows, cols, rb, bytes.data()};
    std::vector<float> got(cols), want(cols);
    embedding_row(table, 3, got.data());
    dequantize_row(type, bytes.data() + 3 * rb, want.data(), cols);
    EXPECT_EQ(got, want) << dtype_name(type);
    EXPECT_THROW(embedding_row(table, 5, got.data()), Error);
    EXPECT_THROW(embedding_row(table, -1, got.data()), Error);
  }
}

// A small paged cache whose sequences use scattered physical blocks.
struct CacheFixture {
  KvCacheLayout layout;
  std::vector<uint16_t> cache;
  CacheFixture(int n_kv_heads, int head_dim, int n_blocks, KvDType dtype = KvDType::F16) {
    layout.n_layers = 2;
    layout.n_kv_heads = n_kv_heads;
    layout.head_dim = head_dim;
    layout.block_size = 16;
    layout.n_blocks = n_blocks;
    layout.dtype = dtype;
    cache.assign(layout.total_elems(), 0x7e00);  // NaN everywhere not written
  }
};

float kv_round(float v, KvDType t) {
  return t == KvDType::BF16 ? bf16_to_f32(f32_to_bf16(v)) : fp16_to_f32(f32_to_fp16(v));
}

// Softmax attention in double over K/V as the test stored them (rounded to the cache type),
// with q and the softmax weights rounded to the cache type as attention does. `bound` gets,
// per output, the most that one-step differences in the weights' rounding can move it
// (sum_p ulp(w_p) |v_p|), plus float accumulation error.
std::vector<double> oracle_attention(const std::vector<std::vector<float>>& ks,
                                     const std::vector<std::vector<float>>& vs, const float* q,
                                     int n_heads, int n_kv_heads, int head_dim, int pos, KvDType t,
                                     std::vector<double>& bound, int first = 0) {
  std::vector<double> out((size_t)n_heads * head_dim, 0.0);
  bound.assign(out.size(), 2e-6);
  const int group = n_heads / n_kv_heads;
  const double weight_ulp = t == KvDType::BF16 ? 1.0 / 128 : 1.0 / 1024;
  for (int h = 0; h < n_heads; ++h) {
    const int kvh = h / group;
    std::vector<double> s(pos + 1, -INFINITY);
    double mx = -1e300;
    for (int p = first; p <= pos; ++p) {
      double dot = 0;
      for (int d = 0; d < head_dim; ++d)
        dot += (double)kv_round(q[h * head_dim + d], t) * kv_round(ks[p][kvh * head_dim + d], t);
      s[p] = dot / std::sqrt((double)head_dim);
      mx = std::max(mx, s[p]);
    }
    double sum = 0;
    for (double& v : s) sum += (v = std::exp(v - mx));
    for (int p = first; p <= pos; ++p) {
      const double w = kv_round((float)(s[p] / sum), t);
      for (int d = 0; d < head_dim; ++d) {
        const double v = kv_round(vs[p][kvh * head_dim + d], t);
        out[h * head_dim + d] += w * v;
        bound[h * head_dim + d] += (w * weight_ulp + 1e-7) * std::fabs(v);
      }
    }
  }
  return out;
}

void check_attention_case(int n_heads, int n_kv_heads, int head_dim, KvDType dtype) {
  CacheFixture f(n_kv_heads, head_dim, 12, dtype);
  const int32_t table[] = {7, 2, 10, 4, 11, 0};  // positions 0..95 in scattered blocks
  const int n_pos = 90;
  std::vector<std::vector<float>> ks, vs;
  for (int p = 0; p < n_pos; ++p) {
    ks.push_back(random_values((size_t)n_kv_heads * head_dim, 100 + p));
    vs.push_back(random_values((size_t)n_kv_heads * head_dim, 200 + p));
    kv_store(f.cache.data(), f.layout, 1, table, p, ks.back().data(), vs.back().data());
  }
  ThreadPool pool(2);
  for (int pos : {0, 15, 16, 49, 63, 64, 89}) {
    const auto q = random_values((size_t)n_heads * head_dim, 300 + pos);
    std::vector<float> out((size_t)n_heads * head_dim);
    attention_one(f.cache.data(), f.layout, 1, table, pos, q.data(), n_heads, out.data());
    std::vector<double> bound;
    const auto want =
        oracle_attention(ks, vs, q.data(), n_heads, n_kv_heads, head_dim, pos, dtype, bound);
    for (size_t i = 0; i < out.size(); ++i)
      ASSERT_NEAR(out[i], want[i], bound[i]) << "pos " << pos << " i " << i;
    // The scalar form gives the same bits, in both summation orders; the one-token order
    // agrees with the oracle as closely.
    std::vector<float> scalar(out.size()), wide(out.size()), wide_scalar(out.size());
    attention_one_scalar(f.cache.data(), f.layout, 1, table, pos, q.data(), n_heads, scalar.data());
    EXPECT_EQ(0, std::memcmp(out.data(), scalar.data(), out.size() * sizeof(float)));
    attention_one(f.cache.data(), f.layout, 1, table, pos, q.data(), n_heads, wide.data(),
                  SumOrder::kLanes64);
    attention_one_scalar(f.cache.data(), f.layout, 1, table, pos, q.data(), n_heads,
                         wide_scalar.data(), SumOrder::kLanes64);
    EXPECT_EQ(0, std::memcmp(wide.data(), wide_scalar.data(), out.size() * sizeof(float)));
    for (size_t i = 0; i < out.size(); ++i)
      ASSERT_NEAR(wide[i], want[i], bound[i]) << "one-token order, pos " << pos << " i " << i;
    // The batched form gives the same bits.
    std::vector<float> batched(out.size());
    const AttentionQuery query{table, pos, q.data(), batched.data()};
    attention_batch(f.cache.data(), f.layout, 1, std::span<const AttentionQuery>(&query, 1),
                    n_heads, pool);
    EXPECT_EQ(0, std::memcmp(out.data(), batched.data(), out.size() * sizeof(float)));
  }
}

// A sliding window: positions before `first` take no weight; the first attended position
// falls inside a 16-position softmax block and inside a cache block.
TEST(Attention, SlidingWindowMatchesOracleOverTheWindow) {
  const int n_heads = 4, n_kv_heads = 2, head_dim = 64;
  CacheFixture f(n_kv_heads, head_dim, 12, KvDType::F16);
  const int32_t table[] = {7, 2, 10, 4, 11, 0};
  std::vector<std::vector<float>> ks, vs;
  for (int p = 0; p < 90; ++p) {
    ks.push_back(random_values((size_t)n_kv_heads * head_dim, 100 + p));
    vs.push_back(random_values((size_t)n_kv_heads * head_dim, 200 + p));
    kv_store(f.cache.data(), f.layout, 1, table, p, ks.back().data(), vs.back().data());
  }
  ThreadPool pool(2);
  for (const auto& [first, pos] : {std::pair{0, 40}, {5, 40}, {17, 89}, {33, 48}, {89, 89}}) {
    const auto q = random_values((size_t)n_heads * head_dim, 300 + pos);
    std::vector<float> out((size_t)n_heads * head_dim);
    AttentionQuery query{table, pos, q.data(), out.data()};
    query.first = first;
    attention_batch(f.cache.data(), f.layout, 1, std::span<const AttentionQuery>(&query, 1),
                    n_heads, pool);
    std::vector<double> bound;
    const auto want = oracle_attention(ks, vs, q.data(), n_heads, n_kv_heads, head_dim, pos,
                                       KvDType::F16, bound, first);
    for (size_t i = 0; i < out.size(); ++i)
      ASSERT_NEAR(out[i], want[i], bound[i]) << "first " << first << " pos " << pos;
  }
}

TEST(Attention, MatchesSoftmaxOracle) {
  check_attention_case(4, 4, 64, KvDType::F16);
}
TEST(Attention, GroupedQueryHeads) {
  check_attention_case(9, 3, 64, KvDType::F16);
}
TEST(Attention, OddHeadDimAndBf16Cache) {
  check_attention_case(2, 1, 12, KvDType::F16);  // head_dim not a multiple of 8: scalar path
  check_attention_case(4, 2, 32, KvDType::BF16);
}
TEST(Attention, WideHeads) {
  check_attention_case(2, 2, 128, KvDType::F16);
}
// head_dim 80 is no multiple of 16 (q·k takes the 64-lane order with a tail); 96 has a tail.
TEST(Attention, HeadDimsWithTails) {
  check_attention_case(2, 1, 80, KvDType::F16);
  check_attention_case(2, 2, 96, KvDType::BF16);
}

// Several sequences at different positions in one call, more queries than threads; each
// result equals attention_one's, and the newest position dominates when its score is largest.
TEST(Attention, BatchOfSequences) {
  const int n_heads = 6, n_kv = 2, hd = 64;
  CacheFixture f(n_kv, hd, 16);
  const int32_t tables[3][4] = {{0, 5, 9, 1}, {3, 11, 2, 6}, {14, 7, 12, 8}};
  const int lengths[3] = {5, 37, 20};
  for (int s = 0; s < 3; ++s)
    for (int p = 0; p < lengths[s]; ++p) {
      const auto k = random_values((size_t)n_kv * hd, 1000 * s + p);
      const auto v = random_values((size_t)n_kv * hd, 2000 * s + p);
      kv_store(f.cache.data(), f.layout, 0, tables[s], p, k.data(), v.data());
    }
  std::vector<std::vector<float>> qs, outs;
  std::vector<AttentionQuery> queries;
  for (int s = 0; s < 3; ++s) {
    qs.push_back(random_values((size_t)n_heads * hd, 50 + s));
    outs.emplace_back((size_t)n_heads * hd);
  }
  // Sequence 1 decodes (the one-token summation order); the others use the default.
  const SumOrder orders[3] = {SumOrder::kLanes16, SumOrder::kLanes64, SumOrder::kLanes16};
  for (int s = 0; s < 3; ++s)
    queries.push_back({tables[s], lengths[s] - 1, qs[s].data(), outs[s].data(), orders[s]});
  ThreadPool pool(3);
  attention_batch(f.cache.data(), f.layout, 0, queries, n_heads, pool);
  for (int s = 0; s < 3; ++s) {
    std::vector<float> alone((size_t)n_heads * hd);
    attention_one(f.cache.data(), f.layout, 0, tables[s], lengths[s] - 1, qs[s].data(), n_heads,
                  alone.data(), orders[s]);
    EXPECT_EQ(0, std::memcmp(alone.data(), outs[s].data(), alone.size() * sizeof(float)))
        << "seq " << s;
  }
}

TEST(Attention, RejectsBadArguments) {
  CacheFixture f(2, 64, 4);
  const int32_t table[] = {0};
  std::vector<float> q(3 * 64), out(3 * 64);
  EXPECT_THROW(attention_one(f.cache.data(), f.layout, 0, table, 0, q.data(), 3, out.data()),
               Error);
  EXPECT_THROW(attention_one(f.cache.data(), f.layout, 5, table, 0, q.data(), 4, out.data()),
               Error);
  EXPECT_THROW(attention_one(f.cache.data(), f.layout, 0, table, -1, q.data(), 4, out.data()),
               Error);
}

TEST(ThreadPool, RunsEveryThreadOnce) {
  for (int n : {1, 2, 5}) {
    ThreadPool pool(n);
    EXPECT_EQ(pool.size(), n);
    for (int round = 0; round < 200; ++round) {
      std::vector<std::atomic<int>> hits(n);
      pool.run([&](int i, int total) {
        EXPECT_EQ(total, n);
        hits[i].fetch_add(1);
      });
      for (int i = 0; i < n; ++i)
        ASSERT_EQ(hits[i].load(), 1) << "thread " << i << " round " << round;
    }
  }
}

TEST(ThreadPool, RethrowsWorkerErrorsAndStaysUsable) {
  ThreadPool pool(3);
  EXPECT_THROW(pool.run([](int i, int) {
    if (i == 2) throw std::runtime_error("worker failed");
  }),
               std::runtime_error);
  std::atomic<int> count{0};
  pool.run([&](int, int) { count.fetch_add(1); });
  EXPECT_EQ(count.load(), 3);
  EXPECT_THROW(ThreadPool(0), Error);
}

TEST(ThreadPool, SplitRangeCoversEverythingOnce) {
  for (int64_t n : {0, 1, 7, 100, 1001})
    for (int parts : {1, 2, 3, 8})
      for (int64_t align : {1, 8, 16}) {
        int64_t next = 0;
        for (int i = 0; i < parts; ++i) {
          const IndexRange r = split_range(n, i, parts, align);
          ASSERT_EQ(r.begin, next);
          ASSERT_LE(r.begin, r.end);
          if (r.end < n) {
            ASSERT_EQ(r.end % align, 0);
          }
          next = r.end;
        }
        ASSERT_EQ(next, n);
      }
}

}  // namespace
}  // namespace hablar::cpu
