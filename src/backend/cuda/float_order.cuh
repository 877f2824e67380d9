// An order-preserving image of floats as unsigned integers (a < b  <=>  float_key(a) <
// float_key(b)), for searches and reductions over keys: the sampler's thresholds, the top
// log-probabilities' (value, id) keys.
#pragma once

#include <cstdint>

namespace hablar::cuda {

__device__ __forceinline__ uint32_t float_key(float f) {
  const uint32_t b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

}  // namespace hablar::cuda
