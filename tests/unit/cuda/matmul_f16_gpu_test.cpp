// The Q4_K and Q6_K products on f16 tensor cores (matmul_f16.cu) against a double-precision
// product over the reference dequantizer. The kernel rounds each weight and each scaled
// activation to f16 (relative 2^-11 each), so the normalized error ||y - ref|| / ||ref|| is
// a few 1e-4; it is held under 2e-3, five times below the int8 path's bound.
#include <cmath>
#include <vector>

#include "backend/cuda/matmul_f16.h"
#include "cuda_test_util.h"
#include "matmul_test_util.h"
#include "quant_test_data.h"

namespace hablar::test {
namespace {

using cuda::DeviceBuffer;

std::vector<float> f16_product(const DeviceWeights& w, const std::vector<float>& x, int m,
                               int parts = 0) {
  const int64_t k = w.view.cols;
  DeviceBuffer<float> dx(x), dy(std::vector<float>((size_t)m * w.view.rows, NAN));
  DeviceBuffer<uint8_t> rows(cuda::f16_rows_bytes(m, k));
  const size_t scratch_bytes = cuda::f16_product_scratch_bytes(w.view, m, parts);
  DeviceBuffer<uint8_t> scratch(std::vector<uint8_t>(std::max<size_t>(scratch_bytes, 1), 0));
  cuda::Stream stream;
  cuda::convert_rows_to_f16(dx.get(), m, k, rows.get(), rows.bytes(), stream.get());
  cuda::matmul_f16(w.view, rows.get(), m, dy.get(), scratch_bytes ? scratch.get() : nullptr,
                   stream.get(), parts);
  stream.synchronize();
  return dy.download();
}

// Weight rows not a multiple of the block's 128 or the tiles' 16, activation rows not a
// multiple of 16 / 32 / 64, K of one and of many super-blocks (split into slices or not),
// M from 1 to past the batched-decode range (prompt chunks). Q6_K rows of an odd number of
// super-blocks start at every 2-byte offset mod 16, and the last row's last block ends where
// the matrix does (its staging stops there). Both ways of sharing a block between its warps.
void expect_matches_reference(DType type) {
  const int64_t shapes[][2] = {{67, 256}, {301, 2048}, {40, 8960}, {1536, 1536}, {129, 768}};
  for (const auto& shape : shapes) {
    const int64_t n = shape[0], k = shape[1];
    const auto host_w = random_weight_bytes(type, n, k, 4242u + (uint32_t)k);
    const auto ref_w = dequantize_matrix(type, host_w, n, k);
    DeviceWeights w(type, n, k, host_w);
    for (int m : {1, 7, 16, 17, 33, 64, 100, 256, 517}) {
      const auto x = random_floats((size_t)m * k, 31u + (uint32_t)m);
      const auto want = reference_product(ref_w, x, m, n, k);
      for (int parts : {1, 2}) {
        const double err = normalized_error(f16_product(w, x, m, parts), want);
        EXPECT_LT(err, 2e-3) << dtype_name(type) << " M=" << m << " N=" << n << " K=" << k
                             << " parts=" << parts;
      }
    }
  }
}

TEST(F16Product, Q4kMatchesReferenceForManyShapes) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  expect_matches_reference(DType::Q4_K);
}

TEST(F16Product, Q6kMatchesReferenceForManyShapes) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  expect_matches_reference(DType::Q6_K);
}

// Activations far outside f16's range (1e6) and far below its normal range (1e-9), and a
// row of zeros: the per-row power-of-two scale keeps every row exact to f16's precision.
TEST(F16Product, RowsOfAnyMagnitudeKeepTheirPrecision) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  const int64_t n = 130, k = 512;
  const int m = 4;
  const auto host_w = random_weight_bytes(DType::Q4_K, n, k, 99u);
  const auto ref_w = dequantize_matrix(DType::Q4_K, host_w, n, k);
  DeviceWeights w(DType::Q4_K, n, k, host_w);
  auto x = random_floats((size_t)m * k, 3u);
  const float magnitude[m] = {1e6f, 1e-9f, 0.0f, 1.0f};
  for (int r = 0; r < m; ++r)
    for (int64_t i = 0; i < k; ++i) x[(size_t)r * k + i] *= magnitude[r];
  const auto got = f16_product(w, x, m);
  const auto want = reference_product(ref_w, x, m, n, k);
  for (int r = 0; r < m; ++r) {
    const std::vector<float> got_row(got.begin() + r * n, got.begin() + (r + 1) * n);
    const std::vector<double> want_row(want.begin() + r * n, want.begin() + (r + 1) * n);
    if (magnitude[r] == 0.0f) {
      for (float v : got_row) EXPECT_EQ(v, 0.0f);
      continue;
    }
    EXPECT_LT(normalized_error(got_row, want_row), 2e-3) << "row scaled by " << magnitude[r];
  }
}

// Where K is split, the slices are added in slice order: calls after the first on the same
// scratch, also after products of other shapes wrote their parts there (as the forward's
// products share one scratch), give the same bits, and those match the reference.
TEST(F16Product, SplitKIsDeterministicAcrossCallsAndShapes) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  const int64_t k = 8960;
  const int m = 40;
  std::vector<DeviceWeights> ws;
  size_t scratch_bytes = 0;
  for (const auto& [type, n] : {std::pair{DType::Q4_K, 300}, std::pair{DType::Q6_K, 300},
                                std::pair{DType::Q4_K, 1000}, std::pair{DType::Q6_K, 40}}) {
    ws.emplace_back(type, n, k, random_weight_bytes(type, n, k, 7u + (uint32_t)n));
    const size_t bytes = cuda::f16_product_scratch_bytes(ws.back().view, m);
    ASSERT_GT(bytes, 0u) << "each shape should split K";
    scratch_bytes = std::max(scratch_bytes, bytes);
  }
  const auto x = random_floats((size_t)m * k, 8u);
  DeviceBuffer<float> dx(x);
  DeviceBuffer<uint8_t> rows(cuda::f16_rows_bytes(m, k)),
      scratch(std::vector<uint8_t>(scratch_bytes, 0));
  cuda::convert_rows_to_f16(dx.get(), m, k, rows.get(), rows.bytes(), nullptr);
  std::vector<std::vector<float>> first(ws.size());
  for (int round = 0; round < 3; ++round)
    for (size_t i = 0; i < ws.size(); ++i) {
      DeviceBuffer<float> dy((size_t)m * ws[i].view.rows);
      cuda::matmul_f16(ws[i].view, rows.get(), m, dy.get(), scratch.get(), nullptr);
      const auto got = dy.download();
      if (round == 0) {
        first[i] = got;
        const auto ref_w = dequantize_matrix(ws[i].view.type, ws[i].host, ws[i].view.rows, k);
        EXPECT_LT(normalized_error(got, reference_product(ref_w, x, m, ws[i].view.rows, k)), 2e-3)
            << "matrix " << i;
      } else {
        EXPECT_EQ(got, first[i]) << "matrix " << i << " round " << round;
      }
    }
}

TEST(F16Product, RejectsWhatItCannotMultiply) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  const auto host_w = random_weight_bytes(DType::Q4_K, 8, 256, 1u);
  DeviceWeights w(DType::Q4_K, 8, 256, host_w);
  DeviceBuffer<uint8_t> rows(cuda::f16_rows_bytes(1, 256));
  DeviceBuffer<float> y(std::vector<float>(8));
  EXPECT_THROW(cuda::matmul_f16(w.view, rows.get(), 0, y.get(), nullptr, nullptr), Error);
  WeightView q8 = w.view;
  q8.type = DType::Q8_0;
  EXPECT_FALSE(cuda::f16_product_supported(q8));
  WeightView odd_q6k = w.view;  // Q6_K rows must be 2-byte aligned
  odd_q6k.type = DType::Q6_K, odd_q6k.row_bytes = 211;
  EXPECT_FALSE(cuda::f16_product_supported(odd_q6k));
  DeviceBuffer<float> x(std::vector<float>(256));
  EXPECT_THROW(cuda::convert_rows_to_f16(x.get(), 1, 256, rows.get(), 16, nullptr), Error);
}

}  // namespace
}  // namespace hablar::test
