// Q8_0 x Q8_0 in lane order on every instruction set against the scalar reference, bit for
// bit, over the shapes where the kernels' paths meet: the one-token path (8 rows at a time),
// the batched one (16 rows transposed, token tiles of 3, 2 and 1), row counts that leave every
// remainder, a row split over several threads, and weight codes of the whole int8 range
// (-128 included, which the quantizer never writes but a file may hold).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/matmul_internal.h"
#include "backend/cpu/ops.h"
#include "core/fp16.h"
#include "core/quant_blocks.h"

namespace hablar::cpu {
namespace {

// rows x cols Q8_0 weights with random codes in [-128, 127] and scales of varied magnitude.
std::vector<BlockQ8_0> random_q8_0(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> code(-128, 127);
  std::uniform_real_distribution<float> scale(-0.02f, 0.02f);
  std::vector<BlockQ8_0> blocks((size_t)(rows * cols / kQK));
  for (BlockQ8_0& b : blocks) {
    b.d = f32_to_fp16(scale(rng));
    for (int8_t& q : b.qs) q = (int8_t)code(rng);
  }
  return blocks;
}

std::vector<float> random_activations(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::vector<float> x((size_t)n);
  for (float& v : x) v = dist(rng);
  // Some blocks with one large value, so that most of their codes are small.
  for (int64_t i = 5; i < n; i += 97) x[(size_t)i] *= 40.0f;
  return x;
}

std::vector<Isa> simd_isas() {
  std::vector<Isa> isas;
  if (isa_kernels(Isa::kAvx2)) isas.push_back(Isa::kAvx2);
  if (isa_kernels(Isa::kAvx512)) isas.push_back(Isa::kAvx512);
  return isas;
}

void expect_equal_to_reference(int64_t rows, int64_t cols, int64_t n_tokens, int threads,
                               uint32_t seed) {
  const std::vector<BlockQ8_0> blocks = random_q8_0(rows, cols, seed);
  const size_t row_bytes = (size_t)(cols / kQK) * sizeof(BlockQ8_0);
  const WeightView w{DType::Q8_0, rows, cols, row_bytes,
                     reinterpret_cast<const uint8_t*>(blocks.data())};
  const std::vector<float> x = random_activations(n_tokens * cols, seed + 1);
  std::vector<float> want((size_t)(rows * n_tokens));
  matmul_reference(w, x.data(), n_tokens, want.data());
  ThreadPool pool(threads);
  for (Isa isa : simd_isas()) {
    std::vector<float> got(want.size(), NAN);
    matmul_with_isa(isa, w, x.data(), n_tokens, got.data(), pool);
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(got[i], want[i]) << isa_name(isa) << " rows " << rows << " cols " << cols
                                 << " tokens " << n_tokens << " threads " << threads << ": row "
                                 << (int64_t)i % rows << " token " << (int64_t)i / rows;
  }
}

TEST(MatmulQ8_0, EqualsReferenceForEveryTokenTileAndRowRemainder) {
  for (int64_t rows : {1, 8, 15, 16, 17, 31, 33}) {
    for (int64_t n_tokens : {1, 2, 3, 4, 5, 6, 7, 8}) {
      SCOPED_TRACE("rows " + std::to_string(rows) + " tokens " + std::to_string(n_tokens));
      expect_equal_to_reference(rows, 96, n_tokens, 1, 100 + (uint32_t)(rows * 16 + n_tokens));
    }
  }
}

TEST(MatmulQ8_0, EqualsReferenceOnModelShapesAndThreadSplits) {
  // Qwen2.5-0.5B's k/v width and FFN down input, a single block row, and prefill-sized batches.
  expect_equal_to_reference(128, 896, 1, 2, 1);
  expect_equal_to_reference(136, 896, 37, 3, 2);
  expect_equal_to_reference(40, 4864, 2, 2, 3);
  expect_equal_to_reference(24, 4864, 130, 2, 4);
  expect_equal_to_reference(200, 32, 11, 3, 5);
}

// The one-token path and the batched one give a token the same floats (batch invariance):
// token 0 alone equals token 0 among others, whatever the batch size.
TEST(MatmulQ8_0, TokenAloneEqualsTokenInBatches) {
  const int64_t rows = 45, cols = 512;
  const std::vector<BlockQ8_0> blocks = random_q8_0(rows, cols, 9);
  const WeightView w{DType::Q8_0, rows, cols, (size_t)(cols / kQK) * sizeof(BlockQ8_0),
                     reinterpret_cast<const uint8_t*>(blocks.data())};
  const std::vector<float> x = random_activations(20 * cols, 10);
  ThreadPool pool(2);
  std::vector<float> alone((size_t)rows);
  matmul(w, x.data(), 1, alone.data(), pool);
  for (int64_t n_tokens : {2, 3, 4, 7, 20}) {
    std::vector<float> batch((size_t)(rows * n_tokens));
    matmul(w, x.data(), n_tokens, batch.data(), pool);
    EXPECT_EQ(0, std::memcmp(alone.data(), batch.data(), sizeof(float) * (size_t)rows))
        << "tokens " << n_tokens;
  }
}

}  // namespace
}  // namespace hablar::cpu
