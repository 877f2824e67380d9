// Fused dequantizing matmuls (every type, M = 1..256, odd N), the bf16 dequantizer and the
// cuBLAS prefill path, each against a double-precision product over core/quant.h's
// dequantized weights.
//
// Thresholds (normalized error ||y - ref|| / ||ref||): 1e-5 for the f32 GEMV path (M <= 8),
// 1e-2 for paths that round x and W to bf16 (M > 8 and prefill).
#include <string>

#include "backend/cuda/matmul.h"
#include "core/dtype.h"
#include "cuda_test_util.h"
#include "quant_test_data.h"

namespace hablar::test {
namespace {

using cuda::DeviceBuffer;

std::vector<double> reference_product(const std::vector<float>& w, const std::vector<float>& x,
                                      int m, int64_t n, int64_t k) {
  std::vector<double> y((size_t)m * n);
  for (int i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t c = 0; c < k; ++c) s += (double)x[(size_t)i * k + c] * w[(size_t)j * k + c];
      y[(size_t)i * n + j] = s;
    }
  return y;
}

struct DeviceWeights {
  DeviceBuffer<uint8_t> bytes;
  WeightView view;
  DeviceWeights(DType type, int64_t n, int64_t k, const std::vector<uint8_t>& host) : bytes(host) {
    view.type = type;
    view.rows = n;
    view.cols = k;
    view.row_bytes = dtype_row_bytes(type, k);
    view.data = bytes.get();
  }
};

class FusedMatmulGpu : public ::testing::TestWithParam<DType> {};

TEST_P(FusedMatmulGpu, MatchesReferenceForEveryRowCount) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  const DType type = GetParam();
  const int64_t n = 67;  // odd: partial blocks and row pairs
  for (int64_t k : {256, 768}) {
    const auto host_w = random_weight_bytes(type, n, k, 1234u + (uint32_t)k);
    const auto ref_w = dequantize_matrix(type, host_w, n, k);
    DeviceWeights w(type, n, k, host_w);
    for (int m : {1, 2, 3, 5, 8, 9, 16, 33, 130, 256}) {
      const auto x = random_floats((size_t)m * k, 77u + (uint32_t)m);
      DeviceBuffer<float> dx(x);
      DeviceBuffer<float> dy(std::vector<float>((size_t)m * n, NAN));
      cuda::matmul_fused(w.view, dx.get(), m, dy.get(), nullptr);
      HABLAR_CUDA_CHECK(cudaDeviceSynchronize());
      const double err = normalized_error(dy.download(), reference_product(ref_w, x, m, n, k));
      const double tol = m <= cuda::kGemvMaxRows ? 1e-5 : 1e-2;
      EXPECT_LT(err, tol) << dtype_name(type) << " M=" << m << " K=" << k;
    }
  }
}

TEST_P(FusedMatmulGpu, DequantizeToBf16MatchesReference) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  const DType type = GetParam();
  const int64_t n = 13, k = 512;
  const auto host_w = random_weight_bytes(type, n, k, 99u);
  const auto ref = dequantize_matrix(type, host_w, n, k);
  DeviceWeights w(type, n, k, host_w);
  DeviceBuffer<uint16_t> out((size_t)(n * k));
  cuda::dequantize_to_bf16(w.view, out.get(), nullptr);
  const auto got = out.download();
  // Within bf16 rounding of the reference (half an ulp of 2^-8, plus f32 slack).
  for (size_t i = 0; i < ref.size(); ++i)
    ASSERT_LE(std::fabs(bf16_to_f32(got[i]) - ref[i]), std::fabs(ref[i]) * 4.0e-3f + 1e-30f)
        << dtype_name(type) << " element " << i;
}

TEST_P(FusedMatmulGpu, PrefillPathMatchesReference) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  const DType type = GetParam();
  const int64_t n = 96, k = 512;
  const int m = 300;
  const auto host_w = random_weight_bytes(type, n, k, 4321u);
  DeviceWeights w(type, n, k, host_w);
  const auto x = random_floats((size_t)m * k, 5u);
  DeviceBuffer<float> dx(x), dy((size_t)m * n);
  cuda::PrefillMatmul prefill;
  prefill.run(w.view, dx.get(), m, dy.get(), nullptr);
  HABLAR_CUDA_CHECK(cudaDeviceSynchronize());
  const auto ref = reference_product(dequantize_matrix(type, host_w, n, k), x, m, n, k);
  EXPECT_LT(normalized_error(dy.download(), ref), 1e-2) << dtype_name(type);
}

TEST(FusedMatmulInt8Activations, Q4KWithWorkspaceMatchesReference) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  // int8 rounding of the activations (per block of 32, to 1/254 of its largest value):
  // normalized error a few 1e-3, held under 1e-2.
  // K = 14336 gives the rows kernel groups of more than one warp per row.
  const int64_t n = 67;
  for (int64_t k : {256, 2048, 14336}) {
    const auto host_w = random_weight_bytes(DType::Q4_K, n, k, 555u + (uint32_t)k);
    const auto ref_w = dequantize_matrix(DType::Q4_K, host_w, n, k);
    DeviceWeights w(DType::Q4_K, n, k, host_w);
    for (int m = 1; m <= cuda::kGemvMaxRows; ++m) {
      const size_t ws_bytes = cuda::matmul_fused_workspace_bytes(w.view, m);
      ASSERT_GT(ws_bytes, 0u);
      DeviceBuffer<uint8_t> ws(ws_bytes);
      const auto x = random_floats((size_t)m * k, 91u + (uint32_t)m);
      DeviceBuffer<float> dx(x);
      DeviceBuffer<float> dy(std::vector<float>((size_t)m * n, NAN));
      cuda::matmul_fused(w.view, dx.get(), m, dy.get(), nullptr, ws.get(), ws.bytes());
      HABLAR_CUDA_CHECK(cudaDeviceSynchronize());
      const double err = normalized_error(dy.download(), reference_product(ref_w, x, m, n, k));
      EXPECT_LT(err, 1e-2) << "M=" << m << " K=" << k;
      EXPECT_GT(err, 0.0) << "the int8 path must have run (exact results mean it did not)";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(WeightTypes, FusedMatmulGpu, ::testing::ValuesIn(cuda_weight_types()),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(FusedMatmulErrors, RejectsBadShapesAndTypes) {
  WeightView w;
  w.type = DType::Q4_K;
  w.rows = 8;
  w.cols = 100;  // not a multiple of 256
  w.row_bytes = 0;
  EXPECT_THROW(cuda::matmul_fused(w, nullptr, 1, nullptr, nullptr), Error);
  w.type = DType::Q2_K;
  w.cols = 256;
  w.row_bytes = dtype_row_bytes(DType::Q2_K, 256);
  try {
    cuda::matmul_fused(w, nullptr, 1, nullptr, nullptr);
    FAIL() << "Q2_K has no CUDA kernel";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("q2_K"), std::string::npos) << e.what();
  }
  w.type = DType::Q8_0;
  w.row_bytes = dtype_row_bytes(DType::Q8_0, 256);
  EXPECT_THROW(cuda::matmul_fused(w, nullptr, 257, nullptr, nullptr), Error);
}

}  // namespace
}  // namespace hablar::test
