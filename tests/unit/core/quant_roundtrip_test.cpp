// quantize_row -> dequantize_row error bounds for every format with a quantizer, over many
// random rows, plus edge cases (zeros, constants, huge and tiny magnitudes, outliers) and
// the API's error handling.
//
// Two bounds per format, both measured on Gaussian rows:
//  - relative RMSE: sqrt(mean((x - x')^2)) / sqrt(mean(x^2)) over all rows;
//  - worst error in a block relative to that block's largest |x| (the quantity the block's
//    scale is derived from).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/fp16.h"
#include "core/quant.h"

namespace hablar {
namespace {

constexpr int64_t kRowLength = 1024;  // a multiple of every block size
constexpr int kRows = 256;

struct FormatBounds {
  DType type;
  double rmse;       // bound on relative RMSE for Gaussian data
  double block_max;  // bound on max |error| in a block / max |x| in the block
};

// Bounds for the 32-value formats follow from the format: half a step, or a full step on
// the side that the code range clips (Q4_0, Q5_0: the extreme maps to -8 / -16, so +max
// rounds to code 7 / 15), plus the half rounding of the stored scale. The others sit 10-25%
// above the measured values (printed by the test); the K-quants' and IQ4's scale fits may
// clip a block's outliers, hence their larger worst-case block errors.
const FormatBounds kBounds[] = {
    {DType::F32, 0.0, 0.0},         {DType::F16, 3.0e-4, 4.9e-4},  // 2^-11
    {DType::BF16, 2.3e-3, 3.91e-3},                                // 2^-8
    {DType::Q4_0, 0.095, 0.1265},                                  // 1/8 (clipped side)
    {DType::Q4_1, 0.088, 0.070},    // (2/15)/2 + rounding of the stored min
    {DType::Q5_0, 0.048, 0.064},    // 1/16 (clipped side)
    {DType::Q5_1, 0.043, 0.034},    // (2/31)/2
    {DType::Q8_0, 0.0060, 0.0045},  // (1/127)/2 + 127 * half rounding of d
    {DType::Q8_1, 0.0060, 0.0045},  {DType::Q2_K, 0.33, 0.42},    {DType::Q3_K, 0.17, 0.22},
    {DType::Q4_K, 0.080, 0.10},     {DType::Q5_K, 0.040, 0.055},  {DType::Q6_K, 0.020, 0.019},
    {DType::Q8_K, 0.0078, 0.0040},  // (1/127)/2, float scale
    {DType::IQ4_NL, 0.085, 0.135},  {DType::IQ4_XS, 0.085, 0.11},
};

std::string name_of(DType t) {
  return std::string(dtype_name(t));
}

std::vector<float> round_trip(DType type, const std::vector<float>& x) {
  const auto n = (int64_t)x.size();
  std::vector<uint8_t> packed(dtype_row_bytes(type, n));
  quantize_row(type, x.data(), packed.data(), n);
  std::vector<float> y((size_t)n);
  dequantize_row(type, packed.data(), y.data(), n);
  return y;
}

struct ErrorStats {
  double relative_rmse = 0;
  double worst_block = 0;  // max over blocks of max|err| / max|x|
  bool all_finite = true;
};

ErrorStats measure(DType type, const std::vector<std::vector<float>>& rows) {
  const int block = (int)dtype_traits(type).block_elems;
  double err2 = 0, x2 = 0;
  ErrorStats stats;
  for (const auto& x : rows) {
    const std::vector<float> y = round_trip(type, x);
    for (size_t b = 0; b < x.size(); b += (size_t)std::max(block, 32)) {
      double block_amax = 0, block_err = 0;
      for (size_t i = b; i < b + (size_t)std::max(block, 32); ++i) {
        if (!std::isfinite(y[i])) stats.all_finite = false;
        const double e = (double)y[i] - (double)x[i];
        err2 += e * e;
        x2 += (double)x[i] * x[i];
        block_amax = std::max(block_amax, std::fabs((double)x[i]));
        block_err = std::max(block_err, std::fabs(e));
      }
      if (block_amax > 0) stats.worst_block = std::max(stats.worst_block, block_err / block_amax);
    }
  }
  stats.relative_rmse = x2 > 0 ? std::sqrt(err2 / x2) : std::sqrt(err2);
  return stats;
}

std::vector<std::vector<float>> gaussian_rows(int n_rows, double sigma, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, (float)sigma);
  std::vector<std::vector<float>> rows((size_t)n_rows, std::vector<float>(kRowLength));
  for (auto& row : rows)
    for (float& v : row) v = normal(rng);
  return rows;
}

TEST(QuantRoundTrip, GaussianRowsWithinBounds) {
  const auto rows = gaussian_rows(kRows, 1.0, 7);
  for (const FormatBounds& f : kBounds) {
    ASSERT_TRUE(has_quantizer(f.type)) << name_of(f.type);
    const ErrorStats s = measure(f.type, rows);
    std::printf(
        "%-7s relative RMSE %.3e (bound %.1e)  worst block error / block max %.3e "
        "(bound %.1e)\n",
        name_of(f.type).c_str(), s.relative_rmse, f.rmse, s.worst_block, f.block_max);
    EXPECT_TRUE(s.all_finite) << name_of(f.type);
    EXPECT_LE(s.relative_rmse, f.rmse) << name_of(f.type);
    EXPECT_LE(s.worst_block, f.block_max) << name_of(f.type);
  }
}

}  // namespace
}  // namespace hablar

namespace hablar {
namespace {

std::vector<DType> quantizable_types() {
  std::vector<DType> out;
  for (const FormatBounds& f : kBounds) out.push_back(f.type);
  return out;
}

const FormatBounds& bounds_of(DType t) {
  for (const FormatBounds& f : kBounds)
    if (f.type == t) return f;
  throw Error("no bounds for " + name_of(t));
}

TEST(QuantRoundTrip, MoreBitsGiveLessError) {
  const auto rows = gaussian_rows(64, 1.0, 11);
  const DType ladder[] = {DType::Q2_K, DType::Q3_K, DType::Q4_K,
                          DType::Q5_K, DType::Q6_K, DType::Q8_0};
  double previous = INFINITY;
  for (DType t : ladder) {
    const double rmse = measure(t, rows).relative_rmse;
    EXPECT_LT(rmse, previous * 0.75) << name_of(t);
    previous = rmse;
  }
  // Each K-quant beats the 32-value format of the same width.
  EXPECT_LT(measure(DType::Q4_K, rows).relative_rmse, measure(DType::Q4_0, rows).relative_rmse);
  EXPECT_LT(measure(DType::Q5_K, rows).relative_rmse, measure(DType::Q5_0, rows).relative_rmse);
  EXPECT_LT(measure(DType::IQ4_NL, rows).relative_rmse, measure(DType::Q4_0, rows).relative_rmse);
}

TEST(QuantRoundTrip, AllZerosStayZero) {
  const std::vector<float> zeros(kRowLength, 0.0f);
  for (DType t : quantizable_types()) {
    const std::vector<float> y = round_trip(t, zeros);
    for (float v : y) ASSERT_EQ(v, 0.0f) << name_of(t);
  }
}

TEST(QuantRoundTrip, ConstantRowsWithinBlockBound) {
  for (float c : {0.7f, -3.25f, 0.05f, 1000.0f, -20000.0f}) {
    const std::vector<std::vector<float>> rows = {std::vector<float>(kRowLength, c)};
    for (DType t : quantizable_types()) {
      const ErrorStats s = measure(t, rows);
      EXPECT_TRUE(s.all_finite) << name_of(t) << " c=" << c;
      EXPECT_LE(s.worst_block, bounds_of(t).block_max) << name_of(t) << " c=" << c;
    }
  }
}

// Magnitudes up to ~5e4 keep every format's half scales finite; relative errors must not
// depend on the magnitude.
TEST(QuantRoundTrip, HugeValuesKeepRelativeBounds) {
  const auto rows = gaussian_rows(16, 1e4, 13);
  for (DType t : quantizable_types()) {
    const ErrorStats s = measure(t, rows);
    EXPECT_TRUE(s.all_finite) << name_of(t);
    EXPECT_LE(s.relative_rmse, bounds_of(t).rmse) << name_of(t);
    EXPECT_LE(s.worst_block, bounds_of(t).block_max) << name_of(t);
  }
}

// Where the stored half scales become subnormal (block maxima below ~1e-2 for the formats
// with two levels of scales) they lose precision or flush to zero, so the relative bounds
// do not hold there; the output must still be finite and within twice the input's range,
// plus the smallest half (a stored min rounds to it at worst).
TEST(QuantRoundTrip, TinyValuesStayFiniteAndSmall) {
  const float kSmallestHalf = fp16_to_f32(1);  // 2^-24
  for (double sigma : {1e-5, 1e-8, 1e-20, 1e-38}) {
    const auto rows = gaussian_rows(4, sigma, 17);
    for (DType t : quantizable_types()) {
      for (const auto& x : rows) {
        const std::vector<float> y = round_trip(t, x);
        float amax = 0;
        for (float v : x) amax = std::max(amax, std::fabs(v));
        for (size_t i = 0; i < x.size(); ++i) {
          ASSERT_TRUE(std::isfinite(y[i])) << name_of(t) << " sigma=" << sigma;
          ASSERT_LE(std::fabs(y[i] - x[i]), 2 * amax + kSmallestHalf)
              << name_of(t) << " sigma=" << sigma;
        }
      }
    }
  }
}

// A few large values among small ones: the block scale follows the outlier.
TEST(QuantRoundTrip, OutliersAreKept) {
  auto rows = gaussian_rows(16, 0.01, 19);
  for (auto& row : rows)
    for (size_t i = 0; i < row.size(); i += 97) row[i] = (i % 2 ? 5.0f : -5.0f);
  for (DType t : quantizable_types()) {
    for (const auto& x : rows) {
      const std::vector<float> y = round_trip(t, x);
      for (size_t i = 0; i < x.size(); i += 97) {
        ASSERT_TRUE(std::isfinite(y[i]));
        EXPECT_NEAR(y[i], x[i], 5.0 * bounds_of(t).block_max) << name_of(t) << " at " << i;
      }
    }
  }
}

TEST(QuantRoundTrip, HalfAndBf16RoundTripExactly) {
  std::vector<float> halves, bf16s;
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = fp16_to_f32((uint16_t)h), b = bf16_to_f32((uint16_t)h);
    if (std::isfinite(f)) halves.push_back(f);
    if (std::isfinite(b)) bf16s.push_back(b);
  }
  const std::vector<float> y16 = round_trip(DType::F16, halves);
  const std::vector<float> yb = round_trip(DType::BF16, bf16s);
  for (size_t i = 0; i < halves.size(); ++i) ASSERT_EQ(f32_bits(y16[i]), f32_bits(halves[i]));
  for (size_t i = 0; i < bf16s.size(); ++i) ASSERT_EQ(f32_bits(yb[i]), f32_bits(bf16s[i]));
}

TEST(QuantRoundTrip, ActivationBlockSums) {
  const auto rows = gaussian_rows(4, 3.0, 23);
  const auto n = (int64_t)rows[0].size();
  std::vector<BlockQ8_1> q81((size_t)n / kQK);
  quantize_row(DType::Q8_1, rows[0].data(), q81.data(), n);
  for (const BlockQ8_1& b : q81) {
    int sum = 0;
    for (int8_t q : b.qs) sum += q;
    // s = d * sum(q), stored as a half (d before its own rounding to half)
    const float want = (float)sum * fp16_to_f32(b.d);
    EXPECT_NEAR(fp16_to_f32(b.s), want, std::fabs(want) * 2e-3 + 1e-6);
  }
  std::vector<BlockQ8_K> q8k((size_t)n / kQK_K);
  quantize_row(DType::Q8_K, rows[1].data(), q8k.data(), n);
  for (const BlockQ8_K& b : q8k) {
    for (int j = 0; j < kQK_K / 16; ++j) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += b.qs[16 * j + l];
      EXPECT_EQ(b.bsums[j], sum);
    }
  }
}

TEST(QuantApi, RejectsBadLengthsAndUnsupportedTypes) {
  std::vector<float> x(64, 1.0f), y(64);
  std::vector<uint8_t> buf(1024);
  try {
    quantize_row(DType::Q4_0, x.data(), buf.data(), 33);
    FAIL() << "33 values of q4_0 must be rejected";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kFormat);
    EXPECT_NE(std::string(e.what()).find("q4_0"), std::string::npos) << e.what();
  }
  EXPECT_THROW(dequantize_row(DType::Q4_K, buf.data(), y.data(), 64), Error);
  try {
    dequantize_row(DType::IQ2_XXS, buf.data(), y.data(), 256);
    FAIL() << "iq2_xxs has no dequantizer";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("iq2_xxs"), std::string::npos) << e.what();
  }
  EXPECT_THROW(quantize_row(DType::I8, x.data(), buf.data(), 64), Error);
  EXPECT_FALSE(has_quantizer(DType::IQ2_XXS));
  EXPECT_FALSE(has_quantizer(DType::I32));
  EXPECT_FALSE(has_dequantizer(DType::IQ1_S));
  for (DType t : quantizable_types()) {
    EXPECT_TRUE(has_quantizer(t)) << name_of(t);
    EXPECT_TRUE(has_dequantizer(t)) << name_of(t);
  }
  // Every type the dtype table marks readable has a dequantizer.
  for (DType t : supported_dtypes()) EXPECT_TRUE(has_dequantizer(t)) << name_of(t);
}

}  // namespace
}  // namespace hablar

namespace hablar {
namespace {

// dequantize_row's branch-free F16 loop against the scalar fp16_to_f32 on every half,
// infinities, NaNs and subnormals included.
TEST(QuantRoundTrip, F16RowMatchesScalarOnEveryHalf) {
  std::vector<uint16_t> all(65536);
  for (uint32_t h = 0; h < 65536; ++h) all[h] = (uint16_t)h;
  std::vector<float> got(all.size());
  dequantize_row(DType::F16, all.data(), got.data(), (int64_t)all.size());
  for (uint32_t h = 0; h < 65536; ++h) {
    uint32_t a, b;
    const float want = fp16_to_f32((uint16_t)h);
    std::memcpy(&a, &got[h], 4);
    std::memcpy(&b, &want, 4);
    ASSERT_EQ(a, b) << "half 0x" << std::hex << h;
  }
}

}  // namespace
}  // namespace hablar
