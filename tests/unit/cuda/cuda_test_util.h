// Helpers of the GPU kernel tests: skip cleanly without a device, normalized errors,
// random data.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/device_memory.h"

// Skips the current test, printing why, when no CUDA device is usable.
#define HABLAR_REQUIRE_CUDA_DEVICE()                                                   \
  do {                                                                                 \
    std::string no_device_reason;                                                      \
    if (::hablar::cuda::device_count(&no_device_reason) == 0)                          \
      GTEST_SKIP() << "no CUDA device (" << no_device_reason << "); GPU test skipped"; \
  } while (0)

namespace hablar::test {

// ||got - want|| / ||want|| over two equally long arrays (inf when got has a NaN).
inline double normalized_error(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double diff = (double)got[i] - want[i];
    if (std::isnan(got[i])) return INFINITY;
    num += diff * diff;
    den += want[i] * want[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1.0));
}

inline std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

}  // namespace hablar::test
