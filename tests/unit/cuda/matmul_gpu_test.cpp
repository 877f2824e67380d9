// Fused dequantizing matmuls (every type, M = 1..256, odd N), the bf16 dequantizer and the
// cuBLAS prefill path, each against a double-precision product over core/quant.h's
// dequantized weights.
//
// Thresholds (normalized error ||y - ref|| / ||ref||): 1e-5 for the f32 GEMV path (M <= 8),
// 1e-2 for paths that round x and W to bf16 (M > 8 and prefill).
#include <string>

#include "backend/cuda/matmul.h"
#include "core/dtype.h"
#include "core/fp16.h"
#include "cuda_test_util.h"
#include "matmul_test_util.h"
#include "quant_test_data.h"

namespace hablar::test {
namespace {

using cuda::DeviceBuffer;

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

// W's kept bf16 copy: run() multiplies it instead of dequantizing W again (the dequantizing
// path's bf16 operands, so its results), and multiply_kept() over rows converted once gives
// them too, at decode-sized M as well as prompt-sized M.
TEST_P(FusedMatmulGpu, KeptCopyEqualsDequantizingPath) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  const DType type = GetParam();
  const int64_t n = 96, k = 512;
  const auto host_w = random_weight_bytes(type, n, k, 4322u);
  DeviceWeights w(type, n, k, host_w);
  const auto ref_w = dequantize_matrix(type, host_w, n, k);
  for (int m : {65, 128, 300}) {
    const auto x = random_floats((size_t)m * k, 6u + (uint32_t)m);
    DeviceBuffer<float> dx(x), fresh((size_t)m * n), kept((size_t)m * n), direct((size_t)m * n);
    DeviceBuffer<uint16_t> x16((size_t)m * k);
    cuda::PrefillMatmul dequantizing, keeping;
    dequantizing.run(w.view, dx.get(), m, fresh.get(), nullptr);
    EXPECT_FALSE(keeping.keeps(w.view));
    keeping.keep_bf16(w.view, nullptr);
    ASSERT_TRUE(keeping.keeps(w.view));
    EXPECT_EQ(keeping.kept_bytes(), (size_t)(n * k) * sizeof(uint16_t));
    keeping.run(w.view, dx.get(), m, kept.get(), nullptr);
    cuda::convert_f32_to_bf16(dx.get(), x16.get(), (int64_t)m * k, nullptr);
    keeping.multiply_kept(w.view, x16.get(), m, direct.get(), nullptr);
    HABLAR_CUDA_CHECK(cudaDeviceSynchronize());
    const std::string where = std::string(dtype_name(type)) + " M=" + std::to_string(m);
    // Same bf16 operands each way; only cuBLAS's choice of algorithm could differ.
    auto to_double = [](const std::vector<float>& v) {
      return std::vector<double>(v.begin(), v.end());
    };
    EXPECT_LT(normalized_error(kept.download(), to_double(fresh.download())), 1e-6) << where;
    EXPECT_LT(normalized_error(direct.download(), to_double(kept.download())), 1e-6) << where;
    EXPECT_LT(normalized_error(direct.download(), reference_product(ref_w, x, m, n, k)), 1e-2)
        << where;
    // The bf16 output: the f32 product rounded once (within an ulp where cuBLAS's algorithm
    // for the bf16 output sums in another order).
    DeviceBuffer<uint16_t> narrow((size_t)m * n);
    keeping.multiply_kept_to_bf16(w.view, x16.get(), m, narrow.get(), nullptr);
    HABLAR_CUDA_CHECK(cudaDeviceSynchronize());
    const auto wide = direct.download();
    const auto got = narrow.download();
    int beyond_ulp = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const float rounded = bf16_to_f32(f32_to_bf16(wide[i]));
      const float ulp = std::max(std::fabs(rounded) * (1.0f / 128.0f), 1e-30f);
      if (std::fabs(bf16_to_f32(got[i]) - rounded) > ulp) ++beyond_ulp;
    }
    EXPECT_EQ(beyond_ulp, 0) << where;
  }
}

// Two kept copies of one shape (K and V) in one strided-batched GEMM: each output as its own
// multiply_kept gives it (the same bf16 operands), whichever order the copies and the outputs
// lie in memory (distances of opposite signs take two GEMMs).
// Two random matrices of one shape and their kept bf16 copies.
struct KeptPair {
  DeviceWeights wa, wb;
  cuda::PrefillMatmul keeping;
  KeptPair(DType type, int64_t n, int64_t k, uint32_t seed)
      : wa(type, n, k, random_weight_bytes(type, n, k, seed)),
        wb(type, n, k, random_weight_bytes(type, n, k, seed + 1)) {
    keeping.keep_bf16(wa.view, nullptr);
    keeping.keep_bf16(wb.view, nullptr);
  }
};

TEST_P(FusedMatmulGpu, KeptPairEqualsTwoProducts) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  const DType type = GetParam();
  const int64_t n = 64, k = 512;
  KeptPair pair(type, n, k, 71u);
  const DeviceWeights &wa = pair.wa, &wb = pair.wb;
  cuda::PrefillMatmul& keeping = pair.keeping;
  for (int m : {17, 256, 2048}) {
    const auto x = random_floats((size_t)m * k, 9u + (uint32_t)m);
    DeviceBuffer<float> dx(x), single_a((size_t)m * n), single_b((size_t)m * n);
    DeviceBuffer<float> outs(2 * (size_t)m * n);  // the pair's outputs, one after the other
    DeviceBuffer<uint16_t> x16((size_t)m * k);
    cuda::convert_f32_to_bf16(dx.get(), x16.get(), (int64_t)m * k, nullptr);
    keeping.multiply_kept(wa.view, x16.get(), m, single_a.get(), nullptr);
    keeping.multiply_kept(wb.view, x16.get(), m, single_b.get(), nullptr);
    for (bool swapped : {false, true}) {
      float* first = outs.get() + (swapped ? (size_t)m * n : 0);
      float* second = outs.get() + (swapped ? 0 : (size_t)m * n);
      keeping.multiply_kept_pair(wa.view, wb.view, x16.get(), m, first, second, nullptr);
      HABLAR_CUDA_CHECK(cudaDeviceSynchronize());
      const auto all = outs.download();
      const size_t at_a = swapped ? (size_t)m * n : 0, at_b = swapped ? 0 : (size_t)m * n;
      const std::vector<float> got_a(all.begin() + at_a, all.begin() + at_a + m * n);
      const std::vector<float> got_b(all.begin() + at_b, all.begin() + at_b + m * n);
      const auto want_a = single_a.download(), want_b = single_b.download();
      const std::string where =
          std::string(dtype_name(type)) + " M=" + std::to_string(m) + (swapped ? " swapped" : "");
      EXPECT_LT(normalized_error(got_a, std::vector<double>(want_a.begin(), want_a.end())), 1e-6)
          << where;
      EXPECT_LT(normalized_error(got_b, std::vector<double>(want_b.begin(), want_b.end())), 1e-6)
          << where;
    }
  }
}

// The int8 path (matmul_fused with a workspace) on M random activation rows against the f64
// product with the dequantized weights: int8 rounding of the activations gives a normalized
// error of a few 1e-3, held under 1e-2, and never 0 (which would mean the f32 path ran).
void expect_int8_product_close(const DeviceWeights& w, const std::vector<float>& ref_w, int m,
                               uint32_t seed) {
  const int64_t n = w.view.rows, k = w.view.cols;
  DeviceBuffer<uint8_t> ws(cuda::matmul_fused_workspace_bytes(w.view, m));
  ASSERT_GT(ws.size(), 0u);
  const auto x = random_floats((size_t)m * k, seed);
  DeviceBuffer<float> dx(x);
  DeviceBuffer<float> dy(std::vector<float>((size_t)m * n, NAN));
  cuda::matmul_fused(w.view, dx.get(), m, dy.get(), nullptr, ws.get(), ws.size());
  HABLAR_CUDA_CHECK(cudaDeviceSynchronize());
  const double err = normalized_error(dy.download(), reference_product(ref_w, x, m, n, k));
  EXPECT_LT(err, 1e-2) << "M=" << m << " N=" << n << " K=" << k;
  EXPECT_GT(err, 0.0) << "the int8 path must have run (exact results mean it did not)";
}

TEST(FusedMatmulInt8Activations, Q4KWithWorkspaceMatchesReference) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  // int8 rounding of the activations (per block of 32, to 1/254 of its largest value):
  // normalized error a few 1e-3, held under 1e-2.
  // K = 14336 gives the sub-block kernel (M > 1) groups of more than one warp per row; at
  // M = 1 the rows kernel takes teams of 16 (K = 256), 32 (1536, 2048) and 128 (8960,
  // 14336) threads, with some threads short of chunks (8960: 140 chunks of 64 values).
  const int64_t n = 67;
  for (int64_t k : {256, 1536, 2048, 8960, 14336}) {
    const auto host_w = random_weight_bytes(DType::Q4_K, n, k, 555u + (uint32_t)k);
    const auto ref_w = dequantize_matrix(DType::Q4_K, host_w, n, k);
    DeviceWeights w(DType::Q4_K, n, k, host_w);
    for (int m = 1; m <= cuda::kGemvMaxRows; ++m)
      expect_int8_product_close(w, ref_w, m, 91u + (uint32_t)m);
  }
}

// A batch of 9 to 256 activation rows takes the integer tensor-core kernel
// (matmul_q4k_mma.cu): weight rows not a multiple of its 16, activation rows not a multiple
// of its 8 / 16 / 32, K of one and of many super-blocks per warp. Error bound as above.
TEST(FusedMatmulInt8Activations, Q4KBatchOnTensorCoresMatchesReference) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  const int64_t shapes[][2] = {{67, 256}, {301, 2048}, {40, 8960}};
  for (const auto& shape : shapes) {
    const int64_t n = shape[0], k = shape[1];
    const auto host_w = random_weight_bytes(DType::Q4_K, n, k, 901u + (uint32_t)k);
    const auto ref_w = dequantize_matrix(DType::Q4_K, host_w, n, k);
    DeviceWeights w(DType::Q4_K, n, k, host_w);
    for (int m : {9, 16, 17, 33, 100, 256})
      expect_int8_product_close(w, ref_w, m, 17u + (uint32_t)m);
  }
}

// Products launched back to back on one stream (the M = 1 kernel starts loading weights
// before the kernel ahead of it ends): each must see the activations quantized just before
// it, and none may disturb another's output.
TEST(FusedMatmulInt8Activations, BackToBackProductsOnAStreamSeeTheirOwnInput) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  const int64_t n = 301, k = 4096;
  const auto host_a = random_weight_bytes(DType::Q4_K, n, k, 71u);
  const auto host_b = random_weight_bytes(DType::Q4_K, n, k, 72u);
  DeviceWeights a(DType::Q4_K, n, k, host_a), b(DType::Q4_K, n, k, host_b);
  const auto x1 = random_floats((size_t)k, 5u), x2 = random_floats((size_t)k, 6u, -3.0f, 3.0f);
  DeviceBuffer<float> dx1(x1), dx2(x2);
  const size_t ws_bytes = cuda::q8_activation_bytes(1, k);
  DeviceBuffer<uint8_t> ws(ws_bytes);
  std::vector<DeviceBuffer<float>> y;
  for (int i = 0; i < 4; ++i) y.emplace_back(std::vector<float>((size_t)n, NAN));
  cuda::Stream stream;
  cuda::quantize_activations_q8(dx1.get(), 1, k, ws.get(), ws_bytes, stream.get());
  cuda::matmul_prequantized(a.view, 1, y[0].get(), ws.get(), stream.get());
  cuda::matmul_prequantized(b.view, 1, y[1].get(), ws.get(), stream.get());
  cuda::quantize_activations_q8(dx2.get(), 1, k, ws.get(), ws_bytes, stream.get());
  cuda::matmul_prequantized(a.view, 1, y[2].get(), ws.get(), stream.get());
  cuda::matmul_fused(b.view, dx1.get(), 1, y[3].get(), stream.get(), ws.get(), ws_bytes);
  stream.synchronize();
  const auto ref_a = dequantize_matrix(DType::Q4_K, host_a, n, k);
  const auto ref_b = dequantize_matrix(DType::Q4_K, host_b, n, k);
  const std::vector<double> want[4] = {
      reference_product(ref_a, x1, 1, n, k), reference_product(ref_b, x1, 1, n, k),
      reference_product(ref_a, x2, 1, n, k), reference_product(ref_b, x1, 1, n, k)};
  for (int i = 0; i < 4; ++i) EXPECT_LT(normalized_error(y[i].download(), want[i]), 1e-2) << i;
}

// The product accumulating into a residual stream (multiply_kept_add: cuBLAS beta = 1) equals
// the product on its own plus the stream, and its alpha scales the product alone (Granite).
TEST_P(FusedMatmulGpu, KeptAddEqualsProductPlusStream) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  const DType type = GetParam();
  const int64_t n = 192, k = 512;
  DeviceWeights w(type, n, k, random_weight_bytes(type, n, k, 77u));
  cuda::PrefillMatmul keeping;
  keeping.keep_bf16(w.view, nullptr);
  for (int m : {65, 2048}) {
    const size_t mn = (size_t)m * n;
    const auto stream_rows = random_floats(mn, 23u + (uint32_t)m);
    DeviceBuffer<float> dx(random_floats((size_t)m * k, 29u + (uint32_t)m)), alone(mn);
    DeviceBuffer<uint16_t> x16((size_t)m * k);
    cuda::convert_f32_to_bf16(dx.get(), x16.get(), (int64_t)m * k, nullptr);
    keeping.multiply_kept(w.view, x16.get(), m, alone.get(), nullptr);
    for (float alpha : {1.0f, 0.25f}) {
      DeviceBuffer<float> residual(stream_rows);
      keeping.multiply_kept_add(w.view, x16.get(), m, residual.get(), alpha, nullptr);
      HABLAR_CUDA_CHECK(cudaDeviceSynchronize());
      const auto product = alone.download();
      std::vector<double> want(mn);
      for (size_t i = 0; i < mn; ++i) want[i] = (double)stream_rows[i] + alpha * (double)product[i];
      const std::string where = std::string(dtype_name(type)) + " M=" + std::to_string(m) +
                                " alpha=" + std::to_string(alpha);
      EXPECT_LT(normalized_error(residual.download(), want), 1e-6) << where;
    }
  }
}

// A tall matrix of long rows (at least 16 rows per multiprocessor, K > 8192) takes the
// looping M = 1 kernel by default: each block walks many row groups.
TEST(FusedMatmulInt8Activations, TallMatrixOfLongRowsMatchesReference) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  const int64_t n = 2203, k = 8448;
  const auto host_w = random_weight_bytes(DType::Q4_K, n, k, 303u);
  DeviceWeights w(DType::Q4_K, n, k, host_w);
  const auto x = random_floats((size_t)k, 404u);
  DeviceBuffer<float> dx(x), dy(std::vector<float>((size_t)n, NAN));
  DeviceBuffer<uint8_t> ws(cuda::matmul_fused_workspace_bytes(w.view, 1));
  cuda::Stream stream;
  cuda::matmul_fused(w.view, dx.get(), 1, dy.get(), stream.get(), ws.get(), ws.bytes());
  stream.synchronize();
  const auto ref = reference_product(dequantize_matrix(DType::Q4_K, host_w, n, k), x, 1, n, k);
  EXPECT_LT(normalized_error(dy.download(), ref), 1e-2);
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
