// The e4m3 reference of the fp8 weight copies (backend/cuda/fp8_rows.h) on the host: every
// finite code decodes to a value that encodes back to it, values between two codes round to
// the nearer (ties to the even code), large ones saturate at 448, and a row's scale puts its
// largest magnitude at 448. The CUDA kernel's codes are compared with these in
// matmul_fp8_gpu_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>

#include "backend/cuda/fp8_rows.h"

namespace hablar::test {
namespace {

using cuda::decode_e4m3;
using cuda::encode_e4m3;

TEST(Fp8RowsHost, EveryFiniteCodeRoundTrips) {
  int finite = 0;
  for (int c = 0; c < 256; ++c) {
    const auto code = (uint8_t)c;
    if ((code & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(decode_e4m3(code)));
      continue;
    }
    const float v = decode_e4m3(code);
    // -0 encodes as 0x80, +0 as 0x00: both round-trip.
    EXPECT_EQ(encode_e4m3(v), code) << "code " << c << " value " << v;
    ++finite;
  }
  EXPECT_EQ(finite, 254);
  EXPECT_EQ(decode_e4m3(0x7E), 448.0f);
  EXPECT_EQ(decode_e4m3(0x08), 0.015625f);             // the smallest normal, 2^-6
  EXPECT_EQ(decode_e4m3(0x01), std::ldexp(1.0f, -9));  // the smallest subnormal
}

// Between two neighbouring codes: a quarter of the way rounds down, three quarters up, the
// midpoint to the code with an even mantissa.
TEST(Fp8RowsHost, RoundsToNearestTiesToEven) {
  for (int c = 0; c < 0x7E; ++c) {
    const auto lo = (uint8_t)c, hi = (uint8_t)(c + 1);
    const float a = decode_e4m3(lo), b = decode_e4m3(hi);
    EXPECT_EQ(encode_e4m3(a + 0.25f * (b - a)), lo) << c;
    EXPECT_EQ(encode_e4m3(a + 0.75f * (b - a)), hi) << c;
    const uint8_t even = (lo & 1) == 0 ? lo : hi;
    EXPECT_EQ(encode_e4m3(0.5f * (a + b)), even) << c;
    EXPECT_EQ(encode_e4m3(-0.5f * (a + b)), (uint8_t)(even | 0x80)) << c;
  }
}

TEST(Fp8RowsHost, SaturatesAndKeepsNan) {
  EXPECT_EQ(encode_e4m3(448.0f), 0x7E);
  EXPECT_EQ(encode_e4m3(470.0f), 0x7E);
  EXPECT_EQ(encode_e4m3(1.0e30f), 0x7E);
  EXPECT_EQ(encode_e4m3(INFINITY), 0x7E);
  EXPECT_EQ(encode_e4m3(-INFINITY), 0xFE);
  EXPECT_EQ(encode_e4m3(NAN), 0x7F);
  EXPECT_EQ(encode_e4m3(1.0e-30f), 0x00);
  EXPECT_EQ(encode_e4m3(-1.0e-30f), 0x80);
}

TEST(Fp8RowsHost, RowScalePutsTheLargestAt448) {
  for (float amax : {1.0e-6f, 0.37f, 1.0f, 3.5f, 448.0f, 9.0e5f}) {
    const float scale = cuda::fp8_row_scale(amax);
    const float inverse = 1.0f / scale;
    EXPECT_EQ(encode_e4m3(amax * inverse), 0x7E) << amax;
    EXPECT_EQ(encode_e4m3(-amax * inverse), 0xFE) << amax;
    // Within e4m3's half step (2^-4 relative) after the scale is applied back.
    const float back = decode_e4m3(encode_e4m3(0.3f * amax * inverse)) * scale;
    EXPECT_NEAR(back, 0.3f * amax, 0.3f * amax / 16.0f) << amax;
  }
  EXPECT_EQ(cuda::fp8_row_scale(0.0f), 1.0f);
}

}  // namespace
}  // namespace hablar::test
