// RMSNorm, RoPE (normal and NeoX), SwiGLU, residual add and the quantized embedding gather
// against scalar loops in double (normalized error thresholds in each test).
#include <cmath>

#include "backend/cuda/ops.h"
#include "cuda_test_util.h"
#include "quant_test_data.h"

namespace hablar::test {
namespace {

using cuda::DeviceBuffer;

TEST(OpsGpu, RmsNormMatchesScalar) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  const int rows = 7, dim = 1000;  // dim not a multiple of the block
  const auto x = random_floats((size_t)rows * dim, 1u, -3.0f, 3.0f);
  const auto w = random_floats(dim, 2u, 0.5f, 1.5f);
  DeviceBuffer<float> dx(x), dw(w), dout((size_t)rows * dim);
  cuda::rms_norm(dx.get(), dw.get(), dout.get(), rows, dim, 1e-6f, nullptr);
  std::vector<double> ref(x.size());
  for (int r = 0; r < rows; ++r) {
    double ss = 0;
    for (int i = 0; i < dim; ++i) ss += (double)x[r * dim + i] * x[r * dim + i];
    const double inv = 1.0 / std::sqrt(ss / dim + 1e-6);
    for (int i = 0; i < dim; ++i) ref[r * dim + i] = x[r * dim + i] * inv * w[i];
  }
  EXPECT_LT(normalized_error(dout.download(), ref), 1e-6);
}

class RopeGpu : public ::testing::TestWithParam<cuda::RopeStyle> {};

TEST_P(RopeGpu, MatchesScalar) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  const bool neox = GetParam() == cuda::RopeStyle::kNeox;
  const int tokens = 5, heads = 3, head_dim = 64, rot_dim = 48;  // partial rotation
  const float theta = 10000.0f;
  const std::vector<int32_t> pos = {0, 1, 17, 900, 2047};
  const auto x = random_floats((size_t)tokens * heads * head_dim, 3u);
  DeviceBuffer<float> dx(x);
  DeviceBuffer<int32_t> dpos(pos);
  cuda::rope(dx.get(), dpos.get(), tokens, heads, head_dim, rot_dim, theta, GetParam(), nullptr);
  std::vector<double> ref(x.begin(), x.end());
  for (int t = 0; t < tokens; ++t)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < rot_dim / 2; ++i) {
        const double angle = pos[t] * std::pow((double)theta, -2.0 * i / rot_dim);
        const size_t base = ((size_t)t * heads + h) * head_dim;
        const size_t a = base + (neox ? i : 2 * i), b = base + (neox ? i + rot_dim / 2 : 2 * i + 1);
        ref[a] = x[a] * std::cos(angle) - x[b] * std::sin(angle);
        ref[b] = x[a] * std::sin(angle) + x[b] * std::cos(angle);
      }
  // Angles up to 2047 rad in f32: about 1e-4 absolute error in the rotation.
  EXPECT_LT(normalized_error(dx.download(), ref), 2e-4);
}

INSTANTIATE_TEST_SUITE_P(Styles, RopeGpu,
                         ::testing::Values(cuda::RopeStyle::kNormal, cuda::RopeStyle::kNeox),
                         [](const auto& info) {
                           return info.param == cuda::RopeStyle::kNeox ? std::string("Neox")
                                                                       : std::string("Normal");
                         });

TEST(OpsGpu, SwigluAndAddMatchScalar) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  const int64_t n = 100003;
  const auto g = random_floats(n, 4u, -8.0f, 8.0f), u = random_floats(n, 5u);
  DeviceBuffer<float> dg(g), du(u), dout(n);
  cuda::swiglu(dg.get(), du.get(), dout.get(), n, nullptr);
  std::vector<double> ref(n);
  for (int64_t i = 0; i < n; ++i) ref[i] = g[i] / (1.0 + std::exp(-(double)g[i])) * u[i];
  EXPECT_LT(normalized_error(dout.download(), ref), 1e-6);
  cuda::add(dg.get(), du.get(), dg.get(), n, nullptr);  // in place, as the residual add runs
  for (int64_t i = 0; i < n; ++i) ref[i] = (double)g[i] + u[i];
  EXPECT_LT(normalized_error(dg.download(), ref), 1e-7);
}

TEST(OpsGpu, EmbeddingGatherDequantizesRows) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  const int64_t rows = 50, cols = 512;
  const std::vector<int32_t> ids = {3, 0, 49, 3, -1, 50, 17};  // two out of range
  for (DType type : cuda_weight_types()) {
    const auto bytes = random_weight_bytes(type, rows, cols, 8u);
    const auto ref_table = dequantize_matrix(type, bytes, rows, cols);
    DeviceBuffer<uint8_t> dtable(bytes);
    WeightView table{type, rows, cols, dtype_row_bytes(type, cols), dtable.get()};
    DeviceBuffer<int32_t> dids(ids);
    DeviceBuffer<float> dout(ids.size() * cols);
    cuda::embedding_gather(table, dids.get(), (int)ids.size(), dout.get(), nullptr);
    const auto got = dout.download();
    for (size_t t = 0; t < ids.size(); ++t)
      for (int64_t c = 0; c < cols; ++c) {
        const bool in_range = ids[t] >= 0 && ids[t] < rows;
        const float want = in_range ? ref_table[ids[t] * cols + c] : 0.0f;
        ASSERT_NEAR(got[t * cols + c], want, 1e-6f * std::max(1.0f, std::fabs(want)))
            << dtype_name(type) << " token " << t << " col " << c;
      }
  }
}

}  // namespace
}  // namespace hablar::test
