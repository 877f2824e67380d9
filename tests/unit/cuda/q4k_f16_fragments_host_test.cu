// The fragment mapping of the f16 tensor-core Q4_K product (q4k_f16_fragments.cuh) checked on
// the host: a whole warp's A and B registers are built with the kernel's functions
// (nibble_pairs, scale_min_pair, stored_index) exactly as matmul_q4k_f16.cu loads them, then
// multiplied as the PTX layout of mma.m16n8k16 defines, and the result compared with the
// reference dequantizer's dot products. Needs nvcc to build, no GPU to run.
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/q4k_f16_fragments.cuh"
#include "backend/cuda/quant_device.cuh"
#include "quant_test_data.h"

namespace hablar::test {
namespace {

namespace frag = cuda::q4k_f16;

uint32_t word_at(const uint8_t* p) {
  uint32_t w;
  std::memcpy(&w, p, 4);
  return w;
}

// The two f16 halves of a 32-bit pair, as floats.
void halves(uint32_t bits, float* low, float* high) {
  __half h[2];
  std::memcpy(h, &bits, 4);
  *low = __half2float(h[0]);
  *high = __half2float(h[1]);
}

TEST(Q4kF16Fragments, ScaleMinPairsEqualTheReferenceDecoding) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int trial = 0; trial < 200; ++trial) {
    uint8_t scales[12];
    for (auto& b : scales) b = (uint8_t)byte(rng);
    for (int s = 0; s < 8; ++s) {
      float want_scale, want_min, scale, min;
      cuda::k_scale_min(scales, s, &want_scale, &want_min);
      halves(frag::scale_min_pair(word_at(scales), word_at(scales + 4), word_at(scales + 8), s),
             &scale, &min);
      EXPECT_EQ(scale - 1024.0f, want_scale) << s;
      EXPECT_EQ(min - 1024.0f, want_min) << s;
    }
  }
}

TEST(Q4kF16Fragments, StoredOrderIsAPermutationOfEachGroupOfFour) {
  for (int i = 0; i < 256; ++i) {
    EXPECT_EQ(frag::stored_index(frag::stored_index(i)), i);
    EXPECT_EQ(frag::stored_index(i) / 4, i / 4);
  }
}

// One warp's mma.m16n8k16 instructions over a super-block of 16 weight rows and 8 activation
// rows, registers built as the kernel builds them, multiplied per the PTX fragment layout.
TEST(Q4kF16Fragments, WarpProductEqualsTheReferenceDotProducts) {
  constexpr int kRows = 16, kTokens = 8, kK = 256;
  const auto bytes = random_weight_bytes(DType::Q4_K, kRows, kK, 77u);
  const auto weights = dequantize_matrix(DType::Q4_K, bytes, kRows, kK);
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> value(-2.0f, 2.0f);
  std::vector<float> x(kTokens * kK), stored(kTokens * kK);
  for (auto& v : x) v = value(rng);
  for (int t = 0; t < kTokens; ++t)
    for (int i = 0; i < kK; ++i) stored[t * kK + frag::stored_index(i)] = x[t * kK + i];

  double c[kRows][kTokens] = {};
  for (int s = 0; s < 8; ++s)
    for (int h = 0; h < 2; ++h) {
      double a[kRows][16], b[16][kTokens];
      int a_set[kRows][16] = {}, b_set[16][kTokens] = {};
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4, q = lane % 4;
        for (int hr = 0; hr < 2; ++hr) {  // a0 / a2 for row g, a1 / a3 for row g + 8
          const int row = g + 8 * hr;
          const uint8_t* block = bytes.data() + row * sizeof(BlockQ4_K);
          float d, dmin, scale, min;
          halves(word_at(block), &d, &dmin);
          halves(
              frag::scale_min_pair(word_at(block + 4), word_at(block + 8), word_at(block + 12), s),
              &scale, &min);
          const frag::NibblePairs p =
              frag::nibble_pairs(word_at(block + 16 + 32 * (s / 2) + 16 * h + 4 * q), s % 2);
          const uint32_t regs[2] = {p.v02, p.v13};  // logical k 2q, 2q+1 and 2q+8, 2q+9
          for (int r = 0; r < 2; ++r) {
            float n_low, n_high;
            halves(regs[r], &n_low, &n_high);
            const double step = (double)d * (scale - 1024.0f),
                         base = (double)dmin * (min - 1024.0f);
            a[row][2 * q + 8 * r] = step * (n_low - 1024.0f) - base;
            a[row][2 * q + 8 * r + 1] = step * (n_high - 1024.0f) - base;
            ++a_set[row][2 * q + 8 * r], ++a_set[row][2 * q + 8 * r + 1];
          }
        }
        // b0, b1: the 8-byte load at value 16h + 4q of token g's stored row.
        const float* at = stored.data() + g * kK + 32 * s + 16 * h + 4 * q;
        b[2 * q][g] = at[0], b[2 * q + 1][g] = at[1], b[2 * q + 8][g] = at[2],
              b[2 * q + 9][g] = at[3];
        for (int k : {2 * q, 2 * q + 1, 2 * q + 8, 2 * q + 9}) ++b_set[k][g];
      }
      for (int r = 0; r < kRows; ++r)
        for (int k = 0; k < 16; ++k) ASSERT_EQ(a_set[r][k], 1) << "A " << r << "," << k;
      for (int k = 0; k < 16; ++k)
        for (int t = 0; t < kTokens; ++t) ASSERT_EQ(b_set[k][t], 1) << "B " << k << "," << t;
      for (int r = 0; r < kRows; ++r)
        for (int t = 0; t < kTokens; ++t)
          for (int k = 0; k < 16; ++k) c[r][t] += a[r][k] * b[k][t];
    }
  for (int r = 0; r < kRows; ++r)
    for (int t = 0; t < kTokens; ++t) {
      double want = 0, magnitude = 0;
      for (int i = 0; i < kK; ++i) {
        want += (double)weights[r * kK + i] * x[t * kK + i];
        magnitude += std::fabs((double)weights[r * kK + i] * x[t * kK + i]);
      }
      EXPECT_NEAR(c[r][t], want, 1e-5 * magnitude) << "row " << r << " token " << t;
    }
}

}  // namespace
}  // namespace hablar::test
