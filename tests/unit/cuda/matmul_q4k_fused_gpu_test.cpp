// The fused one-row Q4_K products of matmul_q4k_rows.h against the unfused launches they
// replace: several matrices of one input in one launch (Q, K and V) equal to one launch each,
// bit for bit; the gate and up products with the gated activation in one launch equal to the
// two products followed by ops.h's swiglu / geglu, and within the int8 error of a
// double-precision reference.
#include <cmath>

#include "backend/cuda/matmul.h"
#include "backend/cuda/matmul_q4k_rows.h"
#include "backend/cuda/ops.h"
#include "cuda_test_util.h"
#include "matmul_test_util.h"
#include "quant_test_data.h"

namespace hablar::test {
namespace {

using cuda::DeviceBuffer;

// x quantized into a one-row int8 workspace on `stream`.
struct QuantizedRow {
  std::vector<float> x;
  DeviceBuffer<float> dx;
  DeviceBuffer<uint8_t> ws;
  cuda::Q8Activations xa;
  QuantizedRow(int64_t k, uint32_t seed, cudaStream_t stream)
      : x(random_floats((size_t)k, seed)), dx(x), ws(cuda::q8_activation_bytes(1, k)) {
    cuda::quantize_activations_q8(dx.get(), 1, k, ws.get(), ws.size(), stream);
    xa = cuda::q8_layout(ws.get(), 1, k);
  }
};

TEST(Q4kRowsFusedGpu, ThreeMatricesInOneLaunchEqualOneLaunchEach) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  // Q, K and V shapes (K and V narrower than Q), rows not a multiple of a block's rows; K
  // of one chunk per thread (256, 1536), and of two (8960).
  const int64_t rows[] = {301, 67, 19};
  for (int64_t k : {256, 1536, 8960}) {
    cuda::Stream stream;
    QuantizedRow in(k, 7u + (uint32_t)k, stream.get());
    std::vector<DeviceWeights> w;
    std::vector<DeviceBuffer<float>> fused, single;
    for (int i = 0; i < 3; ++i) {
      w.emplace_back(DType::Q4_K, rows[i], k,
                     random_weight_bytes(DType::Q4_K, rows[i], k, 40u + (uint32_t)(i + k)));
      fused.emplace_back(std::vector<float>((size_t)rows[i], NAN));
      single.emplace_back(std::vector<float>((size_t)rows[i], NAN));
    }
    const WeightView* ws[] = {&w[0].view, &w[1].view, &w[2].view};
    float* ys[] = {fused[0].get(), fused[1].get(), fused[2].get()};
    cuda::matmul_q4k_rows_multi(ws, ys, in.xa.codes, in.xa.scales, stream.get());
    for (int i = 0; i < 3; ++i)
      cuda::matmul_q4k_rows(w[i].view, in.xa.codes, in.xa.scales, single[i].get(), stream.get());
    stream.synchronize();
    for (int i = 0; i < 3; ++i) {
      const auto got = fused[i].download();
      EXPECT_EQ(got, single[i].download()) << "K " << k << " matrix " << i;
      const auto ref = reference_product(
          dequantize_matrix(DType::Q4_K, w[i].bytes.download(), rows[i], k), in.x, 1, rows[i], k);
      EXPECT_LT(normalized_error(got, ref), 1e-2) << "K " << k << " matrix " << i;
    }
  }
}

double glu_reference(GluActivation act, double g, double u) {
  if (act == GluActivation::kSilu) return g / (1.0 + std::exp(-g)) * u;
  const double c = std::sqrt(2.0 / M_PI);
  return 0.5 * g * (1.0 + std::tanh(c * (g + 0.044715 * g * g * g))) * u;
}

TEST(Q4kRowsFusedGpu, GatedProductsInOneLaunchEqualProductsThenActivation) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  // K: teams of 16, 32 and 128 threads, one and two chunks per thread (8960: two matrices'
  // chunks in registers, two rows a team); 75 rows: a partial last block.
  const int64_t n = 75;
  for (int64_t k : {256, 1536, 8960}) {
    for (GluActivation act : {GluActivation::kSilu, GluActivation::kGeluTanh}) {
      cuda::Stream stream;
      QuantizedRow in(k, 3u + (uint32_t)k, stream.get());
      DeviceWeights gate(DType::Q4_K, n, k, random_weight_bytes(DType::Q4_K, n, k, 91u));
      DeviceWeights up(DType::Q4_K, n, k, random_weight_bytes(DType::Q4_K, n, k, 92u));
      ASSERT_TRUE(cuda::q4k_rows_glu_supported(gate.view, up.view));
      DeviceBuffer<float> fused(std::vector<float>((size_t)n, NAN)), g((size_t)n), u((size_t)n);
      cuda::matmul_q4k_rows_glu(gate.view, up.view, in.xa.codes, in.xa.scales, fused.get(), act,
                                stream.get());
      cuda::matmul_q4k_rows(gate.view, in.xa.codes, in.xa.scales, g.get(), stream.get());
      cuda::matmul_q4k_rows(up.view, in.xa.codes, in.xa.scales, u.get(), stream.get());
      if (act == GluActivation::kSilu) {
        cuda::swiglu(g.get(), u.get(), g.get(), n, stream.get());
      } else {
        cuda::geglu(g.get(), u.get(), g.get(), n, stream.get());
      }
      stream.synchronize();
      const auto got = fused.download(), unfused = g.download();
      for (int64_t r = 0; r < n; ++r)  // the same kernels' sums; the activation may contract
        EXPECT_NEAR(got[(size_t)r], unfused[(size_t)r],
                    1e-6 * (1.0 + std::fabs(unfused[(size_t)r])))
            << "K " << k << " row " << r;
      const auto rg = reference_product(dequantize_matrix(DType::Q4_K, gate.bytes.download(), n, k),
                                        in.x, 1, n, k);
      const auto ru = reference_product(dequantize_matrix(DType::Q4_K, up.bytes.download(), n, k),
                                        in.x, 1, n, k);
      std::vector<double> ref((size_t)n);
      for (size_t r = 0; r < ref.size(); ++r) ref[r] = glu_reference(act, rg[r], ru[r]);
      const double err = normalized_error(got, ref);
      EXPECT_LT(err, 2e-2) << "K " << k;
      EXPECT_GT(err, 0.0) << "the int8 path must have run";
    }
  }
}

TEST(Q4kRowsFusedGpu, GluSupportNeedsOneShapeOfQ4K) {
  WeightView gate;
  gate.type = DType::Q4_K, gate.rows = 64, gate.cols = 1536;
  gate.row_bytes = dtype_row_bytes(DType::Q4_K, 1536);
  alignas(16) static uint8_t bytes[16];
  gate.data = bytes;
  WeightView up = gate;
  EXPECT_TRUE(cuda::q4k_rows_glu_supported(gate, up));
  up.rows = 63;
  EXPECT_FALSE(cuda::q4k_rows_glu_supported(gate, up));
  up = gate, up.type = DType::Q6_K;
  EXPECT_FALSE(cuda::q4k_rows_glu_supported(gate, up));
  gate.cols = up.cols = 128 * 4 * 64 + 256;  // beyond 4 chunks a thread per matrix
  up.type = DType::Q4_K, gate.row_bytes = up.row_bytes = dtype_row_bytes(DType::Q4_K, gate.cols);
  EXPECT_FALSE(cuda::q4k_rows_glu_supported(gate, up));
}

}  // namespace
}  // namespace hablar::test
