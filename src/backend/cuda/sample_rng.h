// The sampler's counter-based random numbers: one uniform in [0, 1) per (seed, step), the
// same on host and device, so a sequence's draws are reproducible from its seed alone and
// independent of batching. splitmix64 finalizer over the mixed counter.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define HABLAR_RNG_HD __host__ __device__ __forceinline__
#else
#define HABLAR_RNG_HD inline
#endif

namespace hablar::cuda {

HABLAR_RNG_HD uint64_t splitmix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// 24 random bits scaled to [0, 1): exact in float.
HABLAR_RNG_HD float sample_uniform(uint64_t seed, uint64_t step) {
  const uint64_t bits = splitmix64(splitmix64(seed) ^ (step * 0xD1B54A32D192ED03ull));
  return (float)(bits >> 40) * (1.0f / 16777216.0f);
}

}  // namespace hablar::cuda
