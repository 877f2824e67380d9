// The embedding step's AVX-512 kernels (backend/cpu/embed_kernels.h): the GEMM gives
// cpu::matmul's bits (+ add_inplace bias, + cpu::gelu) for F16 and F32 weights at every tile
// edge (tokens and rows not multiples of the 5 x 5 tile or the 40-row unit, rows longer than one
// 1024-column block); gelu_inplace gives cpu::gelu's bits; the attention gives EmbedOps' plain
// loops' bits and matches a double precision softmax(q·Kᵀ)V over each whole sequence. Skipped on
// CPUs without AVX-512.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/embed_kernels.h"
#include "backend/cpu/ops.h"
#include "core/quant.h"

namespace hablar::cpu {
namespace {

struct Matrix {
  std::vector<uint8_t> bytes;
  WeightView view;
};

Matrix random_matrix(DType type, int64_t rows, int64_t cols, uint32_t seed) {
  Matrix m;
  const size_t row_bytes = dtype_row_bytes(type, cols);
  m.bytes.resize(row_bytes * (size_t)rows);
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 0.1f);
  std::vector<float> row((size_t)cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (float& v : row) v = dist(rng);
    quantize_row(type, row.data(), m.bytes.data() + (size_t)r * row_bytes, cols);
  }
  m.view.data = m.bytes.data();
  m.view.type = type;
  m.view.rows = rows;
  m.view.cols = cols;
  m.view.row_bytes = row_bytes;
  return m;
}

std::vector<float> random_floats(size_t n, uint32_t seed, float sd) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class EmbedKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!embed::embed_kernels_usable()) GTEST_SKIP() << "no AVX-512 on this CPU";
  }
  ThreadPool pool_{2};
};

TEST_F(EmbedKernels, GemmMatchesMatmulBitForBit) {
  struct Case {
    DType type;
    int64_t rows, cols, tokens;
  };
  const Case cases[] = {{DType::F16, 96, 64, 8},   {DType::F16, 101, 80, 7},
                        {DType::F16, 50, 1040, 5}, {DType::F32, 53, 2064, 9},
                        {DType::F32, 7, 16, 3},    {DType::F16, 768, 768, 13}};
  uint32_t seed = 1;
  for (const Case& c : cases) {
    const Matrix w = random_matrix(c.type, c.rows, c.cols, seed++);
    const std::vector<float> x = random_floats((size_t)(c.tokens * c.cols), seed++, 1.0f);
    const std::vector<float> bias = random_floats((size_t)c.rows, seed++, 0.5f);
    ASSERT_TRUE(embed::float_gemm_supports(w.view));
    for (int variant = 0; variant < 3; ++variant) {  // plain, + bias, + bias + GELU
      std::vector<float> want((size_t)(c.tokens * c.rows)), got(want.size(), NAN);
      matmul(w.view, x.data(), c.tokens, want.data(), pool_);
      for (int64_t t = 0; t < c.tokens && variant > 0; ++t) {
        float* row = want.data() + t * c.rows;
        add_inplace(row, bias.data(), c.rows);
        if (variant == 2) gelu(row, row, c.rows);
      }
      const embed::GemmJob job{
          &w.view, got.data(), {variant > 0 ? bias.data() : nullptr, variant == 2}};
      embed::float_gemm({&job, 1}, x.data(), c.tokens, pool_);
      EXPECT_TRUE(same_bits(want, got)) << dtype_name(c.type) << " " << c.rows << "x" << c.cols
                                        << " tokens " << c.tokens << " variant " << variant;
    }
  }
}

TEST_F(EmbedKernels, GemmJobsShareTheInput) {
  const Matrix a = random_matrix(DType::F16, 64, 128, 11),
               b = random_matrix(DType::F16, 40, 128, 12);
  const std::vector<float> x = random_floats(6 * 128, 13, 1.0f);
  std::vector<float> want_a(6 * 64), want_b(6 * 40), got_a(want_a.size()), got_b(want_b.size());
  matmul(a.view, x.data(), 6, want_a.data(), pool_);
  matmul(b.view, x.data(), 6, want_b.data(), pool_);
  const embed::GemmJob jobs[] = {{&a.view, got_a.data(), {}}, {&b.view, got_b.data(), {}}};
  embed::float_gemm(jobs, x.data(), 6, pool_);
  EXPECT_TRUE(same_bits(want_a, got_a));
  EXPECT_TRUE(same_bits(want_b, got_b));
}

TEST_F(EmbedKernels, GemmRejectsOtherTypesAndWidths) {
  EXPECT_FALSE(embed::float_gemm_supports(random_matrix(DType::Q8_0, 8, 64, 1).view));
  EXPECT_FALSE(embed::float_gemm_supports(random_matrix(DType::F32, 8, 40, 1).view));
}

TEST_F(EmbedKernels, GeluMatchesTheTable) {
  std::vector<float> x = random_floats(4099, 5, 4.0f);
  x[0] = -10.0f, x[1] = 10.0f, x[2] = -12.5f, x[3] = 11.0f, x[4] = 0.0f, x[5] = -0.0f;
  std::vector<float> want(x.size()), got = x;
  gelu(x.data(), want.data(), (int64_t)x.size());
  embed::gelu_inplace(got.data(), (int64_t)got.size());
  EXPECT_TRUE(same_bits(want, got));
}

// softmax(scale * q·k) v in double for token t, head h, over rows [b, e).
std::vector<double> attention_reference(const embed::AttentionShape& s, const float* q,
                                        const float* k, const float* v, int64_t t, int h, int64_t b,
                                        int64_t e) {
  const int HD = s.head_dim, kvh = h / (s.n_heads / s.n_kv_heads);
  const int64_t QD = (int64_t)s.n_heads * HD, KVD = (int64_t)s.n_kv_heads * HD;
  std::vector<double> w;
  double mx = -INFINITY;
  for (int64_t j = b; j < e; ++j) {
    double d = 0;
    for (int i = 0; i < HD; ++i) d += (double)q[t * QD + h * HD + i] * k[j * KVD + kvh * HD + i];
    w.push_back(d * s.scale);
    mx = std::max(mx, w.back());
  }
  double sum = 0;
  for (double& x : w) sum += (x = std::exp(x - mx));
  std::vector<double> out((size_t)HD, 0.0);
  for (int64_t j = b; j < e; ++j)
    for (int i = 0; i < HD; ++i)
      out[(size_t)i] += w[(size_t)(j - b)] / sum * v[j * KVD + kvh * HD + i];
  return out;
}

// The plain loops of EmbedOps::attention for token t, head h over rows [b, e): 8-lane dot,
// scale, std::exp, double sum, p = e * float(1 / sum), out += p * v.
std::vector<float> attention_plain(const embed::AttentionShape& s, const float* q, const float* k,
                                   const float* v, int64_t t, int h, int64_t b, int64_t e) {
  const int HD = s.head_dim, kvh = h / (s.n_heads / s.n_kv_heads);
  const int64_t QD = (int64_t)s.n_heads * HD, KVD = (int64_t)s.n_kv_heads * HD;
  std::vector<float> w;
  float mx = -INFINITY;
  for (int64_t j = b; j < e; ++j) {
    float lanes[8] = {};
    for (int i = 0; i < HD; i += 8)
      for (int l = 0; l < 8; ++l)
        lanes[l] += q[t * QD + h * HD + i + l] * k[j * KVD + kvh * HD + i + l];
    const float d = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) +
                    ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
    w.push_back(d * s.scale);
    mx = std::max(mx, w.back());
  }
  double sum = 0;
  for (float& x : w) sum += (x = std::exp(x - mx));
  const float inv = (float)(1.0 / sum);
  std::vector<float> out((size_t)HD, 0.0f);
  for (int64_t j = b; j < e; ++j) {
    const float p = w[(size_t)(j - b)] * inv;
    for (int i = 0; i < HD; ++i) out[(size_t)i] += p * v[j * KVD + kvh * HD + i];
  }
  return out;
}

TEST_F(EmbedKernels, AttentionGivesThePlainLoopsBits) {
  const embed::AttentionShape shape{4, 4, 48, 1.0f / std::sqrt(48.0f), 0.0f};
  const std::vector<int64_t> seq_begin = {0, 33, 40};
  const std::vector<float> q = random_floats(40 * 4 * 48, 31, 2.0f);
  const std::vector<float> k = random_floats(40 * 4 * 48, 32, 2.0f);
  const std::vector<float> v = random_floats(40 * 4 * 48, 33, 1.0f);
  std::vector<float> out(40 * 4 * 48, NAN);
  embed::bidirectional_attention(shape, seq_begin, q.data(), k.data(), v.data(), out.data(), pool_);
  for (size_t s = 0; s + 1 < seq_begin.size(); ++s)
    for (int64_t t = seq_begin[s]; t < seq_begin[s + 1]; ++t)
      for (int h = 0; h < 4; ++h) {
        const std::vector<float> want = attention_plain(shape, q.data(), k.data(), v.data(), t, h,
                                                        seq_begin[s], seq_begin[s + 1]);
        ASSERT_EQ(std::memcmp(want.data(), out.data() + t * 192 + h * 48, 48 * sizeof(float)), 0)
            << "token " << t << " head " << h;
      }
}

TEST_F(EmbedKernels, AttentionMatchesDoublePrecision) {
  const embed::AttentionShape shape{8, 2, 32, 1.0f / std::sqrt(32.0f), 0.0f};  // grouped heads
  const std::vector<int64_t> seq_begin = {0, 1, 18, 83, 100};  // lengths 1, 17, 65, 17
  const int64_t T = seq_begin.back();
  const std::vector<float> q = random_floats((size_t)(T * 8 * 32), 21, 1.0f);
  const std::vector<float> k = random_floats((size_t)(T * 2 * 32), 22, 1.0f);
  const std::vector<float> v = random_floats((size_t)(T * 2 * 32), 23, 1.0f);
  std::vector<float> out((size_t)(T * 8 * 32), NAN);
  embed::bidirectional_attention(shape, seq_begin, q.data(), k.data(), v.data(), out.data(), pool_);
  double worst = 0;
  for (size_t s = 0; s + 1 < seq_begin.size(); ++s)
    for (int64_t t = seq_begin[s]; t < seq_begin[s + 1]; ++t)
      for (int h = 0; h < 8; ++h) {
        const std::vector<double> want = attention_reference(shape, q.data(), k.data(), v.data(), t,
                                                             h, seq_begin[s], seq_begin[s + 1]);
        for (int i = 0; i < 32; ++i)
          worst = std::max(worst, std::fabs(want[(size_t)i] - out[(size_t)(t * 256 + h * 32 + i)]));
      }
  EXPECT_LT(worst, 2e-5);
}

}  // namespace
}  // namespace hablar::cpu
