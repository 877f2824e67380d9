// The persistent decode step's norm and product phases (persistent_step.h) against the
// launch-per-op kernels they stand for, bit for bit: the norm with its residual add and int8
// rows (add_rms_norm_q8), Q4_K rows in one launch of several matrices and the gated pair
// (matmul_q4k_rows_multi, matmul_q4k_rows_glu), Q6_K rows (matmul_q6k_rows), and f32 rows
// quantized by the phase (quantize_activations_q8). One phase list chains them, so the later
// phases read what earlier ones wrote in other blocks: the grid barrier is under test too.
// (The attention phase is compared end to end: gpu_parity_test.cpp.)
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/matmul.h"
#include "backend/cuda/matmul_q4k_rows.h"
#include "backend/cuda/matmul_q6k_rows.h"
#include "backend/cuda/ops.h"
#include "backend/cuda/persistent_step_runner.h"
#include "core/dtype.h"
#include "cuda_test_util.h"
#include "matmul_test_util.h"
#include "quant_test_data.h"

namespace hablar::test {
namespace {

using cuda::DeviceBuffer;

DeviceWeights random_matrix(DType type, int64_t n, int64_t k, uint32_t seed) {
  return DeviceWeights(type, n, k, random_weight_bytes(type, n, k, seed));
}

cuda::PersistentMatrix matrix_of(const DeviceWeights& w, int matrices, float* out) {
  cuda::PersistentMatrix m;
  EXPECT_TRUE(cuda::persistent_matrix_rule(w.view, matrices, &m));
  m.out = out;
  return m;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Per phase of one launch: block 0's prologue, the last block's end of its share, and the
// barrier after it.
void print_phase_times(const cuda::PersistentStepRunner& runner, const std::string& what,
                       const std::vector<std::string>& names) {
  DeviceBuffer<unsigned long long> stamps(4 * names.size() + 4);
  cuda::set_device_bytes(stamps.get(), 0, stamps.size() * 8);
  runner.launch(nullptr, stamps.get());
  HABLAR_CUDA_CHECK(cudaDeviceSynchronize());
  const auto t = stamps.download();
  std::printf("%s:", what.c_str());
  for (size_t i = 0; i < names.size(); ++i)
    std::printf(" %s %.1f us (prologue %.1f, last block done %.1f, barrier %.1f);",
                names[i].c_str(), (t[4 * i + 4] - t[4 * i]) / 1e3, (t[4 * i + 1] - t[4 * i]) / 1e3,
                ((double)t[4 * i + 2] - (double)t[4 * i]) / 1e3,
                ((double)t[4 * i + 4] - (double)t[4 * i + 2]) / 1e3);
  std::printf("\n");
}

// Shapes of a 1.5B-like layer (E = 1536, FF = 8960) and an 8B-like one (4096, 14336).
class PersistentStepPhases : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(PersistentStepPhases, EqualTheLaunchPerOpKernelsBitForBit) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  const auto [E, FF] = GetParam();
  const int KV = 256;
  auto wq = random_matrix(DType::Q4_K, E, E, 1), wk = random_matrix(DType::Q4_K, KV, E, 2);
  auto wv = random_matrix(DType::Q6_K, KV, E, 3);
  auto gate = random_matrix(DType::Q4_K, FF, E, 4), up = random_matrix(DType::Q4_K, FF, E, 5);
  auto down4 = random_matrix(DType::Q4_K, E, FF, 6), down6 = random_matrix(DType::Q6_K, E, FF, 7);
  const auto x_host = random_floats((size_t)E, 8), add_host = random_floats((size_t)E, 9);
  const auto norm_host = random_floats((size_t)E, 10, 0.5f, 1.5f);
  DeviceBuffer<float> x(x_host), add(add_host), norm_w(norm_host), x_next((size_t)E);
  DeviceBuffer<float> q((size_t)E), k((size_t)KV), v((size_t)KV), act((size_t)FF);
  DeviceBuffer<float> y4((size_t)E), y6((size_t)E);

  std::vector<cuda::PersistentPhase> phases(3);
  cuda::PersistentPhase& qkv = phases[0];  // norm(x + add), then Q (Q4_K), K (Q4_K), V (Q6_K)
  qkv.kind = cuda::PersistentPhaseKind::kNormProducts;
  qkv.x = x.get(), qkv.add = add.get(), qkv.x_out = x_next.get(), qkv.norm_weight = norm_w.get();
  qkv.width = E;
  qkv.matrices[0] = matrix_of(wq, 1, q.get()), qkv.matrices[1] = matrix_of(wk, 1, k.get());
  qkv.matrices[2] = matrix_of(wv, 1, v.get()), qkv.n_matrices = 3;
  cuda::PersistentPhase& glu = phases[1];  // norm(x_next), then the gated pair
  glu = qkv;
  glu.x = x_next.get(), glu.add = nullptr, glu.x_out = nullptr;
  glu.matrices[0] = matrix_of(gate, 2, act.get()), glu.matrices[1] = matrix_of(up, 2, act.get());
  glu.n_matrices = 2, glu.glu = true, glu.act = GluActivation::kSilu;
  cuda::PersistentPhase& down = phases[2];  // the gated rows quantized, two down matrices
  down.kind = cuda::PersistentPhaseKind::kProduct;
  down.input = cuda::PersistentInput::kF32, down.in = act.get(), down.width = FF;
  down.matrices[0] = matrix_of(down4, 1, y4.get()),
  down.matrices[1] = matrix_of(down6, 1, y6.get());
  down.n_matrices = 2;
  cuda::PersistentStepContext ctx;
  ctx.n_embd = E, ctx.n_heads = E / 128, ctx.n_kv_heads = 2, ctx.head_dim = 128,
  ctx.rms_eps = 1e-6f;
  std::string why;
  ASSERT_TRUE(cuda::PersistentStepRunner::device_can_run(&why)) << why;
  cuda::PersistentStepRunner runner(phases, ctx);
  for (int run = 0; run < 3; ++run) runner.launch(nullptr);  // barriers reused across launches
  HABLAR_CUDA_CHECK(cudaDeviceSynchronize());
  print_phase_times(runner, "E " + std::to_string(E) + " FF " + std::to_string(FF),
                    {"QKV", "gate-up", "down"});

  // The same through the launch-per-op kernels, from the same inputs.
  DeviceBuffer<float> rx(x_host), normed((size_t)E), rq((size_t)E), rk((size_t)KV), rv((size_t)KV);
  DeviceBuffer<float> ract((size_t)FF), ry4((size_t)E), ry6((size_t)E);
  DeviceBuffer<uint8_t> ws(cuda::q8_activation_bytes(1, FF));
  const cuda::Q8Activations qa = cuda::q8_layout(ws.get(), 1, E);
  cuda::add_rms_norm_q8(rx.get(), add.get(), norm_w.get(), normed.get(), 1, E, 1e-6f, ws.get(),
                        nullptr);
  const WeightView* qk[] = {&wq.view, &wk.view};
  float* qk_out[] = {rq.get(), rk.get()};
  cuda::matmul_q4k_rows_multi(qk, qk_out, qa.codes, qa.scales, nullptr);
  cuda::matmul_q6k_rows(wv.view, qa.codes, qa.scales, rv.get(), nullptr);
  cuda::rms_norm_q8(rx.get(), norm_w.get(), normed.get(), 1, E, 1e-6f, ws.get(), nullptr);
  cuda::matmul_q4k_rows_glu(gate.view, up.view, qa.codes, qa.scales, ract.get(),
                            GluActivation::kSilu, nullptr);
  cuda::quantize_activations_q8(ract.get(), 1, FF, ws.get(), ws.size(), nullptr);
  const cuda::Q8Activations da = cuda::q8_layout(ws.get(), 1, FF);
  cuda::matmul_q4k_rows(down4.view, da.codes, da.scales, ry4.get(), nullptr);
  cuda::matmul_q6k_rows(down6.view, da.codes, da.scales, ry6.get(), nullptr);
  HABLAR_CUDA_CHECK(cudaDeviceSynchronize());

  EXPECT_TRUE(bitwise_equal(x_next.download(), rx.download())) << "x + add";
  EXPECT_TRUE(bitwise_equal(q.download(), rq.download())) << "Q (Q4_K, 3 matrices in a phase)";
  EXPECT_TRUE(bitwise_equal(k.download(), rk.download())) << "K (Q4_K)";
  EXPECT_TRUE(bitwise_equal(v.download(), rv.download())) << "V (Q6_K)";
  EXPECT_TRUE(bitwise_equal(act.download(), ract.download())) << "gate, up and SwiGLU";
  EXPECT_TRUE(bitwise_equal(y4.download(), ry4.download())) << "down (Q4_K) of quantized f32 rows";
  EXPECT_TRUE(bitwise_equal(y6.download(), ry6.download())) << "down (Q6_K)";
  // Not vacuous: the products are not all zero.
  double sum = 0;
  for (float f : y4.download()) sum += std::abs(f);
  EXPECT_GT(sum, 0.0);
}

// A list of norm-only phases: what a phase costs beyond its products (the norm of a
// 1536-value row in every block and the grid barrier), printed.
TEST(PersistentStepBarrier, NormOnlyPhasesRunAndTheirCostIsPrinted) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  const int E = 1536, n = 64;
  DeviceBuffer<float> x(random_floats((size_t)E, 1)), w(random_floats((size_t)E, 2));
  std::vector<cuda::PersistentPhase> phases((size_t)n);
  for (auto& p : phases) p.x = x.get(), p.norm_weight = w.get(), p.width = E;
  cuda::PersistentStepContext ctx;
  ctx.n_embd = E, ctx.n_heads = 12, ctx.n_kv_heads = 2, ctx.head_dim = 128, ctx.rms_eps = 1e-6f;
  cuda::PersistentStepRunner runner(phases, ctx);
  DeviceBuffer<unsigned long long> stamps(4 * phases.size() + 4);
  for (int run = 0; run < 3; ++run) {
    cuda::set_device_bytes(stamps.get(), 0, stamps.size() * 8);
    runner.launch(nullptr, stamps.get());
  }
  HABLAR_CUDA_CHECK(cudaDeviceSynchronize());
  const auto t = stamps.download();
  ASSERT_GT(t[4 * (size_t)n], t[0]);
  double norm = 0, rest = 0;
  for (int i = 0; i < n; ++i) {
    norm += (double)(t[4 * i + 1] - t[4 * i]), rest += (double)(t[4 * i + 4] - t[4 * i + 1]);
  }
  std::printf("norm-only phase: %.2f us each over %d (norm %.2f, the rest and the barrier %.2f)\n",
              (double)(t[4 * (size_t)n] - t[0]) / 1e3 / n, n, norm / 1e3 / n, rest / 1e3 / n);
}

INSTANTIATE_TEST_SUITE_P(Shapes, PersistentStepPhases,
                         ::testing::Values(std::make_pair(1536, 8960),
                                           std::make_pair(4096, 14336)));

}  // namespace
}  // namespace hablar::test
