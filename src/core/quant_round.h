// Rounding for the reference quantizers, inline: the libm calls (lrintf, roundf) cost a
// third of a K-quant's time when not inlined (a baseline x86-64 build has no SSE4.1).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace hablar::qround {

// Round half to even, as lrintf in the default rounding mode. Below 2^22 in magnitude,
// adding 1.5 * 2^23 leaves the rounded integer in the low mantissa bits (the float add
// rounds half to even); larger values take the library call.
inline int nearest_even(float v) {
  if (!(std::fabs(v) < 4194303.0f)) return (int)std::lrint(v);
  const float shifted = v + 12582912.0f;
  int32_t bits;
  std::memcpy(&bits, &shifted, sizeof bits);
  return (bits & 0x007fffff) - 0x00400000;
}

// Round half away from zero, as roundf, for |v| < 2^31 (the int8 codes' inputs are far
// below): the sum is exact in double, so truncating it rounds exactly. Branch-free, so a
// block's loop vectorizes.
inline int nearest_away(float v) {
  return (int)((double)v + std::copysign(0.5, (double)v));
}

}  // namespace hablar::qround
