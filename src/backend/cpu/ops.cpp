// Element-wise and normalization ops, RoPE, the embedding lookup and the KV cache store.
#include <cmath>
#include <string>
#include <vector>

#include "backend/cpu/act_quant.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/ops_x86.h"
#include "core/cpu_features.h"
#include "core/error.h"
#include "core/fp16.h"
#include "core/kv_rows.h"
#include "core/quant.h"
#include "core/quant_blocks.h"

namespace hablar::cpu {

void rmsnorm(const float* x, const float* weight, float* y, int64_t n, float eps) {
  // As llama.cpp (ggml) computes it, so that both round alike: each square rounded to float,
  // summed in order in double; the mean and the scale in float; y = (x * scale) * weight.
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += (double)(x[i] * x[i]);
  const float mean = (float)(sum / (double)n);
  const float scale = 1.0f / std::sqrt(mean + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale * weight[i];
}

void layernorm(const float* x, const float* weight, const float* bias, float* y, int64_t n,
               float eps) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += (double)x[i];
  const float mean = (float)sum / (float)n;
  double squares = 0.0;
  int64_t i = 0;
  for (float block[kReduceLanes]; i + kReduceLanes <= n; i += kReduceLanes) {
    for (int l = 0; l < kReduceLanes; ++l) {
      const float d = x[i + l] - mean;
      y[i + l] = d;
      block[l] = d * d;
    }
    squares += (double)reduce16(block);
  }
  for (; i < n; ++i) {
    const float d = x[i] - mean;
    y[i] = d;
    squares += (double)(d * d);
  }
  const float variance = (float)(squares / (double)n);
  const float scale = 1.0f / std::sqrt(variance + eps);
  for (int64_t j = 0; j < n; ++j) {
    const float normed = y[j] * scale;
    const float weighted = normed * weight[j];
    y[j] = bias != nullptr ? weighted + bias[j] : weighted;  // (null: no bias, Cohere's)
  }
}

namespace {

void check_rope(int head_dim, const RopeParams& p) {
  if (p.n_dims <= 0 || p.n_dims > head_dim || p.n_dims % 2 != 0)
    throw_error(ErrorKind::kInvalidArgument,
                "rope: n_dims " + std::to_string(p.n_dims) +
                    " must be even and in (0, head_dim=" + std::to_string(head_dim) + "]");
  if (p.scaling != RopeParams::Scaling::kNone && !(p.factor > 0.0f))
    throw_error(ErrorKind::kInvalidArgument, "rope: scaling factor must be > 0");
}

}  // namespace

void rope_apply_scalar(float* x, int n_heads, int head_dim, const RopeParams& p, const float* cos_t,
                       const float* sin_t) {
  const int half = p.n_dims / 2;
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + (int64_t)h * head_dim;
    for (int i = 0; i < half; ++i) {
      const int a = p.neox ? i : 2 * i;
      const int b = p.neox ? i + half : 2 * i + 1;
      const float x0 = v[a], x1 = v[b];
      // Fused as llama.cpp's compiled rotation is (the first product kept exact), so that
      // both round alike.
      v[a] = std::fma(x0, cos_t[i], -(x1 * sin_t[i]));
      v[b] = std::fma(x0, sin_t[i], x1 * cos_t[i]);
    }
  }
}

void rope_apply(float* x, int n_heads, int head_dim, const RopeParams& p, const float* cos_t,
                const float* sin_t) {
  check_rope(head_dim, p);
  static const bool simd = cpu_features().has_avx2_kernels();
  if (simd) {
    avx2::rope_apply(x, n_heads, head_dim, p, cos_t, sin_t);
  } else {
    rope_apply_scalar(x, n_heads, head_dim, p, cos_t, sin_t);
  }
}

void rope(float* x, int n_heads, int head_dim, int pos, const RopeParams& p) {
  check_rope(head_dim, p);
  if (p.n_dims > 2 * kMaxRopePairs)
    throw_error(ErrorKind::kInvalidArgument,
                "rope: n_dims above " + std::to_string(2 * kMaxRopePairs));
  float cos_t[kMaxRopePairs], sin_t[kMaxRopePairs];
  rope_angles(pos, p, cos_t, sin_t);
  rope_apply(x, n_heads, head_dim, p, cos_t, sin_t);
}

float exp_approx(float x) {
  // n = round(x / ln2) by the 1.5 * 2^23 shifter; b = x - n ln2 in two parts; e^b by a
  // degree-5 polynomial; then two exact-or-once-rounded scalings by 2^(n - n/2) and 2^(n/2).
  if (std::isnan(x)) return x;
  const float shifter = 0x1.8p23f;
  const float n = std::fma(x, 0x1.715476p+0f, shifter) - shifter;
  const float b = std::fma(-n, 0x1.7f7d1cp-20f, std::fma(-n, 0x1.62e4p-1f, x));
  if (std::fabs(n) > 192.0f) return n > 0.0f ? INFINITY : 0.0f;
  const float u = b * b;
  const float j = std::fma(std::fma(std::fma(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u,
                                    std::fma(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                           u, std::fma(0x1.ffffecp-1f, b, 1.0f));
  const int ni = (int)n, half = ni / 2;
  return j * std::ldexp(1.0f, ni - half) * std::ldexp(1.0f, half);
}

void swiglu(const float* gate, const float* up, float* out, int64_t n) {
  static const bool simd = cpu_features().has_avx2_kernels();
  if (simd) {
    avx2::swiglu(gate, up, out, n);
    return;
  }
  swiglu_scalar(gate, up, out, n);
}

void swiglu_scalar(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + exp_approx(-g)) * up[i];
  }
}

namespace {

// GELU with the tanh approximation, as llama.cpp's CPU build computes it in float: its
// compiler (GNU C, FMA available under -march=native) contracts 1 + a·x·x into one fused
// multiply-add, so the table is built with that rounding.
float gelu_tanh(float x) {
  constexpr float kCoefA = 0.044715f;
  constexpr float kSqrt2OverPi = 0.79788456080286535587989211986876f;
  return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * x * std::fma(kCoefA * x, x, 1.0f)));
}

// gelu_tanh at every half-precision value, rounded to half: llama.cpp's CPU GELU looks its
// argument up, rounded to half, in such a table (65536 entries, 128 KiB as floats).
const std::vector<float>& gelu_half_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (uint32_t i = 0; i < 65536; ++i)
      t[i] = fp16_to_f32(f32_to_fp16(gelu_tanh(fp16_to_f32((uint16_t)i))));
    return t;
  }();
  return table;
}

}  // namespace

const float* gelu_table() {
  return gelu_half_table().data();
}

void geglu(const float* gate, const float* up, float* out, int64_t n) {
  const std::vector<float>& table = gelu_half_table();
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    if (g <= -10.0f) {
      out[i] = 0.0f;
    } else if (g >= 10.0f) {
      out[i] = g * up[i];
    } else {
      out[i] = table[f32_to_fp16(g)] * up[i];
    }
  }
}

void gelu(const float* x, float* out, int64_t n) {
  const std::vector<float>& table = gelu_half_table();
  for (int64_t i = 0; i < n; ++i) {
    const float g = x[i];
    out[i] = g <= -10.0f ? 0.0f : g >= 10.0f ? g : table[f32_to_fp16(g)];
  }
}

void glu(GluActivation act, const float* gate, const float* up, float* out, int64_t n) {
  if (act == GluActivation::kGeluTanh) {
    geglu(gate, up, out, n);
  } else {
    swiglu(gate, up, out, n);
  }
}

void softcap(float* x, int64_t n, float cap) {
  const float inv = 1.0f / cap;
  for (int64_t i = 0; i < n; ++i) x[i] = std::tanh(x[i] * inv) * cap;
}

void add_inplace(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

uint64_t read_through(const uint8_t* p, size_t n) {
  static const bool simd = cpu_features().has_avx2_kernels();
  if (simd) return avx2::read_through(p, n);
  return read_through_scalar(p, n);
}

uint64_t read_through_scalar(const uint8_t* p, size_t n) {
  const auto* words = reinterpret_cast<const uint64_t*>(p);
  uint64_t acc[8] = {};  // eight independent chains: one 64-byte line per iteration
  for (size_t i = 0; i < n / 8; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] ^= words[i + j];
  return acc[0] ^ acc[1] ^ acc[2] ^ acc[3] ^ acc[4] ^ acc[5] ^ acc[6] ^ acc[7];
}

void embedding_row(const WeightView& table, int32_t token, float* out) {
  if (token < 0 || token >= table.rows)
    throw_error(ErrorKind::kInvalidArgument, "embedding: token id " + std::to_string(token) +
                                                 " outside the vocabulary of " +
                                                 std::to_string(table.rows));
  dequantize_row(table.type, table.row(token), out, table.cols);
}

void kv_store(uint16_t* cache, const KvCacheLayout& layout, int layer, const int32_t* block_table,
              int pos, const float* k, const float* v) {
  const int hd = layout.head_dim;
  for (int h = 0; h < layout.n_kv_heads; ++h) {
    kv_store_row(cache + layout.position_offset(block_table, layer, 0, h, pos), k + (int64_t)h * hd,
                 hd, layout.type(0));
    kv_store_row(cache + layout.position_offset(block_table, layer, 1, h, pos), v + (int64_t)h * hd,
                 hd, layout.type(1));
  }
}

}  // namespace hablar::cpu
