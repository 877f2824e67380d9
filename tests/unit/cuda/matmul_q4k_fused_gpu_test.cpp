// The fused one-row Q4_K products of matmul_q4k_rows.h against the unfused launches they
// replace: several matrices of one input in one launch (Q, K and V) equal to one launch each,
// bit for bit; the gate and up products with the gated activation in one launch equal to the
// two products followed by ops.h's swiglu / geglu, and within the int8 error of a
// double-precision reference; two activation rows in one call equal to a one-row call each.
#include <cmath>
#include <cstring>

#include "backend/cuda/device_memory.h"
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

// m rows of x quantized together into an int8 workspace on `stream`.
struct QuantizedRows {
  std::vector<float> x;
  DeviceBuffer<float> dx;
  DeviceBuffer<uint8_t> ws;
  cuda::Q8Activations xa;
  QuantizedRows(const std::vector<float>& values, int m, int64_t k, cudaStream_t stream)
      : x(values), dx(x), ws(cuda::q8_activation_bytes(m, k)) {
    cuda::quantize_activations_q8(dx.get(), m, k, ws.get(), ws.size(), stream);
    xa = cuda::q8_layout(ws.get(), m, k);
  }
};

bool same_bits(const std::vector<float>& a, const float* b, size_t n) {
  return a.size() >= n && std::memcmp(a.data(), b, n * sizeof(float)) == 0;
}

// A decode step of rows_m sequences: the Q, K and V launch (three segments), the gated pair and a
// tall matrix of long rows (2,200 x 14,336, which one row takes through the looping kernel)
// with rows_m activation rows give each row the bits of a one-row call on it alone.
void expect_rows_equal_one_row_calls(int rows_m) {
  cuda::Stream stream;
  for (int64_t k : {1536, 8960}) {  // one and two chunks per thread
    const auto x = random_floats((size_t)rows_m * k, 5u + (uint32_t)k, -2.0f, 2.0f);
    QuantizedRows both(x, rows_m, k, stream.get());
    const int64_t rows[] = {301, 67, 19};
    std::vector<DeviceWeights> w;
    std::vector<DeviceBuffer<float>> y;
    for (int i = 0; i < 3; ++i) {
      w.emplace_back(DType::Q4_K, rows[i], k,
                     random_weight_bytes(DType::Q4_K, rows[i], k, 50u + (uint32_t)(i + k)));
      y.emplace_back(std::vector<float>((size_t)(rows_m * rows[i]), NAN));
    }
    const WeightView* ws[] = {&w[0].view, &w[1].view, &w[2].view};
    float* ys[] = {y[0].get(), y[1].get(), y[2].get()};
    cuda::matmul_q4k_rows_multi(ws, ys, both.xa.codes, both.xa.scales, stream.get(), rows_m);
    DeviceBuffer<float> glu(std::vector<float>((size_t)(rows_m * rows[0]), NAN));
    cuda::matmul_q4k_rows_glu(w[0].view, w[0].view, both.xa.codes, both.xa.scales, glu.get(),
                              GluActivation::kSilu, stream.get(), rows_m);
    stream.synchronize();
    const std::vector<float> glu_both = glu.download();
    for (int r = 0; r < rows_m; ++r) {
      const std::vector<float> row(x.begin() + (size_t)r * k, x.begin() + (size_t)(r + 1) * k);
      QuantizedRows alone(row, 1, k, stream.get());
      for (int i = 0; i < 3; ++i) {
        DeviceBuffer<float> one(std::vector<float>((size_t)rows[i], NAN));
        cuda::matmul_q4k_rows(w[i].view, alone.xa.codes, alone.xa.scales, one.get(), stream.get());
        stream.synchronize();
        const auto got = y[i].download();
        EXPECT_TRUE(same_bits(one.download(), got.data() + (size_t)r * rows[i], (size_t)rows[i]))
            << "K " << k << " matrix " << i << " row " << r;
      }
      DeviceBuffer<float> one(std::vector<float>((size_t)rows[0], NAN));
      cuda::matmul_q4k_rows_glu(w[0].view, w[0].view, alone.xa.codes, alone.xa.scales, one.get(),
                                GluActivation::kSilu, stream.get());
      stream.synchronize();
      EXPECT_TRUE(same_bits(one.download(), glu_both.data() + (size_t)r * rows[0], (size_t)rows[0]))
          << "K " << k << " gated, row " << r;
    }
  }
  const int64_t n = 2200, k = 14336;
  DeviceWeights tall(DType::Q4_K, n, k, random_weight_bytes(DType::Q4_K, n, k, 77u));
  const auto x = random_floats((size_t)rows_m * k, 78u);
  QuantizedRows both(x, rows_m, k, stream.get());
  DeviceBuffer<float> y(std::vector<float>((size_t)(rows_m * n), NAN));
  cuda::matmul_q4k_rows(tall.view, both.xa.codes, both.xa.scales, y.get(), stream.get(), rows_m);
  stream.synchronize();
  const std::vector<float> got = y.download();
  const auto ref =
      reference_product(dequantize_matrix(DType::Q4_K, tall.host, n, k), x, rows_m, n, k);
  EXPECT_LT(normalized_error(got, ref), 1e-2);
  for (int r = 0; r < rows_m; ++r) {
    const std::vector<float> row(x.begin() + (size_t)r * k, x.begin() + (size_t)(r + 1) * k);
    QuantizedRows alone(row, 1, k, stream.get());
    DeviceBuffer<float> one(std::vector<float>((size_t)n, NAN));
    cuda::matmul_q4k_rows(tall.view, alone.xa.codes, alone.xa.scales, one.get(), stream.get());
    stream.synchronize();
    EXPECT_TRUE(same_bits(one.download(), got.data() + (size_t)r * n, (size_t)n))
        << "tall matrix, row " << r;
  }
}

TEST(Q4kRowsFusedGpu, SeveralRowsEqualOneRowCalls) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  for (int m = 2; m <= cuda::kQ4kRowsMaxM; ++m) {
    SCOPED_TRACE("rows " + std::to_string(m));
    expect_rows_equal_one_row_calls(m);
  }
}

// Which products take the rows kernels: any supported matrix at one or two rows; at three or
// four only a small one (a 1.5B model's 8960 x 1536 gate: 7.7 MB), not a large one (an 8B
// model's 14336 x 4096 gate: 33 MB); never five rows.
TEST(Q4kRowsFusedGpu, RowsKernelsTakeFewRowsOfSmallMatrices) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  alignas(16) static uint8_t bytes[16];
  auto q4k = [&](int64_t rows, int64_t cols) {
    WeightView w;
    w.type = DType::Q4_K, w.rows = rows, w.cols = cols, w.data = bytes;
    w.row_bytes = dtype_row_bytes(DType::Q4_K, cols);
    return w;
  };
  const WeightView small = q4k(8960, 1536), large = q4k(14336, 4096);
  ASSERT_LE(small.rows * (int64_t)small.row_bytes,
            cuda::kQ4kRowsFewBytesPerSm * cuda::device_multiprocessors())
      << "a GPU of fewer multiprocessors than this test assumes";
  for (int m = 1; m <= 2; ++m) {
    EXPECT_TRUE(cuda::q4k_rows_take(small, m)) << m;
    EXPECT_TRUE(cuda::q4k_rows_take(large, m)) << m;
  }
  for (int m = 3; m <= 4; ++m) {
    EXPECT_TRUE(cuda::q4k_rows_take(small, m)) << m;
    EXPECT_FALSE(cuda::q4k_rows_take(large, m)) << m;
  }
  EXPECT_FALSE(cuda::q4k_rows_take(small, 5));
  EXPECT_FALSE(cuda::q4k_rows_take(small, 0));
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
