// The mixture-of-experts kernels (backend/cuda/moe.h) against the same functions run on the
// host (moe_routing.cuh), bit for bit: routing, the grouping by expert and its inverse, the
// row gather, the F16 expert product and the weighted combination with and without a shared
// expert; and the grouped expert products (sized on the device) against each expert's
// product in double precision. The host functions are held to cpu::moe_ffn by
// cuda_moe_host_twin_tests; the wiring through ForwardOps by gpu_parity_tests.
#include <cmath>
#include <cstring>

#include "backend/cuda/moe.h"
#include "backend/cuda/moe_routing.cuh"
#include "core/fp16.h"
#include "cuda_test_util.h"
#include "quant_test_data.h"

namespace hablar::test {
namespace {

using cuda::DeviceBuffer;
namespace mr = moe_routing;

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want,
                      const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int64_t differ = 0;
  for (size_t i = 0; i < want.size(); ++i) differ += bits(got[i]) != bits(want[i]);
  EXPECT_EQ(differ, 0) << what;
}

struct Routed {
  std::vector<float> probs, weights;
  std::vector<int32_t> chosen;
};

Routed route_on_host(std::vector<float> logits, int64_t T, int E, int K, bool normalize) {
  const mr::ExpTable table = mr::libc_expf_table();
  Routed r{std::move(logits), std::vector<float>((size_t)(T * K)),
           std::vector<int32_t>((size_t)(T * K))};
  for (int64_t t = 0; t < T; ++t) {
    float* row = r.probs.data() + t * E;
    mr::softmax_row(row, row, E, table);
    mr::route_token(row, E, K, normalize, r.chosen.data() + t * K, r.weights.data() + t * K);
  }
  return r;
}

// Routes and groups T tokens' logits [T x E] on the device; every output equal to the host's.
void expect_route_and_group_as_host(const std::vector<float>& logits, int64_t T, int E, int K,
                                    bool normalize) {
  const int64_t N = T * K;
  const Routed want = route_on_host(logits, T, E, K, normalize);
  DeviceBuffer<float> d_logits(logits), d_weights((size_t)N);
  DeviceBuffer<int32_t> d_chosen((size_t)N), d_offsets((size_t)E + 1), d_order((size_t)N),
      d_position((size_t)N), d_active((size_t)cuda::moe::active_slots(N, E));
  cuda::moe::route(d_logits.get(), T, E, K, normalize, d_chosen.get(), d_weights.get(), nullptr);
  cuda::moe::group(d_chosen.get(), N, E, d_offsets.get(), d_order.get(), d_position.get(), nullptr,
                   d_active.get());
  expect_same_bits(d_logits.download(), want.probs, "probabilities");
  expect_same_bits(d_weights.download(), want.weights, "weights");
  EXPECT_EQ(d_chosen.download(), want.chosen);
  std::vector<int32_t> offsets{0}, order((size_t)N), position((size_t)N);
  for (int32_t e = 0; e < E; ++e) {
    const int64_t n = mr::expert_slots(want.chosen.data(), N, e, order.data() + offsets.back());
    for (int64_t r = offsets.back(); r < offsets.back() + n; ++r)
      position[(size_t)order[(size_t)r]] = (int32_t)r;
    offsets.push_back(offsets.back() + (int32_t)n);
  }
  EXPECT_EQ(d_offsets.download(), offsets);
  EXPECT_EQ(d_order.download(), order);
  EXPECT_EQ(d_position.download(), position);
  std::vector<int32_t> active((size_t)cuda::moe::active_slots(N, E));
  mr::active_experts(offsets.data(), E, active.data(), (int)active.size());
  EXPECT_EQ(d_active.download(), active);
}

class MoeRouteGpu : public ::testing::TestWithParam<std::tuple<int, int, bool>> {};

TEST_P(MoeRouteGpu, RouteAndGroupAreTheHostFunctions) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  const auto [E, K, normalize] = GetParam();
  const int64_t T = 37;
  expect_route_and_group_as_host(random_floats((size_t)(T * E), 5u, -4.0f, 4.0f), T, E, K,
                                 normalize);
}

// Logits of three values only (equal probabilities everywhere: the picks' ties go to the
// lower expert), over more entries than the grouping's shared-memory tile of 2048.
TEST(MoeGpu, RouteTiesAndManyTokensAreTheHostFunctions) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  const int64_t T = 700;
  const int E = 40, K = 6;  // E not a multiple of 16: the softmax's tail
  auto logits = random_floats((size_t)(T * E), 9u, -1.5f, 1.5f);
  for (float& v : logits) v = std::round(v);
  expect_route_and_group_as_host(logits, T, E, K, true);
}

INSTANTIATE_TEST_SUITE_P(Routers, MoeRouteGpu,
                         ::testing::Values(std::make_tuple(8, 2, true),        // Mixtral
                                           std::make_tuple(60, 4, false),      // Qwen2-MoE
                                           std::make_tuple(128, 8, true),      // Qwen3-MoE
                                           std::make_tuple(1500, 16, true)));  // > 1024 experts

TEST(MoeGpu, GatherF16ProductAndCombineAreTheHostFunctions) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  const int64_t T = 11, D = 200, F = 96;  // D not a multiple of 64: the product's tail
  const int E = 16, K = 3;
  const int64_t N = T * K;
  const auto in = random_floats((size_t)(T * D), 7u, -2.0f, 2.0f);
  const Routed routed =
      route_on_host(random_floats((size_t)(T * E), 8u, -3.0f, 3.0f), T, E, K, true);
  std::vector<int32_t> order, position((size_t)N);
  for (int32_t e = 0; e < E; ++e) {
    std::vector<int32_t> slots((size_t)N);
    const int64_t n = mr::expert_slots(routed.chosen.data(), N, e, slots.data());
    order.insert(order.end(), slots.begin(), slots.begin() + n);
  }
  for (size_t r = 0; r < order.size(); ++r) position[(size_t)order[r]] = (int32_t)r;
  // Gather.
  DeviceBuffer<float> d_in(in), d_rows((size_t)(N * D));
  DeviceBuffer<int32_t> d_order(order), d_position(position);
  cuda::moe::gather(d_in.get(), d_order.get(), N, K, D, d_rows.get(), nullptr);
  std::vector<float> rows((size_t)(N * D));
  for (int64_t r = 0; r < N; ++r)
    std::copy_n(in.data() + order[(size_t)r] / K * D, D, rows.data() + r * D);
  expect_same_bits(d_rows.download(), rows, "gathered rows");
  // An F16 expert [F x D] over the gathered rows.
  const auto wf = random_floats((size_t)(F * D), 9u, -0.2f, 0.2f);
  std::vector<uint16_t> w16(wf.size());
  for (size_t i = 0; i < wf.size(); ++i) w16[i] = f32_to_fp16(wf[i]);
  DeviceBuffer<uint16_t> d_w(w16);
  const WeightView w{DType::F16, F, D, (size_t)D * 2, d_w.get()};
  DeviceBuffer<float> d_y((size_t)(N * F));
  cuda::moe::f16_expert_matmul(w, d_rows.get(), N, d_y.get(), nullptr);
  std::vector<float> y((size_t)(N * F));
  for (int64_t r = 0; r < N; ++r)
    for (int64_t o = 0; o < F; ++o)
      y[(size_t)(r * F + o)] = mr::f16_expert_dot(w16.data() + o * D, rows.data() + r * D, D);
  expect_same_bits(d_y.download(), y, "F16 expert product");
  // The combination, with and without a shared expert (gate logits of both signs).
  const mr::ExpTable table = mr::libc_expf_table();
  const auto shared = random_floats((size_t)(T * D), 10u);
  const auto gate_logits = random_floats((size_t)T, 11u, -6.0f, 6.0f);
  DeviceBuffer<float> d_sorted(rows), d_weights(routed.weights), d_shared(shared),
      d_glog(gate_logits), d_out((size_t)(T * D));
  for (bool with_shared : {false, true}) {
    cuda::moe::combine(d_sorted.get(), d_position.get(), d_weights.get(), T, K, D,
                       with_shared ? d_shared.get() : nullptr, d_glog.get(), d_out.get(), nullptr);
    std::vector<float> want((size_t)(T * D));
    for (int64_t t = 0; t < T; ++t) {
      const float* slot_rows[mr::kMaxExpertsUsed];
      for (int j = 0; j < K; ++j)
        slot_rows[j] = rows.data() + (int64_t)position[(size_t)(t * K + j)] * D;
      for (int64_t d = 0; d < D; ++d)
        want[(size_t)(t * D + d)] =
            mr::combine_value(slot_rows, routed.weights.data() + t * K, K, d, with_shared,
                              shared[(size_t)(t * D + d)], gate_logits[(size_t)t], table);
    }
    expect_same_bits(d_out.download(), want, with_shared ? "combined, shared" : "combined");
  }
}

// Experts of one type at one stride (as a 3-D tensor uploads), routed so that one expert
// gets more than 8 rows (two rounds of the kernel) and others none; and a step with fewer
// entries than experts (fewer slots than experts).
class MoeGroupedGpu : public ::testing::TestWithParam<DType> {};

TEST_P(MoeGroupedGpu, GroupedProductsAreEachExpertsProduct) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  const DType type = GetParam();
  const int E = 6;
  const int64_t n = 67, k = 512;  // odd rows: a partial row pair
  const size_t slice = dtype_row_bytes(type, k) * (size_t)n, stride = (slice + 255) / 256 * 256;
  std::vector<uint8_t> all(stride * E);
  std::vector<std::vector<float>> ref_w;
  for (int e = 0; e < E; ++e) {
    const auto bytes = random_weight_bytes(type, n, k, 300u + (uint32_t)e);
    std::copy(bytes.begin(), bytes.end(), all.begin() + (ptrdiff_t)(stride * e));
    ref_w.push_back(dequantize_matrix(type, bytes, n, k));
  }
  DeviceBuffer<uint8_t> d_w(all);
  const WeightView first{type, n, k, dtype_row_bytes(type, k), d_w.get()};
  for (const int64_t T : {1, 2, 13}) {
    const int K = 2;
    const int64_t N = T * K;
    std::vector<int32_t> chosen((size_t)N);
    for (int64_t i = 0; i < N; ++i)  // expert 4 takes two entries of three; 0 and 5 none
      chosen[(size_t)i] = i % 3 == 2 ? 1 + (int32_t)(i / 3 % 3) : 4;
    const auto x = random_floats((size_t)(N * k), 40u + (uint32_t)T);
    DeviceBuffer<int32_t> d_chosen(chosen), d_offsets((size_t)E + 1), d_order((size_t)N),
        d_position((size_t)N), d_active((size_t)E);
    cuda::moe::group(d_chosen.get(), N, E, d_offsets.get(), d_order.get(), d_position.get(),
                     nullptr, d_active.get());
    DeviceBuffer<float> d_x(x), d_y(std::vector<float>((size_t)(N * n), NAN));
    cuda::moe::grouped_product(first, stride, E, d_x.get(), N, d_offsets.get(), d_active.get(),
                               d_y.get(), nullptr);
    HABLAR_CUDA_CHECK(cudaDeviceSynchronize());
    const auto offsets = d_offsets.download();
    std::vector<double> want((size_t)(N * n));
    for (int e = 0; e < E; ++e)
      for (int32_t r = offsets[(size_t)e]; r < offsets[(size_t)e + 1]; ++r)
        for (int64_t o = 0; o < n; ++o) {
          double sum = 0.0;
          for (int64_t c = 0; c < k; ++c)
            sum += (double)x[(size_t)(r * k + c)] * ref_w[(size_t)e][(size_t)(o * k + c)];
          want[(size_t)(r * n + o)] = sum;
        }
    EXPECT_LT(normalized_error(d_y.download(), want), 1e-5) << dtype_name(type) << " T=" << T;
  }
}

INSTANTIATE_TEST_SUITE_P(Types, MoeGroupedGpu,
                         ::testing::Values(DType::Q4_K, DType::Q6_K, DType::Q8_0, DType::Q5_0,
                                           DType::F16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace hablar::test
