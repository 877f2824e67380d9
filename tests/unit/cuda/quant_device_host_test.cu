// The CUDA kernels' dequantizers (quant_device.cuh, __host__ __device__) run on the host
// against core/quant.h's reference: exact equality on random blocks of every type. Needs
// nvcc to build but no GPU to run, so CI checks the block decoding the GPU kernels use.
#include <gtest/gtest.h>

#include <string>

#include "backend/cuda/kv_elements.cuh"
#include "backend/cuda/quant_device.cuh"
#include "core/kv_rows.h"
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

// The Q8_0 KV rows of the CUDA kernels (kv_elements.cuh) on the host: the scatter's codes
// and scale equal the CPU's rows (core/kv_rows.h) byte for byte, the warp's packing
// replayed as kv_q8_store_lane does it; kv_q8_load8 reads every group of eight as the f16 of
// code * d. Values of every scale from 2^-12 to 2^11, and blocks of zeros.
TEST(CudaKvQ8OnHost, RowsAndReadsMatchTheCpusRows) {
  constexpr int kDim = 256;
  std::vector<float> x(kDim);
  for (int trial = 0; trial < 64; ++trial) {
    uint32_t state = 977u * (uint32_t)trial + 1u;
    const float scale = std::ldexp(1.0f, trial % 24 - 12);
    for (int d = 0; d < kDim; ++d) {
      state = state * 1664525u + 1013904223u;
      x[d] = ((float)(state >> 8) / 16777216.0f - 0.5f) * scale;
    }
    if (trial % 8 == 0) std::fill(x.begin(), x.begin() + 32, 0.0f);
    std::vector<uint16_t> want(kDim / 32 * cuda::kKvQ8BlockUnits), got(want.size(), 0xdead);
    kv_q8_0_quantize_row(x.data(), kDim, reinterpret_cast<BlockQ8_0*>(want.data()));
    for (int b = 0; b < kDim / 32; ++b) {
      float amax = 0.0f;
      for (int l = 0; l < 32; ++l) amax = std::fmax(amax, std::fabs(x[32 * b + l]));
      uint16_t* block = got.data() + b * cuda::kKvQ8BlockUnits;
      for (int l = 0; l < 32; l += 2) {  // lane l writes its code and lane l + 1's
        const int lo = cuda::kv_q8_code(x[32 * b + l], amax);
        const int hi = cuda::kv_q8_code(x[32 * b + l + 1], amax);
        block[1 + l / 2] = (uint16_t)((lo & 0xff) | ((hi & 0xff) << 8));
      }
      block[0] = cuda::kv_q8_scale_bits(amax);
    }
    ASSERT_EQ(got, want) << "trial " << trial;
    const auto* blocks = reinterpret_cast<const BlockQ8_0*>(want.data());
    for (int d = 0; d < kDim; d += 8) {
      const uint4 eight = cuda::kv_q8_load8(want.data(), d);
      const uint32_t words[4] = {eight.x, eight.y, eight.z, eight.w};
      for (int i = 0; i < 8; ++i) {
        const uint16_t bits = (uint16_t)(words[i / 2] >> (16 * (i % 2)));
        ASSERT_EQ(bits, f32_to_fp16(kv_q8_0_value_as_f16(blocks[(d + i) / 32], (d + i) % 32)))
            << "trial " << trial << " dim " << d + i;
      }
    }
  }
}

}  // namespace
}  // namespace hablar::test
