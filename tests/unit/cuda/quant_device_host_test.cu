// The CUDA kernels' dequantizers (quant_device.cuh, __host__ __device__) run on the host
// against core/quant.h's reference: exact equality on random blocks of every type. Needs
// nvcc to build but no GPU to run, so CI checks the block decoding the GPU kernels use.
#include <gtest/gtest.h>

#include <string>

#include "backend/cuda/quant_device.cuh"
#include "quant_test_data.h"

namespace hablar::test {
namespace {

TEST(CudaDequantOnHost, EveryUnitMatchesTheReferenceExactly) {
  const int64_t rows = 5, cols = 768;
  for (DType type : cuda_weight_types()) {
    const auto bytes = random_weight_bytes(type, rows, cols, 31u);
    const auto ref = dequantize_matrix(type, bytes, rows, cols);
    const size_t row_bytes = dtype_row_bytes(type, cols);
    for (int64_t r = 0; r < rows; ++r)
      for (int u = 0; u < cols / 32; ++u) {
        float v[32];
        cuda::dispatch_weight_type(
            type, [&]<DType T>() { cuda::dequant_unit<T>(bytes.data() + r * row_bytes, u, v); });
        for (int i = 0; i < 32; ++i)
          ASSERT_EQ(v[i], ref[r * cols + 32 * u + i])
              << dtype_name(type) << " row " << r << " value " << 32 * u + i;
      }
  }
}

TEST(CudaDequantOnHost, EveryGroupOfEightMatchesTheReferenceExactly) {
  const int64_t rows = 5, cols = 768;
  for (DType type : cuda_weight_types()) {
    const auto bytes = random_weight_bytes(type, rows, cols, 37u);
    const auto ref = dequantize_matrix(type, bytes, rows, cols);
    const size_t row_bytes = dtype_row_bytes(type, cols);
    for (int64_t r = 0; r < rows; ++r)
      for (int g = 0; g < cols / 8; ++g) {
        float v[8];
        cuda::dispatch_weight_type(
            type, [&]<DType T>() { cuda::dequant_group<T>(bytes.data() + r * row_bytes, g, v); });
        for (int i = 0; i < 8; ++i)
          ASSERT_EQ(v[i], ref[r * cols + 8 * g + i])
              << dtype_name(type) << " row " << r << " value " << 8 * g + i;
      }
  }
}

}  // namespace
}  // namespace hablar::test
