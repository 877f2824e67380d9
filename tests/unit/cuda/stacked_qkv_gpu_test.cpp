// Q, K and V kept as one stack and multiplied as one GEMM into rows of [q | k | v]
// (ForwardOps::stacked_qkv): the queued row-work pass that then reads those rows (bias, RoPE,
// the K/V store, or a plain move) gives what the three products over copies kept apart and
// the in-place pass give (the shipped step), within the products' own rounding; the cache
// rows and the attention that follows agree likewise.
#include <array>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "backend/cuda/forward_ops.h"
#include "backend/cuda/matmul.h"
#include "core/fp16.h"
#include "core/rope.h"
#include "cuda_test_util.h"
#include "matmul_test_util.h"
#include "quant_test_data.h"

namespace hablar::test {
namespace {

using cuda::DeviceBuffer;

constexpr int kTokens = 40;  // from kKeptBf16MinRows up: the products take the kept copies

struct QkvWeights {
  DeviceWeights wq, wk, wv;
  DeviceBuffer<float> bq, bk, bv;
  QkvWeights(const ActivationDims& d)
      : wq(DType::Q8_0, d.q_dim(), d.n_embd,
           random_weight_bytes(DType::Q8_0, d.q_dim(), d.n_embd, 1u)),
        wk(DType::Q8_0, d.kv_dim(), d.n_embd,
           random_weight_bytes(DType::Q8_0, d.kv_dim(), d.n_embd, 2u)),
        wv(DType::Q8_0, d.kv_dim(), d.n_embd,
           random_weight_bytes(DType::Q8_0, d.kv_dim(), d.n_embd, 3u)),
        bq(random_floats((size_t)d.q_dim(), 4u)),
        bk(random_floats((size_t)d.kv_dim(), 5u)),
        bv(random_floats((size_t)d.kv_dim(), 6u)) {}
};

struct StepResult {
  std::vector<float> q, k, v, att;
  std::vector<uint8_t> cache;
};

// One step of kTokens tokens (a prompt chunk and a decode token) through matmul_qkv, the
// biases (`bias`: all three, or none so that v only moves), RoPE and the attention.
StepResult run_step(bool stacked, bool bias, bool neox) {
  const ActivationDims dims{256, 4, 2, 64, 512, 100};
  const KvCacheLayout layout{1, 2, 64, 16, 16};
  RopeParams rope;
  rope.n_dims = 64, rope.neox = neox;
  cuda::DeviceMemory cache(layout.total_bytes());
  cuda::set_device_bytes(cache.get(), 0, cache.bytes());
  cuda::ForwardLimits limits;
  limits.max_tokens = 64, limits.max_blocks_per_seq = 4;
  cuda::ForwardOps ops(dims, layout, cache.get(), std::span(&rope, 1), 1e-6f, limits, nullptr);
  QkvWeights w(dims);
  const std::array<const WeightView*, 3> triple{&w.wq.view, &w.wk.view, &w.wv.view};
  if (stacked) {
    ops.keep_bf16_weights({}, std::span(&triple, 1));  // one stack: one GEMM
  } else {
    ops.keep_bf16_weights(triple);  // kept apart: Q alone, K and V as a pair
  }
  std::vector<int32_t> tokens(kTokens, 7);
  const std::vector<int32_t> table_a{0, 1, 2}, table_b{5, 6};
  const SequenceChunk chunks[] = {{std::span(tokens).first(kTokens - 1), 0, table_a, false, 39},
                                  {std::span(tokens).last(1), 20, table_b, false, 8}};
  ops.begin(chunks, {});
  const Activations& a = ops.activations();
  const auto x = random_floats((size_t)kTokens * dims.n_embd, 9u);
  cuda::copy_to_device(a.xb, x.data(), x.size() * 4);
  ops.matmul_qkv(w.wq.view, w.wk.view, w.wv.view, a.xb, a.q, a.k, a.v);
  if (bias) {
    ops.add_bias(a.q, w.bq.get(), dims.q_dim());
    ops.add_bias(a.k, w.bk.get(), dims.kv_dim());
    ops.add_bias(a.v, w.bv.get(), dims.kv_dim());
  }
  ops.rope(a.q, dims.n_heads, 0);
  ops.rope(a.k, dims.n_kv_heads, 0);
  AttentionSpec spec;
  spec.scale = 0.125f;
  ops.attention(0, spec, a.q, a.k, a.v, a.att);
  StepResult r;
  ops.host_rows(a.q, kTokens * dims.q_dim(), r.q);
  ops.host_rows(a.k, kTokens * dims.kv_dim(), r.k);
  ops.host_rows(a.v, kTokens * dims.kv_dim(), r.v);
  ops.host_rows(a.att, kTokens * dims.q_dim(), r.att);
  r.cache.resize(cache.bytes());
  HABLAR_CUDA_CHECK(
      cudaMemcpy(r.cache.data(), cache.get(), r.cache.size(), cudaMemcpyDeviceToHost));
  return r;
}

double relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  return normalized_error(got, std::vector<double>(want.begin(), want.end()));
}

// The cache's f16 values as floats, for a comparison within rounding.
std::vector<float> cache_values(const std::vector<uint8_t>& bytes) {
  std::vector<float> out(bytes.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    uint16_t h;
    std::memcpy(&h, bytes.data() + 2 * i, 2);
    out[i] = fp16_to_f32(h);
  }
  return out;
}

class StackedQkvGpu : public ::testing::TestWithParam<bool> {};  // NeoX RoPE or adjacent pairs

TEST_P(StackedQkvGpu, OneGemmAndTheRowPassEqualThreeProducts) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  for (bool bias : {true, false}) {
    SCOPED_TRACE(bias ? "with biases" : "no biases (v only moves)");
    const StepResult one = run_step(true, bias, GetParam());
    const StepResult apart = run_step(false, bias, GetParam());
    EXPECT_LT(relative_error(one.q, apart.q), 1e-6);
    EXPECT_LT(relative_error(one.k, apart.k), 1e-6);
    EXPECT_LT(relative_error(one.v, apart.v), 1e-6);
    EXPECT_LT(relative_error(one.att, apart.att), 1e-5);
    EXPECT_LT(relative_error(cache_values(one.cache), cache_values(apart.cache)), 1e-3);
    // Something was computed: no NaN, and the rows are not zero.
    double sum = 0.0;
    for (float x : one.q) sum += std::fabs(x);
    EXPECT_TRUE(std::isfinite(sum) && sum > 0.0);
  }
}

INSTANTIATE_TEST_SUITE_P(Rope, StackedQkvGpu, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "neox" : "adjacent"; });

// The stack: its copies one after another in the order given, found again by
// stacked_copies; another order, or a matrix kept apart, is not a stack.
TEST(StackedQkvGpu, KeptStackIsFoundInItsOrderOnly) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  const ActivationDims dims{256, 4, 2, 64, 512, 100};
  QkvWeights w(dims);
  cuda::PrefillMatmul keeping;
  const WeightView* qkv[] = {&w.wq.view, &w.wk.view, &w.wv.view};
  keeping.keep_bf16_stacked(qkv, nullptr);
  const uint16_t* base = keeping.stacked_copies(qkv);
  ASSERT_NE(base, nullptr);
  const WeightView* kqv[] = {&w.wk.view, &w.wq.view, &w.wv.view};
  EXPECT_EQ(keeping.stacked_copies(kqv), nullptr);
  EXPECT_EQ(keeping.kept_bytes(), (size_t)(dims.q_dim() + 2 * dims.kv_dim()) * dims.n_embd * 2);
  DeviceWeights other(DType::Q8_0, dims.kv_dim(), dims.n_embd,
                      random_weight_bytes(DType::Q8_0, dims.kv_dim(), dims.n_embd, 8u));
  keeping.keep_bf16(other.view, nullptr);
  const WeightView* mixed[] = {&w.wq.view, &w.wk.view, &other.view};
  EXPECT_EQ(keeping.stacked_copies(mixed), nullptr);
  // The stack's rows are each matrix's own bf16 copy, as a copy kept apart would be.
  cuda::PrefillMatmul apart;
  apart.keep_bf16(w.wk.view, nullptr);
  const int m = 20;
  const auto x = random_floats((size_t)m * dims.n_embd, 12u);
  DeviceBuffer<float> dx(x), got((size_t)m * dims.kv_dim()), want((size_t)m * dims.kv_dim());
  DeviceBuffer<uint16_t> x16((size_t)m * dims.n_embd);
  cuda::convert_f32_to_bf16(dx.get(), x16.get(), (int64_t)m * dims.n_embd, nullptr);
  keeping.multiply_kept(w.wk.view, x16.get(), m, got.get(), nullptr);
  apart.multiply_kept(w.wk.view, x16.get(), m, want.get(), nullptr);
  HABLAR_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(got.download(), want.download());
}

}  // namespace
}  // namespace hablar::test
