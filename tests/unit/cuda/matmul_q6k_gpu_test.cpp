// The Q6_K product at M = 1 or 2 on int8 activations (matmul_q6k_rows.cu) against a double
// product with core/quant.h's dequantized weights, and each row of a many-row call against a
// one-row call on that row alone. The activations go through
// quantize_activations_q8 as in decode: int8 rounding per block of 32 (to 1/254 of its
// largest value) gives a normalized error of a few 1e-3, held under 1e-2, and never 0.
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/matmul.h"
#include "backend/cuda/matmul_q6k_rows.h"
#include "core/dtype.h"
#include "core/error.h"
#include "cuda_test_util.h"
#include "matmul_test_util.h"
#include "quant_test_data.h"

namespace hablar::test {
namespace {

using cuda::DeviceBuffer;

// Random Q6_K rows on the device, with their dequantized values on the host.
struct Q6KWeights {
  std::vector<uint8_t> host;
  std::vector<float> values;
  DeviceBuffer<uint8_t> bytes;
  WeightView view;
  Q6KWeights(int64_t n, int64_t k, uint32_t seed)
      : host(random_weight_bytes(DType::Q6_K, n, k, seed)),
        values(dequantize_matrix(DType::Q6_K, host, n, k)),
        bytes(host) {
    view.type = DType::Q6_K;
    view.rows = n;
    view.cols = k;
    view.row_bytes = dtype_row_bytes(DType::Q6_K, k);
    view.data = bytes.get();
  }
};

// Quantizes x into the workspace and runs the product on `stream`, queued only.
void quantize_and_multiply(const Q6KWeights& w, const DeviceBuffer<float>& x,
                           DeviceBuffer<uint8_t>& ws, DeviceBuffer<float>& y, cudaStream_t stream) {
  const int64_t k = w.view.cols;
  cuda::quantize_activations_q8(x.get(), 1, k, ws.get(), ws.size(), stream);
  const cuda::Q8Activations xa = cuda::q8_layout(ws.get(), 1, k);
  cuda::matmul_q6k_rows(w.view, xa.codes, xa.scales, y.get(), stream);
}

double product_error(const Q6KWeights& w, uint32_t seed, cudaStream_t stream) {
  const int64_t n = w.view.rows, k = w.view.cols;
  const auto x = random_floats((size_t)k, seed);
  DeviceBuffer<float> dx(x), dy(std::vector<float>((size_t)n, NAN));
  DeviceBuffer<uint8_t> ws(cuda::q8_activation_bytes(1, k));
  quantize_and_multiply(w, dx, ws, dy, stream);
  HABLAR_CUDA_CHECK(cudaDeviceSynchronize());
  return normalized_error(dy.download(), reference_product(w.values, x, 1, n, k));
}

// With 67 rows (few warps, so the team stays at its widest): K = 256 takes teams of 2 lanes
// (16 rows per warp), 1536 and 2048 teams of 16 (2 rows per warp, one half-unit of 128
// values per lane, some lanes idle at 1536), 4352, 8960 and 14336 a warp per row with 1-2,
// 2-3 and 3-4 half-units per lane, 49152 (the widest it takes) with 12. 67 rows leave the
// last warp short of rows, and the matrix mostly ends inside a 16-byte piece (the last bytes
// are staged by 2-byte loads).
TEST(Q6KRowsProduct, MatchesReference) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  const int64_t n = 67;
  for (int64_t k : {256, 1536, 2048, 4352, 8960, 14336, 49152}) {
    const Q6KWeights w(n, k, 606u + (uint32_t)k);
    ASSERT_TRUE(cuda::q6k_rows_supported(w.view)) << "K=" << k;
    const double err = product_error(w, 17u + (uint32_t)k, nullptr);
    EXPECT_LT(err, 1e-2) << "K=" << k;
    EXPECT_GT(err, 0.0) << "K=" << k << ": int8 activations cannot give exact results";
  }
}

// A tall matrix like a vocabulary projection, on a stream of its own (programmatic dependent
// launch after the quantization): many warps, so the team narrows (to 4 lanes and 8 rows per
// warp on an H200's 132 multiprocessors), and the last warp stages the matrix's last bytes.
TEST(Q6KRowsProduct, TallMatrixOnAStreamMatchesReference) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  const Q6KWeights w(20011, 1536, 77u);
  cuda::Stream stream;
  const double err = product_error(w, 78u, stream.get());
  EXPECT_LT(err, 1e-2);
  EXPECT_GT(err, 0.0);
}

// Products queued back to back on one stream (each may start loading weights before the
// kernel ahead of it ends): the second quantization overwrites the workspace after the first
// two products, and each product must still see the activations quantized just before it.
TEST(Q6KRowsProduct, BackToBackProductsOnAStreamSeeTheirOwnInput) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  const int64_t n = 301, k = 4096;
  const Q6KWeights a(n, k, 81u), b(n, k, 82u);
  const auto x1 = random_floats((size_t)k, 5u), x2 = random_floats((size_t)k, 6u, -3.0f, 3.0f);
  DeviceBuffer<float> dx1(x1), dx2(x2);
  DeviceBuffer<uint8_t> ws(cuda::q8_activation_bytes(1, k));
  std::vector<DeviceBuffer<float>> y;
  for (int i = 0; i < 4; ++i) y.emplace_back(std::vector<float>((size_t)n, NAN));
  cuda::Stream stream;
  quantize_and_multiply(a, dx1, ws, y[0], stream.get());
  const cuda::Q8Activations xa = cuda::q8_layout(ws.get(), 1, k);
  cuda::matmul_q6k_rows(b.view, xa.codes, xa.scales, y[1].get(), stream.get());
  quantize_and_multiply(a, dx2, ws, y[2], stream.get());
  cuda::matmul_q6k_rows(b.view, xa.codes, xa.scales, y[3].get(), stream.get());
  stream.synchronize();
  const std::vector<double> want[4] = {
      reference_product(a.values, x1, 1, n, k), reference_product(b.values, x1, 1, n, k),
      reference_product(a.values, x2, 1, n, k), reference_product(b.values, x2, 1, n, k)};
  for (int i = 0; i < 4; ++i) EXPECT_LT(normalized_error(y[i].download(), want[i]), 1e-2) << i;
}

// m rows of x quantized together, then one call of m rows; y [m][n].
std::vector<float> multiply_rows(const Q6KWeights& w, const std::vector<float>& x, int m,
                                 cudaStream_t stream) {
  const int64_t n = w.view.rows, k = w.view.cols;
  DeviceBuffer<float> dx(x), dy(std::vector<float>((size_t)m * n, NAN));
  DeviceBuffer<uint8_t> ws(cuda::q8_activation_bytes(m, k));
  cuda::quantize_activations_q8(dx.get(), m, k, ws.get(), ws.size(), stream);
  const cuda::Q8Activations xa = cuda::q8_layout(ws.get(), m, k);
  cuda::matmul_q6k_rows(w.view, xa.codes, xa.scales, dy.get(), stream, m);
  HABLAR_CUDA_CHECK(cudaStreamSynchronize(stream));
  return dy.download();
}

// A decode step of a few sequences (2 .. kQ6kRowsMaxM): each row of the call is within the int8
// bound of the double product and is the very bits a one-row call gives for that row (the rows
// beside it change nothing). Shapes of a 1.5B model's output head (tall, narrow teams), its down
// product (K = 8960, a warp per row) and a 4096-wide projection; at one row the last two take
// the kernel whose warps share the activations in shared memory, at two the one whose warps
// each read them: the same bits either way.
TEST(Q6KRowsProduct, ManyRowsEqualOneRowCalls) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  cuda::Stream stream;
  for (const auto& [n, k] : {std::pair<int64_t, int64_t>{20011, 1536}, {1536, 8960}, {301, 4096}}) {
    const Q6KWeights w(n, k, 900u + (uint32_t)k);
    for (int m = 2; m <= cuda::kQ6kRowsMaxM; ++m) {
      const auto x = random_floats((size_t)m * k, 31u * m + (uint32_t)k, -2.0f, 2.0f);
      const std::vector<float> y = multiply_rows(w, x, m, stream.get());
      const std::vector<double> want = reference_product(w.values, x, m, n, k);
      EXPECT_LT(normalized_error(y, want), 1e-2) << n << "x" << k << " M=" << m;
      for (int r = 0; r < m; ++r) {
        const std::vector<float> row(x.begin() + (size_t)r * k, x.begin() + (size_t)(r + 1) * k);
        const std::vector<float> alone = multiply_rows(w, row, 1, stream.get());
        EXPECT_EQ(0, std::memcmp(alone.data(), y.data() + (size_t)r * n, n * sizeof(float)))
            << n << "x" << k << " M=" << m << " row " << r;
      }
    }
  }
}

// Host-side checks only: no device needed.
TEST(Q6KRowsProduct, RejectsWhatItCannotTake) {
  WeightView w;
  w.type = DType::Q6_K;
  w.rows = 8;
  w.cols = 1536;
  w.row_bytes = dtype_row_bytes(DType::Q6_K, w.cols);
  alignas(16) static const uint8_t storage[32] = {};
  w.data = storage;
  EXPECT_TRUE(cuda::q6k_rows_supported(w));
  WeightView bad = w;
  bad.type = DType::Q4_K;
  bad.row_bytes = dtype_row_bytes(DType::Q4_K, w.cols);
  EXPECT_FALSE(cuda::q6k_rows_supported(bad));
  bad = w;
  bad.data = storage + 2;  // blocks are 2-byte aligned, but W must start 16-byte aligned
  EXPECT_FALSE(cuda::q6k_rows_supported(bad));
  bad = w;
  bad.cols = 65536;
  bad.row_bytes = dtype_row_bytes(DType::Q6_K, bad.cols);
  EXPECT_FALSE(cuda::q6k_rows_supported(bad));
  EXPECT_THROW(cuda::matmul_q6k_rows(bad, nullptr, nullptr, nullptr, nullptr), Error);
  EXPECT_THROW(cuda::matmul_q6k_rows(w, nullptr, nullptr, nullptr, nullptr, 0), Error);
  EXPECT_THROW(cuda::matmul_q6k_rows(w, nullptr, nullptr, nullptr, nullptr, cuda::kQ6kRowsMaxM + 1),
               Error);
}

}  // namespace
}  // namespace hablar::test
