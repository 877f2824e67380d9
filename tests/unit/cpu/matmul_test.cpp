// matmul: every weight type on every instruction set against the scalar reference, the
// reference against plain float math on dequantized weights, batch invariance and the
// activation quantizers against core/quant.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/act_quant.h"
#include "backend/cpu/matmul_fused.h"
#include "backend/cpu/matmul_internal.h"
#include "backend/cpu/ops.h"
#include "core/error.h"
#include "core/fp16.h"
#include "core/quant.h"

namespace hablar::cpu {
namespace {

const DType kTypes[] = {DType::Q4_0,   DType::Q4_1,   DType::Q5_0, DType::Q5_1, DType::Q8_0,
                        DType::Q2_K,   DType::Q3_K,   DType::Q4_K, DType::Q5_K, DType::Q6_K,
                        DType::IQ4_NL, DType::IQ4_XS, DType::F16,  DType::BF16, DType::F32};

std::vector<float> random_values(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v((size_t)n);
  for (float& x : v) x = dist(rng);
  return v;
}

// A rows x cols matrix in `type`, quantized from random values with the reference quantizer.
struct Matrix {
  std::vector<uint8_t> bytes;
  std::vector<float> dequantized;  // what the weights decode to
  WeightView view;
};
Matrix make_matrix(DType type, int64_t rows, int64_t cols, uint32_t seed) {
  Matrix m;
  const size_t row_bytes = dtype_row_bytes(type, cols);
  m.bytes.resize(row_bytes * (size_t)rows);
  m.dequantized.resize((size_t)(rows * cols));
  const std::vector<float> src = random_values(rows * cols, seed, 0.5f);
  for (int64_t r = 0; r < rows; ++r) {
    quantize_row(type, src.data() + r * cols, m.bytes.data() + r * row_bytes, cols);
    dequantize_row(type, m.bytes.data() + r * row_bytes, m.dequantized.data() + r * cols, cols);
  }
  m.view = WeightView{type, rows, cols, row_bytes, m.bytes.data()};
  return m;
}

// sum_c |w[r][c] * x[t][c]|: the scale of the rounding error of one output.
std::vector<float> magnitudes(const Matrix& m, const std::vector<float>& x, int64_t n_tokens) {
  const int64_t rows = m.view.rows, cols = m.view.cols;
  std::vector<float> out((size_t)(rows * n_tokens));
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0;
      for (int64_t c = 0; c < cols; ++c)
        s += std::fabs((double)m.dequantized[r * cols + c] * x[t * cols + c]);
      out[t * rows + r] = (float)s;
    }
  return out;
}

std::vector<Isa> available_isas() {
  std::vector<Isa> isas{Isa::kScalar};
  if (isa_kernels(Isa::kAvx2)) isas.push_back(Isa::kAvx2);
  if (isa_kernels(Isa::kAvx512)) isas.push_back(Isa::kAvx512);
  return isas;
}

class MatmulType : public ::testing::TestWithParam<DType> {};

std::string type_param_name(const ::testing::TestParamInfo<DType>& info) {
  return std::string(dtype_name(info.param));
}

// Every ISA's kernel agrees with matmul_reference to float rounding: both use the same 8-bit
// activations and exact integer block sums, so only the order of the float additions
// differs. Tolerance: 1e-5 of sum |w * x| (plus 1e-6 absolute).
TEST_P(MatmulType, SimdMatchesReference) {
  const DType type = GetParam();
  ASSERT_TRUE(has_quantizer(type)) << dtype_name(type);
  const int64_t rows = 37, cols = 512, n_tokens = 11;  // odd sizes exercise tile remainders
  const Matrix m = make_matrix(type, rows, cols, 7);
  const std::vector<float> x = random_values(n_tokens * cols, 11);
  std::vector<float> want((size_t)(rows * n_tokens));
  matmul_reference(m.view, x.data(), n_tokens, want.data());
  const std::vector<float> mag = magnitudes(m, x, n_tokens);
  ThreadPool pool(2);
  for (Isa isa : available_isas()) {
    std::vector<float> got((size_t)(rows * n_tokens), NAN);
    matmul_with_isa(isa, m.view, x.data(), n_tokens, got.data(), pool);
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-5f * mag[i] + 1e-6f)
          << isa_name(isa) << " " << dtype_name(type) << " output " << i;
  }
}

// The 32-value formats and the K formats whose order is the same in every role (see
// matmul_reference.cpp): every ISA gives the reference's floats bit for bit, alone (the
// one-token path) and in batches that fill and leave remainders of every tile.
TEST(MatmulLaneOrder, SimdEqualsReferenceBitForBit) {
  ThreadPool pool(2);
  for (DType type : {DType::Q4_0, DType::IQ4_NL, DType::Q4_1, DType::Q5_0, DType::Q8_0, DType::Q5_K,
                     DType::Q6_K}) {
    for (int64_t rows : {7, 16, 45}) {
      const Matrix m = make_matrix(type, rows, 1024, 60 + (uint32_t)rows);
      for (int64_t n_tokens : {1, 2, 3, 9}) {
        const std::vector<float> x = random_values(n_tokens * 1024, 70 + (uint32_t)n_tokens);
        std::vector<float> want((size_t)(rows * n_tokens));
        matmul_reference(m.view, x.data(), n_tokens, want.data());
        for (Isa isa : available_isas()) {
          std::vector<float> got((size_t)(rows * n_tokens), NAN);
          matmul_with_isa(isa, m.view, x.data(), n_tokens, got.data(), pool);
          for (size_t i = 0; i < got.size(); ++i)
            ASSERT_EQ(got[i], want[i]) << isa_name(isa) << " " << dtype_name(type) << " rows "
                                       << rows << " tokens " << n_tokens << " output " << i;
        }
      }
    }
  }
}

// The K formats' orders chosen by the token's role (llama.cpp's batch place, ops.h): every
// ISA gives the reference's floats bit for bit for every role, with the roles mixed in one
// call (runs of each kernel) and a token alone, and the roles do change the sums.
TEST(MatmulKOrders, SimdEqualsReferenceBitForBitForEveryRole) {
  ThreadPool pool(2);
  const uint8_t kRoles[] = {0, kRoleBatchOf8, kRoleGroupOf4, kRoleBatchOf8 | kRoleGroupOf4};
  for (DType type : {DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    for (int64_t rows : {7, 16, 45}) {
      const Matrix m = make_matrix(type, rows, 1024, 80 + (uint32_t)rows);
      const int64_t n_tokens = 11;
      const std::vector<float> x = random_values(n_tokens * 1024, 90 + (uint32_t)rows);
      std::vector<uint8_t> roles((size_t)n_tokens);
      for (int64_t t = 0; t < n_tokens; ++t) roles[(size_t)t] = kRoles[(t / 2 + t) % 4];
      std::vector<float> want((size_t)(rows * n_tokens));
      matmul_reference(m.view, x.data(), n_tokens, want.data(), roles);
      std::vector<float> one_token((size_t)(rows * n_tokens));
      matmul_reference(m.view, x.data(), n_tokens, one_token.data());
      int differing = 0;
      for (size_t i = 0; i < want.size(); ++i) differing += want[i] != one_token[i];
      EXPECT_GT(differing, 0) << dtype_name(type) << ": the roles change no sum";
      for (Isa isa : available_isas()) {
        std::vector<float> got((size_t)(rows * n_tokens), NAN);
        matmul_with_isa(isa, m.view, x.data(), n_tokens, got.data(), pool, roles);
        for (size_t i = 0; i < got.size(); ++i)
          ASSERT_EQ(got[i], want[i])
              << isa_name(isa) << " " << dtype_name(type) << " rows " << rows << " output " << i;
        for (int64_t t = 0; t < n_tokens; ++t) {
          std::vector<float> alone((size_t)rows, NAN);
          matmul_with_isa(isa, m.view, x.data() + t * 1024, 1, alone.data(), pool,
                          TokenRoles(roles.data() + t, 1));
          for (int64_t r = 0; r < rows; ++r)
            ASSERT_EQ(alone[(size_t)r], want[(size_t)(t * rows + r)])
                << isa_name(isa) << " " << dtype_name(type) << " token " << t << " alone";
        }
      }
    }
  }
}

// The role of a token in a llama.cpp batch: 8 tokens or more take the batched K orders, and
// the last (size mod 4) tokens are left out of the 4-token groups.
TEST(MatmulKOrders, BatchRoles) {
  EXPECT_EQ(llama_batch_role(0, 1), 0);
  EXPECT_EQ(llama_batch_role(0, 4), kRoleGroupOf4);
  EXPECT_EQ(llama_batch_role(4, 6), 0);
  EXPECT_EQ(llama_batch_role(3, 6), kRoleGroupOf4);
  EXPECT_EQ(llama_batch_role(7, 8), kRoleBatchOf8 | kRoleGroupOf4);
  EXPECT_EQ(llama_batch_role(8, 9), kRoleBatchOf8);
  EXPECT_EQ(k_order_for(DType::Q4_K, kRoleBatchOf8), KOrder::kOneToken);
  EXPECT_EQ(k_order_for(DType::Q4_K, kRoleGroupOf4), KOrder::kGroupOf4);
  EXPECT_EQ(k_order_for(DType::Q6_K, kRoleBatchOf8), KOrder::kTiled);
  EXPECT_EQ(k_order_for(DType::Q5_K, kRoleGroupOf4), KOrder::kOneToken);
  EXPECT_EQ(k_order_for(DType::Q8_0, kRoleBatchOf8 | kRoleGroupOf4), KOrder::kOneToken);
}

// The reference itself computes the product of the decoded weights with x, up to the 8-bit
// quantization of x (relative error of the whole output under 1.2%), or its F16 rounding
// for F16 weights (under 5e-4); exact for F32 and BF16.
TEST_P(MatmulType, ReferenceMatchesFloatMath) {
  const DType type = GetParam();
  const int64_t rows = 16, cols = 768, n_tokens = 3;
  const Matrix m = make_matrix(type, rows, cols, 3);
  const std::vector<float> x = random_values(n_tokens * cols, 5);
  std::vector<float> got((size_t)(rows * n_tokens));
  matmul_reference(m.view, x.data(), n_tokens, got.data());
  double err = 0, norm = 0;
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t r = 0; r < rows; ++r) {
      double exact = 0;
      for (int64_t c = 0; c < cols; ++c)
        exact += (double)m.dequantized[r * cols + c] * x[t * cols + c];
      const double diff = got[t * rows + r] - exact;
      err += diff * diff;
      norm += exact * exact;
    }
  // Measured: about 0.006 for the 32-value formats, 0.009 for the K formats (Q8_K blocks),
  // 2.2e-4 for F16 (x rounded to F16, relative error up to 2^-11 per value), exact for F32 and
  // BF16 up to float rounding.
  const double tol = type == DType::F16 ? 5e-4 : act_kind_for(type) == ActKind::kF32 ? 1e-5 : 0.012;
  EXPECT_LT(std::sqrt(err / norm), tol) << dtype_name(type);
}

// A token's outputs are bit-identical whether it runs alone or inside any batch.
TEST_P(MatmulType, BatchInvariant) {
  const DType type = GetParam();
  const int64_t rows = 45, cols = 256;
  const Matrix m = make_matrix(type, rows, cols, 9);
  const std::vector<float> batch = random_values(13 * cols, 21);
  ThreadPool pool(2);
  std::vector<float> all((size_t)(13 * rows));
  matmul(m.view, batch.data(), 13, all.data(), pool);
  // Other batch sizes, the token at different places among other tokens.
  std::vector<float> other = random_values(9 * cols, 33);
  for (int64_t t = 0; t < 13; ++t) {
    std::vector<float> alone((size_t)rows);
    matmul(m.view, batch.data() + t * cols, 1, alone.data(), pool);
    ASSERT_EQ(0, std::memcmp(alone.data(), all.data() + t * rows, rows * sizeof(float)))
        << dtype_name(type) << " token " << t;
    const int64_t slot = t % 9;
    std::copy(batch.begin() + t * cols, batch.begin() + (t + 1) * cols,
              other.begin() + slot * cols);
    std::vector<float> mixed((size_t)(9 * rows));
    ThreadPool pool3(3);
    matmul(m.view, other.data(), 9, mixed.data(), pool3);
    ASSERT_EQ(0, std::memcmp(alone.data(), mixed.data() + slot * rows, rows * sizeof(float)))
        << dtype_name(type) << " token " << t << " in slot " << slot;
  }
}

// Decode-sized batches (1..5 tokens, where the one-token path and the batched kernels meet) on
// row counts that leave every remainder of the row groups: each ISA agrees with the reference,
// and each token's outputs equal, bit for bit, what that ISA gives for the token alone.
TEST_P(MatmulType, FewTokensOnOddRowCounts) {
  const DType type = GetParam();
  const int64_t cols = 512;
  ThreadPool pool(2);
  for (int64_t rows : {1, 5, 16, 23, 50}) {
    const Matrix m = make_matrix(type, rows, cols, 40 + (uint32_t)rows);
    for (int64_t n_tokens = 1; n_tokens <= 5; ++n_tokens) {
      const std::vector<float> x = random_values(n_tokens * cols, 50 + (uint32_t)n_tokens);
      std::vector<float> want((size_t)(rows * n_tokens));
      matmul_reference(m.view, x.data(), n_tokens, want.data());
      const std::vector<float> mag = magnitudes(m, x, n_tokens);
      for (Isa isa : available_isas()) {
        std::vector<float> got((size_t)(rows * n_tokens), NAN);
        matmul_with_isa(isa, m.view, x.data(), n_tokens, got.data(), pool);
        for (size_t i = 0; i < got.size(); ++i)
          ASSERT_NEAR(got[i], want[i], 1e-5f * mag[i] + 1e-6f)
              << isa_name(isa) << " " << dtype_name(type) << " rows " << rows << " tokens "
              << n_tokens << " output " << i;
        for (int64_t t = 0; t < n_tokens; ++t) {
          std::vector<float> alone((size_t)rows, NAN);
          matmul_with_isa(isa, m.view, x.data() + t * cols, 1, alone.data(), pool);
          ASSERT_EQ(0, std::memcmp(alone.data(), got.data() + t * rows, rows * sizeof(float)))
              << isa_name(isa) << " " << dtype_name(type) << " rows " << rows << " token " << t
              << " of " << n_tokens;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, MatmulType, ::testing::ValuesIn(kTypes), type_param_name);

// Large prefill shapes span several token chunks and every tile remainder.
TEST(Matmul, LargeBatchMatchesReference) {
  for (DType type : {DType::Q4_1, DType::Q4_K, DType::Q8_0}) {
    const int64_t rows = 21, cols = 2048, n_tokens = 150;
    const Matrix m = make_matrix(type, rows, cols, 1);
    const std::vector<float> x = random_values(n_tokens * cols, 2);
    std::vector<float> want((size_t)(rows * n_tokens)), got(want.size());
    matmul_reference(m.view, x.data(), n_tokens, want.data());
    ThreadPool pool(2);
    matmul(m.view, x.data(), n_tokens, got.data(), pool);
    const std::vector<float> mag = magnitudes(m, x, n_tokens);
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 1e-5f * mag[i] + 1e-6f) << dtype_name(type) << " " << i;
  }
}

// The activation quantizers round as llama.cpp's x86 ones do (qs = round-to-even(x * 127 /
// amax)), which can differ by one code from the file format's reference quantizer (core/
// quant.h: x * (1 / d), ties away from zero); every SIMD form equals the scalar one bit for
// bit, and the Q8_K rows equal the reference's.
TEST(ActivationQuant, SimdMatchesScalarAndRoundsTiesToEven) {
  const int64_t n = 1024;
  std::vector<float> x = random_values(n, 17, 3.0f);
  // Block 0: amax 127 makes the multiplier exactly 1, so k + 0.5 are exact ties.
  for (int i = 0; i < 32; ++i) x[(size_t)i] = (float)(i - 16) + 0.5f;
  x[31] = 127.0f;
  for (int i = 64; i < 96; ++i) x[(size_t)i] = 0.0f;  // an all-zero block
  std::vector<uint8_t> want(act_row_bytes(ActKind::kAct32, n));
  quantize_act32_scalar(x.data(), n, want.data());
  const Act32Row w = act32_row(want.data(), n);
  for (int i = 0; i < 31; ++i) {
    const float v = (float)(i - 16) + 0.5f;
    EXPECT_EQ(w.qs[i], (int)std::nearbyint(v)) << "tie " << v << " rounds to even";
  }
  EXPECT_EQ(w.d[2], 0.0f);
  std::vector<BlockQ8_0> q80((size_t)n / kQK);
  std::vector<BlockQ8_K> q8k((size_t)n / kQK_K);
  quantize_row(DType::Q8_0, x.data(), q80.data(), n);
  quantize_row(DType::Q8_K, x.data(), q8k.data(), n);
  for (int64_t b = 0; b < n / kQK; ++b) {
    ASSERT_EQ(w.d[b], fp16_to_f32(q80[(size_t)b].d)) << "block " << b;
    int sum = 0;
    for (int j = 0; j < kQK; ++j) {
      ASSERT_LE(std::abs(w.qs[b * kQK + j] - q80[(size_t)b].qs[j]), 1) << "block " << b;
      sum += w.qs[b * kQK + j];
    }
    ASSERT_EQ(w.sum[b], sum);
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[(size_t)(b * kQK + j)]));
    ASSERT_EQ(w.s[b], fp16_to_f32(f32_to_fp16((float)sum * (amax / 127.0f)))) << "block " << b;
  }
  std::vector<BlockQ8_K> q8k_scalar((size_t)n / kQK_K);
  quantize_q8k_scalar(x.data(), n, q8k_scalar.data());
  for (size_t b = 0; b < q8k.size(); ++b) {
    ASSERT_EQ(q8k_scalar[b].d, q8k[b].d);
    ASSERT_EQ(0, std::memcmp(q8k_scalar[b].qs, q8k[b].qs, kQK_K));
    ASSERT_EQ(0, std::memcmp(q8k_scalar[b].bsums, q8k[b].bsums, sizeof q8k[b].bsums));
  }
  for (Isa isa : available_isas()) {
    const IsaKernels& k = *isa_kernels(isa);
    std::vector<uint8_t> row(act_row_bytes(ActKind::kAct32, n));
    k.quantize_act32(x.data(), n, row.data());
    ASSERT_EQ(0, std::memcmp(row.data(), want.data(), row.size())) << isa_name(isa);
    std::vector<BlockQ8_K> mine((size_t)n / kQK_K);
    k.quantize_q8k(x.data(), n, mine.data());
    for (size_t b = 0; b < mine.size(); ++b) {
      ASSERT_EQ(mine[b].d, q8k[b].d) << isa_name(isa);
      ASSERT_EQ(0, std::memcmp(mine[b].qs, q8k[b].qs, kQK_K)) << isa_name(isa);
      ASSERT_EQ(0, std::memcmp(mine[b].bsums, q8k[b].bsums, sizeof mine[b].bsums)) << isa_name(isa);
    }
  }
}

TEST(Matmul, ThreadCountDoesNotChangeResults) {
  const Matrix m = make_matrix(DType::Q4_K, 100, 512, 4);
  const std::vector<float> x = random_values(5 * 512, 8);
  std::vector<float> one(500), three(500);
  ThreadPool p1(1), p3(3);
  matmul(m.view, x.data(), 5, one.data(), p1);
  matmul(m.view, x.data(), 5, three.data(), p3);
  EXPECT_EQ(0, std::memcmp(one.data(), three.data(), one.size() * sizeof(float)));
}

// One input through several weights at once (q/k/v; gate/up with SwiGLU) gives exactly what
// separate matmuls give, for weights of different types and activation kinds.
TEST(Matmul, ManyAndSwigluMatchSeparateCalls) {
  ThreadPool pool(2);
  const int64_t cols = 512;
  const Matrix a = make_matrix(DType::Q5_0, 48, cols, 61);
  const Matrix b = make_matrix(DType::Q8_0, 23, cols, 62);
  const Matrix c = make_matrix(DType::Q4_K, 16, cols, 63);
  const Matrix gate = make_matrix(DType::Q4_1, 37, cols, 64);
  const Matrix up = make_matrix(DType::Q6_K, 37, cols, 65);
  for (int64_t n_tokens : {1, 3, 20}) {
    const std::vector<float> x = random_values(n_tokens * cols, 66);
    std::vector<float> ya(a.view.rows * n_tokens), yb(b.view.rows * n_tokens),
        yc(c.view.rows * n_tokens);
    const MatmulTarget targets[] = {
        {&a.view, ya.data()}, {&b.view, yb.data()}, {&c.view, yc.data()}};
    matmul_many(targets, x.data(), n_tokens, pool);
    for (const MatmulTarget& t : targets) {
      std::vector<float> want(t.w->rows * n_tokens);
      matmul(*t.w, x.data(), n_tokens, want.data(), pool);
      ASSERT_EQ(0, std::memcmp(want.data(), t.y, want.size() * sizeof(float)))
          << dtype_name(t.w->type) << " tokens " << n_tokens;
    }
    std::vector<float> fused(gate.view.rows * n_tokens), scratch(fused.size());
    matmul_glu(gate.view, up.view, x.data(), n_tokens, fused.data(), scratch.data(), pool);
    std::vector<float> g(fused.size()), u(fused.size());
    matmul(gate.view, x.data(), n_tokens, g.data(), pool);
    matmul(up.view, x.data(), n_tokens, u.data(), pool);
    swiglu(g.data(), u.data(), g.data(), (int64_t)g.size());
    ASSERT_EQ(0, std::memcmp(g.data(), fused.data(), g.size() * sizeof(float)))
        << "tokens " << n_tokens;
  }
  const Matrix narrow = make_matrix(DType::Q8_0, 8, 256, 67);
  std::vector<float> x(cols), y(64);
  const MatmulTarget mixed[] = {{&a.view, y.data()}, {&narrow.view, y.data()}};
  EXPECT_THROW(matmul_many(mixed, x.data(), 1, pool), Error);
  EXPECT_THROW(matmul_glu(gate.view, a.view, x.data(), 1, y.data(), y.data(), pool), Error);
}

// matmul_grouped: products of different weights over different inputs and token counts
// (a mixture of experts' step, decode and prefill sizes), each bit-identical to matmul /
// matmul_glu with the same roles; a product with no tokens is skipped.
TEST(Matmul, GroupedEqualsOneProductAtATime) {
  ThreadPool pool(3);
  const int64_t cols = 512;
  const Matrix g0 = make_matrix(DType::Q4_K, 96, cols, 71),
               u0 = make_matrix(DType::Q4_K, 96, cols, 72);
  const Matrix g1 = make_matrix(DType::Q6_K, 96, cols, 73),
               u1 = make_matrix(DType::Q6_K, 96, cols, 74);
  const Matrix d0 = make_matrix(DType::Q8_0, 40, cols, 75);
  for (int64_t n : {1, 2, 7}) {
    const std::vector<float> x0 = random_values(n * cols, 80 + (uint32_t)n);
    const std::vector<float> x1 = random_values((n + 1) * cols, 90 + (uint32_t)n);
    const std::vector<uint8_t> r0((size_t)n, llama_batch_role(0, 1)), r1((size_t)n + 1, 0);
    std::vector<float> y0((size_t)(n * 96)), s0(y0.size()), y1((size_t)((n + 1) * 96)),
        s1(y1.size()), y2((size_t)(n * 40));
    const GroupedProduct products[] = {
        {&g0.view, &u0.view, x0.data(), n, y0.data(), s0.data(), TokenRoles(r0)},
        {&d0.view, nullptr, x0.data(), 0, nullptr, nullptr, {}},
        {&g1.view, &u1.view, x1.data(), n + 1, y1.data(), s1.data(), TokenRoles(r1)},
        {&d0.view, nullptr, x0.data(), n, y2.data(), nullptr, TokenRoles(r0)}};
    matmul_grouped(products, pool);
    std::vector<float> want(y0.size()), scratch(y0.size());
    matmul_glu(g0.view, u0.view, x0.data(), n, want.data(), scratch.data(), pool, r0);
    ASSERT_EQ(0, std::memcmp(want.data(), y0.data(), want.size() * 4)) << "tokens " << n;
    want.resize(y1.size()), scratch.resize(y1.size());
    matmul_glu(g1.view, u1.view, x1.data(), n + 1, want.data(), scratch.data(), pool, r1);
    ASSERT_EQ(0, std::memcmp(want.data(), y1.data(), want.size() * 4)) << "tokens " << n;
    want.resize(y2.size());
    matmul(d0.view, x0.data(), n, want.data(), pool, r0);
    ASSERT_EQ(0, std::memcmp(want.data(), y2.data(), want.size() * 4)) << "tokens " << n;
  }
  // A gated pair of unequal rows is refused.
  std::vector<float> x(cols), y(96), sc(96);
  const GroupedProduct bad[] = {{&g0.view, &d0.view, x.data(), 1, y.data(), sc.data(), {}}};
  EXPECT_THROW(matmul_grouped(bad, pool), Error);
}

TEST(Matmul, RejectsBadInput) {
  ThreadPool pool(1);
  std::vector<uint8_t> bytes(4096);
  std::vector<float> x(512), y(16);
  const WeightView iq2{DType::IQ2_XXS, 1, 256, 66, bytes.data()};
  try {
    matmul(iq2, x.data(), 1, y.data(), pool);
    FAIL() << "IQ2_XXS accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("iq2_xxs"), std::string::npos) << e.what();
  }
  // Q4_K rows need a multiple of 256 columns.
  const WeightView q4k{DType::Q4_K, 1, 96, 144, bytes.data()};
  EXPECT_THROW(matmul(q4k, x.data(), 1, y.data(), pool), Error);
  const WeightView null_data{DType::F32, 1, 4, 16, nullptr};
  EXPECT_THROW(matmul(null_data, x.data(), 1, y.data(), pool), Error);
  EXPECT_FALSE(matmul_supports(DType::IQ2_XXS));
  EXPECT_TRUE(matmul_supports(DType::Q6_K));
  // One role per token, or none.
  const WeightView f32{DType::F32, 1, 4, 16, bytes.data()};
  const uint8_t roles[3] = {};
  EXPECT_THROW(matmul(f32, x.data(), 2, y.data(), pool, TokenRoles(roles, 3)), Error);
  EXPECT_THROW(matmul_reference(f32, x.data(), 2, y.data(), TokenRoles(roles, 1)), Error);
}

}  // namespace
}  // namespace hablar::cpu
