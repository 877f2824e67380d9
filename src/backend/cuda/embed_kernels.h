// The kernels of the CUDA embedding ops (embed_ops.h) beyond ops.h: F16 activation rows,
// LayerNorm with bias, biased GELU epilogues, RoPE from angle tables, pooling and the
// tiled bidirectional / causal attention over whole sequences. Launchers only (host C++);
// every one queues on `stream` and returns. F16 values travel as uint16_t bits.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/embed_plan.h"

namespace hablar::cuda::embed {

void f32_to_f16(const float* in, uint16_t* out, int64_t n, cudaStream_t stream);
void f16_to_f32(const uint16_t* in, float* out, int64_t n, cudaStream_t stream);

// y[r][i] = act(y[r][i] + bias[i]) over rows [rows x width] (bias may be null; act GELU-tanh
// when gelu, else none), in place, in F16 (width a multiple of 8) or F32. GELU's tanh is
// 1 - 2 / (e^2u + 1) with the fast exponential in the F16 form.
void bias_act_f16(uint16_t* y, const float* bias, int64_t rows, int64_t width, bool gelu,
                  cudaStream_t stream);
void bias_act_f32(float* y, const float* bias, int64_t rows, int64_t width, bool gelu,
                  cudaStream_t stream);
// y[r][i] = tanh(y[r][i] + bias[i]) (the reranker head's first layer; bias may be null).
void bias_tanh_f32(float* y, const float* bias, int64_t rows, int64_t width, cudaStream_t stream);

// out = act(gate) * up over n F16 values, n a multiple of 8 (act: SiLU, or GELU-tanh when
// gelu); math in f32.
void glu_f16(const uint16_t* gate, const uint16_t* up, uint16_t* out, int64_t n, bool gelu,
             cudaStream_t stream);

// Rows of f32 or F16 values, as a kernel input.
struct RowsIn {
  const void* data = nullptr;  // null: absent
  bool f16 = false;
};

// Per row of [rows x width]: v = x + bias + residual (bias and residual may be absent), then
// y = (v - mean) / sqrt(var + eps) * w + b, written in f32 to out32 and in F16 to out16
// (either may be null). Each thread keeps to the same columns in every pass, so an output
// may alias x or residual.
void layernorm(RowsIn x, const float* bias, RowsIn residual, const float* w, const float* b,
               float* out32, uint16_t* out16, int rows, int width, float eps, cudaStream_t stream);

// Rotates the first 2 * pairs dims of every head of x [tokens][heads][head_dim] by the
// angles of its token's position: cos_t / sin_t [positions][pairs] (core/rope.h's values).
// neox: pairs (i, i + pairs), else (2i, 2i + 1).
void rope_table(float* x, const int32_t* positions, const float* cos_t, const float* sin_t,
                int tokens, int heads, int head_dim, int pairs, bool neox, cudaStream_t stream);

// Pools the hidden rows [T x width] (embed_plan.h's PoolPlan, on the device): mean, first
// or last row, or every row into out; rank sequences' first rows into rank_rows [n_rank x
// width] instead.
struct PoolArgs {
  const float* hidden = nullptr;
  int64_t width = 0;
  const int32_t* seq_begin = nullptr;  // [S + 1]
  const int8_t* pooling = nullptr;     // [S]
  const int64_t* out_begin = nullptr;  // [S + 1]
  const int32_t* rank_slot = nullptr;  // [S]
  int32_t n_seqs = 0;
  float* out = nullptr;
  float* rank_rows = nullptr;
};
void pool(const PoolArgs& a, cudaStream_t stream);

// Attention of each token over its own sequence's rows (F16 in, f32 accumulation, F16 out):
//   q, out [T][n_heads][head_dim], k, v [T][n_kv_heads][head_dim] (query head h reads KV
//   head h / (n_heads / n_kv_heads)); tiles from embed_plan.h. causal: a query at position
//   i sees keys [first(i), i] (first(i) = i - window + 1 when window > 0 and i >= window,
//   else 0); otherwise the whole sequence. Scores scaled, then soft-capped when softcap > 0.
// Flash attention on tensor cores (mma.sync, intermediates in registers): a block of 4 warps
// per (tile, head), 64 keys at a time, online softmax.
struct AttentionArgs {
  const uint16_t* q = nullptr;
  const uint16_t* k = nullptr;
  const uint16_t* v = nullptr;
  uint16_t* out = nullptr;
  // Biases added to q, k, v as they are read ([n_heads x head_dim], [n_kv_heads x head_dim];
  // null: none): the projections' biases, folded in here instead of a pass of their own.
  const float* bq = nullptr;
  const float* bk = nullptr;
  const float* bv = nullptr;
  const EmbedTile* tiles = nullptr;  // device
  int32_t n_tiles = 0;
  int32_t max_len = 0;  // the longest sequence (sizes the keys staged at once; 0: the most)
  int32_t n_heads = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  float scale = 1.0f;
  float softcap = 0.0f;
  int32_t window = 0;
  bool causal = false;
};
bool attention_supports_head_dim(int head_dim);  // 32, 64 and 128
void attention(const AttentionArgs& a, cudaStream_t stream);

}  // namespace hablar::cuda::embed
