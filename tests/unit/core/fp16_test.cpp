// core/fp16.h against the compiler's _Float16 conversions (IEEE binary16, round to nearest
// even) over every half and over floats at and around every rounding boundary, and bf16
// against a nearest-even rounding computed in double precision.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "core/fp16.h"

namespace hablar {
namespace {

// Independent references in double precision: a half's value is m * 2^e exactly; a float
// rounds to the half whose value is nearest (ties to an even code), found by binary search
// over the ordered positive codes.
double half_value(uint16_t h) {
  const int exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  const double sign = (h & 0x8000u) ? -1.0 : 1.0;
  if (exp == 0x1f) return man ? std::copysign((double)NAN, sign) : sign * INFINITY;
  if (exp == 0) return sign * std::ldexp((double)man, -24);
  return sign * std::ldexp((double)(man | 0x400), exp - 25);
}

uint16_t reference_to_half(float x) {
  if (std::isnan(x)) return 0x7e00;
  const uint16_t sign = std::signbit(x) ? 0x8000u : 0;
  const double a = std::fabs((double)x);
  if (a >= 65520.0) return sign | 0x7c00u;  // beyond the largest half + half an ulp
  uint16_t lo = 0, hi = 0x7bff;             // largest code with value <= a
  while (lo < hi) {
    const uint16_t mid = (uint16_t)((lo + hi + 1) / 2);
    if (half_value(mid) <= a) {
      lo = mid;
    } else {
      hi = (uint16_t)(mid - 1);
    }
  }
  if (half_value(lo) == a) return sign | lo;
  const double below = a - half_value(lo), above = half_value((uint16_t)(lo + 1)) - a;
  const uint16_t pick = below < above   ? lo
                        : above < below ? (uint16_t)(lo + 1)
                        : (lo & 1u)     ? (uint16_t)(lo + 1)
                                        : lo;
  return sign | pick;
}

// The compiler's IEEE binary16 type, where the target has one (GCC 12+, clang 15+ on x86).
#if defined(__FLT16_MAX__)
constexpr bool kHaveFloat16 = true;
uint16_t compiler_to_half(float x) {
  const _Float16 h = (_Float16)x;
  uint16_t u;
  memcpy(&u, &h, sizeof u);
  return u;
}
float compiler_from_half(uint16_t u) {
  _Float16 h;
  memcpy(&h, &u, sizeof h);
  return (float)h;
}
#else
constexpr bool kHaveFloat16 = false;
uint16_t compiler_to_half(float x) {
  return reference_to_half(x);
}
float compiler_from_half(uint16_t u) {
  return (float)half_value(u);
}
#endif

// Equal bits, or both NaN with the same sign (NaN payload quieting differs between
// hardware and software conversions).
::testing::AssertionResult same_float(float got, float want) {
  if (std::isnan(want) && std::isnan(got) && std::signbit(got) == std::signbit(want))
    return ::testing::AssertionSuccess();
  if (f32_bits(got) == f32_bits(want)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << std::hexfloat << got << " != " << want;
}

bool is_half_nan(uint16_t h) {
  return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0;
}

void expect_f32_to_fp16_matches(float x) {
  const uint16_t got = f32_to_fp16(x);
  for (const uint16_t want : {compiler_to_half(x), reference_to_half(x)}) {
    if (is_half_nan(want)) {
      EXPECT_TRUE(is_half_nan(got)) << std::hexfloat << x;
    } else {
      EXPECT_EQ(got, want) << std::hexfloat << x;
    }
  }
}

TEST(Fp16, CompilerHalfTypeIsUsedWhereAvailable) {
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12 && defined(__x86_64__)
  EXPECT_TRUE(kHaveFloat16);
#endif
  SUCCEED() << (kHaveFloat16 ? "comparing with _Float16" : "comparing with references only");
}

TEST(Fp16, EveryHalfToFloatMatchesCompiler) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float got = fp16_to_f32((uint16_t)h);
    ASSERT_TRUE(same_float(got, compiler_from_half((uint16_t)h))) << "half 0x" << std::hex << h;
    ASSERT_TRUE(same_float(got, (float)half_value((uint16_t)h))) << "half 0x" << std::hex << h;
  }
}

TEST(Fp16, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t h = 0; h < 65536; ++h) {
    if (is_half_nan((uint16_t)h)) {
      EXPECT_TRUE(is_half_nan(f32_to_fp16(fp16_to_f32((uint16_t)h))));
      continue;
    }
    ASSERT_EQ(f32_to_fp16(fp16_to_f32((uint16_t)h)), h);
  }
}

// Every tie and near-tie: the float halfway between consecutive halves, and its neighbours.
TEST(Fp16, FloatToHalfAtEveryRoundingBoundary) {
  for (uint32_t h = 0; h < 0x7c00u; ++h) {
    for (uint32_t sign : {0u, 0x8000u}) {
      const float lo = fp16_to_f32((uint16_t)(h | sign));
      const float hi = fp16_to_f32((uint16_t)((h + 1) | sign));
      const float mid = (float)(((double)lo + (double)hi) / 2);  // exact in float
      const uint32_t mid_bits = f32_bits(mid);
      for (int32_t delta = -2; delta <= 2; ++delta)
        expect_f32_to_fp16_matches(bits_f32(mid_bits + delta));
      expect_f32_to_fp16_matches(lo);
    }
  }
}

TEST(Fp16, FloatToHalfOverStridedFloats) {
  // Every 997th float bit pattern: all exponents, NaNs, infinities and subnormals.
  for (uint64_t u = 0; u <= 0xffffffffull; u += 997)
    expect_f32_to_fp16_matches(bits_f32((uint32_t)u));
  for (float x : {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 65504.0f, 65519.99f, 65520.0f, 1e-8f,
                  5.96e-8f, 2.98e-8f, 2.9802322e-8f})
    expect_f32_to_fp16_matches(x);
}

// bf16 rounding computed independently: the nearer of the two neighbouring bf16 values in
// double precision, ties to the even one.
uint16_t bf16_nearest_even(float x) {
  const uint32_t bits = f32_bits(x);
  const uint16_t down = (uint16_t)(bits >> 16);
  if ((bits & 0xffffu) == 0) return down;
  const uint16_t up = (uint16_t)(down + 1);
  const double dist_down = std::fabs((double)x - (double)bf16_to_f32(down));
  const double up_value = (up & 0x7f80u) == 0x7f80u && (up & 0x7fu) == 0
                              ? std::copysign(std::ldexp(1.0, 128), (double)x)  // rounds to inf
                              : (double)bf16_to_f32(up);
  const double dist_up = std::fabs((double)x - up_value);
  if (dist_down < dist_up) return down;
  if (dist_up < dist_down) return up;
  return (down & 1u) ? up : down;
}

TEST(Bf16, FloatToBf16IsNearestEven) {
  for (uint64_t u = 0; u <= 0xffffffffull; u += 991) {
    const float x = bits_f32((uint32_t)u);
    if (std::isnan(x)) {
      const uint16_t b = f32_to_bf16(x);
      EXPECT_TRUE(std::isnan(bf16_to_f32(b)));
      EXPECT_TRUE(b & 0x40u) << "NaN must stay quiet";
      continue;
    }
    ASSERT_EQ(f32_to_bf16(x), bf16_nearest_even(x)) << std::hexfloat << x;
  }
  // Exact ties at every exponent.
  for (uint32_t hi = 0; hi < 0x7f80u; hi += 7) {
    const float tie = bits_f32((hi << 16) | 0x8000u);
    ASSERT_EQ(f32_to_bf16(tie), bf16_nearest_even(tie)) << std::hexfloat << tie;
  }
}

TEST(Bf16, EveryBf16RoundTrips) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const float x = bf16_to_f32((uint16_t)b);
    ASSERT_EQ(f32_bits(x), b << 16);
    if (!std::isnan(x)) {
      ASSERT_EQ(f32_to_bf16(x), b);
    }
  }
}

}  // namespace
}  // namespace hablar
