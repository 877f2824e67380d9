// The cublasLt product with its bias+GELU epilogue (lt_gemm.h) against the unfused path the
// encoder takes without it (cuBLAS GEMM into F16, then embed::bias_act_f16) and against a
// double-precision host reference of the F16 inputs.
#include <cmath>
#include <vector>

#include "backend/cuda/cublas_library.h"
#include "backend/cuda/embed_kernels.h"
#include "backend/cuda/lt_gemm.h"
#include "cuda_test_util.h"

namespace hablar::test {
namespace {

using cuda::DeviceBuffer;

// Floats rounded to F16 on the device; `f16` keeps the halves, the return value their floats.
std::vector<float> to_f16(const std::vector<float>& v, DeviceBuffer<uint16_t>& f16) {
  DeviceBuffer<float> f(v);
  f16 = DeviceBuffer<uint16_t>(v.size());
  cuda::embed::f32_to_f16(f.get(), f16.get(), (int64_t)v.size(), nullptr);
  DeviceBuffer<float> back(v.size());
  cuda::embed::f16_to_f32(f16.get(), back.get(), (int64_t)v.size(), nullptr);
  return back.download();
}

std::vector<float> download_f16(const DeviceBuffer<uint16_t>& h) {
  DeviceBuffer<float> f(h.size());
  cuda::embed::f16_to_f32(h.get(), f.get(), (int64_t)h.size(), nullptr);
  return f.download();
}

double gelu_tanh(double x) {
  return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * x * (1.0 + 0.044715 * x * x)));
}

struct Shape {
  int n, k, m;
  int w_offset;  // halves before W's first row: a weight that is not 256-byte aligned
};

TEST(LtGemmGpu, BiasGeluEpilogueEqualsTheUnfusedPath) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  for (const Shape s : {Shape{96, 64, 37, 0}, Shape{3072, 768, 300, 0}, Shape{256, 128, 9, 16}}) {
    SCOPED_TRACE("n " + std::to_string(s.n) + " k " + std::to_string(s.k) + " m " +
                 std::to_string(s.m) + " offset " + std::to_string(s.w_offset));
    std::vector<float> w_host((size_t)s.w_offset + (size_t)s.n * s.k);
    const auto w_rand = random_floats((size_t)s.n * s.k, 31u, -0.1f, 0.1f);
    std::copy(w_rand.begin(), w_rand.end(), w_host.begin() + s.w_offset);
    DeviceBuffer<uint16_t> w16, x16, b16;
    const std::vector<float> w = to_f16(w_host, w16);
    const std::vector<float> x = to_f16(random_floats((size_t)s.m * s.k, 32u, -2.0f, 2.0f), x16);
    const std::vector<float> bias_f32 = random_floats((size_t)s.n, 33u, -0.5f, 0.5f);
    const std::vector<float> bias = to_f16(bias_f32, b16);
    const uint16_t* wp = w16.get() + s.w_offset;

    cuda::LtGemm lt;
    DeviceBuffer<uint16_t> fused((size_t)s.m * s.n), unfused((size_t)s.m * s.n);
    if (!lt.run(wp, s.k, s.n, s.k, x16.get(), s.m, fused.get(), b16.get(), true, nullptr))
      GTEST_SKIP() << "cublasLt has no bias+GELU algorithm here";
    // Unfused: cuBLAS into F16, then the bias (the same F16-rounded values) and GELU pass.
    cuda::CublasHandle blas;
    const float alpha = 1.0f, beta = 0.0f;
    HABLAR_CUBLAS_CHECK(cuda::cublas().gemm_ex(blas.get(), CUBLAS_OP_T, CUBLAS_OP_N, s.n, s.m, s.k,
                                               &alpha, wp, CUDA_R_16F, s.k, x16.get(), CUDA_R_16F,
                                               s.k, &beta, unfused.get(), CUDA_R_16F, s.n,
                                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    DeviceBuffer<float> dbias(bias);
    cuda::embed::bias_act_f16(unfused.get(), dbias.get(), s.m, s.n, true, nullptr);
    const std::vector<float> got = download_f16(fused), base = download_f16(unfused);

    std::vector<double> want((size_t)s.m * s.n);
    double max_diff = 0, max_abs = 0;
    for (int t = 0; t < s.m; ++t)
      for (int o = 0; o < s.n; ++o) {
        double acc = bias[(size_t)o];
        for (int i = 0; i < s.k; ++i)
          acc += (double)w[(size_t)s.w_offset + (size_t)o * s.k + i] * x[(size_t)t * s.k + i];
        const size_t at = (size_t)t * s.n + o;
        want[at] = gelu_tanh(acc);
        max_diff = std::max(max_diff, std::fabs((double)got[at] - base[at]));
        max_abs = std::max(max_abs, std::fabs(want[at]));
      }
    // F16 outputs: a few units in the last place of the largest values apart at most (the
    // unfused path rounds the product to F16 before the GELU, the fused one does not).
    EXPECT_LE(max_diff, 4e-3 * max_abs);
    EXPECT_LT(normalized_error(got, want), 2e-3);
    EXPECT_LT(normalized_error(base, want), 2e-3);
  }
}

}  // namespace
}  // namespace hablar::test
