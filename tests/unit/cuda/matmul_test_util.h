// Helpers of the product tests: weights uploaded to the device as a WeightView, and the
// double-precision product y = x · Wᵀ over dequantized weights.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cuda/device_memory.h"
#include "core/dtype.h"
#include "core/tensor_view.h"

namespace hablar::test {

// y [m][n] = x [m][k] · w [n][k]ᵀ in double precision.
inline std::vector<double> reference_product(const std::vector<float>& w,
                                             const std::vector<float>& x, int m, int64_t n,
                                             int64_t k) {
  std::vector<double> y((size_t)m * n);
  for (int i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t c = 0; c < k; ++c) s += (double)x[(size_t)i * k + c] * w[(size_t)j * k + c];
      y[(size_t)i * n + j] = s;
    }
  return y;
}

// A matrix of n rows of k values of `type`, its bytes on the device.
struct DeviceWeights {
  cuda::DeviceBuffer<uint8_t> bytes;
  WeightView view;
  std::vector<uint8_t> host;
  DeviceWeights(DType type, int64_t n, int64_t k, const std::vector<uint8_t>& host_bytes)
      : bytes(host_bytes), host(host_bytes) {
    view.type = type;
    view.rows = n;
    view.cols = k;
    view.row_bytes = dtype_row_bytes(type, k);
    view.data = bytes.get();
  }
};

}  // namespace hablar::test
