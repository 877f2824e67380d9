// The fusions of cuda::ForwardOps against the unfused ops, bit for bit: the residual add run
// inside the next norm (add_rms_norm), and the queued biases and RoPE of q, k and v run in one
// launch (against a host loop with the same fmaf rounding, and against the same ops forced to
// run one at a time), storing the step's keys and values in the cache for the attention.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "backend/cuda/forward_ops.h"
#include "backend/cuda/lab_knobs.h"
#include "backend/cuda/matmul.h"
#include "backend/cuda/matmul_f16.h"
#include "backend/cuda/ops.h"
#include "core/fp16.h"
#include "core/rope.h"
#include "cuda_test_util.h"

namespace hablar::test {
namespace {

using cuda::DeviceBuffer;

TEST(FusedOpsGpu, AddRmsNormEqualsAddThenNorm) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  for (int dim : {1000, 1536}) {
    const int rows = 5;
    const auto x = random_floats((size_t)rows * dim, 11u, -3.0f, 3.0f);
    const auto y = random_floats((size_t)rows * dim, 12u, -3.0f, 3.0f);
    const auto w = random_floats(dim, 13u, 0.5f, 1.5f);
    DeviceBuffer<float> x1(x), x2(x), dy(y), dw(w), out1((size_t)rows * dim),
        out2((size_t)rows * dim);
    cuda::add(x1.get(), dy.get(), x1.get(), (int64_t)rows * dim, nullptr);
    cuda::rms_norm(x1.get(), dw.get(), out1.get(), rows, dim, 1e-6f, nullptr);
    cuda::add_rms_norm(x2.get(), dy.get(), dw.get(), out2.get(), rows, dim, 1e-6f, nullptr);
    EXPECT_EQ(x1.download(), x2.download()) << "dim " << dim;
    EXPECT_EQ(out1.download(), out2.download()) << "dim " << dim;
  }
}

// The norm that also quantizes its rows for the int8 products (rms_norm_q8, add_rms_norm_q8):
// its f32 rows equal rms_norm's / add_rms_norm's, and its codes and scales equal
// quantize_activations_q8 of those rows, byte for byte.
TEST(FusedOpsGpu, NormWithQuantizationEqualsNormThenQuantize) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  for (int dim : {256, 1536, 2080, 4096, 8192, 8224}) {  // 8224: norm, then quantization
    for (int rows : {1, 5}) {
      for (bool with_add : {false, true}) {
        const size_t n = (size_t)rows * dim;
        const auto x = random_floats(n, 31u, -3.0f, 3.0f), y = random_floats(n, 32u, -2.0f, 2.0f);
        const auto w = random_floats(dim, 33u, 0.5f, 1.5f);
        DeviceBuffer<float> x1(x), x2(x), dy(y), dw(w), out1(n), out2(n);
        const size_t bytes = cuda::q8_activation_bytes(rows, dim);
        DeviceBuffer<uint8_t> q1(std::vector<uint8_t>(bytes, 0)),
            q2(std::vector<uint8_t>(bytes, 0));
        if (with_add) {
          cuda::add_rms_norm(x1.get(), dy.get(), dw.get(), out1.get(), rows, dim, 1e-6f, nullptr);
          cuda::add_rms_norm_q8(x2.get(), dy.get(), dw.get(), out2.get(), rows, dim, 1e-6f,
                                q2.get(), nullptr);
        } else {
          cuda::rms_norm(x1.get(), dw.get(), out1.get(), rows, dim, 1e-6f, nullptr);
          cuda::rms_norm_q8(x2.get(), dw.get(), out2.get(), rows, dim, 1e-6f, q2.get(), nullptr);
        }
        cuda::quantize_activations_q8(out1.get(), rows, dim, q1.get(), bytes, nullptr);
        HABLAR_CUDA_CHECK(cudaDeviceSynchronize());
        const std::string where = "dim " + std::to_string(dim) + " rows " + std::to_string(rows) +
                                  (with_add ? " with add" : "");
        EXPECT_EQ(x1.download(), x2.download()) << where;
        EXPECT_EQ(out1.download(), out2.download()) << where;
        EXPECT_EQ(q1.download(), q2.download()) << where;
      }
    }
  }
}

// The norm that also writes its rows as f16 rows for the f16 tensor-core products
// (rms_norm_f16, add_rms_norm_f16): its f32 rows equal rms_norm's / add_rms_norm's, and its
// f16 values and row scales equal convert_rows_to_f16 of those rows, byte for byte (a row of
// zeros among them keeps scale 1).
TEST(FusedOpsGpu, NormWithF16RowsEqualsNormThenConvert) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  for (int dim : {256, 1536, 2052, 8224}) {  // 8224: norm, then conversion
    for (int rows : {1, 5}) {
      for (bool with_add : {false, true}) {
        const size_t n = (size_t)rows * dim;
        auto x = random_floats(n, 41u, -3.0f, 3.0f);
        const auto y = random_floats(n, 42u, -2.0f, 2.0f);
        if (rows > 1 && !with_add) std::fill(x.begin() + dim, x.begin() + 2 * dim, 0.0f);
        const auto w = random_floats(dim, 43u, 0.5f, 1.5f);
        DeviceBuffer<float> x1(x), x2(x), dy(y), dw(w), out1(n), out2(n);
        const size_t bytes = cuda::f16_rows_bytes(rows, dim);
        DeviceBuffer<uint8_t> f1(std::vector<uint8_t>(bytes, 0)),
            f2(std::vector<uint8_t>(bytes, 0));
        if (with_add) {
          cuda::add_rms_norm(x1.get(), dy.get(), dw.get(), out1.get(), rows, dim, 1e-6f, nullptr);
          cuda::add_rms_norm_f16(x2.get(), dy.get(), dw.get(), out2.get(), rows, dim, 1e-6f,
                                 f2.get(), bytes, nullptr);
        } else {
          cuda::rms_norm(x1.get(), dw.get(), out1.get(), rows, dim, 1e-6f, nullptr);
          cuda::rms_norm_f16(x2.get(), dw.get(), out2.get(), rows, dim, 1e-6f, f2.get(), bytes,
                             nullptr);
        }
        cuda::convert_rows_to_f16(out1.get(), rows, dim, f1.get(), bytes, nullptr);
        HABLAR_CUDA_CHECK(cudaDeviceSynchronize());
        const std::string where = "dim " + std::to_string(dim) + " rows " + std::to_string(rows) +
                                  (with_add ? " with add" : "");
        EXPECT_EQ(x1.download(), x2.download()) << where;
        EXPECT_EQ(out1.download(), out2.download()) << where;
        EXPECT_EQ(f1.download(), f2.download()) << where;
      }
    }
  }
}

// The gated activation that also writes its rows as f16 rows (glu_rows_to_f16): its f32 rows
// equal swiglu's / geglu's and its f16 values and scales convert_rows_to_f16's, byte for byte.
TEST(FusedOpsGpu, GluWithF16RowsEqualsGluThenConvert) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  for (int k : {512, 8960, 40000}) {  // 40000: past the registers, two launches
    for (GluActivation act : {GluActivation::kSilu, GluActivation::kGeluTanh}) {
      const int rows = 3;
      const size_t n = (size_t)rows * k;
      DeviceBuffer<float> gate(random_floats(n, 51u, -4.0f, 4.0f)),
          up(random_floats(n, 52u, -2.0f, 2.0f)), out1(n), out2(n);
      const size_t bytes = cuda::f16_rows_bytes(rows, k);
      DeviceBuffer<uint8_t> f1(std::vector<uint8_t>(bytes, 0)), f2(std::vector<uint8_t>(bytes, 0));
      if (act == GluActivation::kGeluTanh) {
        cuda::geglu(gate.get(), up.get(), out1.get(), (int64_t)n, nullptr);
      } else {
        cuda::swiglu(gate.get(), up.get(), out1.get(), (int64_t)n, nullptr);
      }
      cuda::convert_rows_to_f16(out1.get(), rows, k, f1.get(), bytes, nullptr);
      cuda::glu_rows_to_f16(gate.get(), up.get(), act, out2.get(), rows, k, f2.get(), bytes,
                            nullptr);
      HABLAR_CUDA_CHECK(cudaDeviceSynchronize());
      const std::string where =
          "k " + std::to_string(k) + (act == GluActivation::kGeluTanh ? " gelu" : " silu");
      EXPECT_EQ(out1.download(), out2.download()) << where;
      EXPECT_EQ(f1.download(), f2.download()) << where;
    }
  }
}

// The norm that also writes its rows as bf16 rows for the products over kept bf16 copies
// (rms_norm_bf16, add_rms_norm_bf16): its f32 rows equal rms_norm's / add_rms_norm's, and its
// bf16 rows convert_f32_to_bf16's of those rows, byte for byte, with or without the f32 rows.
TEST(FusedOpsGpu, NormWithBf16RowsEqualsNormThenConvert) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  for (int dim : {256, 1536, 2052, 8224}) {  // 8224: norm, then conversion
    for (int rows : {1, 5}) {
      for (bool with_add : {false, true}) {
        const size_t n = (size_t)rows * dim;
        const auto x = random_floats(n, 61u, -3.0f, 3.0f), y = random_floats(n, 62u, -2.0f, 2.0f);
        const auto w = random_floats(dim, 63u, 0.5f, 1.5f);
        DeviceBuffer<float> x1(x), x2(x), dy(y), dw(w), out1(n), out2(n);
        DeviceBuffer<uint16_t> b1(std::vector<uint16_t>(n, 0)), b2(std::vector<uint16_t>(n, 0));
        if (with_add) {
          cuda::add_rms_norm(x1.get(), dy.get(), dw.get(), out1.get(), rows, dim, 1e-6f, nullptr);
          cuda::add_rms_norm_bf16(x2.get(), dy.get(), dw.get(), out2.get(), rows, dim, 1e-6f,
                                  b2.get(), nullptr);
        } else {
          cuda::rms_norm(x1.get(), dw.get(), out1.get(), rows, dim, 1e-6f, nullptr);
          cuda::rms_norm_bf16(x2.get(), dw.get(), out2.get(), rows, dim, 1e-6f, b2.get(), nullptr);
          // The add form with y = null is the plain form (ForwardOps::rmsnorm calls it so).
          DeviceBuffer<float> x3(x), out3(n);
          DeviceBuffer<uint16_t> b3(std::vector<uint16_t>(n, 0));
          cuda::add_rms_norm_bf16(x3.get(), nullptr, dw.get(), out3.get(), rows, dim, 1e-6f,
                                  b3.get(), nullptr);
          HABLAR_CUDA_CHECK(cudaDeviceSynchronize());
          EXPECT_EQ(x3.download(), x) << "dim " << dim << " rows " << rows;
          EXPECT_EQ(out3.download(), out2.download()) << "dim " << dim << " rows " << rows;
          EXPECT_EQ(b3.download(), b2.download()) << "dim " << dim << " rows " << rows;
        }
        cuda::convert_f32_to_bf16(out1.get(), b1.get(), (int64_t)n, nullptr);
        HABLAR_CUDA_CHECK(cudaDeviceSynchronize());
        const std::string where = "dim " + std::to_string(dim) + " rows " + std::to_string(rows) +
                                  (with_add ? " with add" : "");
        EXPECT_EQ(x1.download(), x2.download()) << where;
        EXPECT_EQ(out1.download(), out2.download()) << where;
        EXPECT_EQ(b1.download(), b2.download()) << where;
        // Without the f32 output (out null: the bf16 rows alone, for kept-copy products only),
        // where the one-launch form runs: the same bf16 rows and residual stream.
        ASSERT_EQ(cuda::rms_norm_bf16_only_supported(dim), dim <= 8192) << where;
        if (!cuda::rms_norm_bf16_only_supported(dim)) continue;
        DeviceBuffer<float> x4(x);
        DeviceBuffer<uint16_t> b4(std::vector<uint16_t>(n, 0));
        cuda::add_rms_norm_bf16(x4.get(), with_add ? dy.get() : nullptr, dw.get(), nullptr, rows,
                                dim, 1e-6f, b4.get(), nullptr);
        HABLAR_CUDA_CHECK(cudaDeviceSynchronize());
        EXPECT_EQ(x4.download(), x1.download()) << where << " bf16 only";
        EXPECT_EQ(b4.download(), b1.download()) << where << " bf16 only";
      }
    }
  }
}

// The gated activation that also writes bf16 values (glu_to_bf16), in place over the gate as
// the forward runs it: its f32 values equal swiglu's / geglu's, and its bf16 values
// convert_f32_to_bf16's of them, byte for byte.
TEST(FusedOpsGpu, GluWithBf16ValuesEqualsGluThenConvert) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  for (GluActivation act : {GluActivation::kSilu, GluActivation::kGeluTanh}) {
    const size_t n = 3 * 8960 + 7;
    const auto g = random_floats(n, 71u, -4.0f, 4.0f);
    DeviceBuffer<float> gate1(g), gate2(g), up(random_floats(n, 72u, -2.0f, 2.0f));
    DeviceBuffer<uint16_t> b1(std::vector<uint16_t>(n, 0)), b2(std::vector<uint16_t>(n, 0));
    if (act == GluActivation::kGeluTanh) {
      cuda::geglu(gate1.get(), up.get(), gate1.get(), (int64_t)n, nullptr);
    } else {
      cuda::swiglu(gate1.get(), up.get(), gate1.get(), (int64_t)n, nullptr);
    }
    cuda::convert_f32_to_bf16(gate1.get(), b1.get(), (int64_t)n, nullptr);
    cuda::glu_to_bf16(gate2.get(), up.get(), act, gate2.get(), b2.get(), (int64_t)n, nullptr);
    HABLAR_CUDA_CHECK(cudaDeviceSynchronize());
    const char* where = act == GluActivation::kGeluTanh ? "gelu" : "silu";
    EXPECT_EQ(gate1.download(), gate2.download()) << where;
    EXPECT_EQ(b1.download(), b2.download()) << where;
  }
}

// The gated activation from bf16 gate and up values into bf16 values (glu_bf16_rows: the
// products over kept copies writing bf16): each value act(g) * u in f32 over the bf16 inputs,
// rounded once, equal to what the f32 activation and conversion give on those inputs; the
// 16-byte form (n a multiple of 8, aligned) and the one-value form (an odd n) alike.
TEST(FusedOpsGpu, GluOnBf16RowsEqualsGluOfTheirValues) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  for (GluActivation act : {GluActivation::kSilu, GluActivation::kGeluTanh}) {
    for (size_t n : {size_t{4 * 8960}, size_t{3 * 8960 + 7}}) {
      std::vector<uint16_t> g16(n), u16(n);
      std::vector<float> g(n), u(n);
      const auto gr = random_floats(n, 73u, -6.0f, 6.0f), ur = random_floats(n, 74u, -3.0f, 3.0f);
      for (size_t i = 0; i < n; ++i) {
        g16[i] = f32_to_bf16(gr[i]), u16[i] = f32_to_bf16(ur[i]);
        g[i] = bf16_to_f32(g16[i]), u[i] = bf16_to_f32(u16[i]);
      }
      DeviceBuffer<uint16_t> dg(g16), du(u16), got(std::vector<uint16_t>(n, 0));
      DeviceBuffer<float> fg(g), fu(u);
      DeviceBuffer<uint16_t> want(std::vector<uint16_t>(n, 0));
      if (act == GluActivation::kGeluTanh) {
        cuda::geglu(fg.get(), fu.get(), fg.get(), (int64_t)n, nullptr);
      } else {
        cuda::swiglu(fg.get(), fu.get(), fg.get(), (int64_t)n, nullptr);
      }
      cuda::convert_f32_to_bf16(fg.get(), want.get(), (int64_t)n, nullptr);
      cuda::glu_bf16_rows(dg.get(), du.get(), act, got.get(), (int64_t)n, nullptr);
      HABLAR_CUDA_CHECK(cudaDeviceSynchronize());
      EXPECT_EQ(got.download(), want.download())
          << (act == GluActivation::kGeluTanh ? "gelu" : "silu") << " n=" << n;
    }
  }
}

struct QkvCase {
  ActivationDims dims{256, 4, 2, 64, 512, 100};
  KvCacheLayout layout{1, 2, 64, 16, 8};
  RopeParams rope;
  std::vector<int32_t> positions{5, 6, 7, 30};
  std::vector<float> q, k, v, bq, bk, bv;

  // rotated 48: a partial rotation (dims 48..63 of each head only take the bias), which the
  // pass's general form takes; 64: whole heads, its vectorized form.
  QkvCase(bool neox, int rotated) {
    rope.n_dims = rotated;
    rope.neox = neox;
    const size_t T = positions.size();
    q = random_floats(T * dims.q_dim(), 21u), bq = random_floats(dims.q_dim(), 22u);
    k = random_floats(T * dims.kv_dim(), 23u), bk = random_floats(dims.kv_dim(), 24u);
    v = random_floats(T * dims.kv_dim(), 25u), bv = random_floats(dims.kv_dim(), 26u);
  }

  // x + bias, then the rotation of each head's pairs with fmaf as the kernels round it.
  std::vector<float> reference(const std::vector<float>& x, const std::vector<float>& bias,
                               int heads, bool rotate) const {
    std::vector<float> out(x.size());
    const int hd = dims.head_dim, half = rope.n_dims / 2, width = heads * hd;
    std::vector<float> c((size_t)half), s((size_t)half);
    for (size_t t = 0; t < positions.size(); ++t) {
      rope_angles(positions[t], rope, c.data(), s.data());
      for (int i = 0; i < width; ++i) out[t * width + i] = x[t * width + i] + bias[(size_t)i];
      if (!rotate) continue;
      for (int h = 0; h < heads; ++h)
        for (int i = 0; i < half; ++i) {
          float* head = out.data() + t * width + (size_t)h * hd;
          const int a = rope.neox ? i : 2 * i, b = rope.neox ? i + half : 2 * i + 1;
          const float x0 = head[a], x1 = head[b];
          head[a] = std::fmaf(x0, c[(size_t)i], -(x1 * s[(size_t)i]));
          head[b] = std::fmaf(x0, s[(size_t)i], x1 * c[(size_t)i]);
        }
    }
    return out;
  }
};

class QueuedRowWorkGpu : public ::testing::TestWithParam<bool> {};

// A step of two sequences (3 tokens and 1) over a cache of zeros, with the case's q, k, v:
// biases of q, k and v (v's only with v_bias) then RoPE of q and k, either as the forward
// calls them (queued, one launch) or with a no-op scale after every op, which makes each run
// alone (one_at_a_time).
struct QueuedQkvStep {
  cuda::DeviceMemory cache;
  DeviceBuffer<float> bq, bk, bv;
  std::unique_ptr<cuda::ForwardOps> ops;

  QueuedQkvStep(const QkvCase& c, bool one_at_a_time, bool v_bias)
      : cache(c.layout.total_bytes()), bq(c.bq), bk(c.bk), bv(c.bv) {
    cuda::set_device_bytes(cache.get(), 0, cache.bytes());
    cuda::ForwardLimits limits;
    limits.max_tokens = 16, limits.max_blocks_per_seq = 4;
    ops = std::make_unique<cuda::ForwardOps>(c.dims, c.layout, cache.get(), std::span(&c.rope, 1),
                                             1e-6f, limits, nullptr);
    const std::vector<int32_t> tokens{1, 2, 3, 4}, table_a{0}, table_b{2, 3};
    const SequenceChunk chunks[] = {{std::span(tokens).first(3), 5, table_a, false, 8},
                                    {std::span(tokens).last(1), 30, table_b, false, 8}};
    ops->begin(chunks, {});
    const Activations& a = ops->activations();
    const auto put = [](float* dst, const std::vector<float>& src) {
      cuda::copy_to_device(dst, src.data(), src.size() * 4);
    };
    put(a.q, c.q), put(a.k, c.k), put(a.v, c.v);
    const auto separate = [&](float* x, int64_t width) {
      if (one_at_a_time) ops->scale(x, 1.0f, width);
    };
    ops->add_bias(a.q, bq.get(), c.dims.q_dim()), separate(a.q, c.dims.q_dim());
    ops->add_bias(a.k, bk.get(), c.dims.kv_dim()), separate(a.k, c.dims.kv_dim());
    if (v_bias) ops->add_bias(a.v, bv.get(), c.dims.kv_dim()), separate(a.v, c.dims.kv_dim());
    ops->rope(a.q, c.dims.n_heads, 0), separate(a.q, c.dims.q_dim());
    ops->rope(a.k, c.dims.n_kv_heads, 0), separate(a.k, c.dims.kv_dim());
  }
};

// The rows of q, k and v after the step's queued work.
std::vector<std::vector<float>> run_qkv_ops(const QkvCase& c, bool one_at_a_time) {
  QueuedQkvStep step(c, one_at_a_time, true);
  const Activations& a = step.ops->activations();
  std::vector<std::vector<float>> out(3);
  const int64_t T = (int64_t)c.positions.size();
  step.ops->host_rows(a.q, T * c.dims.q_dim(), out[0]);  // host_rows fills the vector given
  step.ops->host_rows(a.k, T * c.dims.kv_dim(), out[1]);
  step.ops->host_rows(a.v, T * c.dims.kv_dim(), out[2]);
  return out;
}

void expect_row_work_matches_host_rounding(const QkvCase& c) {
  const auto want_q = c.reference(c.q, c.bq, c.dims.n_heads, true);
  const auto want_k = c.reference(c.k, c.bk, c.dims.n_kv_heads, true);
  const auto want_v = c.reference(c.v, c.bv, c.dims.n_kv_heads, false);
  for (bool one_at_a_time : {false, true}) {
    const auto got = run_qkv_ops(c, one_at_a_time);
    EXPECT_EQ(got[0], want_q) << "q, one at a time: " << one_at_a_time;
    EXPECT_EQ(got[1], want_k) << "k, one at a time: " << one_at_a_time;
    EXPECT_EQ(got[2], want_v) << "v, one at a time: " << one_at_a_time;
  }
}

// The step's attention after its queued biases and RoPE: as the forward calls the ops, the
// RoPE pass stores the step's keys and values in the cache and the attention runs no scatter
// kernel; one op at a time, the scatter kernel stores them. v_bias false leaves v with no
// queued work (the pass takes it as a copy to the cache). Returns the cache's bytes and the
// attention's output.
std::pair<std::vector<uint8_t>, std::vector<float>> run_attention_after_row_work(const QkvCase& c,
                                                                                 bool one_at_a_time,
                                                                                 bool v_bias) {
  QueuedQkvStep step(c, one_at_a_time, v_bias);
  const Activations& a = step.ops->activations();
  AttentionSpec spec;
  spec.scale = 1.0f / std::sqrt((float)c.dims.head_dim);
  step.ops->attention(0, spec, a.q, a.k, a.v, a.att);
  std::vector<float> out;
  step.ops->host_rows(a.att, (int64_t)c.positions.size() * c.dims.q_dim(), out);
  std::vector<uint8_t> bytes(step.cache.bytes());
  HABLAR_CUDA_CHECK(
      cudaMemcpy(bytes.data(), step.cache.get(), bytes.size(), cudaMemcpyDeviceToHost));
  return {bytes, out};
}

void expect_rope_pass_stores_as_scatter(const QkvCase& c) {
  for (bool v_bias : {true, false}) {
    const auto fused = run_attention_after_row_work(c, false, v_bias);
    const auto separate = run_attention_after_row_work(c, true, v_bias);
    EXPECT_EQ(fused.first, separate.first) << "cache, v bias: " << v_bias;
    EXPECT_EQ(fused.second, separate.second) << "attention output, v bias: " << v_bias;
    // Something was stored: the cache is not all zeros.
    EXPECT_NE(std::count(fused.first.begin(), fused.first.end(), 0), (long)fused.first.size());
  }
}

TEST_P(QueuedRowWorkGpu, BiasAndRopeOfQkvInOneLaunchMatchHostRounding) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  for (int rotated : {48, 64}) {
    SCOPED_TRACE(rotated);
    expect_row_work_matches_host_rounding(QkvCase(GetParam(), rotated));
  }
}

TEST_P(QueuedRowWorkGpu, RopePassStoresTheKvTheScatterKernelWould) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  for (int rotated : {48, 64}) {
    SCOPED_TRACE(rotated);
    expect_rope_pass_stores_as_scatter(QkvCase(GetParam(), rotated));
  }
}

// A step of a 40-token prompt chunk over a cached prefix of 10 positions, a decode token and
// a 3-token chunk: the long chunk's attention on the flash prefill kernel (the decode kernel
// takes the other rows), against every row on the decode kernel (the lab's
// HABLAR_FLASH_PREFILL=0): the same cache, outputs within the flash kernel's f16 rounding of
// the probabilities. Returns the cache's bytes and the attention's output.
std::pair<std::vector<uint8_t>, std::vector<float>> run_mixed_step_attention(bool flash,
                                                                             bool neox) {
  const ActivationDims dims{256, 4, 2, 64, 512, 100};
  const KvCacheLayout layout{1, 2, 64, 16, 16};
  RopeParams rope;
  rope.n_dims = 64, rope.neox = neox;
  std::vector<uint16_t> cached;  // the prefix's K/V (and everything else) random f16 values
  for (float x : random_floats(layout.total_elems(), 31u)) cached.push_back(f32_to_fp16(x));
  cuda::DeviceBuffer<uint16_t> cache(cached);
  cuda::ForwardLimits limits;
  limits.max_tokens = 64, limits.max_blocks_per_seq = 4;
  cuda::ForwardOps ops(dims, layout, cache.get(), std::span(&rope, 1), 1e-6f, limits, nullptr);
  std::vector<int32_t> tokens(44, 7);
  const std::vector<int32_t> table_a{0, 1, 2, 3}, table_b{5, 6}, table_c{8};
  const SequenceChunk chunks[] = {{std::span(tokens).subspan(0, 40), 10, table_a, false, 50},
                                  {std::span(tokens).subspan(40, 1), 20, table_b, false, 8},
                                  {std::span(tokens).subspan(41, 3), 0, table_c, false, 3}};
  // The lab's HABLAR_FLASH_PREFILL: 2 the flash kernel for this step's four blocks (fewer
  // than a GPU's multiprocessors), 0 the decode kernel; read when the step is staged.
  setenv("HABLAR_FLASH_PREFILL", flash ? "2" : "0", 1);
  ops.begin(chunks, {});
  const Activations& a = ops.activations();
  const auto put = [](float* dst, const std::vector<float>& src) {
    cuda::copy_to_device(dst, src.data(), src.size() * 4);
  };
  put(a.q, random_floats(44 * (size_t)dims.q_dim(), 32u));
  put(a.k, random_floats(44 * (size_t)dims.kv_dim(), 33u));
  put(a.v, random_floats(44 * (size_t)dims.kv_dim(), 34u));
  ops.rope(a.q, dims.n_heads, 0);
  ops.rope(a.k, dims.n_kv_heads, 0);
  AttentionSpec spec;
  spec.scale = 0.125f;
  ops.attention(0, spec, a.q, a.k, a.v, a.att);
  unsetenv("HABLAR_FLASH_PREFILL");
  std::vector<float> out;
  ops.host_rows(a.att, 44 * (int64_t)dims.q_dim(), out);
  std::vector<uint8_t> bytes(cache.bytes());
  HABLAR_CUDA_CHECK(cudaMemcpy(bytes.data(), cache.get(), bytes.size(), cudaMemcpyDeviceToHost));
  return {bytes, out};
}

TEST_P(QueuedRowWorkGpu, PromptChunkOnTheFlashKernelMatchesTheDecodeKernel) {
  HABLAR_REQUIRE_CUDA_DEVICE();
  cuda::enable_lab_knobs();  // HABLAR_FLASH_PREFILL selects the decode kernel for the reference
  const auto flash = run_mixed_step_attention(true, GetParam());
  const auto decode = run_mixed_step_attention(false, GetParam());
  EXPECT_EQ(flash.first, decode.first) << "the cache";
  ASSERT_EQ(flash.second.size(), decode.second.size());
  double worst = 0.0;
  for (size_t i = 0; i < flash.second.size(); ++i)
    worst = std::max(worst, (double)std::fabs(flash.second[i] - decode.second[i]));
  EXPECT_LT(worst, 5e-3);
  // The rows the decode kernel takes in both runs (the decode token and the short chunk).
  const size_t width = 4 * 64;
  for (size_t i = 40 * width; i < 44 * width; ++i)
    EXPECT_EQ(flash.second[i], decode.second[i]) << "row " << i / width;
}

INSTANTIATE_TEST_SUITE_P(Styles, QueuedRowWorkGpu, ::testing::Values(false, true),
                         [](const auto& info) {
                           return info.param ? std::string("Neox") : std::string("Normal");
                         });

}  // namespace
}  // namespace hablar::test
