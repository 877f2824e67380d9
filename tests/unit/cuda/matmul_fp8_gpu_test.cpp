// Products over fp8 weight copies (PrefillMatmul::keep_fp8): the rows' e4m3 codes and scales
// byte for byte against the host reference (fp8_rows.h), the product against a double-precision
// product over exactly those codes (the scales' layout and cublasLt's call: the FP8 sums'
// rounding away), and against the unrounded weights within e4m3's error.
#include <string>

#include "backend/cuda/fp8_rows.h"
#include "backend/cuda/matmul.h"
#include "core/dtype.h"
#include "core/fp16.h"
#include "cuda_test_util.h"
#include "matmul_test_util.h"
#include "quant_test_data.h"

namespace hablar::test {
namespace {

using cuda::DeviceBuffer;

// The host reference of quantize_rows_fp8: codes [m][k] and scales [m].
struct Fp8Rows {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
};
Fp8Rows host_fp8_rows(const std::vector<uint16_t>& x_bf16, int64_t m, int64_t k) {
  Fp8Rows r{std::vector<uint8_t>((size_t)(m * k)), std::vector<float>((size_t)m)};
  for (int64_t i = 0; i < m; ++i) {
    float amax = 0.0f;
    for (int64_t c = 0; c < k; ++c)
      amax = std::fmax(amax, std::fabs(bf16_to_f32(x_bf16[(size_t)(i * k + c)])));
    const float scale = cuda::fp8_row_scale(amax), inverse = 1.0f / scale;
    r.scales[(size_t)i] = scale;
    for (int64_t c = 0; c < k; ++c)
      r.codes[(size_t)(i * k + c)] =
          cuda::encode_e4m3(bf16_to_f32(x_bf16[(size_t)(i * k + c)]) * inverse);
  }
  return r;
}

// y [m][n] in double over the codes and scales of x and W.
std::vector<double> fp8_product(const Fp8Rows& x, const Fp8Rows& w, int m, int64_t n, int64_t k) {
  std::vector<double> y((size_t)m * n);
  for (int i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t c = 0; c < k; ++c)
        s += (double)cuda::decode_e4m3(x.codes[(size_t)(i * k + c)]) *
             cuda::decode_e4m3(w.codes[(size_t)(j * k + c)]);
      y[(size_t)i * n + j] = s * x.scales[(size_t)i] * w.scales[(size_t)j];
    }
  return y;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = f32_to_bf16(v[i]);
  return out;
}

// Rows of every kind: ordinary, all zero, tiny (subnormal codes), huge, one outlier, NaN-free.
TEST(Fp8RowsGpu, CodesAndScalesEqualTheHostReference) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  const int64_t m = 6, k = 4104;  // k % 8 == 0, not a multiple of the block's 2,048 values
  std::vector<float> x = random_floats((size_t)(m * k), 5u);
  for (int64_t c = 0; c < k; ++c) {
    x[(size_t)(1 * k + c)] = 0.0f;
    x[(size_t)(2 * k + c)] *= 1.0e-6f;
    x[(size_t)(3 * k + c)] *= 3.0e4f;
    x[(size_t)(5 * k + c)] *= 0.01f;
  }
  x[(size_t)(4 * k + 77)] = -250.0f;
  x[(size_t)(5 * k + k - 1)] = 9.0f;
  const auto x16 = to_bf16(x);
  DeviceBuffer<uint16_t> dx(x16);
  DeviceBuffer<uint8_t> codes((size_t)(m * k));
  DeviceBuffer<float> scales((size_t)m);
  cuda::quantize_rows_fp8(dx.get(), m, k, codes.get(), scales.get(), nullptr);
  HABLAR_CUDA_CHECK(cudaDeviceSynchronize());
  const Fp8Rows want = host_fp8_rows(x16, m, k);
  const auto got_codes = codes.download();
  const auto got_scales = scales.download();
  for (int64_t i = 0; i < m; ++i) {
    EXPECT_EQ(got_scales[(size_t)i], want.scales[(size_t)i]) << "row " << i;
    int differ = 0;
    for (int64_t c = 0; c < k; ++c)
      differ += got_codes[(size_t)(i * k + c)] != want.codes[(size_t)(i * k + c)];
    EXPECT_EQ(differ, 0) << "row " << i;
  }
}

class Fp8CopyGpu : public ::testing::TestWithParam<DType> {};

// W's fp8 copy: its codes are those of W's bf16 dequantization, and every product of
// fp8_min_rows() rows or more over it (f32 and bf16 outputs, the pair, run() from f32 rows)
// equals the double product over the codes within the FP8 tensor cores' accumulation (Hopper
// keeps about 14 significant bits in FP8 sums: 1.3-1.7e-4 measured on an H100; a wrong scale
// layout would be off by O(1)), and the exact product within e4m3's error. Fewer rows take
// the bf16 copy, as a matrix with no fp8 copy would.
TEST_P(Fp8CopyGpu, ProductsEqualTheProductOfTheCodes) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  const DType type = GetParam();
  const int64_t n = 96, k = 512;
  const auto host_w = random_weight_bytes(type, n, k, 4323u);
  DeviceWeights w(type, n, k, host_w), w2(type, n, k, random_weight_bytes(type, n, k, 4324u));
  DeviceBuffer<uint16_t> w16((size_t)(n * k)), w2_16((size_t)(n * k));
  cuda::dequantize_to_bf16(w.view, w16.get(), nullptr);
  cuda::dequantize_to_bf16(w2.view, w2_16.get(), nullptr);
  HABLAR_CUDA_CHECK(cudaDeviceSynchronize());
  const Fp8Rows wq = host_fp8_rows(w16.download(), n, k);
  const Fp8Rows w2q = host_fp8_rows(w2_16.download(), n, k);
  const auto exact_w = dequantize_matrix(type, host_w, n, k);
  cuda::PrefillMatmul keeping, bf16_only;
  ASSERT_TRUE(keeping.keep_fp8(w.view, nullptr)) << "cublasLt has no FP8 product here";
  ASSERT_TRUE(keeping.keep_fp8(w2.view, nullptr));
  bf16_only.keep_bf16(w.view, nullptr);
  EXPECT_TRUE(keeping.keeps_fp8(w.view));
  EXPECT_FALSE(bf16_only.keeps_fp8(w.view));
  EXPECT_EQ(keeping.kept_bytes(), 2 * (size_t)(n * k * 3 + n * 4));
  keeping.set_fp8_min_rows(1024);
  keeping.reserve_fp8_rows(2048, k);
  for (int m : {256, 1024, 2048}) {
    const std::string where = std::string(dtype_name(type)) + " M=" + std::to_string(m);
    const auto x = random_floats((size_t)m * k, 8u + (uint32_t)m);
    const auto x16 = to_bf16(x);
    const Fp8Rows xq = host_fp8_rows(x16, m, k);
    DeviceBuffer<uint16_t> dx16(x16), narrow((size_t)m * n);
    DeviceBuffer<float> dx(x), y((size_t)m * n), pair(2 * (size_t)m * n), ran((size_t)m * n),
        wide((size_t)m * n);
    keeping.multiply_kept(w.view, dx16.get(), m, y.get(), nullptr);
    keeping.multiply_kept_to_bf16(w.view, dx16.get(), m, narrow.get(), nullptr);
    keeping.multiply_kept_pair(w.view, w2.view, dx16.get(), m, pair.get(),
                               pair.get() + (size_t)m * n, nullptr);
    keeping.run(w.view, dx.get(), m, ran.get(), nullptr);
    bf16_only.multiply_kept(w.view, dx16.get(), m, wide.get(), nullptr);
    HABLAR_CUDA_CHECK(cudaDeviceSynchronize());
    const auto got = y.download();
    if (m < keeping.fp8_min_rows()) {
      const auto want = wide.download();
      EXPECT_LT(normalized_error(got, std::vector<double>(want.begin(), want.end())), 1e-6)
          << where;
      continue;
    }
    const auto codes_product = fp8_product(xq, wq, m, n, k);
    EXPECT_LT(normalized_error(got, codes_product), 1e-3) << where;
    // e4m3 rounds each operand by up to 2^-4 (about 2^-5 on average): a few percent.
    const double err = normalized_error(got, reference_product(exact_w, x, m, n, k));
    EXPECT_LT(err, 0.06) << where;
    EXPECT_GT(err, 1e-3) << where << ": no fp8 rounding at all?";
    const auto both = pair.download();
    const std::vector<float> got_a(both.begin(), both.begin() + (size_t)m * n);
    const std::vector<float> got_b(both.begin() + (size_t)m * n, both.end());
    EXPECT_LT(normalized_error(got_a, codes_product), 1e-3) << where;
    EXPECT_LT(normalized_error(got_b, fp8_product(xq, w2q, m, n, k)), 1e-3) << where;
    EXPECT_LT(normalized_error(ran.download(), codes_product), 1e-3) << where;
    const auto rounded = narrow.download();
    std::vector<float> widened(rounded.size());
    for (size_t i = 0; i < rounded.size(); ++i) widened[i] = bf16_to_f32(rounded[i]);
    EXPECT_LT(normalized_error(widened, codes_product), 5e-3) << where;
  }
}

INSTANTIATE_TEST_SUITE_P(WeightTypes, Fp8CopyGpu,
                         ::testing::Values(DType::Q4_K, DType::Q6_K, DType::Q8_0, DType::F16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace hablar::test
