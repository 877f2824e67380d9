// The fragment mappings of the f16 tensor-core products (q4k_f16_fragments.cuh,
// q6k_f16_fragments.cuh) checked on the host: a whole warp's A and B registers are built with
// the kernel's functions (nibble_pairs, scale_min_pair, six_bit_pairs, stored_index and the
// offsets) exactly as f16_weight_formats.cuh loads them, then multiplied as the PTX layout of
// mma.m16n8k16 defines, and the result compared with the reference dequantizer's dot
// products. Needs nvcc to build, no GPU to run.
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/q4k_f16_fragments.cuh"
#include "backend/cuda/q6k_f16_fragments.cuh"
#include "backend/cuda/quant_device.cuh"
#include "quant_test_data.h"

namespace hablar::test {
namespace {

namespace frag = cuda::q4k_f16;
namespace frag6 = cuda::q6k_f16;

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

constexpr int kRows = 16, kTokens = 8, kK = 256;

// One mma.m16n8k16 instruction being assembled: every A and B element must be set once.
struct Instruction {
  double a[kRows][16] = {}, b[16][kTokens] = {};
  int a_set[kRows][16] = {}, b_set[16][kTokens] = {};
  // The two values of an f16 pair register of row `row` (logical k `k` and k + 1), each
  // mapped by `value` from the f16 the register holds.
  template <typename Value>
  void set_a(int row, int k, uint32_t pair, Value value) {
    float low, high;
    halves(pair, &low, &high);
    a[row][k] = value(low), a[row][k + 1] = value(high);
    ++a_set[row][k], ++a_set[row][k + 1];
  }
  // b0, b1 of lane (g, q): the 8-byte load at value `at` of token g's stored row, as logical
  // k 2q, 2q + 1, 2q + 8, 2q + 9.
  void set_b(const std::vector<float>& stored, int g, int q, int at) {
    const float* v = stored.data() + g * kK + at;
    b[2 * q][g] = v[0], b[2 * q + 1][g] = v[1], b[2 * q + 8][g] = v[2], b[2 * q + 9][g] = v[3];
    for (int k : {2 * q, 2 * q + 1, 2 * q + 8, 2 * q + 9}) ++b_set[k][g];
  }
  void multiply_into(double (&c)[kRows][kTokens]) const {
    for (int r = 0; r < kRows; ++r)
      for (int k = 0; k < 16; ++k) ASSERT_EQ(a_set[r][k], 1) << "A " << r << "," << k;
    for (int k = 0; k < 16; ++k)
      for (int t = 0; t < kTokens; ++t) ASSERT_EQ(b_set[k][t], 1) << "B " << k << "," << t;
    for (int r = 0; r < kRows; ++r)
      for (int t = 0; t < kTokens; ++t)
        for (int k = 0; k < 16; ++k) c[r][t] += a[r][k] * b[k][t];
  }
};

// Activation rows of one super-block, and the same in the stored order the kernel loads.
struct Activations {
  std::vector<float> x, stored;
  Activations() : x(kTokens * kK), stored(kTokens * kK) {
    std::mt19937 rng(9);
    std::uniform_real_distribution<float> value(-2.0f, 2.0f);
    for (auto& v : x) v = value(rng);
    for (int t = 0; t < kTokens; ++t)
      for (int i = 0; i < kK; ++i) stored[t * kK + frag::stored_index(i)] = x[t * kK + i];
  }
};

void expect_reference_products(const std::vector<float>& weights, const std::vector<float>& x,
                               const double (&c)[kRows][kTokens]) {
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

// One warp's instructions over a Q4_K super-block of 16 weight rows and 8 activation rows,
// registers built as the kernel builds them, multiplied per the PTX fragment layout.
TEST(Q4kF16Fragments, WarpProductEqualsTheReferenceDotProducts) {
  const auto bytes = random_weight_bytes(DType::Q4_K, kRows, kK, 77u);
  const Activations act;
  double c[kRows][kTokens] = {};
  for (int s = 0; s < 8; ++s)
    for (int h = 0; h < 2; ++h) {
      Instruction in;
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
          const double step = (double)d * (scale - 1024.0f), base = (double)dmin * (min - 1024.0f);
          auto value = [&](float n) { return step * (n - 1024.0f) - base; };
          const frag::NibblePairs p =
              frag::nibble_pairs(word_at(block + 16 + 32 * (s / 2) + 16 * h + 4 * q), s % 2);
          in.set_a(row, 2 * q, p.v02, value);
          in.set_a(row, 2 * q + 8, p.v13, value);
        }
        in.set_b(act.stored, g, q, 32 * s + 16 * h + 4 * q);
      }
      in.multiply_into(c);
    }
  expect_reference_products(dequantize_matrix(DType::Q4_K, bytes, kRows, kK), act.x, c);
}

// The same for a Q6_K super-block: per half-block n, group c and half h one instruction whose
// 16 values share the scale of sub-block sub_block(n, c, h).
TEST(Q6kF16Fragments, WarpProductEqualsTheReferenceDotProducts) {
  const auto bytes = random_weight_bytes(DType::Q6_K, kRows, kK, 78u);
  const Activations act;
  double c[kRows][kTokens] = {};
  for (int n = 0; n < 2; ++n)
    for (int group = 0; group < 4; ++group)
      for (int h = 0; h < 2; ++h) {
        Instruction in;
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane / 4, q = lane % 4;
          for (int hr = 0; hr < 2; ++hr) {
            const int row = g + 8 * hr;
            const auto* block =
                reinterpret_cast<const BlockQ6_K*>(bytes.data() + row * sizeof(BlockQ6_K));
            const uint8_t* raw = bytes.data() + row * sizeof(BlockQ6_K);
            __half d;
            std::memcpy(&d, &block->d, 2);
            const double scale =
                (double)__half2float(d) * block->scales[frag6::sub_block(n, group, h)];
            auto value = [&](float v) { return scale * (v - 1056.0f); };
            const frag::NibblePairs p =
                frag6::six_bit_pairs(word_at(raw + frag6::ql_offset(n, group, h, q)),
                                     word_at(raw + frag6::qh_offset(n, h, q)), group);
            in.set_a(row, 2 * q, p.v02, value);
            in.set_a(row, 2 * q + 8, p.v13, value);
          }
          in.set_b(act.stored, g, q, 128 * n + 32 * group + 16 * h + 4 * q);
        }
        in.multiply_into(c);
      }
  expect_reference_products(dequantize_matrix(DType::Q6_K, bytes, kRows, kK), act.x, c);
}

}  // namespace
}  // namespace hablar::test
