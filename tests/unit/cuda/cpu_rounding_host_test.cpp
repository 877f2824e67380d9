// The deterministic mode's numerics (backend/cuda/cpu_rounding.cuh), compiled for the host,
// against the CPU backend's scalar references: every value bit for bit. The kernels of
// cpu_rounding_ops.cu call these functions one thread per value, so this pins their values
// without a GPU; the GPU parity test (tests/unit/engine/gpu_parity_test.cpp) checks the
// wiring on a device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cuda/cpu_rounding.cuh"
#include "core/cpu_features.h"
#include "core/quant.h"

namespace hablar {
namespace {

namespace cr = cpu_rounding;

std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

struct Matrix {
  std::vector<uint8_t> bytes;
  WeightView view;
};

Matrix random_matrix(DType type, int64_t rows, int64_t cols, uint32_t seed) {
  const std::vector<float> f = random_floats((size_t)(rows * cols), seed, 0.05f);
  Matrix m;
  const size_t row_bytes = dtype_row_bytes(type, cols);
  m.bytes.resize(row_bytes * (size_t)rows);
  for (int64_t r = 0; r < rows; ++r)
    quantize_row(type, f.data() + r * cols, m.bytes.data() + r * row_bytes, cols);
  m.view = {type, rows, cols, row_bytes, m.bytes.data()};
  return m;
}

// The vector width of this machine's CPU float tiles (cpu_rounding_ops.cu passes the same).
int float_lanes() {
  return cpu_features().has_avx512_kernels() ? 16 : cpu_features().has_avx2_kernels() ? 8 : 1;
}

// A token's row quantized block by block as the kernel does it: Act32 rows (codes, d, s,
// sums) for the 32-value formats, Q8_K blocks for the K formats.
struct QuantizedRow {
  std::vector<int8_t> qs;
  std::vector<float> d, s;
  std::vector<int32_t> sum;
  std::vector<BlockQ8_K> k_blocks;
  int64_t nb = 0;
  QuantizedRow(DType type, const float* x, int64_t k) {
    if (type == DType::Q4_K || type == DType::Q5_K || type == DType::Q6_K) {
      nb = k / kQK_K;
      k_blocks.resize((size_t)nb);
      for (int64_t b = 0; b < nb; ++b) cr::quantize_block_q8k(x + b * kQK_K, &k_blocks[(size_t)b]);
      return;
    }
    nb = k / kQK;
    qs.resize((size_t)k), d.resize((size_t)nb), s.resize((size_t)nb), sum.resize((size_t)nb);
    for (int64_t b = 0; b < nb; ++b)
      cr::quantize_block32(x + b * kQK, qs.data() + b * kQK, &d[(size_t)b], &s[(size_t)b],
                           &sum[(size_t)b]);
  }
};

bool is_float(DType type) {
  return type == DType::F32 || type == DType::F16 || type == DType::BF16;
}

// The kernel's two steps on the host: the token's row quantized, then each output row's dot
// product in the order of the token's role.
float emulated_dot(const WeightView& w, const float* x, int64_t r, uint8_t role) {
  if (is_float(w.type)) return cr::dot_float(w.type, w.row(r), x, w.cols, float_lanes());
  const QuantizedRow a(w.type, x, w.cols);
  if (!a.k_blocks.empty())
    return cr::dot_q8k(w.type, w.row(r), a.k_blocks.data(), a.nb, cr::k_order_for(w.type, role));
  return cr::dot_act32(w.type, w.row(r), a.qs.data(), a.d.data(), a.s.data(), a.nb);
}

// The same through block_terms() and its chains (the warp kernel's form).
float chained_dot(const WeightView& w, const float* x, int64_t r, uint8_t role) {
  const QuantizedRow a(w.type, x, w.cols);
  return cr::dot_by_chains(w.type, cr::k_order_for(w.type, role), w.row(r), a.qs.data(), a.d.data(),
                           a.s.data(), a.k_blocks.data(), a.nb);
}

class CpuRoundingMatmul : public ::testing::TestWithParam<DType> {};

TEST_P(CpuRoundingMatmul, EqualsTheCpuReferenceInEveryRole) {
  const DType type = GetParam();
  const int64_t rows = 24, cols = 512, tokens = 4;
  const Matrix m = random_matrix(type, rows, cols, 7);
  const std::vector<float> x = random_floats((size_t)(tokens * cols), 11);
  for (uint8_t role :
       {uint8_t{0}, kRoleBatchOf8, kRoleGroupOf4, uint8_t(kRoleBatchOf8 | kRoleGroupOf4)}) {
    const std::vector<uint8_t> roles((size_t)tokens, role);
    std::vector<float> want((size_t)(tokens * rows));
    cpu::matmul_reference(m.view, x.data(), tokens, want.data(), roles);
    int differing = 0;
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t r = 0; r < rows; ++r)
        differing += bits(emulated_dot(m.view, x.data() + t * cols, r, role)) !=
                     bits(want[(size_t)(t * rows + r)]);
    EXPECT_EQ(differing, 0) << dtype_name(type) << " role " << (int)role;
    // The chained form the warp kernel runs gives the same values.
    int chained_differing = 0;
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t r = 0; r < rows; ++r)
        chained_differing += bits(chained_dot(m.view, x.data() + t * cols, r, role)) !=
                             bits(want[(size_t)(t * rows + r)]);
    EXPECT_EQ(chained_differing, 0) << dtype_name(type) << " role " << (int)role;
  }
}

INSTANTIATE_TEST_SUITE_P(Types, CpuRoundingMatmul,
                         ::testing::Values(DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1,
                                           DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(CpuRounding, QuantizedProductsAreTheCpusOwnSimdValues) {
  // The CPU's SIMD products equal its scalar reference (tests/unit/cpu); checked here once
  // more against the emulation, on the machine's own instruction set, for a token alone and
  // for the tokens of a batch.
  ThreadPool pool(1);
  for (DType type : {DType::F32, DType::F16, DType::BF16, DType::Q4_0, DType::Q4_1, DType::Q5_0,
                     DType::Q5_1, DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    for (int64_t tokens : {1, 9}) {
      const int64_t cols = type == DType::F32 ? 520 : 512;  // a float tail past the lanes
      const Matrix m = random_matrix(type, 16, cols, 3);
      const std::vector<float> x = random_floats((size_t)(cols * tokens), 5);
      std::vector<uint8_t> roles((size_t)tokens);
      for (int64_t t = 0; t < tokens; ++t) roles[(size_t)t] = llama_batch_role(t, tokens);
      std::vector<float> got((size_t)(16 * tokens));
      cpu::matmul(m.view, x.data(), tokens, got.data(), pool, roles);
      for (int64_t t = 0; t < tokens; ++t)
        for (int64_t r = 0; r < 16; ++r)
          EXPECT_EQ(bits(emulated_dot(m.view, x.data() + t * cols, r, roles[(size_t)t])),
                    bits(got[(size_t)(t * 16 + r)]))
              << dtype_name(type) << " token " << t << " of " << tokens << " row " << r;
    }
  }
}

TEST(CpuRounding, DequantizedRowsAreTheCpus) {
  for (DType type : {DType::F16, DType::BF16, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1,
                     DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    const Matrix m = random_matrix(type, 2, 512, 9);
    std::vector<float> want(512);
    dequantize_row(type, m.view.row(1), want.data(), 512);
    for (int64_t c = 0; c < 512; ++c)
      ASSERT_EQ(bits(cr::dequantize_value(type, m.view.row(1), c)), bits(want[(size_t)c]))
          << dtype_name(type) << " value " << c;
  }
}

TEST(CpuRounding, NormAndActivationsAreTheCpus) {
  const std::vector<float> x = random_floats(576, 13, 3.0f), w = random_floats(576, 17);
  std::vector<float> want(576);
  cpu::rmsnorm(x.data(), w.data(), want.data(), 576, 1e-5f);
  const float scale = cr::rms_scale(x.data(), 576, 1e-5f);
  for (size_t i = 0; i < 576; ++i)
    ASSERT_EQ(bits(cr::mul(cr::mul(x[i], scale), w[i])), bits(want[i])) << i;
  const std::vector<float> g = random_floats(4096, 19, 6.0f), u = random_floats(4096, 23);
  std::vector<float> act(4096);
  cpu::swiglu_scalar(g.data(), u.data(), act.data(), 4096);
  for (size_t i = 0; i < 4096; ++i) {
    ASSERT_EQ(bits(cr::exp_approx(g[i] * 10.0f)), bits(cpu::exp_approx(g[i] * 10.0f))) << g[i];
    ASSERT_EQ(bits(cr::swiglu(g[i], u[i])), bits(act[i])) << i;
  }
}

// phi2's LayerNorm at widths with and without a tail past the blocks of 16, in place too.
TEST(CpuRounding, LayerNormIsTheCpus) {
  for (int n : {64, 2048, 2560, 1000, 7}) {
    const std::vector<float> x = random_floats((size_t)n, 41, 3.0f),
                             w = random_floats((size_t)n, 43),
                             b = random_floats((size_t)n, 47, 0.5f);
    std::vector<float> want((size_t)n), got((size_t)n), in_place = x;
    cpu::layernorm(x.data(), w.data(), b.data(), want.data(), n, 1e-5f);
    cr::layernorm_row(x.data(), w.data(), b.data(), got.data(), n, 1e-5f);
    cr::layernorm_row(in_place.data(), w.data(), b.data(), in_place.data(), n, 1e-5f);
    for (size_t i = 0; i < (size_t)n; ++i) {
      ASSERT_EQ(bits(got[i]), bits(want[i])) << n << " value " << i;
      ASSERT_EQ(bits(in_place[i]), bits(want[i])) << n << " value " << i;
    }
  }
}

TEST(CpuRounding, GeluTableAndGegluAreTheCpus) {
  const std::vector<float> table = cr::gelu_half_table();
  std::vector<float> x(65536), want(65536);
  for (uint32_t i = 0; i < 65536; ++i) x[i] = fp16_to_f32((uint16_t)i);
  cpu::gelu(x.data(), want.data(), 65536);
  for (uint32_t i = 0; i < 65536; ++i) {
    if (std::isnan(x[i]) || x[i] <= -10.0f || x[i] >= 10.0f) continue;
    ASSERT_EQ(bits(table[i]), bits(want[i])) << x[i];
  }
  const std::vector<float> g = random_floats(4096, 29, 4.0f), u = random_floats(4096, 37);
  std::vector<float> act(4096);
  cpu::geglu(g.data(), u.data(), act.data(), 4096);
  for (size_t i = 0; i < 4096; ++i)
    ASSERT_EQ(bits(cr::geglu(g[i], u[i], table.data())), bits(act[i])) << g[i];
}

// One sequence's cache of `len` positions, attended by every head of a query at the last
// position, in both summation orders, against the CPU's scalar attention.
TEST(CpuRounding, AttentionIsTheCpus) {
  for (int head_dim : {64, 80, 128}) {
    KvCacheLayout layout;
    layout.n_layers = 1, layout.n_kv_heads = 2, layout.head_dim = head_dim;
    layout.block_size = 16, layout.n_blocks = 8;
    std::vector<uint16_t> cache(layout.total_elems());
    std::vector<int32_t> table = {5, 2, 7, 0, 1, 3, 4, 6};
    const int len = 100, n_heads = 6;
    for (int p = 0; p < len; ++p) {
      const std::vector<float> k = random_floats((size_t)(2 * head_dim), 100 + p);
      const std::vector<float> v = random_floats((size_t)(2 * head_dim), 500 + p);
      cpu::kv_store(cache.data(), layout, 0, table.data(), p, k.data(), v.data());
    }
    const std::vector<float> q = random_floats((size_t)(n_heads * head_dim), 31, 2.0f);
    for (cpu::SumOrder order : {cpu::SumOrder::kLanes16, cpu::SumOrder::kLanes64}) {
      std::vector<float> want((size_t)(n_heads * head_dim));
      cpu::attention_one_scalar(cache.data(), layout, 0, table.data(), len - 1, q.data(), n_heads,
                                want.data(), order);
      std::vector<float> qr((size_t)head_dim), scores((size_t)len), out((size_t)head_dim);
      for (int h = 0; h < n_heads; ++h) {
        const cr::HeadView view{cache.data(), &layout, table.data(), 0, h / (n_heads / 2)};
        cr::attend_head(view, q.data() + h * head_dim, 0, len - 1,
                        1.0f / std::sqrt((float)head_dim), 0.0f, order == cpu::SumOrder::kLanes64,
                        qr.data(), scores.data(), out.data());
        for (int d = 0; d < head_dim; ++d)
          ASSERT_EQ(bits(out[(size_t)d]), bits(want[(size_t)(h * head_dim + d)]))
              << "head_dim " << head_dim << " head " << h << " dim " << d;
      }
    }
  }
}

}  // namespace
}  // namespace hablar
