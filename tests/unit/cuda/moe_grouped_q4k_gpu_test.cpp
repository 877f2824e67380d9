// The Q4_K expert products on int8 rows (backend/cuda/moe.h grouped_q4k_*): against each
// expert's product in double precision over the same int8-rounded rows (so only float
// rounding separates them), for the SwiGLU form (gate and up, rows gathered by expert) and
// the plain one (rows already in grouped order); K over one chunk per thread, teams wider
// than a warp, and two chunks per thread.
#include <cmath>

#include "backend/cuda/matmul.h"
#include "backend/cuda/moe.h"
#include "cuda_test_util.h"
#include "quant_test_data.h"

namespace hablar::test {
namespace {

using cuda::DeviceBuffer;

// x rounded as quantize_rows rounds it: per block of 32, d = max |x| / 127 and x ~ d * q.
std::vector<double> int8_rounded(const std::vector<float>& x) {
  std::vector<double> out(x.size());
  for (size_t b = 0; b < x.size(); b += 32) {
    float amax = 0.0f;
    for (size_t i = b; i < b + 32; ++i) amax = std::fmax(amax, std::fabs(x[i]));
    const float d = amax / 127.0f;
    for (size_t i = b; i < b + 32; ++i)
      out[i] = d > 0.0f ? (double)d * std::nearbyint(x[i] / d) : 0.0;
  }
  return out;
}

double dot(const double* x, const float* w, int64_t k) {
  double sum = 0.0;
  for (int64_t c = 0; c < k; ++c) sum += x[c] * (double)w[c];
  return sum;
}

// E experts of one Q4_K matrix [n x k] at one 256-byte aligned stride, and their values.
struct Experts {
  std::vector<uint8_t> bytes;
  std::vector<std::vector<float>> values;
  size_t stride = 0;
};
Experts random_experts(int E, int64_t n, int64_t k, uint32_t seed) {
  Experts ex;
  const size_t slice = dtype_row_bytes(DType::Q4_K, k) * (size_t)n;
  ex.stride = (slice + 255) / 256 * 256;
  ex.bytes.resize(ex.stride * E);
  for (int e = 0; e < E; ++e) {
    const auto b = random_weight_bytes(DType::Q4_K, n, k, seed + (uint32_t)e);
    std::copy(b.begin(), b.end(), ex.bytes.begin() + (ptrdiff_t)(ex.stride * e));
    ex.values.push_back(dequantize_matrix(DType::Q4_K, b, n, k));
  }
  return ex;
}

class MoeGroupedQ4kGpu : public ::testing::TestWithParam<int64_t> {};

TEST_P(MoeGroupedQ4kGpu, SwigluAndPlainProductsAreEachExpertsProduct) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  const int64_t k = GetParam(), n = 67;  // odd rows: a partial row pair
  const int E = 6, K = 2;
  const Experts gate = random_experts(E, n, k, 500u), up = random_experts(E, n, k, 600u);
  DeviceBuffer<uint8_t> d_gate(gate.bytes), d_up(up.bytes);
  const WeightView gate0{DType::Q4_K, n, k, dtype_row_bytes(DType::Q4_K, k), d_gate.get()};
  const WeightView up0{DType::Q4_K, n, k, dtype_row_bytes(DType::Q4_K, k), d_up.get()};
  ASSERT_TRUE(cuda::moe::grouped_q4k_supported(gate0, gate.stride));
  for (const int64_t T : {1, 2, 13}) {
    const int64_t N = T * K;
    std::vector<int32_t> chosen((size_t)N);
    for (int64_t i = 0; i < N; ++i)  // expert 4 takes two entries of three; 0 and 5 none
      chosen[(size_t)i] = i % 3 == 2 ? 1 + (int32_t)(i / 3 % 3) : 4;
    DeviceBuffer<int32_t> d_chosen(chosen), d_offsets((size_t)E + 1), d_order((size_t)N),
        d_position((size_t)N), d_active((size_t)E);
    cuda::moe::group(d_chosen.get(), N, E, d_offsets.get(), d_order.get(), d_position.get(),
                     nullptr, d_active.get());
    const auto tokens = random_floats((size_t)(T * k), 70u + (uint32_t)T);
    const auto sorted = random_floats((size_t)(N * k), 80u + (uint32_t)T);
    DeviceBuffer<float> d_tokens(tokens), d_sorted(sorted);
    DeviceBuffer<uint8_t> d_q8(cuda::q8_activation_bytes((int)N, k));
    DeviceBuffer<float> d_glu(std::vector<float>((size_t)(N * n), NAN)),
        d_plain(std::vector<float>((size_t)(N * n), NAN));
    cuda::moe::quantize_rows(d_tokens.get(), d_order.get(), K, N, k, d_q8.get(), nullptr);
    cuda::moe::grouped_q4k_glu(gate0, gate.stride, up0, up.stride, E, d_q8.get(), N,
                               d_offsets.get(), d_active.get(), d_glu.get(), nullptr);
    cuda::moe::quantize_rows(d_sorted.get(), nullptr, 1, N, k, d_q8.get(), nullptr);
    cuda::moe::grouped_q4k_product(gate0, gate.stride, E, d_q8.get(), N, d_offsets.get(),
                                   d_active.get(), d_plain.get(), nullptr);
    HABLAR_CUDA_CHECK(cudaDeviceSynchronize());
    const auto offsets = d_offsets.download(), order = d_order.download();
    const auto tokens8 = int8_rounded(tokens), sorted8 = int8_rounded(sorted);
    std::vector<double> want_glu((size_t)(N * n)), want_plain((size_t)(N * n));
    for (int e = 0; e < E; ++e)
      for (int32_t r = offsets[(size_t)e]; r < offsets[(size_t)e + 1]; ++r)
        for (int64_t o = 0; o < n; ++o) {
          const double* x = tokens8.data() + (int64_t)(order[(size_t)r] / K) * k;
          const double g = dot(x, gate.values[(size_t)e].data() + o * k, k);
          const double u = dot(x, up.values[(size_t)e].data() + o * k, k);
          want_glu[(size_t)(r * n + o)] = g / (1.0 + std::exp(-g)) * u;
          want_plain[(size_t)(r * n + o)] =
              dot(sorted8.data() + r * k, gate.values[(size_t)e].data() + o * k, k);
        }
    EXPECT_LT(normalized_error(d_glu.download(), want_glu), 1e-5) << "SwiGLU, T=" << T;
    EXPECT_LT(normalized_error(d_plain.download(), want_plain), 1e-5) << "plain, T=" << T;
  }
}

// K = 512: 8 chunks, teams of 16; 4096: 64 chunks, teams of 64 (two warps); 10240: 160
// chunks, teams of 128 with two chunks a thread.
INSTANTIATE_TEST_SUITE_P(Widths, MoeGroupedQ4kGpu, ::testing::Values(512, 4096, 10240),
                         [](const auto& info) { return std::to_string(info.param) + "_columns"; });

}  // namespace
}  // namespace hablar::test
