// Rows in FP8 (e4m3) with one f32 scale per row, as the fp8 weight copies and their products'
// input rows hold them (matmul.h: PrefillMatmul::keep_fp8):
//
//   scale = max |x_i| / 448 (448: e4m3's largest finite value; 1 for a row of zeros)
//   code_i = e4m3(x_i * (1 / scale)), rounded to nearest even, saturating at +-448
//   x_i ~ scale * value(code_i)
//
// e4m3 here is the "fn" form: 1 sign, 4 exponent (bias 7) and 3 mantissa bits, no infinities,
// S.1111.111 the only NaN; normals from 2^-6, subnormals in steps of 2^-9. A scale per row
// keeps every value of a row within 3 mantissa bits (a relative error of at most 2^-4) down to
// 2^-15 of its largest: the rounding of a float format, not of a fixed grid.
//
// The scalar functions below are the reference: the CUDA kernel (matmul_fp8.cu) converts with
// the hardware instruction and the tests compare its codes with these byte for byte.
#pragma once

#include <cmath>
#include <cstdint>

namespace hablar::cuda {

inline constexpr float kE4m3Max = 448.0f;

// The scale of a row whose largest magnitude is amax (correctly rounded f32 division, as the
// kernel computes it).
inline float fp8_row_scale(float amax) {
  return amax > 0.0f ? amax / kE4m3Max : 1.0f;
}

// e4m3 code of v: round to nearest even, saturating finite (|v| >= 448 and infinities give
// +-448), NaN gives 0x7F.
inline uint8_t encode_e4m3(float v) {
  if (std::isnan(v)) return 0x7F;
  const uint8_t sign = std::signbit(v) ? 0x80 : 0x00;
  const float a = std::fabs(v);
  if (a >= kE4m3Max) return sign | 0x7E;
  if (a < 0.015625f) {  // below 2^-6: subnormal steps of 2^-9 (a step of 8 is the first normal)
    const float steps = std::nearbyint(a * 512.0f);
    return sign | (uint8_t)steps;
  }
  int e = 0;
  const float mant = std::frexp(a, &e) * 2.0f;  // a = mant * 2^(e-1), mant in [1, 2)
  e -= 1;
  float frac = std::nearbyint((mant - 1.0f) * 8.0f);
  if (frac == 8.0f) frac = 0.0f, e += 1;
  const int code = ((e + 7) << 3) | (int)frac;
  return sign | (uint8_t)(code > 0x7E ? 0x7E : code);
}

// The value of an e4m3 code (NaN for 0x7F / 0xFF).
inline float decode_e4m3(uint8_t code) {
  const float sign = (code & 0x80) ? -1.0f : 1.0f;
  const int e = (code >> 3) & 0xF, m = code & 0x7;
  if (e == 0xF && m == 0x7) return NAN;
  if (e == 0) return sign * std::ldexp((float)m, -9);
  return sign * std::ldexp(1.0f + (float)m / 8.0f, e - 7);
}

}  // namespace hablar::cuda
