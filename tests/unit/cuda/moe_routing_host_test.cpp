// The host twin of the CUDA mixture of experts (backend/cuda/moe.cu, ForwardOps::moe_ffn):
// the functions its kernels run (moe_routing.cuh), compiled for the host and strung together
// in the order the device runs them — router product, softmax and top-k per token, the
// stable grouping of (token, slot) entries by expert and its inverse, gathered rows, each
// expert's products on its rows (one-token roles; F16 experts in the expert order), SwiGLU,
// the weighted sum in slot order and the gated shared expert — must give cpu::moe_ffn's
// output bit for bit (the deterministic mode's promise) for Mixtral-, Qwen2-MoE- and
// Qwen3-MoE-like layers in F16, Q8_0 and Q4_K. Runs without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/matmul_fused.h"
#include "backend/cpu/moe.h"
#include "backend/cpu/ops.h"
#include "backend/cuda/moe_routing.cuh"
#include "core/llama_batch_roles.h"
#include "core/quant.h"
#include "core/thread_pool.h"

namespace hablar {
namespace {

namespace mr = moe_routing;
namespace cr = cpu_rounding;

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

std::vector<float> random_floats(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

struct Matrix {
  std::vector<uint8_t> bytes;
  WeightView view;
};

Matrix random_matrix(DType type, int64_t rows, int64_t cols, uint32_t seed, float scale = 0.08f) {
  const std::vector<float> f = random_floats((size_t)(rows * cols), seed, scale);
  Matrix m;
  const size_t row_bytes = dtype_row_bytes(type, cols);
  m.bytes.resize(row_bytes * (size_t)rows);
  for (int64_t r = 0; r < rows; ++r)
    quantize_row(type, f.data() + r * cols, m.bytes.data() + r * row_bytes, cols);
  m.view = {type, rows, cols, row_bytes, m.bytes.data()};
  return m;
}

TEST(MoeRoutingHost, LibcExpfIsTheCLibrarysExpf) {
  const mr::ExpTable table = mr::libc_expf_table();
  // Every 97th float bit pattern (both signs, all exponents, NaN and infinities included),
  // then a dense sweep of the softmax's range.
  int64_t differ = 0, n = 0;
  const auto check = [&](float x) {
    const float got = mr::libc_expf(x, table), want = std::exp(x);
    ++n;
    if (bits(got) != bits(want) && !(std::isnan(got) && std::isnan(want))) {
      if (differ < 5)
        ADD_FAILURE() << std::hexfloat << "expf(" << x << "): " << got << " vs " << want;
      ++differ;
    }
  };
  for (uint64_t b = 0; b < (1ull << 32); b += 97) {
    const auto u = (uint32_t)b;
    float x;
    std::memcpy(&x, &u, 4);
    check(x);
  }
  for (float x = -30.0f; x <= 0.0f; x += 1.0f / 4096) check(x);
  EXPECT_EQ(differ, 0) << "of " << n;
}

TEST(MoeRoutingHost, SoftmaxIsTheCpusForEveryTail) {
  const mr::ExpTable table = mr::libc_expf_table();
  for (int n : {1, 2, 8, 15, 16, 17, 60, 64, 128, 131}) {
    const std::vector<float> x = random_floats((size_t)n, (uint32_t)n, 2.0f);
    std::vector<float> want((size_t)n), got((size_t)n);
    cpu::softmax_row(x.data(), want.data(), n);
    mr::softmax_row(x.data(), got.data(), n, table);
    for (int i = 0; i < n; ++i)
      ASSERT_EQ(bits(got[(size_t)i]), bits(want[(size_t)i])) << n << " " << i;
  }
}

TEST(MoeRoutingHost, TopKTakesTheLowerIndexOfEqualProbabilities) {
  const float probs[] = {0.1f, 0.3f, 0.3f, 0.05f, 0.25f};
  int32_t chosen[3];
  float w[3];
  mr::route_token(probs, 5, 3, true, chosen, w);
  EXPECT_EQ(chosen[0], 1);
  EXPECT_EQ(chosen[1], 2);
  EXPECT_EQ(chosen[2], 4);
  const float total = (float)((double)0.3f + (double)0.3f + (double)0.25f);
  EXPECT_EQ(bits(w[0]), bits(0.3f / total));
  mr::route_token(probs, 5, 3, false, chosen, w);
  EXPECT_EQ(bits(w[2]), bits(0.25f));
}

TEST(MoeRoutingHost, GroupingIsAStableCountingSortWithItsInverse) {
  // 5 tokens x 2 slots over 4 experts (expert 3 unused).
  const int32_t chosen[] = {2, 0, 0, 1, 2, 1, 0, 2, 1, 0};
  const int64_t N = 10;
  std::vector<int32_t> order((size_t)N), position((size_t)N);
  int64_t at = 0;
  std::vector<int64_t> offsets{0};
  for (int32_t e = 0; e < 4; ++e) {
    const int64_t n = mr::expert_slots(chosen, N, e, order.data() + at);
    for (int64_t r = at; r < at + n; ++r) position[(size_t)order[(size_t)r]] = (int32_t)r;
    at += n;
    offsets.push_back(at);
  }
  EXPECT_EQ(offsets, (std::vector<int64_t>{0, 4, 3 + 4, 10, 10}));
  EXPECT_EQ(order, (std::vector<int32_t>{1, 2, 6, 9, 3, 5, 8, 0, 4, 7}));
  for (int64_t i = 0; i < N; ++i) EXPECT_EQ(order[(size_t)position[(size_t)i]], i);
}

TEST(MoeRoutingHost, ActiveExpertsListsTheExpertsWithEntriesThenMinusOne) {
  // 6 experts; 1, 3 and 4 have entries.
  const int32_t offsets[] = {0, 0, 2, 2, 7, 8, 8};
  int32_t active[5];
  mr::active_experts(offsets, 6, active, 5);
  EXPECT_EQ(std::vector<int32_t>(active, active + 5), (std::vector<int32_t>{1, 3, 4, -1, -1}));
  // Fewer slots than experts with entries (a step of fewer entries than experts cannot have
  // more experts with entries than slots; the list stops at the slots anyway).
  mr::active_experts(offsets, 6, active, 2);
  EXPECT_EQ(std::vector<int32_t>(active, active + 2), (std::vector<int32_t>{1, 3}));
}

struct MoeCase {
  const char* name;
  DType type;
  int n_experts, n_used;
  bool normalize, shared;
  int64_t n_embd, n_ff;
};

void PrintTo(const MoeCase& c, std::ostream* os) {
  *os << c.name;
}

class MoeHostTwin : public ::testing::TestWithParam<MoeCase> {};

// ForwardOps::moe_ffn's sequence on the host.
void twin_moe(const ExpertsView& ex, const float* in, int64_t T, int64_t D, ThreadPool& pool,
              float* out) {
  const mr::ExpTable table = mr::libc_expf_table();
  const int E = (int)ex.gate.size(), K = ex.n_used;
  const int64_t N = T * K, FE = ex.gate[0].rows;
  std::vector<float> logits((size_t)(T * E)), weights((size_t)N);
  std::vector<int32_t> chosen((size_t)N), order((size_t)N), position((size_t)N);
  cpu::matmul(*ex.router, in, T, logits.data(), pool);
  for (int64_t t = 0; t < T; ++t) {
    float* row = logits.data() + t * E;
    mr::softmax_row(row, row, E, table);
    mr::route_token(row, E, K, ex.normalize, chosen.data() + t * K, weights.data() + t * K);
  }
  std::vector<int64_t> offsets{0};
  for (int32_t e = 0; e < E; ++e) {
    const int64_t at = offsets.back();
    const int64_t n = mr::expert_slots(chosen.data(), N, e, order.data() + at);
    for (int64_t r = at; r < at + n; ++r) position[(size_t)order[(size_t)r]] = (int32_t)r;
    offsets.push_back(at + n);
  }
  std::vector<float> rows((size_t)(N * D)), gate((size_t)(N * FE)), up((size_t)(N * FE)),
      down((size_t)(N * D));
  for (int64_t r = 0; r < N; ++r)
    std::copy_n(in + order[(size_t)r] / K * D, D, rows.data() + r * D);
  const std::vector<uint8_t> single((size_t)N, llama_batch_role(0, 1));
  const auto product = [&](const WeightView& w, const float* x, int64_t n, float* y) {
    if (w.type != DType::F16) return cpu::matmul(w, x, n, y, pool, {single.data(), (size_t)n});
    for (int64_t t = 0; t < n; ++t)
      for (int64_t o = 0; o < w.rows; ++o)
        y[t * w.rows + o] =
            mr::f16_expert_dot(reinterpret_cast<const uint16_t*>(
                                   static_cast<const uint8_t*>(w.data) + o * w.row_bytes),
                               x + t * w.cols, w.cols);
  };
  for (int e = 0; e < E; ++e) {
    const int64_t at = offsets[(size_t)e], n = offsets[(size_t)e + 1] - at;
    if (n == 0) continue;
    product(ex.gate[(size_t)e], rows.data() + at * D, n, gate.data() + at * FE);
    product(ex.up[(size_t)e], rows.data() + at * D, n, up.data() + at * FE);
  }
  for (int64_t i = 0; i < N * FE; ++i) gate[(size_t)i] = cr::swiglu(gate[(size_t)i], up[(size_t)i]);
  for (int e = 0; e < E; ++e) {
    const int64_t at = offsets[(size_t)e], n = offsets[(size_t)e + 1] - at;
    if (n > 0) product(ex.down[(size_t)e], gate.data() + at * FE, n, down.data() + at * D);
  }
  const bool shared = ex.shared_gate != nullptr;
  std::vector<float> sg, su, sd((size_t)(T * D)), glog((size_t)T);
  if (shared) {
    const int64_t FS = ex.shared_gate->rows;
    sg.resize((size_t)(T * FS)), su.resize((size_t)(T * FS));
    cpu::matmul(*ex.shared_gate, in, T, sg.data(), pool);
    cpu::matmul(*ex.shared_up, in, T, su.data(), pool);
    for (size_t i = 0; i < sg.size(); ++i) sg[i] = cr::swiglu(sg[i], su[i]);
    cpu::matmul(*ex.shared_down, sg.data(), T, sd.data(), pool);
    cpu::matmul(*ex.shared_gate_inp, in, T, glog.data(), pool);
  }
  for (int64_t t = 0; t < T; ++t) {
    const float* slot_rows[mr::kMaxExpertsUsed];
    for (int j = 0; j < K; ++j)
      slot_rows[j] = down.data() + (int64_t)position[(size_t)(t * K + j)] * D;
    for (int64_t d = 0; d < D; ++d)
      out[t * D + d] =
          mr::combine_value(slot_rows, weights.data() + t * K, K, d, shared,
                            shared ? sd[(size_t)(t * D + d)] : 0.0f, glog[(size_t)t], table);
  }
}

TEST_P(MoeHostTwin, EqualsTheCpuBitForBit) {
  const MoeCase& c = GetParam();
  ThreadPool pool(2);
  std::vector<Matrix> store;
  store.reserve(3 * (size_t)c.n_experts + 5);
  const auto matrix = [&](DType type, int64_t rows, int64_t cols, float scale = 0.08f) {
    store.push_back(random_matrix(type, rows, cols, (uint32_t)store.size() + 11, scale));
    return store.back().view;
  };
  const WeightView router = matrix(DType::F32, c.n_experts, c.n_embd, 0.3f);
  std::vector<WeightView> gate, up, down;
  for (int e = 0; e < c.n_experts; ++e) {
    gate.push_back(matrix(c.type, c.n_ff, c.n_embd));
    up.push_back(matrix(c.type, c.n_ff, c.n_embd));
    down.push_back(matrix(c.type, c.n_embd, c.n_ff));
  }
  WeightView sgi, sg, su, sd;
  ExpertsView ex{&router, gate, up, down, c.n_used, c.normalize};
  if (c.shared) {
    sgi = matrix(DType::F32, 1, c.n_embd, 0.3f);
    sg = matrix(c.type, c.n_ff, c.n_embd), su = matrix(c.type, c.n_ff, c.n_embd);
    sd = matrix(c.type, c.n_embd, c.n_ff);
    ex.shared_gate_inp = &sgi, ex.shared_gate = &sg, ex.shared_up = &su, ex.shared_down = &sd;
  }
  for (int64_t T : {1, 3, 9}) {
    const std::vector<float> in = random_floats((size_t)(T * c.n_embd), (uint32_t)T, 1.0f);
    std::vector<float> want((size_t)(T * c.n_embd)), got(want.size());
    cpu::MoeScratch scratch;
    cpu::moe_ffn(ex, in.data(), T, c.n_embd, want.data(), pool, scratch);
    twin_moe(ex, in.data(), T, c.n_embd, pool, got.data());
    int64_t differ = 0;
    for (size_t i = 0; i < want.size(); ++i) differ += bits(got[i]) != bits(want[i]);
    EXPECT_EQ(differ, 0) << c.name << " T=" << T << ": first values " << got[0] << " vs "
                         << want[0];
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layers, MoeHostTwin,
    ::testing::Values(MoeCase{"mixtral_f16", DType::F16, 8, 2, true, false, 160, 96},
                      MoeCase{"mixtral_q8_0", DType::Q8_0, 8, 2, true, false, 128, 96},
                      MoeCase{"mixtral_q4_k", DType::Q4_K, 8, 2, true, false, 256, 256},
                      MoeCase{"qwen2moe_f16", DType::F16, 60, 4, false, true, 128, 64},
                      MoeCase{"qwen2moe_q8_0", DType::Q8_0, 60, 4, false, true, 128, 64},
                      MoeCase{"qwen2moe_q4_k", DType::Q4_K, 60, 4, false, true, 256, 256},
                      MoeCase{"qwen3moe_f16", DType::F16, 128, 8, true, false, 64, 32},
                      MoeCase{"qwen3moe_q8_0", DType::Q8_0, 128, 8, true, false, 64, 32},
                      MoeCase{"qwen3moe_q4_k", DType::Q4_K, 128, 8, true, false, 256, 256}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace hablar
