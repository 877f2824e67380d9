// The Q6_K half-unit arithmetic of the int8 decode product (q6k_unit.cuh, __host__
// __device__) run on the host against the kernels' reference dequantizer
// QuantTraits<Q6_K>::unit: exact in integers (d = 1), and in floats with the product's
// activation scales. Needs nvcc to build (quant_device.cuh), no GPU to run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/q6k_unit.cuh"
#include "backend/cuda/quant_device.cuh"
#include "quant_test_data.h"

namespace hablar::test {
namespace {

using cuda::q6k::HalfUnit;

int quarter_dot_at(const HalfUnit& u, int q, const int* x) {
  switch (q) {
    case 0:
      return cuda::q6k::quarter_dot<0>(u, x);
    case 1:
      return cuda::q6k::quarter_dot<1>(u, x);
    case 2:
      return cuda::q6k::quarter_dot<2>(u, x);
    default:
      return cuda::q6k::quarter_dot<3>(u, x);
  }
}

int8_t code_byte(const int (&x)[32], int i) {
  return (int8_t)(x[i / 4] >> (8 * (i % 4)));
}

// Random int8 codes, four to a word, the full range -128..127 included.
void random_codes(std::mt19937& rng, int (&x)[32]) {
  std::uniform_int_distribution<int> byte(0, 255);
  for (int& word : x) {
    uint32_t w = 0;
    for (int b = 0; b < 4; ++b) w |= (uint32_t)byte(rng) << (8 * b);
    word = (int)w;
  }
}

// A row of three super-blocks placed 16 + `shift` bytes into a padded buffer, so that the
// blocks start at both 4-byte aligned and 2-mod-4 addresses (the kernel's shared copies see
// both), with d = 1 when `unit_d` (every weight then an exact integer s * (q6 - 32)).
struct PlacedRow {
  static constexpr int64_t kCols = 768;
  std::vector<uint8_t> buffer;
  const uint8_t* row;
  PlacedRow(uint32_t seed, int shift, bool unit_d) : buffer(16 + 3 * 210 + 32) {
    auto bytes = random_weight_bytes(DType::Q6_K, 1, kCols, seed);
    if (unit_d)
      for (int b = 0; b < 3; ++b) put_half(bytes.data() + 210 * b + 208, 1.0f);
    std::memcpy(buffer.data() + 16 + shift, bytes.data(), bytes.size());
    row = buffer.data() + 16 + shift;
  }
};

TEST(Q6KUnitOnHost, QuarterDotsAreExactIntegers) {
  std::mt19937 rng(7);
  for (int shift : {0, 2}) {
    const PlacedRow placed(11u + (uint32_t)shift, shift, /*unit_d=*/true);
    for (int b = 0; b < 3; ++b)
      for (int half = 0; half < 2; ++half) {
        const HalfUnit u = cuda::q6k::load_half_unit(placed.row + 210 * b, half);
        for (int q = 0; q < 4; ++q) {
          float w[32];
          cuda::QuantTraits<DType::Q6_K>::unit(placed.row + 210 * b, 4 * half + q, w);
          int x[32];
          random_codes(rng, x);
          int64_t want = 0, x32 = 0;
          for (int i = 0; i < 32; ++i) {
            want += (int64_t)w[i] * code_byte(x, i);
            x32 += code_byte(x, i);
          }
          const int s1 = cuda::q6k::scale_of(u, 2 * q + 1);
          ASSERT_EQ(quarter_dot_at(u, q, x + 0) - 32 * (int64_t)s1 * x32, want)
              << "block " << b << " half " << half << " quarter " << q << " shift " << shift;
        }
      }
  }
}

// The kernel's per-lane result: the four quarters against codes whose blocks have random
// scales dx (sx = dx * sum of codes, as the quantizer stores it), times the block's d.
TEST(Q6KUnitOnHost, HalfUnitDotMatchesTheDequantizedProduct) {
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> scale(0.001f, 0.05f);
  for (int shift : {0, 2}) {
    const PlacedRow placed(21u + (uint32_t)shift, shift, /*unit_d=*/false);
    for (int b = 0; b < 3; ++b)
      for (int half = 0; half < 2; ++half) {
        int x[32];
        random_codes(rng, x);
        float2 xs[4];
        double want = 0, magnitude = 0;
        for (int q = 0; q < 4; ++q) {
          float w[32];
          cuda::QuantTraits<DType::Q6_K>::unit(placed.row + 210 * b, 4 * half + q, w);
          const float dx = scale(rng);
          int sum = 0;
          for (int i = 0; i < 32; ++i) {
            const int c = code_byte(x, 32 * q + i);
            sum += c;
            want += (double)w[i] * dx * c;
            magnitude += std::fabs((double)w[i] * dx * c);
          }
          xs[q] = make_float2(dx, dx * (float)sum);
        }
        const HalfUnit u = cuda::q6k::load_half_unit(placed.row + 210 * b, half);
        const float got = cuda::q6k::half_unit_dot(u, x, xs);
        // Float rounding only, a few 1e-7 of the magnitude: the decoding is checked exactly
        // above; this checks how the quarters, their dx and sx and the block's d combine.
        EXPECT_NEAR(got, want, 2e-6 * magnitude)
            << "block " << b << " half " << half << " shift " << shift;
      }
  }
}

}  // namespace
}  // namespace hablar::test
